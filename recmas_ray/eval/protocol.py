"""Evaluation protocols: named sets of settings that say how a number is produced.

    --protocol greedy     every setting as configured; the defaults decode greedily, once (tests, quick checks)
    --protocol reference  the release's sampling, token budgets, recommended m and R per (style,
                          benchmark), several sampled runs aggregated as mean and spread, and the
                          benchmark's headline metric (AIME: pass@10)

A protocol is a recipe: `reference(style, dataset)` returns the `EvalConfig` the release would run, and
`jobs.run --protocol reference` starts from it, then applies the --config file and the flags over it (the
user's values win). Where a setting came from is the difference between the recipe and the final config:
`resolution(cfg)` names, for every setting the protocol sets, the protocol's value and the run's, and goes
into every results file.

Facts and where they come from ([Apr], [Jun]: the two public releases, docs/reproducing.md#sources):
- sampling T=0.6, top_p=0.95, top_k unset (the model's generation config), retry on: [Apr] run.py
- MBPP+ T=0.2: [Apr]; LiveCodeBench T per style: [Jun] recommendations
- max_new_tokens: MATH500 1000 for sequential_light, 2000 for other styles, 4000 elsewhere: [Apr]
- m, R (and batch size where recorded): the June recommendations first, then the April ones,
  else the runner defaults m=32, R=3 [Apr run.py]
- AIME scored pass@10 with num_rollouts=10: [Jun] run.py
- three seeds for every other benchmark: sampled single-seed numbers are noisy
- mixture summarizer decodes every round, the reference grader is the headline (strict reported too)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from recmas_ray.eval.config import EvalConfig
from recmas_ray.styles import get_style
from recmas_ray.styles.base import ReferenceCell
from recmas_ray.system.config import SystemConfig
from recmas_ray.tasks.benchmarks import BENCHMARKS, canonical_name

RUNNER_DEFAULT_M, RUNNER_DEFAULT_R = 32, 3  # [Apr] runner defaults
REFERENCE_SEEDS = 3  # >= 3 seeds against single-seed noise
AIME_ROLLOUTS = 10  # [Jun]: AIME pass@10, num_rollouts=10


Cell = ReferenceCell
"""The release's recommendation for one (style, benchmark) pair: each style declares its own
(`StyleSpec.reference_cells`, `reference_default`)."""
RUNNER_DEFAULT = Cell(latent_steps=RUNNER_DEFAULT_M, rounds=RUNNER_DEFAULT_R,
                      source="[Apr] runner defaults m32/R3 (cell not recorded)")

# [Apr]: temperature 0.2 for MBPP+; every other benchmark samples at 0.6.
BENCHMARK_TEMPERATURE = {"mbppplus": 0.2}
REFERENCE_TEMPERATURE, REFERENCE_TOP_P = 0.6, 0.95  # [Apr] run.py
MODEL_TOP_K = -1  # [Apr] run.py: top_k unset, so the model's generation config decides


def recommended(style: str, benchmark: str) -> Cell:
    """The release's m, R (and batch size, temperature) for a pair, as the style declares it; the style's default
    where unrecorded, else the runner defaults."""
    spec = get_style(style)
    return spec.reference_cells.get(benchmark) or spec.reference_default or RUNNER_DEFAULT


def max_new_tokens(style: str, benchmark: str) -> int:
    """The release's token budget: the style's where it declares one (MATH500: 1000 for the light sequential
    system, 2000 for the others), else 4000 ([Apr] run.py)."""
    return get_style(style).reference_max_new_tokens.get(benchmark, 4000)


def headline_metric(benchmark: str) -> str:
    """The benchmark's published metric (`BenchmarkSpec.metric`); local files report accuracy."""
    spec = BENCHMARKS.get(benchmark)
    return spec.metric if spec is not None else "accuracy"


def metric_k(metric: str) -> int | None:
    """k of a pass@k metric name, else None."""
    return int(metric.split("@", 1)[1]) if metric.startswith("pass@") else None


