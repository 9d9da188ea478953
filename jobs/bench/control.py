"""The control plane's capacity: agent calls per second one replica's orchestrator sustains when the
agents cost nothing (simulated agents with zero step, token and prefill time), so what is timed is Ray's
calls, the orchestrator's threads, routing and the object store, not models. Writes control.json.

    python -m jobs.bench.control                          # ~1 min: 48 batches at 16 in flight, R = 3
    PYTHONPATH=/path/to/other/checkout python -m jobs.bench.control --output_path out/before   # another version

Agent calls counted from the agents' own call logs; calls/s = calls / wall time of the batches.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Annotated

from recmas_ray.config.checks import Range, WritableDir
from recmas_ray.config.cli import run_job


@dataclass(kw_only=True)
class ControlBenchConfig:
    """Orchestrator capacity with zero-cost agents (see the module docstring)."""

    num_batches: Annotated[int, Range(1, 100_000)] = 48
    """Batches per repetition."""
    in_flight: Annotated[int, Range(1, 4096)] = 16
    """Batches in flight."""
    batch_size: Annotated[int, Range(1, 4096)] = 4
    """Questions per batch."""
    rounds: Annotated[int, Range(1, 16)] = 3
    """R (sequential_light: 3 R calls per batch)."""
    repeats: Annotated[int, Range(1, 100)] = 3
    """Repetitions (the median is reported)."""
    timeout_s: Annotated[float, Range(0, 86400, lo_open=True)] = 600.0
    output_path: Annotated[str, WritableDir()] = "out/bench_control"


def bench(cfg: ControlBenchConfig) -> int:
    import statistics

    import ray

    from recmas_ray.config.placement import PlacementConfig
    from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
    from recmas_ray.distributed.replicas import build_replicas
    from recmas_ray.system.plan import simulated_plan

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    plan = simulated_plan("sequential_light", "sim:hidden=256,step_ms=0,token_ms=0,tokens=1,prefill_ms=0")
    rc = RecursionConfig(method="recursive_mas", num_recursive_rounds=cfg.rounds, latent_steps=4,
                         decode=DecodeConfig(max_new_tokens=1))
    reps = build_replicas(plan, PlacementConfig(preset="cpu", cpus_per_agent=0.1, agent_max_restarts=0),
                          timeout_s=cfg.timeout_s)
    runs = []
    try:
        batches = [([f"q{k}.{i}" for i in range(cfg.batch_size)], ["math"] * cfg.batch_size)
                   for k in range(cfg.num_batches)]
        reps.solve_all(batches[:cfg.in_flight], rc, in_flight_per_replica=cfg.in_flight)  # warm
        for _ in range(cfg.repeats):
            reps.call_logs(clear=True)
            t0 = time.perf_counter()
            reps.solve_all(batches, rc, in_flight_per_replica=cfg.in_flight)
            wall = time.perf_counter() - t0
            calls = sum(len(v) for log in reps.call_logs() for v in log.values())
            runs.append({"seconds": wall, "agent_calls": calls, "calls_per_s": calls / wall,
                         "loadavg_1m": os.getloadavg()[0]})
    finally:
        reps.shutdown()
        ray.shutdown()
    report = {"config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}, "runs": runs,
              "median_calls_per_s": statistics.median(r["calls_per_s"] for r in runs)}
    os.makedirs(cfg.output_path, exist_ok=True)
    path = os.path.join(cfg.output_path, "control.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print(f"{report['median_calls_per_s']:.1f} agent calls/s (median of {cfg.repeats}); wrote {path}")
    return 0


def main(argv=None) -> int:
    return run_job(bench, ControlBenchConfig, argv, prog="python -m jobs.bench.control", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
