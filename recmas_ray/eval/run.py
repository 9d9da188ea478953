"""An evaluation run behind `jobs/run.py`: questions in, graded samples and lm-eval-style results out.

Order of work, so that bad input fails before any model loads:
  0. record where the --protocol settings came from (the recipe or the run, see `eval/protocol.py`)
  1. load and validate the questions (named benchmark or local file)
  2. plan the system (model names, dims, links, prompt set; checks every --ckpt_override); code
     questions get their interface line (`question_with_interface`)
  3. start the agents (in-process, or Ray actors + orchestrator)
  4. per method: stream batches (Ray backend: a Ray Data pipeline of client actors, see
     `eval/stream.py`), append each graded sample to `samples_<bench>_<time>.jsonl` as it arrives
     (fsynced; `--resume` skips what is there), then summarise into `results_<time>.json`

The samples file has a sidecar `samples_<bench>_<time>.fingerprint.json`: everything that changes
results (`eval/fingerprint.py`). `--resume` against a different fingerprint stops, naming the fields,
before anything is written; a second run into the same folder stops at its lock (`OutputLock`).
A batch that fails `max_batch_retries` + 1 times is written as error records; results count them
(`n_errored`), the job exits 1, and `--resume` runs them again.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import time
from pathlib import Path

from recmas_ray.config.checks import check_tree
from recmas_ray.config.tree import save_config
from recmas_ray.console import current
from recmas_ray.config.inputs import OutputLock
from recmas_ray.eval.config import EvalConfig
from recmas_ray.models.registry import model_kind
from recmas_ray.tasks.benchmarks import BENCHMARKS, canonical_name, load_benchmark, task_type_for
from recmas_ray.eval.fingerprint import (bench_name, check_fingerprint, fingerprint_path, link_hashes,
                                         resolved_runtime, run_fingerprint, verify_resume)
from recmas_ray.eval.protocol import Resolution, metric_k, resolution as protocol_resolution
from recmas_ray.eval.plots import plot_vs_rounds
from recmas_ray.eval.progress import QuestionProgress
from recmas_ray.eval.rows import apply_row_options, row_fingerprint, row_record
from recmas_ray.eval.results import (adaptive_lines, machine_load, markdown_table, read_results, summarize,
                                     write_results)
from recmas_ray.eval.samples import VERDICT_FIELDS, SampleWriter, read_samples, sample_key, timestamp, with_verdicts
from recmas_ray.eval.batch_runner import BatchRunner, memory_args
from recmas_ray.tasks import get_task
from recmas_ray.styles import question_with_interface
from recmas_ray.styles.prompts import prompt_set_hash
from recmas_ray.system.plan import plan_system
from recmas_ray.system.provenance import link_origin, require_known_links
from recmas_ray.system.trained import check_trained_task, trained_task

log = logging.getLogger(__name__)


def open_samples_file(cfg: EvalConfig) -> Path:
    """The latest samples file of this benchmark when resuming, else a new timestamped one."""
    out = Path(cfg.output_path)
    out.mkdir(parents=True, exist_ok=True)
    existing = sorted(glob.glob(str(out / f"samples_{bench_name(cfg)}_*.jsonl")))
    if cfg.resume and existing:
        return Path(existing[-1])
    return out / f"samples_{bench_name(cfg)}_{timestamp()}.jsonl"


def done_keys(samples_file: Path) -> set[str]:
    """Keys of finished samples; errored ones (an `error` field) are not finished and run again."""
    return {sample_key(r) for r in read_samples(samples_file) if not r.get("error")} if samples_file.exists() \
        else set()


def run_warnings(cfg: EvalConfig, plan) -> list[str]:
    """Warnings recorded in the results: a named benchmark run on random-weight (tiny:) models."""
    tiny = sorted(r for r, m in plan.role_models.items() if model_kind(m).random_weights)
    if os.path.exists(cfg.dataset) or canonical_name(cfg.dataset) not in BENCHMARKS or not tiny:
        return []
    return [f"benchmark {cfg.dataset} runs on random-weight tiny models (roles {', '.join(tiny)}): its scores "
            f"measure nothing; use --preset demo|paper or --models ROLE=MODEL"]


def prepare(cfg: EvalConfig) -> tuple[EvalConfig, Resolution, list[dict], object]:
    """The checked config with its protocol resolved, the questions and the system plan (no model loaded)."""
    check_tree(cfg)
    resolution = protocol_resolution(cfg)

    overrides = cfg.system.link_folders()  # --links' folders with --ckpt_override over them, Hub ids fetched
    local = canonical_name(cfg.dataset) not in BENCHMARKS  # a local file's rows take the trained task by default
    task = {"task_type": cfg.task or trained_task(overrides) or "math"} if local else {}
    items = load_benchmark(cfg.dataset, path=cfg.dataset_path, num_samples=cfg.num_samples, seed=cfg.system.seed,
                           json_field=cfg.dataset_json_field, **task)
    plan = plan_system(cfg.system, task=get_task(items[0]["task_type"]).adapter, tools=cfg.tool_loop(),
                       ckpt_override=overrides)
    check_trained_task(overrides, [i["task_type"] for i in items], prompt_set_hash(plan.style),
                       allow=cfg.system.allow_task_mismatch)
    # links well-formed (plan_system read them), no model loaded yet: refuse those of unknown origin here
    require_known_links(overrides, allow_unknown=cfg.allow_unknown_links)
    return cfg, resolution, items, apply_row_options(cfg, plan)  # --outer_init, --format_help (eval/rows.py)


def dry_run(cfg: EvalConfig, echo=print) -> int:
    """`--dry_run`: print the memory plan of this run and stop (no model, no file, no agent)."""
    # lazy: Ray reads env settings on import; this module loads before the console sets them
    from recmas_ray.distributed.cluster import init_ray
    # lazy: Ray reads env settings on import; this module loads before the console sets them
    from recmas_ray.distributed.memory import dry_run as print_plan

    if _named_benchmark(cfg):  # the plan needs its task type, not its questions (no copy or Hub needed)

        check_tree(cfg)
        overrides = cfg.system.link_folders()  # --links' folders with --ckpt_override over them
        plan = plan_system(cfg.system, task=get_task(task_type_for(cfg.dataset)).adapter, tools=cfg.tool_loop(),
                           ckpt_override=overrides)
    else:
        cfg, _, _, plan = prepare(cfg)
    if cfg.backend == "ray" and cfg.placement.wants_gpus() and not cfg.placement.plan_node_gpus:
        init_ray()  # the cluster's GPUs (a private local cluster: this machine's)
    return print_plan(plan, cfg.placement, echo=echo, **memory_args(cfg, plan))


def _named_benchmark(cfg: EvalConfig) -> bool:
    """`cfg.dataset` names a benchmark (not a local file)."""
    return not os.path.exists(cfg.dataset) and canonical_name(cfg.dataset) in BENCHMARKS


def evaluate(cfg: EvalConfig, *, progress: bool = True, system=None, echo: bool = True) -> dict:
    """Run every method on the same samples; returns {"results": ..., "samples_path", "results_path", "table"}.

    `system`: a running `RaySystem` built from the same plan, reused (and left running) instead of
    starting new agents, e.g. across the runs of a sweep. `echo`: print the results table (the job); the
    Python API returns it instead, so a caller's `print(report["table"])` shows it once.
    """
    cfg, resolution, items, plan = prepare(cfg)
    for warning in run_warnings(cfg, plan):
        current().warn(warning)
    items = [{**i, "question": question_with_interface(plan.style, i["question"], i.get("interface"))}
             for i in items]
    fingerprint = run_fingerprint(cfg, {**plan.manifest(), "link_sha256": link_hashes(plan)},
                                  extra={"protocol": cfg.protocol, "prompt_set_sha256": prompt_set_hash(plan.style),
                                         **resolved_runtime(cfg, plan), **row_fingerprint(cfg)})
    verify_resume(cfg, fingerprint)  # read-only: a refused resume writes nothing, not even the lock file
    with OutputLock(cfg.output_path):  # a second run into this folder stops here, naming this one's PID
        return _evaluate_locked(cfg, plan, items, fingerprint, resolution, progress, system, echo)


def _evaluate_locked(cfg: EvalConfig, plan, items: list[dict], fingerprint: dict, resolution, progress: bool,
                     system, echo: bool = True) -> dict:
    """The writing half of `evaluate`, run while this process holds the output folder's lock."""
    samples_file = open_samples_file(cfg)
    check_fingerprint(samples_file, fingerprint, resume=cfg.resume)
    save_config(cfg, cfg.output_path)
    start = time.time()
    backend = BatchRunner(cfg, plan, system)
    wall, fresh = {}, {}
    try:
        with SampleWriter(samples_file) as writer:
            for method in cfg.methods:
                done = done_keys(samples_file)
                batches = []
                for r in range(cfg.num_rollouts):  # one rollout index per batch: its decode seed is seed + r
                    todo = [i for i in items
                            if sample_key({"method": method, "doc_id": i["doc_id"], "rollout": r}) not in done]
                    batches += [(todo[k:k + cfg.batch_size], r) for k in range(0, len(todo), cfg.batch_size)]
                n_todo = sum(len(b) for b, _ in batches)
                # samples, ETA, accuracy so far; its rate (samples / seconds since it opened) is the throughput
                bar = _bar(n_todo, f"{cfg.system.style}/{method}", progress)
                # each question counted as its final decode stops (agents report it), else as its record arrives
                counter = QuestionProgress(bar, relay=backend.progress_relay())
                t0 = time.perf_counter()
                n_ok = n_done = 0
                fresh[method] = n_todo == len(items) * cfg.num_rollouts  # else wall time covers only part
                try:
                    for rec in backend.stream(batches, method, counter):
                        key = sample_key(rec)
                        if key in done:  # never a second line per sample, even if a batch came back twice
                            continue
                        if not rec.get("error"):
                            done.add(key)
                        writer.write(with_verdicts(rec))
                        n_done, n_ok = n_done + 1, n_ok + int(rec["correct"])
                        bar.set_postfix(acc=f"{n_ok / n_done:.3f}", refresh=False)
                        counter.done([key])
                    wall[method] = time.perf_counter() - t0  # the results' throughput: the bar's span too
                finally:
                    counter.close()
    finally:
        backend.close()
    return finish(cfg, samples_file, plan, {m: t for m, t in wall.items() if fresh[m]}, start, resolution, echo=echo)