def reference_settings(style: str, benchmark: str) -> dict[str, tuple[Any, str]]:
    """Dotted EvalConfig path -> (value, source) of the reference protocol for one pair."""
    cell = recommended(style, benchmark)
    k = metric_k(headline_metric(benchmark))
    temp = cell.temperature if cell.temperature is not None else BENCHMARK_TEMPERATURE.get(
        benchmark, REFERENCE_TEMPERATURE)
    out: dict[str, tuple[Any, str]] = {
        "recursion.decode.do_sample": (True, "[Apr] run.py: sampling always on"),
        "recursion.decode.temperature": (temp, cell.source if cell.temperature is not None else
                                         "[Apr] run.py: T=0.6, MBPP+ 0.2"),
        "recursion.decode.top_p": (REFERENCE_TOP_P, "[Apr] run.py"),
        "recursion.decode.top_k": (MODEL_TOP_K, "[Apr] run.py: unset, the model's generation config"),
        "recursion.decode.max_new_tokens": (max_new_tokens(style, benchmark), "[Apr] run.py"),
        "recursion.latent_steps": (cell.latent_steps, cell.source),
        "recursion.num_recursive_rounds": (cell.rounds, cell.source),
        "recursion.decode_every_round": (get_style(style).decodes_each_round,
                                         "[Apr]: the summarizer decodes every round"),
        "num_rollouts": ((AIME_ROLLOUTS, "[Jun] run.py: AIME pass@10, num_rollouts=10") if k and k > 1 else
                         (REFERENCE_SEEDS, ">= 3 seeds against single-seed noise, mean and spread")),
        "format_retry": (True, "[Apr] run.py: --ans retry always on"),
        "grader": ("reference", "the release's lenient grader (strict is recorded too)"),
    }
    if cell.batch_size is not None:
        out["batch_size"] = (cell.batch_size, cell.source)
    return out


def reference(style: str, dataset: str):
    """The `EvalConfig` the release runs for `style` on `dataset`: the recipe `--protocol reference` starts from
    (Python callers change the returned config before running it)."""
    cfg = EvalConfig(system=SystemConfig(style=style), dataset=dataset, protocol="reference")
    for path, (value, _) in reference_settings(style, benchmark_key(dataset)).items():
        cfg = _replace(cfg, path, value)
    return cfg


@dataclass
class Resolution:
    """What a protocol sets, and whether the run kept it."""

    protocol: str
    """Protocol name."""
    benchmark: str
    """Benchmark key the tables were read for."""
    style: str
    """Style name the tables were read for."""
    settings: dict[str, dict] = field(default_factory=dict)
    """Dotted path -> {value, source ("protocol", or "explicit" where the run differs), protocol_value,
    explicit_value (where it differs), cite}."""
    metric: str = "accuracy"
    """Headline metric name (accuracy, pass@10, ...)."""
    aggregation: str = "mean and std over runs (rollout r decodes with seed + r)"
    """How sampled runs combine."""

    def record(self) -> dict:
        """The JSON-able record written into results files."""
        return dataclasses.asdict(self)


def _get(cfg, path: str):
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _replace(cfg, path: str, value):
    head, _, rest = path.partition(".")
    if not rest:
        return dataclasses.replace(cfg, **{head: value})
    return dataclasses.replace(cfg, **{head: _replace(getattr(cfg, head), rest, value)})


def benchmark_key(dataset: str) -> str:
    """The tables' name of a dataset (release aliases resolved; a local file keeps its path)."""
    return canonical_name(dataset)


def resolution(cfg) -> Resolution:
    """Where each setting of the protocol came from: the recipe's value, or the run's own where they differ
    (greedy sets nothing)."""
    bench = benchmark_key(cfg.dataset)
    res = Resolution(protocol=cfg.protocol, benchmark=bench, style=cfg.system.style, metric=headline_metric(bench))
    table = reference_settings(cfg.system.style, bench) if cfg.protocol == "reference" else {}
    for path, (value, cite) in table.items():
        mine = _get(cfg, path)
        res.settings[path] = {"value": mine, "source": "protocol", "protocol_value": value, "cite": cite}
        if mine != value:
            res.settings[path] |= {"source": "explicit", "explicit_value": mine}
    return res
