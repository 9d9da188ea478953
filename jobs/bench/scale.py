"""Scaling benchmark on the production path: Ray Data clients, router and grading over simulated agents.

Agents are cost-simulated (`sim:` models, recmas_ray/models/sim.py) inside the SAME agent actors,
pools, orchestrators, router, transport, Ray Data clients and grader as real models: each latent step,
generated token and prompt prefill waits a time proportional to the role's parameters (the paper's
light or mixture system by default, `paper_sim_models`), and messages have the real size
[B, m, hidden]. So two CPU cores host dozens of agents on a simulated cluster of fake GPUs.

Figures (targets in brackets), read in the steady state (`steady_window`: fill and drain left
out; the same figures over the whole active window are reported beside them):
  balance      the same GPU count (--gpus) as whole-system replicas only vs per-role pools sized
               from each role's cost (one replica): per-role busy fraction (its copies' mean),
               throughput, throughput per GPU, for each R in --balance_rounds
               [lowest role busy ~0.3 -> >= 0.7; throughput per GPU >= 1.8x]
  weak         whole-system replicas 1 .. max(--replicas), --num_batches per replica: efficiency =
               throughput / (replicas x one replica's) [>= 0.9 at 4 and 8]
  ray_call     Ray's cost per agent call passing a message on (a chain of zero-cost rollouts) at 0 B
               (an empty call), 32 KiB and 1 MiB, fp32 and bf16, and its ratio to the empty call
               [<= 5 ms at 1 MiB on an idle machine]
  real models  tiny random-weight models, 1 vs 2 replicas: identical predictions

  python -m jobs.bench.scale                        # simulated 2-node cluster, 24 fake GPUs
  python -m jobs.bench.scale --quick                # fewer batches, replicas 1 and 4
  python -m jobs.bench.scale --address HOST:PORT    # on a running cluster (its own GPUs) instead

Writes <output_path>/bench_scale.json and bench_scale.png; the machine's load average is recorded.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Annotated

from jobs.bench.scale_costs import call_costs, plot, real_models
from recmas_ray.config.checks import NonEmpty, OneOf, Range, WritableDir
from recmas_ray.config.cli import run_job
from recmas_ray.config.recursion import MAX_LATENT_STEPS, MAX_ROUNDS
from recmas_ray.config.tree import save_config

SYSTEMS = ("light", "mixture")
PAPER_ROLES = {"light": ("planner", "critic", "solver"), "mixture": ("math", "code", "science", "summarizer")}


@dataclass(kw_only=True)
class ScaleBenchConfig:
    """What the scaling benchmark runs."""

    system: Annotated[str, OneOf(SYSTEMS)] = "light"
    """Paper system whose per-role costs are simulated: light (sequential) or mixture."""
    gpus: Annotated[int, Range(1, 1024)] = 18
    """GPUs (one per agent actor) of the balance comparison, the same for both layouts (18: six light
    systems, or one pool of 3 / 2 / 13 copies, the whole-GPU split closest to the roles' costs)."""
    balance_rounds: Annotated[list[int], Range(1, MAX_ROUNDS), NonEmpty()] = field(default_factory=lambda: [1, 3])
    """R of the balance comparison."""
    replicas: Annotated[list[int], Range(1, 64), NonEmpty()] = field(default_factory=lambda: [1, 4, 8])
    """Whole-system replica counts of the weak-scaling series."""
    weak_rounds: Annotated[int, Range(1, MAX_ROUNDS)] = 3
    """R of the weak-scaling series."""
    num_batches: Annotated[int, Range(1, 100_000)] = 18
    """Batches per run (balance: per whole-system replica's share of the GPUs; weak: per replica). The
    steady-state window needs more than twice the batches in flight (auto: 6 per light replica), 18 gives
    it a third of the run (`steady_window`)."""
    batch_size: Annotated[int, Range(1, 4096)] = 4
    """Questions per batch."""
    num_clients: Annotated[int, Range(0, 1024)] = 0
    """Ray Data clients (batches in flight): 0, the production default (auto: two per agent actor, the
    same total for both layouts of the balance comparison); N: N per replica in the weak series and N
    in all in the balance comparison (a small machine's memory: each client is a process)."""
    latent_steps: Annotated[int, Range(0, MAX_LATENT_STEPS)] = 32
    """m."""
    tokens: Annotated[int, Range(1, 100_000)] = 256
    """Tokens the decoder generates per batch (the paper's runs decode 256-1000)."""
    ms_per_gparam: Annotated[float, Range(0, 10_000)] = 20.0
    """Simulated ms per latent step or token per billion parameters. 20: the 1.54B solver takes 31 ms per
    token, the pace of an eager Hugging Face decode step of a 1-2B model at a small batch on one GPU (bound
    by kernel launches, not FLOPs); far below it the Ray Data clients, orchestrators and grading of a small
    machine, not the simulated GPUs, set the pace, and the run measures the host instead of the balance."""
    prompt_tokens: Annotated[int, Range(0, 100_000)] = 200
    """Prompt tokens prefilled on every call (20x faster per token than decoding)."""
    nodes: Annotated[int, Range(1, 64)] = 2
    """Simulated nodes (ignored with address)."""
    gpus_per_node: Annotated[int, Range(0, 1024)] = 12
    """Fake GPUs per simulated node."""
    cpus_per_node: Annotated[int, Range(1, 1024)] = 16
    """Logical CPUs per simulated node (agents, orchestrators and clients mostly wait)."""
    call_chain: Annotated[int, Range(1, 100_000)] = 60
    """Zero-cost calls timed per ray_call figure."""
    real: bool = True
    """Check tiny real models on 1 vs 2 replicas (--no_real skips it)."""
    address: str | None = None
    """Join this Ray cluster (HOST:PORT or auto) instead of simulating one."""
    timeout_s: Annotated[float, Range(0, 86400, lo_open=True)] = 600.0
    """Timeout of every wait, in seconds."""
    output_path: Annotated[str, WritableDir()] = "out/bench_scale"
    """Where bench_scale.json, bench_scale.png and config.json go."""


def quick() -> ScaleBenchConfig:
    """Fewer batches; weak scaling at 1 and 4 replicas; R = 1 only."""
    return ScaleBenchConfig(replicas=[1, 4], balance_rounds=[1], num_batches=6, real=False)


def start_cluster(args):
    """A head without resources plus `--nodes` nodes with fake GPUs, every process on 127.0.0.1 (or the
    cluster at --address, which must answer within 10 s)."""
    import ray

    from recmas_ray.distributed.cluster import loopback_only

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    if args.address:
        ray.init(address=args.address, log_to_driver=False)
        return None
    from ray.cluster_utils import Cluster

    # A private temp dir: the simulated cluster's address file must not replace the machine's own
    # (`ray.init()` / init_ray elsewhere would join it); short, for Ray's 108-byte socket paths.
    if "RAY_TMPDIR" not in os.environ:
        import tempfile

        os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rbs", dir="/tmp")
    # Each simulated node gets its share of this host's free memory: left alone, every node would declare
    # the whole host's, and memory-aware sizing (the clients' auto depth) would plan for several hosts.
    node_memory = int(0.7 * os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / (args.nodes + 1))
    with loopback_only():
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                                "object_store_memory": 256 * 2**20,
                                                                "memory": node_memory,
                                                                "node_ip_address": "127.0.0.1"})
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=args.cpus_per_node, num_gpus=args.gpus_per_node, memory=node_memory,
                             object_store_memory=384 * 2**20, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    return cluster