def evaluate_all(cfg: EvalConfig, *, progress: bool | None = None) -> list[dict]:
    """`evaluate` once, or once per R of `sweep_rounds` (sub-directories R<r>, one plot across them)."""
    progress = cfg.progress if progress is None else progress
    if not cfg.sweep_rounds:
        return [evaluate(cfg, progress=progress)]
    outs = [evaluate(dataclasses.replace(cfg, recursion=dataclasses.replace(cfg.recursion, num_recursive_rounds=r),
                                         sweep_rounds=[], plot=False, output_path=os.path.join(cfg.output_path, f"R{r}")),
                     progress=progress) for r in cfg.sweep_rounds]
    if cfg.plot:
        outs[-1]["plot_path"] = str(plot_results(cfg.output_path, bench_name(cfg), cfg.system.style))
    return outs


def headline(metrics: dict, metric: str, grader: str) -> dict:
    """Which summary value is the headline: the benchmark's metric (pass@k needs k rollouts) under `grader`."""
    k = metric_k(metric)
    key = f"pass@{k},{grader}" if k and k > 1 else f"accuracy,{grader}"
    out = {"metric": metric, "grader": grader, "headline": key}
    if key not in metrics:  # e.g. AIME's pass@10 from fewer than 10 rollouts per question
        key = f"accuracy,{grader}"
        out |= {"headline": key, "headline_note": f"{metric} needs {k} rollouts per question, "
                                                  f"ran {metrics['rollouts_per_doc']}: accuracy reported"}
    out["headline_value"] = metrics[key]
    return out


