"""Scaling benchmark: system replicas x recursion rounds on a simulated multi-node cluster with fake GPUs.

Agents are cost-simulated (`sim:` models, recmas_ray/models/sim.py): each latent step and each
generated token waits a configured time inside the SAME agent actor, pool, orchestrator, router and
object-store transport code as a real model, and messages have the real size [B, m, hidden]
(float32). So two CPU cores can host dozens of agents, and what is measured is the system: routing,
out-of-order agents, Ray's per-call cost and the pipeline of rounds.

Figures (targets of issue 12 in brackets):
  throughput       batches/s for replicas 1, 2, 4, 8 and R = 1, 2, 3
  efficiency       throughput / (replicas x one-replica throughput), strong scaling (the same
                   `--num_batches` spread over the replicas) and weak scaling (`--num_batches` per
                   replica) [>= 0.9 at 4 replicas]
  busy fraction    each agent's busy time / wall time, one replica, `--in_flight` batches in flight,
                   from the agents' own call logs [every agent >= 0.8 at R = 3 with 8 in flight]
  ray_call_ms      Ray's cost per agent call at the message size: a chain of zero-cost calls
                   passing one message on, agent to agent [<= 5 ms]
  real models      tiny random-weight models, 1 vs 2 replicas: identical predictions

  python -m jobs.bench_scale                        # simulated 2-node cluster, 24 fake GPUs (a few minutes)
  python -m jobs.bench_scale --quick                # replicas 1, 2, 4; R = 1, 3; fewer batches
  python -m jobs.bench_scale --address auto         # on a running cluster (its own GPUs) instead

Writes <output_path>/bench_scale.json and bench_scale.png (efficiency vs replicas; busy fraction vs R).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from recmas_ray.config.checks import NonEmpty, OneOf, Range, WritableDir
from recmas_ray.config.cli import run_job, save_config
from recmas_ray.config.evaluation import style_names
from recmas_ray.config.recursion import MAX_LATENT_STEPS, MAX_ROUNDS

import json
import os
import platform
import statistics
import sys
import time


@dataclass(kw_only=True)
class ScaleBenchConfig:
    """What the scaling benchmark runs."""

    replicas: Annotated[list[int], Range(1, 64), NonEmpty()] = field(default_factory=lambda: [1, 2, 4, 8])
    """Replica counts."""
    rounds: Annotated[list[int], Range(1, MAX_ROUNDS), NonEmpty()] = field(default_factory=lambda: [1, 2, 3])
    """Recursion rounds R."""
    num_batches: Annotated[int, Range(1, 100_000)] = 16
    """Batches per run (strong scaling; weak scaling runs this many per replica)."""
    batch_size: Annotated[int, Range(1, 4096)] = 4
    """Questions per batch."""
    in_flight: Annotated[int, Range(1, 1024)] = 8
    """Batches in flight per replica."""
    hidden: Annotated[int, Range(1, 65536)] = 2048
    """Message width of the simulated agents."""
    latent_steps: Annotated[int, Range(0, MAX_LATENT_STEPS)] = 32
    """m."""
    step_ms: Annotated[float, Range(0, 10_000)] = 5.0
    """Simulated cost of one latent step, in ms."""
    token_ms: Annotated[float, Range(0, 10_000)] = 5.0
    """Simulated cost of one generated token, in ms."""
    tokens: Annotated[int, Range(1, 100_000)] = 32
    """Tokens the decoder generates per batch."""
    style: Annotated[str, OneOf(style_names)] = "sequential_light"
    """Style whose agents are simulated."""
    nodes: Annotated[int, Range(1, 64)] = 2
    """Simulated nodes (ignored with address)."""
    gpus_per_node: Annotated[int, Range(0, 1024)] = 12
    """Fake GPUs per simulated node."""
    cpus_per_node: Annotated[int, Range(1, 1024)] = 8
    """Logical CPUs per simulated node."""
    call_chain: Annotated[int, Range(1, 100_000)] = 60
    """Zero-cost calls timed for ray_call_ms."""
    weak: bool = True
    """Run the weak-scaling series too (--no_weak skips it)."""
    real: bool = True
    """Check tiny real models on 1 vs 2 replicas (--no_real skips it)."""
    address: str | None = None
    """Join this Ray cluster (e.g. auto) instead of simulating one."""
    timeout_s: Annotated[float, Range(0, 86400, lo_open=True)] = 600.0
    """Timeout of every wait, in seconds."""
    output_path: Annotated[str, WritableDir()] = "out/bench_scale"
    """Where bench_scale.json, bench_scale.png and config.json go."""


def quick() -> ScaleBenchConfig:
    """Replicas 1, 2, 4; R = 1, 3; 8 batches."""
    return ScaleBenchConfig(replicas=[1, 2, 4], rounds=[1, 3], num_batches=8)


def start_cluster(args):
    """A head without resources plus `--nodes` nodes with fake GPUs, every process on 127.0.0.1 (or the
    cluster at --address, which must answer within 10 s)."""
    import ray

    from recmas_ray.distributed.driver import loopback_only

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    if args.address:
        ray.init(address=args.address, log_to_driver=False)
        return None
    from ray.cluster_utils import Cluster

    with loopback_only():
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                                "object_store_memory": 256 * 2**20,
                                                                "node_ip_address": "127.0.0.1"})
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=args.cpus_per_node, num_gpus=args.gpus_per_node,
                             object_store_memory=384 * 2**20, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    return cluster


def recursion(rounds: int, args):
    from recmas_ray.config.recursion import DecodeConfig, RecursionConfig

    return RecursionConfig(method="recursive_mas", num_recursive_rounds=rounds, latent_steps=args.latent_steps,
                           decode=DecodeConfig(max_new_tokens=args.tokens))


def batches(n: int, size: int, tag: str) -> list:
    return [([f"{tag} question {k}.{i}: what is {k} + {i}?" for i in range(size)], ["math"] * size)
            for k in range(n)]


def busy_fractions(logs: dict, t0: float, t1: float) -> dict:
    """Each role's busy time inside [t0, t1] divided by t1 - t0 (from its own call log)."""
    wall = max(t1 - t0, 1e-9)
    return {role: sum(max(0.0, min(c["t1"], t1) - max(c["t0"], t0)) for c in calls) / wall
            for role, calls in logs.items()}


