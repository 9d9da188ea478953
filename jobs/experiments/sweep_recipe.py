r"""Which outer-training recipe makes trained links carry the hidden operand? (the experiment driver)

One run: generate the hidden-operand set (`synthetic_hidden`: only the planner is told "x = 17."; critic and
solver see "What is x - 8?"), split train / held-out (disjoint, checked), train the inner links once (shared
by every recipe), then for each named recipe train the outer links with the project's own trainer and
measure on the held-out questions, with the project's own runner (`run_batch`, in-process agents):

  accuracy   trained links / the same links with latents shuffled between questions / zeroed / fresh outer
             links (trained inner links), graded strictly; McNemar's exact test of trained vs each
  NLL        of the gold answer's fact tokens (the hidden x, "17" in "17 - 8 = 9. \boxed{9}") and result
             tokens (the value after "="), per question, paired differences (mean +- SE) trained vs shuffled
  probe      can a linear map read x from each edge's message (the final round's, mean over positions)?
             5-fold cross-validated ridge R^2 and the share of questions whose rounded prediction is x
  baselines  once per run: the single agent without the fact (floor), with it (ceiling), TextMAS

Results stream to <out_dir>/<recipe>/result.json (a finished recipe is skipped on a rerun with the same
flags) and the table to <out_dir>/summary.md. Recipes (`RECIPES`; --recipes picks, in order):

  demo_today      K = 8, R = 1, lr 1e-4, HF warmup (first step at lr 0): the demo's outer recipe as it was
  release         K = 80, R = 2, lr 5e-4, warmup 1 shifted (first step > 0), steps/rows as given
  release_lr1e-3  release at lr 1e-3 (the lr of a longer earlier run)
  +norm           release + latents rescaled to the target's token-embedding norm (non-reference)
  +bridge         release + ridge bridge init of the outer links (non-reference)
  +value          release + answer value tokens weighted 5x in the loss (non-reference)
  all             release + norm + bridge + value
  release_r1      release at R = 1 and lr 1e-3 (half the cost per step: what a 2-core budget affords)
  norm_value_r1   release_r1 + norm + value (no bridge: its fit loads both base models in the driver)
  all_r1          release_r1 + norm + bridge + value
  bridge_r1       release_r1 + bridge (the bridge alone)
  rollout_r1      release_r1 with the first stage's latents from its m-step rollout, as inference sends them,
                  instead of hidden states over its gold text (non-reference; also rollout_bridge_r1,
                  rollout_bridge_value_r1, rollout_all_r1)
  state_bridge_value_r1
                  the one-hop setting that carries the fact (docs/learning_runs.md, diag7 at 64 + 64 held-out): R = 1,
                  lr 1e-3 held constant, the first stage's m-step rollout as inference sends it, the rollout-state
                  bridge init (`--outer_init state_bridge`), value tokens weighted 5x (all non-reference)
  full_*_r1       every stage sends its m-step rollout, graph kept through the agents that receive latents;
                  full_detached_* cuts each rollout step's fed-back inner(h) from the graph (non-reference)
  token_hop_by_hop_r1
                  every hop a token link, only the last (into the decoder) trained, on the earlier stages' frozen
                  rollouts as inference sends them (`jobs.train_outer --schedule hop_by_hop` on Ray Train, via
                  `jobs.experiments.hop_by_hop`; non-reference): the two-hop setting that carries the fact
                  (docs/learning_runs.md, run F)

--style distillation runs the one-hop system (the Gemma-3-270M expert is told the fact, the SmolLM2-135M learner
decodes): the value has to cross one link, where sequential_light's critic must carry it on through its own
frozen inner link, trained on gold text that never holds the value.

Example (real small models, about an hour on 2 busy cores; logs under out_exp/, never committed):
    PYTHONPATH=$PWD python -m jobs.experiments.sweep_recipe --out_dir out_exp/sweep --recipes release,all \
        --num_train 512 --num_eval 128 --outer_steps 64
Smoke test of the pipeline (tiny random models, a minute):
    PYTHONPATH=$PWD python -m jobs.experiments.sweep_recipe --preset tiny --out_dir /tmp/sweep --num_train 16 \
        --num_eval 8 --inner_steps 2 --outer_steps 2 --recipes release
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import ray

from jobs.experiments import hop_by_hop
from jobs.experiments.sweep_recipe_measure import Measurer, summary_table
from recmas_ray.config.checks import OneOf, Range, WritableDir
from recmas_ray.config.cli import run_job
from recmas_ray.distributed.cluster import init_ray
from recmas_ray.styles import check_role_models, get_style
from recmas_ray.system.config import with_system
from recmas_ray.system.provenance import link_origin, require_known_links
from recmas_ray.train.config import SCHEDULES, InnerTrainConfig, OuterTrainConfig
from recmas_ray.train.inner_job import train_all_roles
from recmas_ray.train.pipeline import train_outer
from recmas_ray.train.synthetic import check_disjoint, write_jsonl
from recmas_ray.train.synthetic_facts import FACT_TASKS, split_by_value

RELEASE = {"max_latent_tokens": 80, "num_recursive_rounds": 2, "lr": 5e-4, "warmup_steps": 1}
R1 = {**RELEASE, "num_recursive_rounds": 1, "lr": 1e-3}
"""release at R = 1 and lr 1e-3: the base of the *_r1 recipes."""
NORM, BRIDGE, VALUE = {"latent_norm": "embedding"}, {"outer_init": "bridge"}, {"value_token_weight": 5.0}
ROLLOUT = {"rollout_latent_steps": "m"}
FULL = {"rollout_latent_steps": "m", "rollout_stages": "all"}
"""Every stage sends its rollout, graph kept through the agents that receive latents (non-reference)."""
DETACHED = {"rollout_feedback": "detached"}
"""With FULL: the rollouts' fed-back inner(h) cut from the graph (gradient through attention to the received
latents only; non-reference)."""
RECIPES: dict[str, dict] = {
    "demo_today": {"max_latent_tokens": 8, "num_recursive_rounds": 1, "lr": 1e-4, "warmup_steps": 1,
                   "warmup_from_zero": True},
    "release": RELEASE,
    "release_lr1e-3": {**RELEASE, "lr": 1e-3},
    "+norm": {**RELEASE, **NORM},
    "+bridge": {**RELEASE, **BRIDGE},
    "+value": {**RELEASE, **VALUE},
    "all": {**RELEASE, **NORM, **BRIDGE, **VALUE},
    "release_r1": R1,
    "norm_value_r1": {**R1, **NORM, **VALUE},
    "all_r1": {**R1, **NORM, **BRIDGE, **VALUE},
    "bridge_r1": {**R1, **BRIDGE},
    "rollout_r1": {**R1, **ROLLOUT},
    "rollout_bridge_r1": {**R1, **ROLLOUT, **BRIDGE},
    "rollout_bridge_value_r1": {**R1, **ROLLOUT, **BRIDGE, **VALUE},
    "rollout_all_r1": {**R1, **ROLLOUT, **BRIDGE, **NORM, **VALUE},
    "state_bridge_value_r1": {**R1, **ROLLOUT, "outer_init": "state_bridge", **VALUE, "lr_scheduler_type": "constant"},
    "full_r1": {**R1, **FULL},
    "full_bridge_r1": {**R1, **FULL, **BRIDGE},
    "full_bridge_value_r1": {**R1, **FULL, **BRIDGE, **VALUE},
    "full_bridge_value_r1_lr3e-3": {**R1, **FULL, **BRIDGE, **VALUE, "lr": 3e-3},
    "full_bridge_value_r2": {**RELEASE, "lr": 1e-3, **FULL, **BRIDGE, **VALUE},
    "full_detached_bridge_value_r1": {**R1, **FULL, **DETACHED, **BRIDGE, **VALUE},
    "token_hop_by_hop_r1": {"schedule": "hop_by_hop", "num_recursive_rounds": 1, "lr": 1e-3, "token_tau": 0.02,
                            "rollout_latent_steps": "m", **VALUE, "lr_scheduler_type": "constant",
                            "warmup_steps": 0, "torch_threads": 2},
}
"""Recipe name -> OuterTrainConfig fields (on top of the sweep's steps, batch size and seed); "m" stands for
the sweep's --latent_steps. A recipe with "schedule": "hop_by_hop" trains through `hop_by_hop.train` (the
product's schedule in the sweep's data order) and is measured with its links.pt attached."""
SWEEP_STYLES = ("sequential_light", "distillation", "mixture", "deliberation")


@dataclass(kw_only=True)
class SweepRecipeConfig:
    """One sweep: data sizes, the shared inner training, the outer budget and the recipes to compare."""

    out_dir: Annotated[str, WritableDir()] = "out_exp/sweep_recipe"
    """Folder for data, checkpoints, per-recipe result.json and summary.md."""
    style: Annotated[str, OneOf(SWEEP_STYLES)] = "sequential_light"
    """System: sequential_light (planner -> critic -> solver, two hops) or distillation (expert -> learner, one
    hop); the roles told the fact are the first stage's (synthetic_hidden.HIDDEN_CONTEXT_ROLES)."""
    preset: Annotated[str, OneOf(("demo", "tiny"))] = "demo"
    """demo (SmolLM2-135M planner and solver, Gemma-3-270M critic) or tiny (random weights: the smoke test)."""
    fact_task: Annotated[str, OneOf(FACT_TASKS)] = "recall"
    """Hidden-fact task (`train.synthetic_facts`): recall (the first stage is told "x = 65.", the decoder asked
    "What is x?"), two_fact (sequential: planner x, critic y, solver asked about one), mixture (three experts,
    three facts, the summarizer asked about one) or compare ("Is x greater than 52?", yes / no)."""
    num_unseen: Annotated[int, Range(0, 500)] = 0
    """Held-out questions whose fact values never occur in training (beside the --num_eval seen-values ones)."""
    task: Annotated[str, OneOf(("qa", "math"))] = "qa"
    """Answer-format instruction of the prompts (the demo's qa asks for a short boxed answer)."""
    recipes: Annotated[list[str], OneOf(tuple(RECIPES))] = field(default_factory=lambda: ["release", "all"])
    """Recipes to train and measure, in order (see RECIPES)."""
    num_train: Annotated[int, Range(2, 1500)] = 512
    """Generated training rows."""
    num_eval: Annotated[int, Range(2, 500)] = 128
    """Held-out questions (a McNemar test at p < 0.01 needs >= 128)."""
    inner_steps: Annotated[int, Range(1, 1_000_000)] = 48
    """Inner-loop steps per role (trained once, shared by every recipe)."""
    inner_lr: Annotated[float, Range(0, 1, lo_open=True)] = 3e-3
    """Inner-loop learning rate (the demo's)."""
    inner_schedule: Annotated[str, OneOf(SCHEDULES)] = "cosine"
    """Inner-loop lr after warmup: cosine (to 0, the reference), linear or constant (the two-hop runs': a
    critic whose inner link stops short of a cosine loss near 0.003 never states the value)."""
    role_models: dict[str, str] = field(default_factory=dict)
    """Base model per role instead of the preset's, ROLE=MODEL (e.g. planner=pkg:gemma3-270m: SmolLM2's rollout
    never states the value, docs/learning_runs.md)."""
    outer_steps: Annotated[int, Range(1, 1_000_000)] = 64
    """Outer-loop steps of every recipe."""
    outer_batch_size: Annotated[int, Range(1, 1024)] = 4
    """Outer-loop rows per step."""
    eval_every: Annotated[int, Range(0, 1_000_000)] = 0
    """Held-out loss curve of the outer run every this many steps (0: off; costs a forward sweep each)."""
    latent_steps: Annotated[int, Range(1, 4096)] = 16
    """m at evaluation: latent rollout steps per agent and round."""
    max_new_tokens: Annotated[int, Range(1, 512)] = 24
    """Decoding budget of every text step at evaluation."""
    eval_batch_size: Annotated[int, Range(1, 1024)] = 32
    """Questions per agent call at evaluation."""
    inner_from: str | None = None
    """Reuse the inner links of an earlier sweep (<inner_from>/<role>, e.g. out_exp/sweep/inner) instead of
    training them (they must come from the same --preset and --seed data)."""
    allow_unknown_links: bool = False
    """Use --inner_from (or earlier inner links in --out_dir) without a provenance.json matching their files
    (`system.provenance`); they are recorded as of unknown origin in every result.json."""
    baselines: bool = True
    """Also measure the single agent without / with the fact and TextMAS (once per sweep)."""
    extra_rows: Annotated[list[str], OneOf(("zeroed", "bridge_init"))] = field(
        default_factory=lambda: ["zeroed", "bridge_init"])
    """Rows measured beside trained / shuffled / fresh: zeroed latents, the untrained bridge init (bridge recipes)."""
    seed: Annotated[int, Range(0, 2**31 - 1)] = 0
    """Seed of the data, the link init and the data order."""

    def validate(self) -> None:
        """--role_models names roles of --style; --inner_from holds every role's inner link (checked before Ray
        or any model starts)."""
        check_role_models("--role_models", dict(self.role_models), self.style)

        roles = get_style(self.style).roles
        if self.inner_from and not all((Path(self.inner_from) / r / "manifest.json").exists() for r in roles):
            raise ValueError(f"--inner_from {self.inner_from!r}: expected <dir>/<role>/manifest.json for {list(roles)}")
        if self.inner_from:
            require_known_links({r: str(Path(self.inner_from) / r) for r in roles}, what="--inner_from",
                                allow_unknown=self.allow_unknown_links)