def finish(cfg: EvalConfig, samples_file: Path, plan, wall: dict, start: float,
           resolution: Resolution | None = None, *, echo: bool = True) -> dict:
    """Summarise the samples file per method, write results JSON (+ plot), print the table (unless not `echo`:
    the Python API returns it; with adaptive rounds, also the rounds used per method)."""
    resolution = resolution or protocol_resolution(cfg)
    k = metric_k(resolution.metric)
    all_samples = [with_verdicts(s) for s in read_samples(samples_file)]
    results, num_errored = {}, 0
    for method in cfg.methods:
        rows = [s for s in all_samples if s.get("method") == method and not s.get("error")]
        errored = sum(1 for s in all_samples if s.get("method") == method and s.get("error"))
        num_errored += errored
        if not rows and not errored:
            continue
        if rows:
            rollouts = min(sum(1 for s in rows if s["doc_id"] == d) for d in {s["doc_id"] for s in rows})
            ks = sorted({1, rollouts} | ({k} if k and k <= rollouts else set())) if rollouts > 1 else None
            metrics = summarize(rows, correct_fields=VERDICT_FIELDS, k_values=ks, wall_seconds=wall.get(method))
            metrics |= headline(metrics, resolution.metric, cfg.grader)
        else:
            metrics = {"n_samples": 0}
        results[f"{bench_name(cfg)}/{method}"] = {"benchmark": bench_name(cfg), "method": method,
                                                   "rounds": cfg.recursion.num_recursive_rounds, **metrics,
                                                   "n_errored": errored}
    # the section as configured, with what the plan resolved it to (roles' base models, links' sources)
    config = {**dataclasses.asdict(cfg), "system": {**dataclasses.asdict(cfg.system), **plan.manifest()},
              "samples_file": str(samples_file),
              "fingerprint_file": str(fingerprint_path(samples_file))}
    machine = machine_load()
    extra = {"protocol": resolution.record(), "machine": machine,
             "prompt_set": {"path": cfg.system.prompt_set, "sha256": prompt_set_hash(plan.style)},
             "warnings": run_warnings(cfg, plan), "link_origins": _link_origins(cfg), **row_record(cfg, all_samples)}
    path = write_results(cfg.output_path, "", results, config, start_time=start, extra=extra)
    track_results(cfg, results, [path, samples_file])
    table = markdown_table(results, machine=machine)
    if echo:
        current().line(table)
    for line in adaptive_lines(cfg.methods, cfg.recursion.adaptive_threshold, cfg.recursion.num_recursive_rounds,
                               all_samples):
        current().line(line)
    if num_errored:
        current().line(f"{num_errored} sample(s) failed after {cfg.max_batch_retries} retries (field 'error' in "
                       f"{samples_file}); rerun with --resume to retry them")
    out = {"results": results, "samples_path": str(samples_file), "results_path": str(path), "table": table,
           "num_errored": num_errored}
    if cfg.plot:
        out["plot_path"] = str(plot_results(cfg.output_path, bench_name(cfg), cfg.system.style))
    return out