def timed_run(replicas, n_replicas: int, n_batches: int, rounds: int, args, tag: str) -> dict:
    """One run: `n_batches` over the first `n_replicas` replicas; throughput and busy fractions."""
    replicas.call_logs(clear=True)
    t0 = time.time()
    out = replicas.solve_all(batches(n_batches, args.batch_size, tag), recursion(rounds, args),
                             in_flight_per_replica=args.in_flight, replicas=n_replicas)
    t1 = time.time()
    logs = replicas.call_logs()[:n_replicas]
    busy = [busy_fractions(log, t0, t1) for log in logs]
    return {"replicas": n_replicas, "rounds": rounds, "batches": n_batches, "seconds": t1 - t0,
            "throughput_batches_per_s": n_batches / (t1 - t0),
            "batches_per_replica": [sum(1 for i, _ in out if i == r) for r in range(n_replicas)],
            "busy_fraction": busy, "min_busy": min(min(b.values()) for b in busy)}


def ray_call_cost(handles: dict, args, latent_steps: int) -> dict:
    """ms per agent call: a chain of zero-cost rollouts, each taking the previous one's message
    ([batch, latent_steps, hidden] float32) from the other actor."""
    import ray

    a, b = handles["planner"], handles["critic"]
    users, edge = ["cost probe"] * args.batch_size, ("planner->critic",)
    ref, _ = a.rollout.options(num_returns=2).remote(users, [], latent_steps, edge)
    ray.get(ref, timeout=args.timeout_s)  # warm: both actors have deserialised a message once
    samples = []
    for _ in range(3):
        t0 = time.perf_counter()
        for k in range(args.call_chain):
            actor = b if k % 2 == 0 else a
            ref, _ = actor.rollout.options(num_returns=2).remote(users, ["<<SLOT>>"], latent_steps, edge, ref)
        ray.get(ref, timeout=args.timeout_s)
        samples.append((time.perf_counter() - t0) / args.call_chain * 1000)
    msg = ray.get(ref, timeout=args.timeout_s)
    return {"ms_per_call": statistics.median(samples), "samples_ms": samples, "message_shape": list(msg.shape),
            "message_bytes": msg.numel() * msg.element_size()}