def _inner(cfg: SweepRecipeConfig, train_file: Path, out: Path) -> dict[str, str]:
    """Inner links of every role, trained once (reused when <out>/inner/<role> exists)."""
    roles = get_style(cfg.style).roles
    dirs = {r: Path(cfg.inner_from or out / "inner") / r for r in roles}
    if all((d / "manifest.json").exists() for d in dirs.values()):  # reused: only links whose origin is known
        require_known_links({r: str(d) for r, d in dirs.items()}, what="inner links", allow_unknown=cfg.allow_unknown_links)
    else:
        train_all_roles(with_system(
            InnerTrainConfig, style=cfg.style, mas_role="all", preset=cfg.preset, dataset_name=str(train_file),
            role_models=dict(cfg.role_models), lr_scheduler_type=cfg.inner_schedule,
            save_dir=str(out / "inner"), max_steps=cfg.inner_steps, batch_size=4, lr=cfg.inner_lr, warmup_steps=2,
            save_every=cfg.inner_steps, seed=cfg.seed, num_workers=0, progress=False, max_length=512, task=cfg.task,
            log_every=max(1, cfg.inner_steps // 4)))
    return {r: str(d) for r, d in dirs.items()}


def recipe_settings(recipe: str, cfg: SweepRecipeConfig) -> dict:
    """The recipe's OuterTrainConfig fields with "m" resolved to --latent_steps."""
    return {k: cfg.latent_steps if v == "m" else v for k, v in RECIPES[recipe].items()}


def _outer_config(cfg: SweepRecipeConfig, recipe: str, inner: dict, train_file: Path, eval_file: Path, out: Path):
    """One recipe's OuterTrainConfig."""
    return with_system(
        OuterTrainConfig, style=cfg.style, preset=cfg.preset, ckpt_override=dict(inner), role_models=dict(cfg.role_models),
        dataset_name=str(train_file),
        task=cfg.task, save_dir=str(out / recipe / "outer"), max_steps=cfg.outer_steps,
        batch_size=cfg.outer_batch_size, save_every=cfg.outer_steps, seed=cfg.seed, cpus_per_worker=0.5,
        max_failures=0, log_every=max(1, cfg.outer_steps // 8), progress=False,
        eval_every=cfg.eval_every, eval_dataset=str(eval_file) if cfg.eval_every else None,
        **recipe_settings(recipe, cfg))


def _outer(cfg: SweepRecipeConfig, recipe: str, inner: dict, train_file: Path, eval_file: Path, out: Path):
    """Train one recipe's outer links; returns (save_dir, per-step log, held-out curve, seconds)."""
    t0 = time.perf_counter()
    res = train_outer(_outer_config(cfg, recipe, inner, train_file, eval_file, out))
    return str(res.save_dir), res.log, res.eval_log, time.perf_counter() - t0


def _hop_by_hop(cfg: SweepRecipeConfig, recipe: str, inner: dict, train: list[dict], heldout: list[dict],
                out: Path) -> dict:
    """A hop_by_hop recipe: train its token links with the product's schedule on Ray Train (the agents load
    in its workers), then measure them attached to the measuring agents."""
    settings = recipe_settings(recipe, cfg)
    t0 = time.perf_counter()
    done = hop_by_hop.train(_outer_config(cfg, recipe, inner, out / "train.jsonl", out / "heldout.jsonl", out),
                            len(train))
    secs, log = time.perf_counter() - t0, done["log"]
    print(f"[sweep] {recipe}: hop-by-hop training {secs:.0f} s, loss {log[0]['loss']:.3f} -> {log[-1]['loss']:.3f}",
          flush=True)
    measurer = Measurer(cfg, inner, heldout)  # its agents start with the plan's links, latent norm none
    got = measurer.recipe(None, settings, rows=tuple(r for r in cfg.extra_rows if r != "bridge_init"),
                          attach=lambda pool: hop_by_hop.attach(pool, done["links"]))
    measurer.close()
    got["link_origins"] = {r: link_origin(d) for r, d in inner.items()}
    got.update(recipe=recipe, settings=settings, train_seconds=secs, loss_first=log[0]["loss"],
               loss_last=log[-1]["loss"], eval_curve=[], outer_links=str(out / recipe / "outer" / hop_by_hop.LINKS_FILE))
    return got


def main_cfg(cfg: SweepRecipeConfig) -> int:
    """Run the sweep; writes per-recipe result.json and summary.md, prints the table."""
    out = Path(cfg.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    want = dataclasses.asdict(cfg)
    old = out / "sweep_config.json"
    if old.exists():
        prev = json.loads(old.read_text())
        diff = sorted(k for k in want if k not in ("recipes", "allow_unknown_links") and prev.get(k) != want[k])
        if diff:
            raise ValueError(f"--out_dir {out} holds a sweep with other settings ({', '.join(diff)}); "
                             "use another --out_dir")
    old.write_text(json.dumps(want, indent=2))
    train, seen, unseen = split_by_value(cfg.fact_task, cfg.style, num_train=cfg.num_train, num_seen=cfg.num_eval,
                                         num_unseen=cfg.num_unseen, seed=cfg.seed)
    heldout = seen + unseen  # measured together; summary_table splits them (the first num_eval are seen values)
    check_disjoint(train, heldout)
    train_file, eval_file = write_jsonl(train, out / "train.jsonl"), write_jsonl(heldout, out / "heldout.jsonl")
    if not ray.is_initialized():
        init_ray()
    t0 = time.perf_counter()
    inner = _inner(cfg, train_file, out)
    print(f"[sweep] inner links ready ({time.perf_counter() - t0:.0f} s)", flush=True)
    results = {}
    if cfg.baselines:
        path = out / "baselines.json"
        if not path.exists():
            measurer = Measurer(cfg, inner, heldout)
            path.write_text(json.dumps(measurer.baselines(), indent=2))
            measurer.close()
        results["_baselines"] = json.loads(path.read_text())
    for recipe in cfg.recipes:
        path = out / recipe / "result.json"
        if not path.exists() and recipe_settings(recipe, cfg).get("schedule") == "hop_by_hop":
            path.write_text(json.dumps(_hop_by_hop(cfg, recipe, inner, train, heldout, out), indent=2))
        elif not path.exists():
            save_dir, log, curve, secs = _outer(cfg, recipe, inner, train_file, eval_file, out)
            print(f"[sweep] {recipe}: outer training {secs:.0f} s, loss {log[0]['loss']:.3f} -> "
                  f"{log[-1]['loss']:.3f}", flush=True)
            measurer = Measurer(cfg, inner, heldout)  # the agents load only while no training runs (memory)
            settings = recipe_settings(recipe, cfg)
            got = measurer.recipe(save_dir, settings, rows=tuple(cfg.extra_rows))
            measurer.close()

            got["link_origins"] = {**{r: link_origin(d) for r, d in inner.items()}, "outer": link_origin(save_dir)}
            got.update(recipe=recipe, settings=settings, train_seconds=secs,
                       loss_first=log[0]["loss"], loss_last=log[-1]["loss"], eval_curve=curve)
            path.write_text(json.dumps(got, indent=2))
        results[recipe] = json.loads(path.read_text())
        table = summary_table(results, cfg)
        (out / "summary.md").write_text(table + "\n")
        print(table, flush=True)
    return 0


def main(argv=None) -> int:
    """Command line: parse, check, run; bad input is one line and exit 2."""
    return run_job(main_cfg, SweepRecipeConfig, argv, prog="sweep_recipe", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