def _link_origins(cfg: EvalConfig) -> dict:
    """--ckpt_override folder -> where its links came from (`system.provenance.link_origin`: path, sha256 of
    the files, the command and config that made them, or why that is unknown)."""
    return {r: link_origin(p) for r, p in cfg.system.link_folders().items()}


def plot_results(output_path: str, bench: str, style: str) -> Path:
    """`plot_<bench>.png`: accuracy, tokens and seconds per sample vs rounds, one line per method.

    Points come from every results_*.json under `output_path` of this benchmark and style (the
    latest per method and R), so runs with different --num_recursive_rounds into one directory
    (or a comma list of R in jobs/run.py) draw lines; a single run gives one point per method.
    """
    points: dict[tuple[str, int], tuple[float, dict]] = {}
    for f in glob.glob(os.path.join(output_path, "**", "results_*.json"), recursive=True):
        try:
            data = json.loads(Path(f).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue  # a file being written by another run
        if ((data.get("config") or {}).get("system") or {}).get("style") != style:  # the plan's manifest
            continue
        for v in read_results(data).values():
            if v.get("benchmark") == bench and "rounds" in v:
                key = (v["method"], int(v["rounds"]))
                if key not in points or points[key][0] < data.get("date", 0):
                    points[key] = (data.get("date", 0), v)
    rows = [{"method": m, "rounds": r, "accuracy": v.get("accuracy,strict"),
             "tokens_per_sample": v.get("tokens_per_sample,none"),
             "seconds_per_sample": v.get("latency_s,none", v.get("seconds_per_sample,none"))} for (m, r), (_, v) in sorted(points.items())]
    return plot_vs_rounds(rows, Path(output_path) / f"plot_{bench}.png")


def _bar(total, desc, enabled):
    return current().bar(total, desc, unit="sample", enabled=enabled)


def track_results(cfg: EvalConfig, results: dict, files: list) -> None:
    """The run's metrics (one run per evaluation, metrics prefixed by benchmark/method) and its files."""
    # lazy: Ray reads env settings on import; this module loads before the console sets them
    from recmas_ray.tracking import start_run

    if cfg.track.tracking == "none":
        return
    tracker = start_run(cfg.track, output_dir=cfg.output_path, run_name=f"eval-{bench_name(cfg)}-{cfg.system.style}",
                        config=cfg)
    for key, metrics in results.items():
        tracker.log_metrics({f"{key}/{k}": v for k, v in metrics.items()})
    for f in files:
        tracker.log_artifact(f)
    tracker.close()