def recursion(rounds: int, args):
    from recmas_ray.config.recursion import DecodeConfig, RecursionConfig

    return RecursionConfig(method="recursive_mas", num_recursive_rounds=rounds, latent_steps=args.latent_steps,
                           decode=DecodeConfig(max_new_tokens=args.tokens))


def question_batches(n: int, size: int, tag: str) -> list:
    """(items, rollout) batches as the evaluation driver makes them: graded math questions."""
    return [([{"doc_id": f"{tag}-{k}-{i}", "question": f"{tag} question {k}.{i}: what is {k} + {i}?",
               "gold": "0", "task_type": "math", "benchmark": "bench_scale"} for i in range(size)], 0)
            for k in range(n)]


def busy_by_role(logs: dict, t0: float, t1: float) -> dict:
    """Each role's busy time in [t0, t1] / (t1 - t0), averaged over its copies (call logs ROLE, ROLE#K)."""
    wall, per = max(t1 - t0, 1e-9), {}
    for name, calls in logs.items():
        busy = sum(max(0.0, min(c["t1"], t1) - max(c["t0"], t0)) for c in calls) / wall
        per.setdefault(name.split("#")[0], []).append(busy)
    return {role: sum(v) / len(v) for role, v in per.items()}


def steady_window(decodes: list[tuple[float, float]], entries: list[float]) -> tuple[float, float, float]:
    """(t_a, t_b, batches done in [t_a, t_b]) in the steady state, given each batch's decode (its last call)
    and each batch's first call (`entries`).

    A run starts with a burst: the D batches in flight enter at once (D: those that entered before the first
    one finished) and queue at the first roles. The window opens when the D-th batch finishes, so every
    batch still in flight entered one at a time, as finished ones made room; it closes when the last batch
    enters, after which the upstream roles run dry and the pipeline drains (or at the last decode end if
    no batch waited). It holds N - 2D completions: a run needs N > 2D batches (3D gives a window of D).
    Batches done count each decode by the share of it inside the window: whole systems started together
    finish in bunches, and counting only whole completions would make the rate depend on where a bunch
    falls at the window's edges. Without a window (N <= 2D) the whole active run is used."""
    ends = sorted(t1 for _, t1 in decodes)
    depth = sum(1 for t in entries if t < ends[0])
    t_a, t_b = ends[max(depth, 1) - 1], max(entries)
    if t_b - t_a <= 0:
        t_a, t_b = min(t0 for t0, _ in decodes), ends[-1]
    done = sum(max(0.0, min(t1, t_b) - max(t0, t_a)) / max(t1 - t0, 1e-9) for t0, t1 in decodes)
    return t_a, t_b, done


