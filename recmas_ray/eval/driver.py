"""Evaluation driver behind `jobs/run.py`: questions in, graded samples and lm-eval-style results out.

Order of work, so that bad input fails before any model loads:
  1. load and validate the questions (named benchmark or local file)
  2. plan the system (model names, dims, links; checks every --ckpt_override)
  3. start the agents (in-process, or Ray actors + orchestrator)
  4. per method: stream batches (Ray backend: a Ray Data pipeline of client actors, see
     `eval/stream.py`), append each graded sample to `samples_<bench>_<time>.jsonl` as it arrives
     (fsynced; `--resume` skips what is there), then summarise into `results_<time>.json`
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from recmas_ray.agent import DecodeConfig
from recmas_ray.distributed.placement import PlacementConfig
from recmas_ray.eval.benchmarks import load_benchmark
from recmas_ray.eval.results import (SampleWriter, load_done_ids, markdown_table, plot_vs_rounds, read_samples,
                                     sample_key, summarize, timestamp, write_results)
from recmas_ray.eval.stream import StreamConfig, for_rollout, solve_and_grade
from recmas_ray.runner import METHODS, RecursionConfig
from recmas_ray.system.plan import plan_system
from recmas_ray.tools.loop import ToolLoopConfig

log = logging.getLogger(__name__)
BACKENDS = ("ray", "local")


@dataclass(kw_only=True)
class EvalConfig:
    """One evaluation run (the resolved form of `jobs/run.py`'s flags; saved next to the results)."""

    style: str
    """Collaboration style (sequential_light, sequential_scaled, mixture, distillation, deliberation)."""
    dataset: str
    """Benchmark name or a local .jsonl/.json question file."""
    dataset_path: str | None = None
    """Local copy of a named benchmark (else its RECMAS_<NAME>_PATH variable, else the Hub)."""
    dataset_json_field: str | None = None
    """For local JSON wrapped as {"data": [...]}."""
    preset: str = "tiny"
    """Base models for roles without a checkpoint: tiny, demo or paper."""
    ckpt_override: dict[str, str] = field(default_factory=dict)
    """ROLE=DIR inner links, outer=DIR outer links."""
    methods: list[str] = field(default_factory=lambda: ["recursive_mas"])
    """Methods run on the same samples."""
    num_recursive_rounds: int = 3
    """R."""
    latent_steps: int = 32
    """m."""
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    """Decoding settings shared by every method."""
    decode_every_round: bool = False
    """Mixture reference behaviour (decode and discard in non-final rounds)."""
    num_samples: int | None = None
    """Evaluate the first N questions (all when None)."""
    num_rollouts: int = 1
    """Rollouts per question (pass@k); rollout r decodes with seed + r."""
    batch_size: int = 8
    """Questions per agent call."""
    max_inflight_batches: int = 2
    """Ray backend: client actors, i.e. batches in flight at once, so agents overlap."""
    client_cpus: float = 0.25
    """Ray backend: logical CPUs per client actor (clients never ask for GPUs)."""
    client_max_restarts: int = -1
    """Ray backend: restarts of a dead client, its batch rerun (-1: no limit; 0: a dead client ends the run)."""
    format_retry: bool = True
    """Answer-format retry of the release (recorded per sample as retry_used)."""
    backend: str = "ray"
    """ray (agents as actors) or local (in-process)."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Ray placement preset and per-role resources."""
    device: str = "auto"
    """auto, cpu or cuda."""
    dtype: str = "auto"
    """Model dtype: auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16."""
    seed: int = 42
    """Seed for fresh links and sampling."""
    grader: str = "strict"
    """strict (math-verify) or reference (the release's lenient rules); both are recorded per sample."""
    output_path: str = "out"
    """Directory for samples_*.jsonl and results_*.json."""
    resume: bool = False
    """Skip samples already in the latest samples file of this benchmark."""
    plot: bool = False
    """Write accuracy/tokens/seconds vs rounds as PNG."""
    timeout_s: float = 900.0
    """Timeout of every wait on Ray."""
    torch_threads: int = 0
    """Torch threads per agent (0 = library default)."""
    transport: str = "object_store"
    """How latents move between agent actors: object_store, rdt:gloo (CPU) or rdt:nccl (GPU)."""
    tools: ToolLoopConfig | None = None
    """Deliberation toolcaller's tool loop (None: plain decoding); jobs/run.py sets it for --style deliberation."""

    def validate(self) -> None:
        bad = [m for m in self.methods if m not in METHODS]
        if bad or not self.methods:
            raise ValueError(f"unknown method(s) {bad or self.methods}; expected a comma list of {METHODS}")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; expected one of {BACKENDS}")
        for name in ("num_rollouts", "batch_size", "max_inflight_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.client_cpus < 0 or self.client_max_restarts < -1:
            raise ValueError(f"client_cpus must be >= 0 and client_max_restarts >= -1, "
                             f"got {self.client_cpus} and {self.client_max_restarts}")
        if self.grader not in ("strict", "reference"):
            raise ValueError(f"grader must be strict or reference, got {self.grader!r}")
        self.recursion("recursive_mas", 0).validate()

    def recursion(self, method: str, rollout: int) -> RecursionConfig:
        return for_rollout(RecursionConfig(method=method, num_recursive_rounds=self.num_recursive_rounds,
                                           latent_steps=self.latent_steps, decode_every_round=self.decode_every_round,
                                           decode=self.decode), rollout)


def bench_name(cfg: EvalConfig) -> str:
    return Path(cfg.dataset).stem if os.path.exists(cfg.dataset) else cfg.dataset


def open_samples_file(cfg: EvalConfig) -> Path:
    """The latest samples file of this benchmark when resuming, else a new timestamped one."""
    out = Path(cfg.output_path)
    out.mkdir(parents=True, exist_ok=True)
    existing = sorted(glob.glob(str(out / f"samples_{bench_name(cfg)}_*.jsonl")))
    if cfg.resume and existing:
        return Path(existing[-1])
    return out / f"samples_{bench_name(cfg)}_{timestamp()}.jsonl"


class Backend:
    """Runs batches in-process or on a Ray system; `stream` yields graded sample records."""

    def __init__(self, cfg: EvalConfig, plan, system=None):
        self.cfg, self.plan, self.owned = cfg, plan, system is None
        if system is not None:  # a running system of the same plan (sweeps, tests): reused, not shut down
            if cfg.backend != "ray" or system.plan.manifest() != plan.manifest() or system.plan.specs != plan.specs:
                raise ValueError(f"the given Ray system runs {system.plan.manifest()}, which does not match "
                                 f"this run's {plan.manifest()} (backend {cfg.backend})")
            self.system = system
        elif cfg.backend == "local":
            from recmas_ray.runner import LocalPool
            from recmas_ray.service import AgentService

            self.pool = LocalPool({r: AgentService(*plan.service_args(r)) for r in plan.style.roles})
            self.system = None
        else:
            from recmas_ray.distributed.driver import build_ray_system, init_ray

            init_ray()
            self.system = build_ray_system(plan, cfg.placement, timeout_s=cfg.timeout_s,
                                           torch_threads=cfg.torch_threads, transport=cfg.transport)

    def stream(self, batches, method):
        """Yield graded sample records as batches finish (Ray: several in flight, arrival order)."""
        cfg, decoder = self.cfg, self.plan.style.decoder
        if self.system is not None:
            from recmas_ray.eval.stream import stream_samples

            yield from stream_samples(self.system, batches, method, cfg.recursion(method, 0), cfg.grader,
                                      cfg.format_retry, StreamConfig(
                                          num_clients=cfg.max_inflight_batches, client_cpus=cfg.client_cpus,
                                          client_max_restarts=cfg.client_max_restarts, timeout_s=cfg.timeout_s))
            return
        from recmas_ray.runner import run_batch

        def solve(qs, ts, rc):
            return run_batch(self.pool, self.plan.style, qs, ts, rc)

        def retry(texts, suffixes, n, decode):
            return self.pool.services[decoder].retry_format(texts, suffixes, n, cfg=decode)

        for batch, rollout in batches:
            yield from solve_and_grade(batch, rollout, method, cfg.recursion(method, 0), cfg.grader, solve,
                                       retry if cfg.format_retry else None)

    def close(self):
        if self.system is not None and self.owned:
            self.system.shutdown()


def evaluate(cfg: EvalConfig, *, progress: bool = True, system=None) -> dict:
    """Run every method on the same samples; returns {"results": ..., "samples_path", "results_path"}.

    `system`: a running `RaySystem` built from the same plan, reused (and left running) instead of
    starting new agents, e.g. across the runs of a sweep.
    """
    cfg.validate()
    items = load_benchmark(cfg.dataset, path=cfg.dataset_path, num_samples=cfg.num_samples, seed=cfg.seed,
                           json_field=cfg.dataset_json_field)
    task = items[0]["task_type"] if items[0]["task_type"] in ("math", "code") else "math"
    plan = plan_system(cfg.style, preset=cfg.preset, ckpt_overrides=cfg.ckpt_override, seed=cfg.seed,
                       dtype=cfg.dtype, device=cfg.device, task=task, tools=cfg.tools)
    samples_file = open_samples_file(cfg)
    start = time.time()
    backend = Backend(cfg, plan, system)
    wall, fresh = {}, {}
    try:
        with SampleWriter(samples_file) as writer:
            for method in cfg.methods:
                done = load_done_ids(samples_file) if samples_file.exists() else set()
                batches = []
                for r in range(cfg.num_rollouts):  # one rollout index per batch: its decode seed is seed + r
                    todo = [i for i in items
                            if sample_key({"method": method, "doc_id": i["doc_id"], "rollout": r}) not in done]
                    batches += [(todo[k:k + cfg.batch_size], r) for k in range(0, len(todo), cfg.batch_size)]
                t0 = time.perf_counter()
                n_todo = sum(len(b) for b, _ in batches)
                bar = _bar(n_todo, f"{cfg.style}/{method}", progress)
                n_ok = n_done = 0
                fresh[method] = n_todo == len(items) * cfg.num_rollouts  # else wall time covers only part
                for rec in backend.stream(batches, method):
                    key = sample_key(rec)
                    if key in done:  # never a second line per sample, even if a batch came back twice
                        continue
                    done.add(key)
                    writer.write(rec)
                    n_done, n_ok = n_done + 1, n_ok + int(rec["correct"])
                    bar.update(1)
                    bar.set_postfix(acc=f"{n_ok / n_done:.3f}",
                                    sps=f"{n_done / max(time.perf_counter() - t0, 1e-9):.2f}")
                bar.close()
                wall[method] = time.perf_counter() - t0
    finally:
        backend.close()
    return finish(cfg, samples_file, plan, {m: t for m, t in wall.items() if fresh[m]}, start)


def finish(cfg: EvalConfig, samples_file: Path, plan, wall: dict, start: float) -> dict:
    """Summarise the samples file per method, write results JSON (+ plot), print the table."""
    all_samples = read_samples(samples_file)
    results = {}
    for method in cfg.methods:
        rows = [s for s in all_samples if s.get("method") == method]
        if not rows:
            continue
        metrics = summarize(rows, wall_seconds=wall.get(method))
        results[f"{bench_name(cfg)}/{method}"] = {"benchmark": bench_name(cfg), "method": method,
                                                   "rounds": cfg.num_recursive_rounds, **metrics}
    config = {**dataclasses.asdict(cfg), "system": plan.manifest(), "samples_file": str(samples_file)}
    path = write_results(cfg.output_path, "", results, config, start_time=start)
    table = markdown_table(results)
    print(table, flush=True)
    out = {"results": results, "samples_path": str(samples_file), "results_path": str(path), "table": table}
    if cfg.plot:
        out["plot_path"] = str(plot_results(cfg.output_path, bench_name(cfg), cfg.style))
    return out


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
        if (data.get("config") or {}).get("style") != style:
            continue
        for v in data.get("results", {}).values():
            if v.get("benchmark") == bench and "rounds" in v:
                key = (v["method"], int(v["rounds"]))
                if key not in points or points[key][0] < data.get("date", 0):
                    points[key] = (data.get("date", 0), v)
    rows = [{"method": m, "rounds": r, "accuracy": v.get("accuracy,strict"),
             "tokens_per_sample": v.get("tokens_per_sample,none"),
             "seconds_per_sample": v.get("seconds_per_sample,none")} for (m, r), (_, v) in sorted(points.items())]
    return plot_vs_rounds(rows, Path(output_path) / f"plot_{bench}.png")


def _bar(total, desc, enabled):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, dynamic_ncols=True)
