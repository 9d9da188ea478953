"""Evaluation driver behind `jobs/run.py`: questions in, graded samples and lm-eval-style results out.

Order of work, so that bad input fails before any model loads:
  1. load and validate the questions (named benchmark or local file)
  2. plan the system (model names, dims, links; checks every --ckpt_override)
  3. start the agents (in-process, or Ray actors + orchestrator)
  4. per method: stream batches, append each finished sample to `samples_<bench>_<time>.jsonl`
     (fsynced; `--resume` skips what is there), then summarise into `results_<time>.json`
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from recmas_ray.agent import DecodeConfig
from recmas_ray.distributed.placement import PlacementConfig
from recmas_ray.eval.benchmarks import load_benchmark
from recmas_ray.eval.graders import grade
from recmas_ray.eval.results import (SampleWriter, load_done_ids, markdown_table, plot_vs_rounds, read_samples,
                                     sample_key, summarize, timestamp, write_results)
from recmas_ray.runner import METHODS, RecursionConfig, SampleResult
from recmas_ray.system import plan_system

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
    """Ray backend: batches in flight at once, so agents overlap."""
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

    def validate(self) -> None:
        bad = [m for m in self.methods if m not in METHODS]
        if bad or not self.methods:
            raise ValueError(f"unknown method(s) {bad or self.methods}; expected a comma list of {METHODS}")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; expected one of {BACKENDS}")
        for name in ("num_rollouts", "batch_size", "max_inflight_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.grader not in ("strict", "reference"):
            raise ValueError(f"grader must be strict or reference, got {self.grader!r}")
        self.recursion("recursive_mas", 0).validate()

    def recursion(self, method: str, rollout: int) -> RecursionConfig:
        return RecursionConfig(method=method, num_recursive_rounds=self.num_recursive_rounds,
                               latent_steps=self.latent_steps, decode_every_round=self.decode_every_round,
                               decode=dataclasses.replace(self.decode, seed=self.decode.seed + rollout))


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


def sample_record(item: dict, method: str, rollout: int, res: SampleResult, grader: str) -> dict:
    g = grade(item["task_type"], item, res.prediction, mode=grader)
    return {"doc_id": item["doc_id"], "method": method, "rollout": rollout, "benchmark": item.get("benchmark"),
            "question": item["question"], "gold": item["gold"], "prediction": res.prediction,
            "extracted": g.extracted, "correct": g.correct, "parse_failed": g.parse_failed,
            "grade_detail": g.detail, "tokens": res.num_text_tokens, "latent_steps": res.num_latent_steps,
            "latency_s": res.seconds, "trace": res.trace}


class Backend:
    """Runs batches either in-process or on a Ray system; `submit` + `completed` stream results."""

    def __init__(self, cfg: EvalConfig, plan):
        self.cfg, self.plan = cfg, plan
        if cfg.backend == "local":
            from recmas_ray.runner import LocalPool
            from recmas_ray.service import AgentService

            self.pool = LocalPool({r: AgentService(*plan.service_args(r)) for r in plan.style.roles})
            self.system = None
        else:
            from recmas_ray.distributed.driver import build_ray_system, init_ray

            init_ray()
            self.system = build_ray_system(plan, cfg.placement, timeout_s=cfg.timeout_s,
                                           torch_threads=cfg.torch_threads)

    def run(self, batches, method):
        """Yield (batch, results) as batches finish; several in flight on Ray."""
        from recmas_ray.runner import run_batch

        if self.system is None:
            for batch, rollout in batches:
                qs, tasks = [i["question"] for i in batch], [i["task_type"] for i in batch]
                yield batch, rollout, run_batch(self.pool, self.plan.style, qs, tasks, self.cfg.recursion(method, rollout))
            return
        import ray

        pending, queue = {}, list(batches)
        while queue or pending:
            while queue and len(pending) < self.cfg.max_inflight_batches:
                batch, rollout = queue.pop(0)
                ref = self.system.solve([i["question"] for i in batch], [i["task_type"] for i in batch],
                                        self.cfg.recursion(method, rollout), batch_id=str(batch[0]["doc_id"]))
                pending[ref] = (batch, rollout)
            done, _ = ray.wait(list(pending), num_returns=1, timeout=self.cfg.timeout_s)
            if not done:
                raise RuntimeError(f"no batch finished within {self.cfg.timeout_s:g}s ({len(pending)} in flight)")
            batch, rollout = pending.pop(done[0])
            try:
                yield batch, rollout, ray.get(done[0], timeout=self.cfg.timeout_s)
            except ray.exceptions.RayTaskError as e:
                raise e.cause if isinstance(e.cause, Exception) else e

    def close(self):
        if self.system is not None:
            self.system.shutdown()


def evaluate(cfg: EvalConfig, *, progress: bool = True) -> dict:
    """Run every method on the same samples; returns {"results": ..., "samples_path", "results_path"}."""
    cfg.validate()
    items = load_benchmark(cfg.dataset, path=cfg.dataset_path, num_samples=cfg.num_samples, seed=cfg.seed,
                           json_field=cfg.dataset_json_field)
    task = items[0]["task_type"] if items[0]["task_type"] in ("math", "code") else "math"
    plan = plan_system(cfg.style, preset=cfg.preset, ckpt_overrides=cfg.ckpt_override, seed=cfg.seed,
                       dtype=cfg.dtype, device=cfg.device, task=task)
    samples_file = open_samples_file(cfg)
    start = time.time()
    backend = Backend(cfg, plan)
    wall = {}
    try:
        with SampleWriter(samples_file) as writer:
            for method in cfg.methods:
                done = load_done_ids(samples_file) if samples_file.exists() else set()
                batches = []
                for r in range(cfg.num_rollouts):  # one rollout index per batch: its decode seed is seed + r
                    todo = [i for i in items if sample_key({"method": method, "doc_id": i["doc_id"], "rollout": r}) not in done]
                    batches += [(todo[k:k + cfg.batch_size], r) for k in range(0, len(todo), cfg.batch_size)]
                t0 = time.perf_counter()
                bar = _bar(sum(len(b) for b, _ in batches), f"{cfg.style}/{method}", progress)
                n_ok = n_done = 0
                for batch, rollout, results in backend.run(batches, method):
                    for item, res in zip(batch, results):
                        rec = sample_record(item, method, rollout, res, cfg.grader)
                        writer.write(rec)
                        n_done, n_ok = n_done + 1, n_ok + int(rec["correct"])
                    bar.update(len(batch))
                    bar.set_postfix(acc=f"{n_ok / max(n_done, 1):.3f}",
                                    sps=f"{n_done / max(time.perf_counter() - t0, 1e-9):.2f}")
                bar.close()
                wall[method] = time.perf_counter() - t0
    finally:
        backend.close()
    return finish(cfg, samples_file, plan, wall, start)


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
    if cfg.plot:
        rows = [{"method": v["method"], "rounds": v["rounds"], "accuracy": v.get("accuracy,strict"),
                 "tokens_per_sample": v.get("tokens_per_sample,none"),
                 "seconds_per_sample": v.get("seconds_per_sample,none")} for v in results.values()]
        plot_vs_rounds(rows, Path(cfg.output_path) / f"plot_{bench_name(cfg)}.png")
    return {"results": results, "samples_path": str(samples_file), "results_path": str(path), "table": table}


def _bar(total, desc, enabled):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, dynamic_ncols=True)
