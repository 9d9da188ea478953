"""Evaluation results in lm-evaluation-harness's layout (docs/usage.md); per-sample records are in
`eval/samples.py`, the PNG in `eval/plots.py`.

- `summarize`: accuracy with standard error, pass@k, tokens, latent steps, and the run's two timings:
  `throughput_samples_per_s` (samples / wall-clock seconds of the method's run, what the progress bar's rate
  shows) and `latency_s` (mean per question, from its batch's submission to its result).
- `write_results`: `results_<ISO time>.json` with `results` (numbers only), `metadata` (each task's
  strings: benchmark, method, grader, headline, ...), `config`, `versions`, `git_hash`, `date`,
  `n-samples`, `total_evaluation_time_seconds`; `read_results` joins the two again (also reads older
  files, whose strings sat in the metric rows).
- `markdown_table`: the table jobs print on stdout (speedup: throughput over the baseline's; timing columns
  marked unreliable when the machine's load average exceeds its cores, `machine_load`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import subprocess
import time
from collections import defaultdict
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from recmas_ray.eval.samples import json_default, timestamp

__all__ = ["pass_at_k", "summarize", "write_results", "read_results", "split_metadata", "markdown_table"]

BASELINE = "recursive_textmas"
HIGHER_IS_BETTER = {"accuracy": True, "tokens_per_sample": False, "latent_steps_per_sample": False,
                    "seconds_per_sample": False, "latency_s": False, "parse_failure_rate": False,
                    "retry_rate": False, "rounds_per_sample": False,
                    "throughput_samples_per_s": True}
# ----------------------------------------------------------------------------- summaries


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate (Chen et al. 2021) from n samples of which c are correct."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _tokens(rec: Mapping) -> float | None:
    t = rec.get("tokens")
    if isinstance(t, Mapping):
        return float(t["total"]) if "total" in t else float(sum(t.values()))
    return None if t is None else float(t)


def _latent_steps(rec: Mapping) -> float | None:
    if rec.get("latent_steps") is not None:
        return float(rec["latent_steps"])
    trace = rec.get("trace")
    if isinstance(trace, list) and trace:
        return float(sum(step.get("latent_steps", 0) or 0 for step in trace))
    return None


def summarize(samples: Iterable[Mapping[str, Any]], *,
              correct_fields: Mapping[str, str] | None = None,
              k_values: Sequence[int] | None = None,
              wall_seconds: float | None = None) -> dict[str, Any]:
    """Metrics of one (benchmark, method) group in lm-eval's "<metric>,<filter>" naming.

    `correct_fields` maps a filter name to the boolean field holding that grader's verdict
    (default {"strict": "correct"}). Accuracy averages per document first (rollouts of one
    document are not independent) and its stderr is the sample std over documents / sqrt(n),
    i.e. sqrt(p(1-p)/(n-1)) for one rollout. pass@k is reported for `k_values`, by default
    for 1 and the number of rollouts when documents have more than one.
    """
    samples = list(samples)
    if not samples:
        raise ValueError("summarize() got no samples")
    fields = dict(correct_fields or {"strict": "correct"})
    by_doc: dict[str, list[Mapping]] = defaultdict(list)
    for s in samples:
        by_doc[str(s["doc_id"])].append(s)
    n_docs = len(by_doc)
    min_rollouts = min(len(v) for v in by_doc.values())
    ks = list(k_values) if k_values is not None else (
        sorted({1, min_rollouts}) if min_rollouts > 1 else [])
    out: dict[str, Any] = {}
    for filt, fld in fields.items():
        missing = [s["doc_id"] for s in samples if fld not in s]
        if missing:
            raise ValueError(f"samples lack the {fld!r} field used for filter {filt!r} "
                             f"(first doc_id: {missing[0]!r})")
        per_doc = [sum(bool(s[fld]) for s in v) / len(v) for v in by_doc.values()]
        p = sum(per_doc) / n_docs
        var = sum((x - p) ** 2 for x in per_doc) / (n_docs - 1) if n_docs > 1 else float("nan")
        out[f"accuracy,{filt}"] = p
        out[f"accuracy_stderr,{filt}"] = math.sqrt(var / n_docs) if n_docs > 1 else float("nan")
        for k in ks:
            if k > min_rollouts:
                raise ValueError(f"pass@{k} needs >= {k} rollouts per document, "
                                 f"some have {min_rollouts}")
            out[f"pass@{k},{filt}"] = sum(
                pass_at_k(len(v), sum(bool(s[fld]) for s in v), k) for v in by_doc.values()
            ) / n_docs
        if min_rollouts > 1:  # sampled runs (rollout r = seed + r): each run's accuracy, mean and spread
            by_run: dict[str, list[bool]] = defaultdict(list)
            for s in samples:
                by_run[str(s.get("rollout", 0))].append(bool(s[fld]))
            runs = [sum(v) / len(v) for _, v in sorted(by_run.items(), key=lambda kv: int(kv[0]))]
            mean = sum(runs) / len(runs)
            out[f"accuracy_runs,{filt}"] = runs
            out[f"accuracy_runs_std,{filt}"] = math.sqrt(sum((x - mean) ** 2 for x in runs) / (len(runs) - 1)) \
                if len(runs) > 1 else float("nan")
    extras = {
        "tokens_per_sample": [_tokens(s) for s in samples],
        "latent_steps_per_sample": [_latent_steps(s) for s in samples],
        "rounds_per_sample": [s.get("rounds") for s in samples],
        "latency_s": [s.get("latency_s", s.get("seconds")) for s in samples],
        "parse_failure_rate": [float(bool(s["parse_failed"])) if "parse_failed" in s else None
                               for s in samples],
        "retry_rate": [float(bool(s["retry_used"])) if "retry_used" in s else None
                       for s in samples],
    }
    for name, vals in extras.items():
        vals = [float(v) for v in vals if v is not None]
        if vals:
            out[f"{name},none"] = _mean(vals)
    if wall_seconds:  # batches run concurrently, so only wall-clock time gives throughput
        out["throughput_samples_per_s,none"] = len(samples) / wall_seconds
    out["n_docs"] = n_docs
    out["n_samples"] = len(samples)
    out["rollouts_per_doc"] = min_rollouts
    return out


# ----------------------------------------------------------------------------- results file

def machine_load() -> dict[str, Any]:
    """The machine's CPUs this process may use and its load average (1, 5, 15 min): timings mean little
    when the load exceeds the cores (other work shares them)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        load = None
    return {"cpu_count": cpus, "load_avg": load}


