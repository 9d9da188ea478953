"""The control plane's capacity: agent calls per second one replica's orchestrator sustains when the
agents cost nothing (simulated agents with zero step, token and prefill time), so what is timed is Ray's
calls, the orchestrator's threads, routing and the object store, not models. Writes control.json.

    python -m jobs.bench.control                          # ~1 min: 48 batches at 16 in flight, R = 3
    python -m jobs.bench.control --no_bulk_dispatch       # one Ray call per batch's agent call
    python -m jobs.bench.control --capacity_in_flight 16 64 128 256   # ~2 min: also the capacity (below)
    PYTHONPATH=/path/to/other/checkout python -m jobs.bench.control --output_path out/before   # another version

Agent calls counted from the agents' own call logs: each batch's call once (`agent_calls`, `calls_per_s`: the
logical calls the issue's target counts), whether it reached its agent alone or with other batches' calls in one
bulk Ray call (`distributed.bulk`, on here for every role: `ray_calls`, `ray_calls_per_s` count those Ray actor
calls, from the size each logged call records; the simulated agents run one call at a time, so a copy's calls also
wait while it has a bulk call outstanding, `bulk.SERIAL_WINDOW`); calls/s = calls / wall time of the batches. Also the router's
acquire + release pairs per second (one per batch, one router for all replicas), and the CPU each process used
during the timed runs, read inside it (`cores`: CPU seconds / wall seconds): on a machine whose cores the agents,
raylet and driver share with the orchestrator, calls/s is the whole machine's rate, while the orchestrator's own
CPU per agent call (`orchestrator_cpu_ms_per_call`; its inverse `calls_per_orchestrator_cpu_s`) is what one
orchestrator sustains when its agents run elsewhere (a cluster; Ray's own threads can take it past one core).
`measure` runs on an existing Ray connection (jobs/bench/scale.py calls it on its simulated cluster).

The capacity (`--capacity_in_flight`): the same measurement at each of those numbers of batches in flight
(`capacity_batches_per_slot` batches per slot each), and the highest median calls/s of them. It is what the
orchestrator sustains when it has enough work: before any control-plane change the rate stayed flat at 390-470
calls/s from 16 to 256 in flight on this machine, while bulk dispatch carries more batches per Ray call the more
are in flight, so the default 16 alone understates the change.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Annotated

import ray

from recmas_ray.config.checks import Range, WritableDir
from recmas_ray.config.cli import run_job
from recmas_ray.config.placement import PlacementConfig
from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.distributed.cluster import start_ray
from recmas_ray.distributed.orchestrator import start_router
from recmas_ray.distributed.replicas import build_replicas
from recmas_ray.models.registry import SIMULATED
from recmas_ray.system.plan import simulated_plan


ROUTER_WAVE = 64
"""Acquires sent to the router at once (its actor's concurrency), so its capacity is timed, not round trips."""
ROUTER_WAVES = 20


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
    bulk_dispatch: bool = True
    """Aligned calls of several batches to one agent leave as one Ray call (`distributed.bulk`); false: one Ray
    call per batch's agent call, as before bulk dispatch (and as agents without continuous batching get by default)."""
    timeout_s: Annotated[float, Range(0, 86400, lo_open=True)] = 600.0
    """Timeout of every wait, in seconds."""
    capacity_in_flight: Annotated[list[int], Range(1, 4096)] = field(default_factory=list)
    """Also measure at each of these numbers in flight and report the capacity: the highest median calls/s
    among them (empty: only `in_flight`)."""
    capacity_batches_per_slot: Annotated[int, Range(1, 10_000)] = 15
    """Batches per slot in flight in each capacity run (at 128 in flight: 1920 batches)."""
    output_path: Annotated[str, WritableDir()] = "out/bench_control"
    """Where control.json goes."""


def measure(cfg: ControlBenchConfig) -> dict:
    """The figures on the Ray cluster this process is connected to: agent calls/s through one replica's
    orchestrator (zero-cost agents, `cfg.in_flight` batches in flight), and the router's acquire + release
    pairs/s (one router serves every replica)."""
    plan = simulated_plan("sequential_light", SIMULATED.name("hidden=256,step_ms=0,token_ms=0,tokens=1,prefill_ms=0"))
    rc = RecursionConfig(method="recursive_mas", num_recursive_rounds=cfg.rounds, latent_steps=4,
                         decode=DecodeConfig(max_new_tokens=1))
    reps = build_replicas(plan, PlacementConfig(preset="cpu", cpus_per_agent=0.1, agent_max_restarts=0,
                                                num_replicas=1, ready_timeout_s=cfg.timeout_s),
                          timeout_s=cfg.timeout_s, max_batches=cfg.in_flight, bulk_dispatch=cfg.bulk_dispatch)
    runs = []
    try:
        batches = [([f"q{k}.{i}" for i in range(cfg.batch_size)], ["math"] * cfg.batch_size)
                   for k in range(cfg.num_batches)]
        reps.solve_all(batches[:cfg.in_flight], rc, in_flight_per_replica=cfg.in_flight)  # warm
        system = reps.systems[0]
        processes = {"orchestrator": system.orchestrator, **system.actors(), "router": reps.router}
        for _ in range(cfg.repeats):
            reps.call_logs(clear=True)
            cpu0 = _cpu_seconds(processes, cfg.timeout_s)
            t0 = time.perf_counter()
            reps.solve_all(batches, rc, in_flight_per_replica=cfg.in_flight)
            wall = time.perf_counter() - t0
            cpu = {k: v - cpu0[k] for k, v in _cpu_seconds(processes, cfg.timeout_s).items()}
            logs = reps.call_logs()
            calls = sum(len(v) for log in logs for v in log.values())
            # Ray actor calls the agents ran: a bulk call's batches each log their own call with its size
            ray_calls = round(sum(1.0 / c.get("bulk", 1) for log in logs for v in log.values() for c in v))
            # time each agent spent inside its calls (host work: resolving input refs, storing messages): an
            # agent near 1 caps the rate; all well below 1 puts the cap in the orchestrator and Ray's calls
            busy = {name: round(sum(c["t1"] - c["t0"] for c in v) / wall, 3) for log in logs for name, v in log.items()}
            runs.append({"seconds": wall, "agent_calls": calls, "calls_per_s": calls / wall, "ray_calls": ray_calls,
                         "cores": {k: round(v / wall, 3) for k, v in cpu.items()},
                         "orchestrator_cpu_ms_per_call": 1000 * cpu["orchestrator"] / calls,
                         "ray_calls_per_s": ray_calls / wall,
                         "agent_busy": busy, "ms_per_call_in_agent": round(
                             1000 * sum(c["t1"] - c["t0"] for log in logs for v in log.values() for c in v) / calls, 3),
                         "loadavg_1m": os.getloadavg()[0], "cpu_count": os.cpu_count()})
    finally:
        reps.shutdown()
    router = start_router(1, timeout_s=cfg.timeout_s)
    try:
        wave = ROUTER_WAVE
        t0 = time.perf_counter()
        for _ in range(ROUTER_WAVES):  # `wave` clients' acquires at once, then their releases
            leases = ray.get([router.acquire.remote(1.0) for _ in range(wave)], timeout=cfg.timeout_s)
            ray.get([router.release.remote(lease) for _, lease in leases], timeout=cfg.timeout_s)
        router_pairs_per_s = ROUTER_WAVES * wave / (time.perf_counter() - t0)
    finally:
        ray.kill(router)
    calls_per_s = statistics.median(r["calls_per_s"] for r in runs)
    cpu_ms = statistics.median(r["orchestrator_cpu_ms_per_call"] for r in runs)
    return {"config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}, "runs": runs,
            "median_calls_per_s": calls_per_s, "orchestrator_s_per_call": 1.0 / calls_per_s,
            "orchestrator_cpu_ms_per_call": cpu_ms, "calls_per_orchestrator_cpu_s": 1000.0 / cpu_ms,
            "router_pairs_per_s": router_pairs_per_s, "router_s_per_batch": 1.0 / router_pairs_per_s}


def _cpu_seconds(actors: dict, timeout_s: float) -> dict:
    """CPU seconds each actor's process has used so far, all its threads (read inside the process, so on any
    node)."""
    used = ray.get([h.__ray_call__.remote(lambda _self: time.process_time()) for h in actors.values()],
                   timeout=timeout_s)
    return dict(zip(actors, used))


def bench(cfg: ControlBenchConfig) -> int:
    start_ray(num_cpus=8, log_to_driver=False)  # (no dashboard) retries a start-up a busy machine delays
    try:
        report = measure(cfg)
        if cfg.capacity_in_flight:
            report["capacity"] = capacity(cfg)
    finally:
        ray.shutdown()
    os.makedirs(cfg.output_path, exist_ok=True)
    path = os.path.join(cfg.output_path, "control.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print(f"{report['median_calls_per_s']:.1f} agent calls/s (median of {cfg.repeats}; the orchestrator "
          f"{report['orchestrator_cpu_ms_per_call']:.3f} ms of CPU per call: "
          f"{report['calls_per_orchestrator_cpu_s']:.0f} calls per CPU second), router "
          f"{report['router_pairs_per_s']:.1f} acquire+release/s; wrote {path}")
    if "capacity" in report:
        cap = report["capacity"]
        sweep = ", ".join(f"{r['in_flight']}: {r['median_calls_per_s']:.0f} "
                          f"({r['orchestrator_cpu_ms_per_call']:.3f} ms)" for r in cap["sweep"])
        print(f"capacity {cap['calls_per_s']:.1f} agent calls/s at {cap['in_flight']} in flight; calls/s (orchestrator "
              f"CPU per call) by batches in flight: {sweep}")
    return 0


def capacity(cfg: ControlBenchConfig) -> dict:
    """`measure` at each of `cfg.capacity_in_flight` batches in flight; the capacity is the highest median calls/s
    (on the Ray connection of this process)."""
    sweep = []
    for n in cfg.capacity_in_flight:
        run = measure(replace(cfg, in_flight=n, num_batches=n * cfg.capacity_batches_per_slot))
        sweep.append({"in_flight": n, "num_batches": n * cfg.capacity_batches_per_slot,
                      **{k: run[k] for k in ("median_calls_per_s", "orchestrator_cpu_ms_per_call",
                                             "calls_per_orchestrator_cpu_s")},
                      "runs": run["runs"]})
    best = max(sweep, key=lambda r: r["median_calls_per_s"])
    return {"calls_per_s": best["median_calls_per_s"], "in_flight": best["in_flight"], "sweep": sweep}


def main(argv=None) -> int:
    return run_job(bench, ControlBenchConfig, argv, prog="python -m jobs.bench.control", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