def eval_run(replicas, n_replicas: int, n_batches: int, rounds: int, args, tag: str, clients: int = 0) -> dict:
    """`n_batches` through the production evaluation stream (Ray Data clients, router, grading) on the
    first `n_replicas` replicas, `clients` batches in flight per replica (0: the production default).

    Throughput and busy fractions are read from the agents' own call logs in the steady state
    (`steady_window`: fill and drain left out); `*_active_window` figures span the
    first call's start to the last call's end, fill and drain included; `wall_s` adds Ray Data's start
    of the client actors.
    """
    import ray

    from recmas_ray.eval.config import StreamConfig
    from recmas_ray.distributed.replicas import RayReplicas, start_router
    from recmas_ray.eval.stream import stream_samples

    view = RayReplicas(replicas.plan, replicas.systems[:n_replicas], start_router(n_replicas, timeout_s=args.timeout_s),
                       args.timeout_s)
    view.call_logs(clear=True)
    stream = StreamConfig(num_clients=clients, client_cpus=0.05)
    t0 = time.time()
    records = list(stream_samples(view, question_batches(n_batches, args.batch_size, tag), "recursive_mas",
                                  recursion(rounds, args), "strict", False, stream, timeout_s=args.timeout_s))
    wall = time.time() - t0
    logs = view.call_logs()
    ray.kill(view.router)
    calls = [c for log in logs for cs in log.values() for c in cs]
    done = [(c["t0"], c["t1"]) for c in calls if c["method"] == "decode"]
    entries = {}  # batch k's first call (its prompt names "question k.0:")
    for c in calls:
        m = re.search(r" question (\d+)\.0:", c["first_user"])
        if m:
            entries[m.group(1)] = min(entries.get(m.group(1), c["t0"]), c["t0"])
    errors = sum(1 for r in records if r.get("error"))
    if errors or len(records) != n_batches * args.batch_size or len(done) != n_batches:
        raise RuntimeError(f"{tag}: {errors} errored samples, {len(records)} of {n_batches * args.batch_size} "
                           f"returned, {len(done)} of {n_batches} decode calls logged")
    a, b = min(c["t0"] for c in calls), max(c["t1"] for c in calls)
    if len(entries) != n_batches:
        raise RuntimeError(f"{tag}: the call logs name {len(entries)} of {n_batches} batches")
    sa, sb, n_steady = steady_window(done, list(entries.values()))

    def role_busy(t_a, t_b):
        busy = [busy_by_role(log, t_a, t_b) for log in logs]
        return {r: sum(x[r] for x in busy) / len(busy) for r in busy[0]}

    steady, whole = role_busy(sa, sb), role_busy(a, b)
    return {"replicas": n_replicas, "rounds": rounds, "batches": n_batches, "active_s": b - a, "wall_s": wall,
            "steady_s": sb - sa, "steady_batches": n_steady, "clients_per_replica": clients or "auto",
            "throughput_batches_per_s": n_steady / (sb - sa), "busy_by_role": steady,
            "min_role_busy": min(steady.values()),
            "throughput_active_window": n_batches / (b - a), "busy_by_role_active_window": whole,
            "min_role_busy_active_window": min(whole.values()), "graded": len(records)}