def timings_unreliable(machine: Mapping[str, Any] | None) -> bool:
    """Whether the 1-minute load average exceeded the cores when the results were written."""
    load = (machine or {}).get("load_avg")
    return bool(load) and load[0] > (machine or {}).get("cpu_count", 1)


def library_versions() -> dict[str, str | None]:
    """Python's and every figure-moving library's version (None where one is not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    # Every library whose version can move a figure (constraints.txt pins them for the README's commands).
    for pkg in ("recmas_ray", "torch", "transformers", "tokenizers", "ray", "datasets", "numpy", "safetensors",
                "accelerate", "gguf", "math-verify"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def _git_hash(cwd: Path | None = None) -> str | None:
    cwd = cwd or Path(__file__).resolve().parent
    try:
        res = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd, text=True,
                             capture_output=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    return res.stdout.strip() or None


def _higher_is_better(metrics: Mapping[str, Any]) -> dict[str, bool]:
    names = {m.split(",")[0] for m in metrics if "," in m and "_stderr" not in m}
    return {n: HIGHER_IS_BETTER.get(n, n.startswith("pass@")) for n in sorted(names)
            if n in HIGHER_IS_BETTER or n.startswith("pass@")}


def write_results(output_dir: str | os.PathLike, run_name: str, results: Mapping[str, Mapping],
                  config: Any, *, n_samples: Mapping[str, Mapping[str, int]] | None = None,
                  total_evaluation_time_seconds: float | None = None,
                  start_time: float | None = None, ts: str | None = None,
                  extra: Mapping[str, Any] | None = None) -> Path:
    """Write `<output_dir>/<run_name>/results_<ts>.json` atomically and return its path.

    `results` maps a task key (e.g. "math500/recursive_mas") to its metrics, ideally with
    "benchmark" and "method" entries so `markdown_table` can compare methods; string entries are
    written to `metadata[task]`, so `results[task]` holds only numbers (what metric loggers and
    lm-eval's tools expect). `config` may be
    a dataclass (dumped with `asdict`) or any JSON-able mapping. `extra` adds top-level entries
    (the evaluation driver's `protocol`, `prompt_set` and `warnings`). The file follows lm-eval's schema
    (`n-shot`, `configs`, `versions` with one entry per task next to the package versions,
    `higher_is_better`, `n-samples`), so `lm_eval.utils.make_table` renders it; `machine` records the
    CPU count and load average (`machine_load`, unless `extra` gives it).
    """
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    now = time.time()
    split = {k: split_metadata(v) for k, v in results.items()}
    payload = {
        "results": {k: metrics for k, (metrics, _) in split.items()},
        "metadata": {k: meta for k, (_, meta) in split.items()},
        "config": config,
        "versions": {**library_versions(), **{k: 1.0 for k in results}},
        "n-shot": {k: 0 for k in results},
        "higher_is_better": {k: _higher_is_better(v) for k, v in results.items()},
        "configs": {k: {"task": k, "dataset_path": str(v.get("benchmark", k)), "output_type": "generate_until",
                        "num_fewshot": 0, "metric_list": [{"metric": "accuracy", "aggregation": "mean",
                                                           "higher_is_better": True}]}
                    for k, v in results.items()},
        "git_hash": _git_hash(),
        "date": now,
        "start_time": start_time,
        "end_time": now,
        "n-samples": dict(n_samples) if n_samples is not None else {
            k: {"original": v.get("n_docs"), "effective": v.get("n_docs")}
            for k, v in results.items()},
        "total_evaluation_time_seconds": total_evaluation_time_seconds if
        total_evaluation_time_seconds is not None else (now - start_time if start_time else None),
        "machine": machine_load(),
        **dict(extra or {}),
    }
    path = Path(output_dir) / run_name / f"results_{ts or timestamp()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=json_default, ensure_ascii=False),
                   encoding="utf-8")
    os.replace(tmp, path)
    return path


def split_metadata(row: Mapping[str, Any]) -> tuple[dict, dict]:
    """(metrics, metadata) of one task's row: its string entries are metadata, everything else
    (numbers, booleans, None, lists of per-run numbers) stays a metric."""
    metrics = {k: v for k, v in row.items() if not isinstance(v, str)}
    return metrics, {k: v for k, v in row.items() if isinstance(v, str)}


def read_results(source: str | os.PathLike | Mapping[str, Any]) -> dict[str, dict]:
    """Task key -> its row with metadata joined back in, from a results file or its parsed payload.

    Files written before the `metadata` section kept the strings in the rows themselves; they read the
    same way (`--resume` and the plots read older folders too).
    """
    data = source if isinstance(source, Mapping) else json.loads(Path(source).read_text(encoding="utf-8"))
    meta = data.get("metadata") or {}
    return {k: {**(meta.get(k) or {}), **v} for k, v in (data.get("results") or {}).items()}


# ----------------------------------------------------------------------------- table and plot

def _split_key(key: str, entry: Mapping) -> tuple[str, str]:
    bench, _, method = key.partition("/")
    return str(entry.get("benchmark", bench)), str(entry.get("method", method or "-"))


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "N/A"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _speedup(entry: Mapping, base: Mapping | None) -> str:
    """Wall-clock speedup over the baseline: throughput ratio (mean latency ratio for runs without a fresh
    wall time, e.g. resumed ones)."""
    if not base:
        return "N/A"
    q, bq = entry.get("throughput_samples_per_s,none"), base.get("throughput_samples_per_s,none")
    if q and bq:
        return f"{q / bq:.2f}x"
    s, bs = entry.get("latency_s,none"), base.get("latency_s,none")
    return f"{bs / s:.2f}x" if s and bs else "N/A"


def markdown_table(results: Mapping[str, Mapping[str, Any]], baseline: str = BASELINE,
                   machine: Mapping[str, Any] | None = None) -> str:
    """lm-eval style markdown table; with several methods per benchmark it adds speedup (throughput over
    the `baseline`'s: Recursive-TextMAS, the paper's headline comparison) and token reduction (1 - tokens /
    baseline tokens). Timings: `Latency s` (mean per question, submission to result) and `Samples/s`
    (wall-clock throughput). When `machine` (`machine_load`) shows more load than cores, the timing columns
    carry a `*` and a last line says why they are unreliable."""
    rows = [(*_split_key(k, v), v) for k, v in results.items()]
    methods_per_bench: dict[str, dict[str, Mapping]] = defaultdict(dict)
    for bench, method, entry in rows:
        methods_per_bench[bench][method] = entry
    compare = any(len(m) > 1 for m in methods_per_bench.values())
    mark = "*" if timings_unreliable(machine) else ""
    head = ["Tasks", "Method", "Metric", "Value", "", "Stderr", "Tokens/sample", "Latent steps",
            f"Latency s{mark}", f"Samples/s{mark}"] + ([f"Speedup{mark}", "Token reduction"] if compare else [])
    lines = ["|" + "|".join(head) + "|", "|" + "|".join("---" for _ in head) + "|"]
    for bench, method, entry in rows:
        base = methods_per_bench[bench].get(baseline) if compare else None
        tail = []
        if compare:
            t, bt = entry.get("tokens_per_sample,none"), (base or {}).get("tokens_per_sample,none")
            tail = [_speedup(entry, base), f"{100 * (1 - t / bt):.1f}%" if t is not None and bt else "N/A"]
        metrics = [m for m in entry if "," in m and (m.startswith("accuracy,")
                                                     or m.startswith("pass@"))]
        for m in metrics:
            name, _, filt = m.partition(",")
            se = entry.get(f"{name}_stderr,{filt}")
            lines.append("|" + "|".join([
                bench, method, m, _fmt(entry[m]), "+-" if se is not None else "", _fmt(se),
                _fmt(entry.get("tokens_per_sample,none"), 1),
                _fmt(entry.get("latent_steps_per_sample,none"), 1),
                _fmt(entry.get("latency_s,none", entry.get("seconds_per_sample,none")), 3),
                _fmt(entry.get("throughput_samples_per_s,none"), 3)] + tail) + "|")
    if mark:
        lines.append(f"* unreliable: load average {machine['load_avg'][0]:g} > {machine['cpu_count']} cores "
                     "(other work shared the CPUs)")
    return "\n".join(lines)


def adaptive_lines(methods, threshold: float | None, most: int, samples: list[dict]) -> list[str]:
    """With adaptive rounds (`threshold` set): per method, the rounds its questions ran, one console line."""
    if threshold is None:
        return []
    out = []
    for method in methods:
        rounds = [int(s["rounds"]) for s in samples if s.get("method") == method and not s.get("error")
                  and s.get("rounds") is not None]
        if not rounds:
            continue
        parts = [f"{rounds.count(r)} stopped after round {r}" for r in range(1, most) if rounds.count(r)]
        out.append(f"adaptive rounds ({method}, threshold {threshold:g}): "
                   + ", ".join(parts + [f"{rounds.count(most)} ran all {most}"])
                   + f" (mean {sum(rounds) / len(rounds):.2f} rounds per question)")
    return out