def real_models(args) -> dict:
    """Tiny models on 2 CPU replicas: the same predictions from 1 replica as from 2."""
    from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
    from recmas_ray.distributed.driver import build_replicas
    from recmas_ray.distributed.placement import PlacementConfig
    from recmas_ray.system.plan import plan_system

    plan = plan_system(args.style, preset="tiny", seed=0)
    cfg = RecursionConfig(method="recursive_mas", num_recursive_rounds=2, latent_steps=4,
                          decode=DecodeConfig(max_new_tokens=6))
    qs = batches(4, 2, "real")
    t0 = time.perf_counter()
    reps = build_replicas(plan, PlacementConfig(preset="cpu", cpus_per_agent=0.05, num_replicas=2,
                                                agent_max_restarts=0), timeout_s=args.timeout_s, torch_threads=1)
    try:
        one = reps.solve_all(qs, cfg, in_flight_per_replica=2, replicas=1)
        two = reps.solve_all(qs, cfg, in_flight_per_replica=2, replicas=2)
    finally:
        reps.shutdown()
    p1 = [[r.prediction for r in res] for _, res in one]
    p2 = [[r.prediction for r in res] for _, res in two]
    return {"same_predictions": p1 == p2, "replica_of_batch_2_replicas": [i for i, _ in two],
            "num_batches": len(qs), "seconds": time.perf_counter() - t0}


