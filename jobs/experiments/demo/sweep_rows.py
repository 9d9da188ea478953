"""Rows of the demo's report from the recipe sweep's measurements (`jobs.experiments.sweep_recipe_measure`).

The hidden-fact tasks are measured by the sweep's `Measurer` (per question: correct strictly and leniently, the
prediction, fact / result NLL); `rows_from_measure` turns one task's result.json and baselines.json into the
rows `demo.verdicts` and `demo.report` read (the keys of `demo.compare.summarize_run`), optionally for one
held-out split (its positions), so the headline, the tables and the PNG of every task come from one code path:

    rows = rows_from_measure(result, baselines, positions=range(64), rounds=1)
    tasks = [{"style": "distillation", "task": "recall (seen values)", "rows": rows}]
    verdicts.headline(tasks) + verdicts.collaboration(tasks); report.plot_tasks(tasks, png)
"""

from __future__ import annotations

import math

from jobs.experiments.demo.compare import BY_KEY, Variant, wilson

MEASURED = {"single_floor": "single_agent", "single_ceiling": "single_agent/fact", "textmas": "textmas",
            "trained": "recursive_mas/trained", "shuffled": "ablation/shuffle", "zeroed": "ablation/zero",
            "fresh": "recursive_mas/fresh"}
"""Measurer name -> the demo variant it is."""
BRIDGE = Variant("recursive_mas/bridge_init", "RecursiveMAS, bridge init (untrained outer links)", "recursive_mas",
                 "bridge_init")


def _mean(values: list) -> float:
    got = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return sum(got) / len(got) if got else float("nan")


def row_from_measure(name: str, measured: dict, *, positions=None, rounds: int = 1) -> dict:
    """One report row of a measured run (`Measurer._run` output): accuracy strict (Wilson 95% CI) and lenient,
    per-question outcomes keyed by position (so runs on the same held-out rows pair up), fact-token NLL as
    the row's NLL; cost figures are not measured there (NaN)."""
    variant = BRIDGE if name == "bridge_init" else BY_KEY[MEASURED[name]]
    idx = list(range(len(measured["correct"]))) if positions is None else list(positions)
    correct = {f"q{i}": bool(measured["correct"][i]) for i in idx}
    lenient_all = measured.get("correct_lenient") or measured["correct"]
    lenient = {f"q{i}": bool(lenient_all[i] or measured["correct"][i]) for i in idx}
    nll = {f"q{i}": (measured.get("fact_nll") or [None] * len(measured["correct"]))[i] for i in idx}
    n, k, k_len = len(idx), sum(correct.values()), sum(lenient.values())
    lo, hi = wilson(k, n)
    lo_len, hi_len = wilson(k_len, n)
    nan = float("nan")
    values = [v for v in nll.values() if v is not None]
    mean = _mean(values)
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values)) if len(values) > 1 else nan
    preds = measured.get("predictions") or []
    return {"variant": variant.key, "label": variant.label, "method": variant.method, "links": variant.links,
            "ablation": variant.ablation, "rounds": 1 if name in ("single_floor", "single_ceiling", "textmas") else rounds,
            "n": n, "correct": k, "accuracy": k / n if n else nan, "ci_low": lo, "ci_high": hi,
            "correct_lenient": k_len, "accuracy_lenient": k_len / n if n else nan, "ci_low_lenient": lo_len,
            "ci_high_lenient": hi_len, "nll": mean, "nll_stderr": se, "nll_kind": "fact-token", "tokens_per_sample": nan,
            "latent_steps_per_sample": nan, "seconds_per_sample": None, "wall_seconds": None,
            "nll_per_doc": nll, "correct_per_doc": correct, "correct_lenient_per_doc": lenient,
            "prediction_per_doc": {f"q{i}": preds[i] for i in idx if i < len(preds)}}


def rows_from_measure(result: dict, baselines: dict | None = None, *, positions=None, rounds: int = 1) -> list[dict]:
    """Every measured run of one task (`result.json` of a recipe, `baselines.json`) as report rows, in the demo's
    method order; `positions`: the held-out rows of one split (None: all)."""
    runs = {**(baselines or {}), **{k: v for k, v in result.items() if isinstance(v, dict) and "correct" in v}}
    order = list(MEASURED) + ["bridge_init"]
    return [row_from_measure(name, runs[name], positions=positions, rounds=rounds) for name in order if name in runs]


__all__ = ["MEASURED", "row_from_measure", "rows_from_measure"]
