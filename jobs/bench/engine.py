"""One agent's steady-state throughput and latency with continuous batching against the unbatched path, on a
real model, with every batch's text AND latents compared to the unbatched run. Writes engine.json.

Each batch is one solver-like job: `rows` questions, a rollout of `latent_steps` latent steps, then a decode of
up to `tokens` tokens from a prompt holding those latents. Batches arrive as a Poisson process (exponential
gaps) at a rate above what the run can serve, and wait in a queue until one of the `in_flight` places is free:

    unbatched    one batch at a time, each call on its own cache (continuous batching off: the earlier default)
    batched D    D batches in flight through the agent's `StepScheduler`: their steps share forwards, a batch
                 joins as soon as another leaves (staggered, not in waves)

A run's throughput is read in its steady state: batches admitted per second from the moment all D places are
taken to the last admission (each admission takes the place a completion freed; far more batches than in flight,
`batches_per_in_flight` x D, so the window holds most of the run). Latency: p50 / p95 from a batch's admission to
its result (service) and from its arrival (with the queue wait). Modes run interleaved, `repeats` rounds in a
rotating order, so a change of the shared machine's load hits every mode alike; the report gives per-mode
medians and spread, the ratio to the unbatched path within each round, and the 1-minute load average around
every run. Every depth's run is checked against the unbatched outputs of the same batches (text identical,
latents within `latent_rtol` of their largest entry); exit status 1 otherwise.

    python -m jobs.bench.engine                               # SmolLM2-135M, CPU, ~10 min on 2 loaded cores
    python -m jobs.bench.engine --model tiny:llama --repeats 1 --in_flight 4 --batches_per_in_flight 3  # seconds
    python -m jobs.bench.engine --device cuda --model tiny:llama --in_flight 1 8 64   # a GPU (jobs/gpu_check.sh)
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import queue
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated

import torch
import transformers

from recmas_ray.engine.agent import Agent
from recmas_ray.config.checks import NonEmpty, OneOf, Range, WritableDir
from recmas_ray.config.cli import run_job
from recmas_ray.config.inputs import check_cuda
from recmas_ray.config.recursion import DecodeConfig
from recmas_ray.engine.kv_cache import PrefixStore
from recmas_ray.engine.links import InnerLink
from recmas_ray.models.loader import load_frozen_model
from recmas_ray.models.registry import SMOLLM2_135M
from recmas_ray.engine.scheduler import StepScheduler
from recmas_ray.train.synthetic import make_arithmetic_dataset

SLOT = "<<LATENT_PLANNER_SLOT>>"
DEFAULT_DEPTH = 6
"""Batches in flight per replica by default (`eval.stream.CLIENTS_PER_ACTOR` x a 3-agent system's actors)."""


@dataclass(kw_only=True)
class EngineBenchConfig:
    """Steady-state continuous batching benchmark of one agent (see the module docstring)."""

    model: str = SMOLLM2_135M
    """The agent's base model (packaged real model by default; tiny:FAMILY for a quick check)."""
    in_flight: Annotated[list[int], Range(1, 1024), NonEmpty()] = field(default_factory=lambda: [DEFAULT_DEPTH, 32])
    """Batches in flight of the batched runs (the default depth, 6, and 32)."""
    num_batches: Annotated[int, Range(1, 100_000)] = 6
    """Batches of the unbatched run, and the fewest of a batched run."""
    batches_per_in_flight: Annotated[int, Range(3, 1000)] = 3
    """A batched run at depth D runs max(num_batches, this x D) batches: its steady window is the middle ones."""
    repeats: Annotated[int, Range(1, 100)] = 3
    """Interleaved rounds (each runs every mode once, in a rotating order)."""
    rows: Annotated[int, Range(1, 256)] = 1
    """Questions per batch."""
    latent_steps: Annotated[int, Range(1, 4096)] = 8
    """m of each batch's rollout."""
    tokens: Annotated[int, Range(1, 4096)] = 16
    """Decode budget of each batch."""
    overload: Annotated[float, Range(1, 1000)] = 3.0
    """Arrival rate as a multiple of what the mode could serve with perfect batching (one batch alone's rate x D
    in flight, x 2 for the unbatched path): above what it serves, so its places stay full (steady state) even
    if the machine's load falls after the calibration."""
    latent_rtol: Annotated[float, Range(0, 1)] = 1e-5
    """Largest latent difference from the unbatched run that counts as identical, as a share of the largest latent
    entry (a real model's last-layer states reach hundreds: float32 rounding alone moves them by ~1e-5)."""
    seed: int = 7
    """Seed of the questions and of the arrival times."""
    torch_threads: Annotated[int, Range(0, 1024)] = 1
    """torch threads (0: torch's default). One by default: on the shared 2-core machine at load average ~35, two
    intra-op threads stalled at their barriers (one SmolLM2 batch alone: 96-151 s wall against 6-9 s with one)."""
    device: Annotated[str, OneOf(("cpu", "cuda"))] = "cpu"
    """Where the agent runs."""
    dtype: Annotated[str, OneOf(("float32", "bfloat16"))] = "float32"
    """The model's dtype. In bfloat16 (as on a GPU in production) a merged batch's shape changes the rounding, so
    greedy tokens may differ from one batch at a time: `identical_outputs` false, exit status 1."""
    output_path: Annotated[str, WritableDir()] = "out/bench_engine"


def _questions(n: int, rows: int, seed: int) -> list[list[str]]:
    data = make_arithmetic_dataset(n * rows, seed=seed)
    return [[r["question"] for r in data[k * rows:(k + 1) * rows]] for k in range(n)]


def _job(agent, users: list[str], cfg):
    """One batch: rollout on its prompt, then a decode whose prompt carries those latents (the agent's engine
    decides whether they go through its scheduler); returns (texts, latents H_BMD)."""
    e, mask, prefix = agent.embed_batch_with_prefix([f"Question: {u}\nMake a short plan." for u in users])
    h = agent.latent_rollout(e, mask, cfg.latent_steps, prefix_ids=prefix)
    e2, mask2, prefix2 = agent.embed_batch_with_prefix([f"Question: {u}\nPlan: {SLOT}\nSolve it." for u in users],
                                                       {SLOT: agent.inner_link(h)})
    ids = agent._decode_static(e2, mask2, DecodeConfig(max_new_tokens=cfg.tokens), prefix2)
    return [agent.detokenize(t) for t in ids], h.cpu()


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def measure(agent, batches, depth: int, batched: bool, rate: float, cfg, seed: int) -> dict:
    """Every batch, arriving at Poisson times of `rate` per second, through `depth` places in flight."""
    agent.engine = dataclasses.replace(agent.engine, continuous_batching=batched)
    agent.prefix_store = PrefixStore(int(agent.engine.prefix_cache_mib * 2**20))  # every run starts cold
    agent._scheduler = StepScheduler(agent) if batched else None
    rng = random.Random(seed)
    gaps = [rng.expovariate(rate) for _ in batches]
    arrivals: queue.Queue = queue.Queue()
    outputs, arrived_at, admitted_at, done_at = [None] * len(batches), {}, {}, {}
    t0 = time.perf_counter()

    def arrive():
        t = t0
        for k, gap in enumerate(gaps):
            t += gap
            time.sleep(max(0.0, t - time.perf_counter()))
            arrived_at[k] = time.perf_counter()
            arrivals.put(k)
        for _ in range(depth):
            arrivals.put(None)

    def place():
        with torch.no_grad():
            while (k := arrivals.get()) is not None:
                admitted_at[k] = time.perf_counter()
                outputs[k] = _job(agent, batches[k], cfg)
                done_at[k] = time.perf_counter()

    load_before = os.getloadavg()[0]
    threads = [threading.Thread(target=arrive)] + [threading.Thread(target=place) for _ in range(depth)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sched = agent._scheduler
    if sched is not None:
        sched.close()
    ends, starts = sorted(done_at.values()), sorted(admitted_at.values())
    # steady state: from the moment every place is taken (the D-th admission) to the last admission (then the
    # places empty out); each admission in between took a place another batch's completion freed
    steady = len(starts) - depth >= 2
    rows = sum(len(b) for b in batches) / len(batches)
    service = [done_at[k] - admitted_at[k] for k in done_at]
    sojourn = [done_at[k] - arrived_at[k] for k in done_at]
    return {"mode": f"batched_{depth}" if batched else "unbatched", "in_flight": depth, "batches": len(batches),
            "arrival_rate_per_s": rate, "seconds": ends[-1] - t0,
            "steady_questions_per_s": (rows * (len(starts) - depth) / (starts[-1] - starts[depth - 1]) if steady
                                       else rows * len(ends) / (ends[-1] - t0)),
            "steady_window_batches": len(starts) - depth if steady else 0,
            "latency_p50_s": _percentile(service, 0.5), "latency_p95_s": _percentile(service, 0.95),
            "latency_with_queue_p50_s": _percentile(sojourn, 0.5),
            "latency_with_queue_p95_s": _percentile(sojourn, 0.95),
            "shared_steps": sched.num_steps if sched else None,
            "rows_per_step": sched.rows_stepped / max(sched.num_steps, 1) if sched else 1.0,
            "prefills": sched.num_prefills if sched else len(batches) * 2,
            "cache_reallocations": sched.num_rebuilds if sched else None,
            "loadavg_1m_before": load_before, "loadavg_1m_after": os.getloadavg()[0], "outputs": outputs}


def compare(base: list, run: list) -> dict:
    """Text equality and the largest latent difference over the batches both runs have."""
    n = min(len(base), len(run))
    diff = max(float((a[1] - b[1]).abs().max()) for a, b in zip(base[:n], run[:n]))
    return {"compared_batches": n, "text_identical": all(a[0] == b[0] for a, b in zip(base[:n], run[:n])),
            "max_latent_diff": diff, "max_latent_abs": max(float(a[1].abs().max()) for a in base[:n])}


def _spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "values": xs}


def bench(cfg: EngineBenchConfig) -> int:
    if cfg.device == "cuda":
        check_cuda("--device cuda")  # one line, exit 2, before the model loads
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    model, tok = load_frozen_model(cfg.model, dtype=getattr(torch, cfg.dtype), device=cfg.device)
    torch.manual_seed(0)
    agent = Agent(model, tok, InnerLink(model.config.hidden_size), role="solver", model_name=cfg.model)
    depths = sorted(set(cfg.in_flight))
    count = {d: max(cfg.num_batches, cfg.batches_per_in_flight * d) for d in depths}
    batches = _questions(max([cfg.num_batches, *count.values()]), cfg.rows, cfg.seed)
    measure(agent, batches[:1], 1, False, 1e6, cfg, cfg.seed)  # warm-up
    modes = [("unbatched", 1, False)] + [(f"batched_{d}", d, True) for d in depths]
    rounds = []
    for r in range(cfg.repeats):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        # one batch alone, now: the unit of this round's arrival rates (the shared machine's load drifts)
        alone_s = measure(agent, batches[:2], 1, False, 1e6, cfg, cfg.seed)["seconds"] / 2
        runs = {}
        for name, depth, batched in order:
            n = cfg.num_batches if not batched else count[depth]
            run = measure(agent, batches[:n], depth, batched, cfg.overload * max(depth, 2) / alone_s, cfg, cfg.seed + r)
            # arrival-bound: it served about what arrived, so its figure is a floor of what it can serve
            run["arrival_bound"] = run["steady_questions_per_s"] >= 0.8 * run["arrival_rate_per_s"] * cfg.rows
            runs[name] = run
            print(f"round {r + 1} {name:>12}: {run['steady_questions_per_s']:.3f} questions/s, p50 "
                  f"{run['latency_p50_s']:.2f} s, p95 {run['latency_p95_s']:.2f} s, {run['rows_per_step']:.1f} rows "
                  f"per step, load {run['loadavg_1m_before']:.1f}", flush=True)
        base = runs["unbatched"]["outputs"]
        for name, run in runs.items():
            run["vs_unbatched"] = compare(base, run.pop("outputs"))
            run["throughput_ratio_vs_unbatched"] = (run["steady_questions_per_s"]
                                                    / runs["unbatched"]["steady_questions_per_s"])
        rounds.append({"order": [m[0] for m in order], "one_batch_alone_s": alone_s, "runs": runs})
        identical = _write(cfg, modes, rounds)  # after every round: a long run keeps what it finished
    return 0 if identical else 1


def _write(cfg: EngineBenchConfig, modes, rounds: list) -> bool:
    """engine.json from the rounds so far (per-mode medians and spread); returns whether every output matched."""
    summary = {}
    for name, _, _ in modes:
        per = [rd["runs"][name] for rd in rounds]
        summary[name] = {k: _spread([p[k] for p in per]) for k in
                         ("steady_questions_per_s", "throughput_ratio_vs_unbatched", "latency_p50_s", "latency_p95_s",
                          "latency_with_queue_p95_s", "rows_per_step", "loadavg_1m_before")}
    identical = all(r["vs_unbatched"]["text_identical"] and r["vs_unbatched"]["max_latent_diff"]
                    <= cfg.latent_rtol * r["vs_unbatched"]["max_latent_abs"]
                    for rd in rounds for r in rd["runs"].values())
    report = {"config": dataclasses.asdict(cfg), "cpu_count": os.cpu_count(),
              "device_name": torch.cuda.get_device_name(0) if cfg.device == "cuda" else platform.processor() or "cpu",
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "python": platform.python_version()},
              "rounds_done": len(rounds), "identical_outputs": identical,
              "summary": summary, "rounds": rounds}
    os.makedirs(cfg.output_path, exist_ok=True)
    path = os.path.join(cfg.output_path, "engine.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps({"identical_outputs": identical, "throughput_ratio_median": {
        k: v["throughput_ratio_vs_unbatched"]["median"] for k, v in summary.items()}}))
    print(f"wrote {path}", flush=True)
    return identical


def main(argv=None) -> int:
    return run_job(bench, EngineBenchConfig, argv, prog="python -m jobs.bench.engine", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