def plot(report: dict, path: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 2, 1)
    for kind, style in (("strong", "-"), ("weak", "--")):
        for r in report["rounds"]:
            pts = [(x["replicas"], x["efficiency"]) for x in report[kind] if x["rounds"] == r]
            if pts:
                ax.plot(*zip(*pts), style, marker="o", label=f"R={r} {kind}")
    ax.axhline(0.9, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("replicas")
    ax.set_ylabel("efficiency")
    ax.set_ylim(0, 1.1)
    ax.set_title(f"{report['num_batches']} batches (strong) / per replica (weak)")
    ax.legend(fontsize=7)
    ax = fig.add_subplot(1, 2, 2)
    one = [x for x in report["strong"] if x["replicas"] == 1]
    for role in one[0]["busy_fraction"][0]:
        ax.plot([x["rounds"] for x in one], [x["busy_fraction"][0][role] for x in one], marker="o", label=role)
    ax.axhline(0.8, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("recursion rounds R")
    ax.set_ylabel("busy fraction")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"one replica, {report['in_flight']} batches in flight")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def bench(args: ScaleBenchConfig) -> int:
    """Run the series and write the report (the config is saved next to it)."""
    counts, rounds = list(args.replicas), list(args.rounds)
    import ray

    from recmas_ray.distributed.driver import build_replicas
    from recmas_ray.distributed.placement import PlacementConfig
    from recmas_ray.system.plan import simulated_plan

    from recmas_ray.distributed.driver import check_reachable

    if args.address:
        check_reachable(args.address)  # a dead address: one line and exit 2 before anything is written
    save_config(args, args.output_path)
    t_start = time.perf_counter()
    cluster = start_cluster(args)
    sim = f"sim:hidden={args.hidden},step_ms={args.step_ms},token_ms={args.token_ms},tokens={args.tokens}"
    report = {"style": args.style, "model": sim, "rounds": rounds, "replica_counts": counts,
              "num_batches": args.num_batches, "batch_size": args.batch_size, "in_flight": args.in_flight,
              "latent_steps": args.latent_steps, "cluster": ray.cluster_resources(), "strong": [], "weak": [],
              "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                          "loadavg_1_5_15": list(os.getloadavg()), "ray": ray.__version__}}
    try:
        t0 = time.perf_counter()
        reps = build_replicas(simulated_plan(args.style, sim),
                              PlacementConfig(preset="one_gpu_per_agent", cpus_per_agent=0.05,
                                              num_replicas=max(counts), agent_max_restarts=0),
                              timeout_s=args.timeout_s, torch_threads=1)
        report["startup_s"] = time.perf_counter() - t0
        try:
            report["replica_nodes"] = [sorted({i["node"][:8] for i in s.infos.values()}) for s in reps.systems]
            timed_run(reps, 1, 2, 1, args, "warmup")
            for r in rounds:
                for n in counts:
                    report["strong"].append(timed_run(reps, n, args.num_batches, r, args, f"s{n}r{r}"))
                    if not not args.weak and n > 1:
                        report["weak"].append(timed_run(reps, n, args.num_batches * n, r, args, f"w{n}r{r}"))
                    print(json.dumps({k: v for k, v in report["strong"][-1].items() if k != "busy_fraction"}),
                          flush=True)
            for kind in ("strong", "weak"):
                for x in report[kind]:
                    base = next(y for y in report["strong"] if y["replicas"] == 1 and y["rounds"] == x["rounds"])
                    x["efficiency"] = x["throughput_batches_per_s"] / (x["replicas"] * base["throughput_batches_per_s"])
            for x in report["strong"]:
                if x["replicas"] == 1 and not not args.weak:
                    report["weak"].insert(0, dict(x))
        finally:
            reps.shutdown()
        cost_plan = simulated_plan(args.style, f"sim:hidden={args.hidden},step_ms=0,token_ms=0,tokens=1")
        cost = build_replicas(cost_plan, PlacementConfig(preset="cpu", cpus_per_agent=0.05, num_replicas=1,
                                                         agent_max_restarts=0), timeout_s=args.timeout_s)
        try:
            report["ray_call"] = ray_call_cost(cost.systems[0].handles, args, args.latent_steps)
            # the same chain with one latent step: a message small enough to be inlined (< 100 KiB)
            report["ray_call_small_message"] = ray_call_cost(cost.systems[0].handles, args, 1)
        finally:
            cost.shutdown()
        if not not args.real:
            report["real_models"] = real_models(args)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    by = {(x["replicas"], x["rounds"]): x for x in report["strong"]}
    weak = {(x["replicas"], x["rounds"]): x for x in report["weak"]}
    r_max = max(rounds)
    report["targets"] = {
        "efficiency_at_4_replicas_strong": {r: by[(4, r)]["efficiency"] for r in rounds if (4, r) in by},
        "efficiency_at_4_replicas_weak": {r: weak[(4, r)]["efficiency"] for r in rounds if (4, r) in weak},
        "target_efficiency": 0.9,
        f"min_busy_one_replica_R{r_max}": by[(1, r_max)]["min_busy"], "target_busy": 0.8,
        "ray_call_ms": report["ray_call"]["ms_per_call"], "target_ray_call_ms": 5.0,
        "ray_call_ms_small_message": report["ray_call_small_message"]["ms_per_call"],
        "real_models_same_predictions": (report.get("real_models") or {}).get("same_predictions")}
    report["seconds"] = time.perf_counter() - t_start
    path = os.path.join(args.output_path, "bench_scale.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    plot(report, os.path.join(args.output_path, "bench_scale.png"))
    print(json.dumps(report["targets"], indent=2))
    print(f"wrote {path} and bench_scale.png")
    return 0


def main(argv=None) -> int:
    return run_job(bench, ScaleBenchConfig, argv, prog="python -m jobs.bench_scale", description=__doc__,
                   recipes={"quick": quick})


if __name__ == "__main__":
    sys.exit(main())