def build(plan, copies: dict | None, n: int, args):
    from recmas_ray.distributed.launch import start_agents
    from recmas_ray.config.placement import PlacementConfig

    placement = PlacementConfig(preset="one_gpu_per_agent", cpus_per_agent=0.05, num_replicas=n,
                                agent_max_restarts=0, role_replicas=copies or {})
    return start_agents(plan, backend="ray", placement=placement, timeout_s=args.timeout_s, torch_threads=1)


def balance(plan, rounds: int, args) -> dict:
    """Whole-system replicas vs one replica of per-role pools, both on `args.gpus` GPUs."""
    from recmas_ray.distributed.pools import copies_from_costs, role_costs

    roles = list(plan.style.roles)
    n_whole = args.gpus // len(roles)
    costs = role_costs(plan.style, plan.role_models, rounds, args.latent_steps, args.tokens)
    copies = copies_from_costs(costs, budget=n_whole * len(roles))
    out = {"rounds": rounds, "role_costs_ms": costs, "pool_copies": copies, "gpus": n_whole * len(roles),
           # the best any layout can do: every GPU busy, vs whole systems paced by their slowest role
           "ideal_per_gpu_ratio": max(costs.values()) * len(roles) / sum(costs.values()),
           # ... and with these whole copies: the pool's slowest role (copies / cost) against the whole systems'
           "ideal_ratio_for_these_copies": min(copies[r] / costs[r] for r in roles) * max(costs.values()) / n_whole}
    n_batches = args.num_batches * n_whole
    for name, cps, n in (("whole_system", None, n_whole), ("per_role_pools", copies, 1)):
        reps = build(plan, cps, n, args)
        # the same batches in flight in all: auto gives 2 per agent actor either way; N is the total
        clients = max(1, args.num_clients // n) if args.num_clients else 0
        try:
            run = eval_run(reps, n, n_batches, rounds, args, f"{name}-{rounds}", clients)
        finally:
            reps.shutdown()
        run["throughput_per_gpu"] = run["throughput_batches_per_s"] / out["gpus"]
        out[name] = run
        print(json.dumps({name: {k: v for k, v in run.items() if not k.startswith("busy_by_role")}}), flush=True)
    out["per_gpu_ratio"] = out["per_role_pools"]["throughput_per_gpu"] / out["whole_system"]["throughput_per_gpu"]
    out["per_gpu_ratio_active_window"] = (out["per_role_pools"]["throughput_active_window"]
                                          / out["whole_system"]["throughput_active_window"])
    return out


def weak(plan, args) -> list[dict]:
    """Whole-system replicas, `num_batches` per replica: efficiency vs one replica."""
    counts = sorted(set(args.replicas))
    reps = build(plan, None, max(counts), args)
    rows = []
    try:
        for n in counts:
            rows.append(eval_run(reps, n, args.num_batches * n, args.weak_rounds, args, f"weak{n}", args.num_clients))
            print(json.dumps({k: v for k, v in rows[-1].items() if not k.startswith("busy_by_role")}), flush=True)
    finally:
        reps.shutdown()
    base = rows[0]["throughput_batches_per_s"] / rows[0]["replicas"]
    for row in rows:
        row["efficiency"] = row["throughput_batches_per_s"] / (row["replicas"] * base)
        row["efficiency_active_window"] = row["throughput_active_window"] / (
            row["replicas"] * rows[0]["throughput_active_window"] / rows[0]["replicas"])
    return rows


def bench(args: ScaleBenchConfig) -> int:
    """Run the series and write the report (the config is saved next to it)."""
    from recmas_ray.distributed.cluster import check_reachable

    if args.address:
        check_reachable(args.address)  # a dead address: one line and exit 2 before anything is written
    if args.gpus < len(PAPER_ROLES[args.system]):
        raise ValueError(f"--gpus {args.gpus}: the {args.system} system needs at least {len(PAPER_ROLES[args.system])}")
    import ray

    from recmas_ray.models.sim import PAPER_STYLES, paper_sim_models
    from recmas_ray.system.plan import simulated_plan

    save_config(args, args.output_path)
    t_start = time.perf_counter()
    load_before = list(os.getloadavg())
    cluster = start_cluster(args)
    models = paper_sim_models(args.system, ms_per_gparam=args.ms_per_gparam, tokens=args.tokens,
                              prompt_tokens=args.prompt_tokens)
    plan = simulated_plan(PAPER_STYLES[args.system], models)
    report = {"system": args.system, "style": plan.style_name, "models": models, "tokens": args.tokens,
              "latent_steps": args.latent_steps, "batch_size": args.batch_size, "num_batches": args.num_batches,
              "weak_rounds": args.weak_rounds, "num_clients": args.num_clients or "auto",
              "cluster": ray.cluster_resources(), "balance": [],
              "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                          "loadavg_1_5_15_before": load_before, "ray": ray.__version__}}
    report["weak"], report["ray_call"], report["errors"] = [], {}, {}

    def series(name, fn):  # a series that fails (a loaded machine's start-up timeout) is recorded, not fatal
        try:
            return fn()
        except RuntimeError as e:
            report["errors"][name] = " ".join(str(e).split())[:500]
            print(f"{name} failed: {report['errors'][name]}", file=sys.stderr, flush=True)
            return None

    try:
        for r in args.balance_rounds:
            row = series(f"balance_R{r}", lambda: balance(plan, r, args))
            if row:
                report["balance"].append(row)
        report["weak"] = series("weak", lambda: weak(plan, args)) or []
        report["ray_call"] = series("ray_call", lambda: call_costs(args)) or {}
        if args.real:
            report["real_models"] = series("real_models", lambda: real_models(args))
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    report["machine"]["loadavg_1_5_15_after"] = list(os.getloadavg())
    weak_eff = {x["replicas"]: x["efficiency"] for x in report["weak"]}
    calls = report["ray_call"]
    report["targets"] = {
        "balance": {f"R{b['rounds']}": {
            "min_role_busy_whole_system": b["whole_system"]["min_role_busy"],
            "min_role_busy_per_role_pools": b["per_role_pools"]["min_role_busy"], "target_min_busy_pools": 0.7,
            "throughput_per_gpu_ratio": b["per_gpu_ratio"], "target_ratio": 1.8,
            "throughput_per_gpu_ratio_active_window": b["per_gpu_ratio_active_window"],
            "min_role_busy_per_role_pools_active_window": b["per_role_pools"]["min_role_busy_active_window"],
            "ideal_ratio_for_these_costs": b["ideal_per_gpu_ratio"],
            "ideal_ratio_for_these_copies": b["ideal_ratio_for_these_copies"]} for b in report["balance"]},
        "weak_efficiency": {n: weak_eff[n] for n in (4, 8) if n in weak_eff}, "target_weak_efficiency": 0.9,
        "weak_efficiency_active_window": {x["replicas"]: x["efficiency_active_window"] for x in report["weak"]
                                          if x["replicas"] in (4, 8)},
        "ray_call_ms": {d: {k: v["ms_per_call"] for k, v in calls[d].items()} for d in calls},
        "ray_call_ratio_to_empty_at_1MiB": {d: calls[d]["1MiB"]["ratio_to_empty_call"] for d in calls},
        "failed_series": sorted(report["errors"]),
        "target_ray_call_ms_at_1MiB": 5.0,
        "real_models_same_predictions": (report.get("real_models") or {}).get("same_predictions"),
        "loadavg_1min_before_after": [load_before[0], report["machine"]["loadavg_1_5_15_after"][0]]}
    report["seconds"] = time.perf_counter() - t_start
    path = os.path.join(args.output_path, "bench_scale.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    if report["balance"] and report["weak"]:
        plot(report, os.path.join(args.output_path, "bench_scale.png"))
    print(json.dumps(report["targets"], indent=2))
    print(f"wrote {path}" + (" and bench_scale.png" if report["balance"] and report["weak"] else ""))
    return 1 if report["errors"] else 0


def main(argv=None) -> int:
    return run_job(bench, ScaleBenchConfig, argv, prog="python -m jobs.bench.scale", description=__doc__,
                   recipes={"quick": quick})


if __name__ == "__main__":
    sys.exit(main())
