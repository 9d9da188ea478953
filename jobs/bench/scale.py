"""Scaling benchmark on the production path: Ray Data clients, router and grading over simulated agents,
beside a discrete-event model of the same cost table.

What this measures and what it does not: the agents sleep the cost table's times, and the model
(jobs/bench/scale_model.py) prices calls from the same table, so "Ray within x% of the model" measures Ray's
own overhead (control plane, transport, scheduling) over that table, not the model's truth; the pools /
whole ratios are the table's arithmetic (modelled). The table is the paper's (parameters x --ms_per_gparam,
a guess) or, with --costs, fitted from measured times of real agents (jobs/bench/scale_fit.py). The model
itself is checked against real agents in jobs/bench/scale_real.py.

Agents are cost-simulated (`sim:` models, recmas_ray/models/sim.py) inside the SAME agent actors, pools,
orchestrators, router, transport, Ray Data clients and grader as real models: each call's simulated device
time comes from the role's cost table (prefill per row-token, latent steps and decoded tokens with a
batch-size term, rows leaving at their EOS; the paper's light or mixture system, `paper_sim_models`),
the agent sleeps it and logs it apart from the call's host time; messages have the real size
[B, m, hidden]. So two CPU cores host dozens of agents on a simulated cluster of fake GPUs.

Figures (targets in brackets), read in the steady state (`call_logs.steady_window`):
  control      zero-cost agents: agent calls/s one orchestrator sustains, router acquire+release/s
               (jobs/bench/control.py `measure`, on the same cluster)
  balance      the same GPUs (--gpus) as whole-system replicas vs one replica of per-role pools sized from
               the roles' mean device time per batch, for each R in --balance_rounds: throughput per GPU
               [pools >= 1.6x at R = 3], each role's busy fraction by device time [>= 0.75], and the model
               (jobs/bench/scale_model.py) of the same run (its own decode times) [Ray within 3%], devices
               only and with the measured host costs, plus its long-run figures
  dilation     the balance of --dilation_rounds again with every cost x --dilation: the same ratios within
               2%, else the run is host-bound (flagged in the JSON and the summary)
  projection   the model, with the measured control-plane costs, at --project_gpus GPUs of these pools:
               throughput, efficiency, what saturates
  ray_call     (--ray_call) Ray's cost per agent call passing a message on, 0 B / 32 KiB / 1 MiB
  real models  (--real) tiny random-weight models, 1 vs 2 replicas: identical predictions

  python -m jobs.bench.scale                        # simulated 2-node cluster, 30 fake GPUs
  python -m jobs.bench.scale --quick                # fewer batches, R = 1 only, no dilation
  python -m jobs.bench.scale --address HOST:PORT    # on a running cluster (its own GPUs) instead

Writes <output_path>/bench_scale.json and bench_scale.png; the machine's load average is recorded.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import re
import sys
import time

import ray

from jobs.bench.scale_costs import call_costs, plot, real_models, targets
from jobs.bench.call_logs import summarize
from jobs.bench.control import ControlBenchConfig, measure
from jobs.bench.scale_model import dilation_check, expected_role_ms, model_run, pool_caps, project, rel
from jobs.bench.scale_setup import ScaleBenchConfig, paper_plan, paper_roles, quick, start_cluster
from recmas_ray.config.cli import run_job
from recmas_ray.config.placement import PlacementConfig
from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.config.tree import save_config
from recmas_ray.distributed.cluster import check_reachable
from recmas_ray.distributed.launch import start_agents
from recmas_ray.distributed.orchestrator import start_router
from recmas_ray.distributed.role_copies import copies_from_costs
from recmas_ray.distributed.systems import RayReplicas
from recmas_ray.eval.config import StreamConfig
from recmas_ray.eval.stream import CLIENTS_PER_ACTOR, stream_samples
from recmas_ray.models.sim import parse_sim_name


def recursion(rounds: int, args):
    return RecursionConfig(method="recursive_mas", num_recursive_rounds=rounds, latent_steps=args.latent_steps,
                           decode=DecodeConfig(max_new_tokens=args.tokens))


def question_batches(n: int, size: int, tag: str) -> list:
    """(items, rollout) batches as the evaluation driver makes them: graded math questions."""
    return [([{"doc_id": f"{tag}-{k}-{i}", "question": f"{tag} question {k}.{i}: what is {k} + {i}?",
               "gold": "0", "task_type": "math", "benchmark": "bench_scale"} for i in range(size)], 0)
            for k in range(n)]


def sim_params(plan) -> dict:
    return {r: parse_sim_name(m) for r, m in plan.role_models.items()}


def eval_run(replicas, n_replicas: int, n_batches: int, rounds: int, args, tag: str, clients: int = 0) -> dict:
    """`n_batches` through the production evaluation stream (Ray Data clients, router, grading) on the
    first `n_replicas` replicas, `clients` batches in flight per replica (0: the production default).

    Read from the agents' own call logs by `call_logs.summarize` (steady window; busy by device and by
    host time); `depth` is the most batches in flight at once (what the model is given);
    `agent_host_s_per_call` the mean of each call's span minus its device time; `wall_s` adds Ray Data's
    start of the client actors."""
    view = RayReplicas(replicas.plan, replicas.systems[:n_replicas], start_router(n_replicas, timeout_s=args.timeout_s),
                       args.timeout_s)
    view.call_logs(clear=True)
    stream = StreamConfig(num_clients=clients, client_cpus=0.05, batches_per_client=args.batches_per_client)
    t0 = time.time()
    records = list(stream_samples(view, question_batches(n_batches, args.batch_size, tag), "recursive_mas",
                                  recursion(rounds, args), "strict", False, stream, timeout_s=args.timeout_s))
    wall = time.time() - t0
    logs = view.call_logs()
    ray.kill(view.router)
    calls = [c for log in logs for cs in log.values() for c in cs]
    decodes = [c for c in calls if c["method"] == "decode"]
    entries, decode_s = {}, {}  # batch k's first call and its decode's device time (its prompt names "question k.0:")
    for c in calls:
        m = re.search(r" question (\d+)\.0:", c["first_user"])
        if m:
            entries[m.group(1)] = min(entries.get(m.group(1), c["t0"]), c["t0"])
            if c["method"] == "decode":
                decode_s[m.group(1)] = c["device_s"]
    errors = sum(1 for r in records if r.get("error"))
    if errors or len(records) != n_batches * args.batch_size or len(decodes) != n_batches:
        raise RuntimeError(f"{tag}: {errors} errored samples, {len(records)} of {n_batches * args.batch_size} "
                           f"returned, {len(decodes)} of {n_batches} decode calls logged")
    if len(entries) != n_batches or len(decode_s) != n_batches:
        raise RuntimeError(f"{tag}: the call logs name {len(entries)} of {n_batches} batches, "
                           f"{len(decode_s)} of their decodes")
    out = summarize(logs, list(entries.values()))
    ends = [c["t1"] for c in decodes]
    first_end = min(ends)
    # most batches ever in flight at once (entered, not yet decoded): the depth the clients reached, which the
    # first finish may come before (R = 1 batches finish while the last clients still start)
    events = sorted([(t, 1) for t in entries.values()] + [(t, -1) for t in ends])
    in_flight = max(itertools.accumulate(d for _, d in events))
    out.update({"replicas": n_replicas, "rounds": rounds, "batches": n_batches, "wall_s": wall,
                "depth": in_flight, "depth_at_first_finish": sum(1 for t in entries.values() if t < first_end),
                "graded": len(records),
                "decode_device_s_by_entry": [decode_s[k] for k in sorted(entries, key=entries.get)],
                "agent_calls": len(calls),
                "agent_host_s_per_call": sum(c["t1"] - c["t0"] - c["device_s"] for c in calls) / len(calls)})
    return out


def build(plan, copies: dict | None, n: int, args):
    # agents start slowly on a loaded machine (each imports torch): their readiness waits the run's timeout
    placement = PlacementConfig(preset="one_gpu_per_agent", cpus_per_agent=0.05, num_replicas=n,
                                agent_max_restarts=0, role_replicas=copies or {}, ready_timeout_s=args.timeout_s)
    return start_agents(plan, backend="ray", placement=placement, timeout_s=args.timeout_s, torch_threads=1)


def balance(plan, rounds: int, args, control: dict | None) -> dict:
    """Whole-system replicas vs one replica of per-role pools, both on `args.gpus` GPUs, each beside the
    model of the same run (devices only; with the measured host costs) and the model's long run."""
    style, params = plan.style, sim_params(plan)
    roles = list(style.roles)
    n_whole = args.gpus // len(roles)
    costs = expected_role_ms(style, params, rounds, args.latent_steps, args.tokens, args.batch_size)
    copies = copies_from_costs(costs, budget=n_whole * len(roles))
    out = {"rounds": rounds, "role_device_ms_per_batch": costs, "pool_copies": copies, "gpus": n_whole * len(roles),
           **pool_caps(costs, copies, n_whole)}
    n_batches = args.num_batches * n_whole
    kw = dict(rounds=rounds, latent_steps=args.latent_steps, max_new_tokens=args.tokens, batch_size=args.batch_size)
    for name, cps, n in (("whole_system", None, n_whole), ("per_role_pools", copies, 1)):
        layout = [cps or {r: 1 for r in roles}] * n
        reps = build(plan, cps, n, args)
        clients = max(1, (args.num_clients or CLIENTS_PER_ACTOR * out["gpus"]) // n)  # the same in flight in both
        try:
            # both layouts get the same questions, so the same decode lengths (drawn per row from its prompt):
            # the ratio compares schedules on the same work
            run = eval_run(reps, n, n_batches, rounds, args, f"balance-{rounds}", clients)
        finally:
            reps.shutdown()
        depth = max(1, round(run["depth"] / n))
        # the model of the same run: the same decode times, batch by batch in the order they entered
        same_work = dict(num_batches=n_batches, depth=depth, decode_s=run.pop("decode_device_s_by_entry"), **kw)
        model = model_run(style, params, layout, **same_work)
        host = dict(agent_host_s_per_call=run["agent_host_s_per_call"],
                    orchestrator_s_per_call=(control or {}).get("orchestrator_s_per_call", 0.0),
                    router_s_per_batch=(control or {}).get("router_s_per_batch", 0.0))
        with_host = model_run(style, params, layout, **same_work, **host)
        long = model_run(style, params, layout, num_batches=args.model_batches_per_depth * depth * n, depth=depth,
                         **kw)
        earlier = model_run(style, params, layout, num_batches=args.model_batches_per_depth * depth * n,
                            depth=depth, route_when="submitted", **kw)
        keep = ("throughput_batches_per_s", "busy_by_role", "min_role_busy", "steady_s")
        run["model"] = {k: model[k] for k in keep}
        run["model_with_host_costs"] = {k: with_host[k] for k in keep}
        run["model_long_run"] = {k: long[k] for k in keep}
        run["model_long_run_routed_when_submitted"] = {k: earlier[k] for k in keep}  # the earlier build
        run["ray_vs_model"] = rel(run["throughput_batches_per_s"], model["throughput_batches_per_s"])
        run["ray_vs_model_with_host_costs"] = rel(run["throughput_batches_per_s"], with_host["throughput_batches_per_s"])
        run["throughput_per_gpu"] = run["throughput_batches_per_s"] / out["gpus"]
        out[name] = run
        print(json.dumps({name: {k: v for k, v in run.items() if not isinstance(v, dict)}}), flush=True)
    w, p = out["whole_system"], out["per_role_pools"]
    out["per_gpu_ratio"] = p["throughput_batches_per_s"] / w["throughput_batches_per_s"]
    for key in ("model", "model_long_run", "model_long_run_routed_when_submitted"):
        out[f"{key}_per_gpu_ratio"] = p[key]["throughput_batches_per_s"] / w[key]["throughput_batches_per_s"]
    return out


def bench(args: ScaleBenchConfig) -> int:
    """Run the series and write the report (the config is saved next to it)."""
    if args.address:
        check_reachable(args.address)  # a dead address: one line and exit 2 before anything is written
    num_roles = len(paper_roles(args.system))
    if args.gpus < num_roles:
        raise ValueError(f"--gpus {args.gpus}: the {args.system} system needs at least {num_roles}")
    # a whole system that fits one node is placed STRICT_PACK (distributed/placement.py), so GPUs left over on a
    # node hold no system: count the systems each node holds, not its GPUs (27 on 2 x 14 waited forever)
    if not args.address and args.gpus // num_roles > args.nodes * (args.gpus_per_node // num_roles):
        raise ValueError(f"--gpus {args.gpus}: the simulated cluster has {args.nodes} x {args.gpus_per_node} fake GPUs, "
                         f"{args.nodes * (args.gpus_per_node // num_roles)} whole {args.system} systems of {num_roles}; "
                         "expected at most that (or more --nodes / --gpus_per_node)")

    save_config(args, args.output_path)
    t_start = time.perf_counter()
    load_before = list(os.getloadavg())
    cluster = start_cluster(args)
    plan = paper_plan(args)
    report = {"system": args.system, "style": plan.style_name, "models": plan.role_models, "tokens": args.tokens,
              "latent_steps": args.latent_steps, "batch_size": args.batch_size, "num_batches": args.num_batches,
              "ms_per_gparam": args.ms_per_gparam, "costs": args.costs or "paper table (modelled)", "num_clients": args.num_clients or "auto",
              "cluster": ray.cluster_resources(), "balance": [], "dilation": [], "control": None,
              "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                          "loadavg_1_5_15_before": load_before, "ray": ray.__version__}, "errors": {}}

    def series(name, fn):  # a series that fails (a loaded machine's start-up timeout) is recorded, not fatal
        try:
            return fn()
        except RuntimeError as e:
            report["errors"][name] = " ".join(str(e).split())[:500]
            print(f"{name} failed: {report['errors'][name]}", file=sys.stderr, flush=True)
            return None

    try:
        if args.control_batches:
            report["control"] = series("control", lambda: measure(ControlBenchConfig(
                num_batches=args.control_batches, in_flight=min(16, args.control_batches), repeats=1,
                timeout_s=args.timeout_s, bulk_dispatch=False)))  # as its simulated agents run: no bulk calls
        by_rounds = {}
        for r in sorted(set(args.balance_rounds) | set(args.dilation_rounds)):
            by_rounds[r] = series(f"balance_R{r}", lambda: balance(plan, r, args, report["control"]))
            if by_rounds[r] and r in args.balance_rounds:
                report["balance"].append(by_rounds[r])
        for r in args.dilation_rounds:
            dilated = series(f"dilation_R{r}", lambda: balance(paper_plan(args, args.dilation), r, args,
                                                               report["control"]))
            if dilated and by_rounds.get(r):
                report["dilation"].append({**dilation_check(by_rounds[r], dilated, args.dilation,
                                                            args.dilation_tolerance), "dilated_run": dilated})
        if args.ray_call:
            report["ray_call"] = series("ray_call", lambda: call_costs(args)) or {}
        if args.real:
            report["real_models"] = series("real_models", lambda: real_models(args))
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    if report["control"] and report["balance"] and args.project_gpus:
        b = report["balance"][-1]
        pools = b["per_role_pools"]
        report["projection"] = {"rounds": b["rounds"], **project(
            plan.style, sim_params(plan), b["pool_copies"], args.project_gpus,
            depth=max(1, pools["depth"]), batches_per_depth=min(4, args.model_batches_per_depth),
            orchestrator_s_per_call=report["control"]["orchestrator_s_per_call"],
            router_s_per_batch=report["control"]["router_s_per_batch"],
            agent_host_s_per_call=pools["agent_host_s_per_call"], rounds=b["rounds"],
            latent_steps=args.latent_steps, max_new_tokens=args.tokens, batch_size=args.batch_size)}
    report["machine"]["loadavg_1_5_15_after"] = list(os.getloadavg())
    report["targets"] = targets(report, args)
    report["seconds"] = time.perf_counter() - t_start
    path = os.path.join(args.output_path, "bench_scale.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    if report["balance"]:
        plot(report, os.path.join(args.output_path, "bench_scale.png"))
    print(json.dumps(report["targets"], indent=2))
    if report["targets"]["host_bound"]:
        print("HOST-BOUND: the ratios change under cost dilation by more than "
              f"{args.dilation_tolerance:.0%}; the model's figures stand beside the run's", flush=True)
    print(f"wrote {path}" + (" and bench_scale.png" if report["balance"] else ""))
    return 1 if report["errors"] else 0


def main(argv=None) -> int:
    return run_job(bench, ScaleBenchConfig, argv, prog="python -m jobs.bench.scale", description=__doc__,
                   recipes={"quick": quick})


if __name__ == "__main__":
    sys.exit(main())
