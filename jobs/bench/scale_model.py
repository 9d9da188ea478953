"""A discrete-event model of `jobs/bench/scale.py`: the same cost table, routing and closed-loop clients,
without Ray. Pure Python.

What it models, as the production path does it (eval/stream.py, distributed/actors.py RayPool):
  clients   `depth` batches in flight per replica; a client takes the next batch when its last one ends
  router    `routing.ReplicaRouter.acquire(work)`: the replica with the least queued rows x steps
  dispatch  the replica's orchestrator chains every call of the batch's schedule at once (latents travel
            as ObjectRefs); each call is routed once its inputs exist (`routing.Dispatcher`) by
            `routing.RoleGroup.pick` (least queued rows x steps, the batch's previous copy of the role
            within the affinity slack); `route_when="submitted"` models the earlier build, which picked
            every call's copy when the batch was submitted
  copies    one call at a time (one simulated device each); a call starts when its inputs exist and the
            copy is free, the earliest-ready first (out-of-order actors)
  costs     `models.sim.call_device_ms`; decode lengths drawn per row as `models.sim.row_tokens`
Host costs are optional: `orchestrator_s_per_call` (one orchestrator per replica serves its calls'
dispatch one after another; from jobs/bench/control.py), `router_s_per_batch` (one router for all) and
`agent_host_s_per_call` (added to each call on its copy). With them all 0 it models the devices alone.

The call logs it returns have the agents' format, so `summarize` (jobs/bench/call_logs.py) reads a model run and a
Ray run alike: throughput in the steady window (`steady_window`) and busy fractions by host time (the call's span)
and by device time (`device_s`).
"""

from __future__ import annotations

import heapq
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from jobs.bench.call_logs import summarize
from jobs.bench.scale_setup import ScaleBenchConfig, paper_plan
from recmas_ray.config.cli import run_job
from recmas_ray.distributed.role_copies import copies_from_costs
from recmas_ray.distributed.routing import ReplicaRouter, RoleGroup
from recmas_ray.models.sim import call_device_ms, parse_sim_name, row_tokens
from recmas_ray.styles import StyleSpec, build_schedule


@dataclass
class CallPlan:
    """One agent call of a batch's schedule: role, kind (rollout or decode), steps, the calls it reads."""

    role: str
    kind: str
    steps: int
    inputs: list[int]


def batch_calls(style: StyleSpec, rounds: int, latent_steps: int, max_new_tokens: int) -> list[CallPlan]:
    """The calls of one batch in submission order (the runner's walk of `build_schedule`)."""
    calls, producer = [], {}
    for step in build_schedule(style, rounds):
        inputs = sorted({producer[e] for _, e in step.inputs if e in producer})
        if step.decode:
            calls.append(CallPlan(step.role, "decode", max_new_tokens, inputs))
        elif step.outputs:
            calls.append(CallPlan(step.role, "rollout", latent_steps, inputs))
            for e in step.outputs:
                producer[e] = len(calls) - 1
    return calls


def expected_role_ms(style, params: dict, rounds: int, latent_steps: int, max_new_tokens: int, rows: int,
                     *, draws: int = 512) -> dict[str, float]:
    """Each role's mean device ms per batch (decode lengths averaged over `draws` seeded draws)."""
    out = {r: 0.0 for r in style.roles}
    rng = random.Random(0)
    for c in batch_calls(style, rounds, latent_steps, max_new_tokens):
        if c.kind == "decode":
            out[c.role] += sum(call_device_ms(params[c.role], "decode", rows, c.steps,
                                              [row_tokens(params[c.role], c.steps, rng.randrange(2**32))
                                               for _ in range(rows)]) for _ in range(draws)) / draws
        else:
            out[c.role] += call_device_ms(params[c.role], "rollout", rows, c.steps)
    return out


@dataclass
class _Copy:
    name: str
    running: bool = False
    ready: list = field(default_factory=list)  # heap of (ready time, submission seq, call)
    log: list = field(default_factory=list)


@dataclass
class _Call:
    plan: CallPlan
    batch: int
    replica: int
    copy: int = -1
    waiting: int = 0
    inputs_t: float = 0.0
    submitted: bool = False
    device_s: float = 0.0
    dependents: list = field(default_factory=list)


def simulate(style: StyleSpec, params: dict, layout: list[dict[str, int]], *, rounds: int, latent_steps: int,
             max_new_tokens: int, batch_size: int, num_batches: int, depth: int, seed: int = 0,
             orchestrator_s_per_call: float = 0.0, router_s_per_batch: float = 0.0,
             agent_host_s_per_call: float = 0.0, route_when: str = "ready", num_orchestrators: int = 0,
             decode_s: Sequence[float] | None = None, shared_devices: float = 0.0, other_load: float = 0.0) -> dict:
    """Run `num_batches` through `layout` (one dict of copies per role per replica) with `depth` batches in
    flight per replica; returns {"logs": per replica {ROLE#K: calls}, "batches": {id: (entry, end)}}.
    `route_when`: "ready" (as built: a call is routed when its inputs exist) or "submitted" (the earlier build:
    every call of a batch routed when the batch starts, counting work that cannot run yet).
    `num_orchestrators`: 0, one per replica (as built); n, the replicas share n (replica i uses i mod n).
    `decode_s`: the k-th batch admitted decodes for decode_s[k] seconds (a Ray run's own, so the model of a
    run has the same work), instead of drawing its rows' lengths.
    `shared_devices`: 0, every copy its own device (GPUs); c > 0, all copies share c processors (agents on one
    host's CPU cores): n calls running at once each progress at min(1, c / (other_load + n)) of their speed,
    `other_load` being the other runnable processes the host's scheduler shares the cores with fairly."""
    if route_when not in ("submitted", "ready"):
        raise ValueError(f"route_when={route_when!r}; expected submitted or ready")
    if decode_s is not None and len(decode_s) < num_batches:
        raise ValueError(f"decode_s has {len(decode_s)} times; expected one per batch ({num_batches})")
    plan = batch_calls(style, rounds, latent_steps, max_new_tokens)
    work = float(sum(batch_size * c.steps for c in plan))
    router = ReplicaRouter(len(layout), clock=lambda: now)
    groups = [{r: RoleGroup(r, [_Copy(f"{r}#{k}") for k in range(n)]) for r, n in rep.items()} for rep in layout]
    rng = random.Random(seed)
    events, seq = [], 0
    orchestrator_of = [i % num_orchestrators if num_orchestrators else i for i in range(len(layout))]
    orchestrator_free = [0.0] * len(layout)
    router_free = 0.0
    leases, batches, next_batch = {}, {}, 0
    now = 0.0

    def push(t, kind, payload):
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, payload))

    running, shared = {}, {"t": 0.0, "version": 0}  # shared_devices: call -> [work left (s), copy, t0]

    def share(n: int) -> float:  # each running call's speed under processor sharing
        return min(1.0, shared_devices / (other_load + n)) if n else 1.0

    def advance(t: float):  # processor sharing: every running call progresses at the shared rate
        rate = share(len(running))
        for entry in running.values():
            entry[0] -= (t - shared["t"]) * rate
        shared["t"] = t

    def reschedule(t: float):  # the next finish under sharing (earlier predictions are superseded)
        shared["version"] += 1
        if running:
            rate = share(len(running))
            push(t + max(0.0, min(e[0] for e in running.values())) / rate, "shared_finish", shared["version"])

    def try_start(copy: _Copy, t: float):
        if copy.running or not copy.ready:
            return
        _, _, call = heapq.heappop(copy.ready)
        copy.running = True
        if shared_devices > 0:
            advance(t)
            running[id(call)] = [call.device_s + agent_host_s_per_call, copy, call, t]
            reschedule(t)
        else:
            push(t + call.device_s + agent_host_s_per_call, "finish", (copy, call, t))

    def mark_ready(call: _Call, t: float):
        group = groups[call.replica][call.plan.role]
        if call.copy < 0:
            call.copy = group.pick(batch_size * call.plan.steps, affinity=str(call.batch))
        copy = group.copies[call.copy]
        nonlocal seq
        seq += 1
        heapq.heappush(copy.ready, (max(t, call.inputs_t), seq, call))
        try_start(copy, t)

    def start_batch(t: float):
        nonlocal next_batch, router_free
        if next_batch >= num_batches:
            return
        b, next_batch = next_batch, next_batch + 1
        router_free = max(router_free, t) + router_s_per_batch
        push(router_free, "admit", b)

    def finish(copy: _Copy, c: _Call, t0: float):
        copy.running = False
        group = groups[c.replica][c.plan.role]
        group.done(c.copy, batch_size * c.plan.steps)
        copy.log.append({"method": c.plan.kind, "t0": t0, "t1": now, "device_s": c.device_s,
                         "batch": c.batch, "batch_size": batch_size})
        entry = batches[c.batch]
        entry[0] = t0 if entry[0] is None else min(entry[0], t0)
        for d in c.dependents:
            d.waiting -= 1
            d.inputs_t = max(d.inputs_t, now)
            if d.waiting == 0 and d.submitted:
                mark_ready(d, now)
        if c.plan.kind == "decode":
            entry[1] = now
            router.release(leases.pop(c.batch)[1])
            for g in groups[c.replica].values():
                g.forget(str(c.batch))
            start_batch(now)
        try_start(copy, now)

    for _ in range(depth * len(layout)):
        start_batch(0.0)
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "admit":
            b = payload
            replica, lease = router.acquire(work)
            leases[b], batches[b] = (replica, lease), [None, None]
            calls = [_Call(c, b, replica) for c in plan]
            for i, c in enumerate(calls):
                c.waiting = len(c.plan.inputs)
                for j in c.plan.inputs:
                    calls[j].dependents.append(c)
                if c.plan.kind == "decode" and decode_s is not None:
                    c.device_s = decode_s[b]
                elif c.plan.kind == "decode":
                    counts = [row_tokens(params[c.plan.role], c.plan.steps, rng.randrange(2**32))
                              for _ in range(batch_size)]
                    c.device_s = call_device_ms(params[c.plan.role], "decode", batch_size, max(counts), counts) / 1e3
                else:
                    c.device_s = call_device_ms(params[c.plan.role], "rollout", batch_size, c.plan.steps) / 1e3
                o = orchestrator_of[replica]
                orchestrator_free[o] = max(orchestrator_free[o], now) + orchestrator_s_per_call
                push(orchestrator_free[o], "submit", c)
        elif kind == "submit":
            c = payload
            if route_when == "submitted":
                c.copy = groups[c.replica][c.plan.role].pick(batch_size * c.plan.steps, affinity=str(c.batch))
            c.submitted = True
            if c.waiting == 0:
                mark_ready(c, now)
        elif kind == "shared_finish":
            if payload != shared["version"]:
                continue
            advance(now)
            for key in [k for k, e in running.items() if e[0] <= 1e-9]:
                _, copy, c, t0 = running.pop(key)
                finish(copy, c, t0)
            reschedule(now)
        elif kind == "finish":
            finish(*payload)
    logs = [{cp.name: cp.log for g in rep.values() for cp in g.copies} for rep in groups]
    return {"logs": logs, "batches": {b: tuple(v) for b, v in batches.items()}}


def rel(a: float, b: float) -> float:
    """a / b - 1."""
    return a / b - 1.0 if b else float("inf")


def dilation_check(base: dict, dilated: dict, factor: float, tolerance: float) -> dict:
    """The same balance at costs x 1 and x `factor`: a device-bound run keeps its ratios (throughput x cost
    scale, pools / whole, each layout's lowest busy); a change beyond `tolerance` means the host sets the pace."""
    ratios = {"per_gpu_ratio": (base["per_gpu_ratio"], dilated["per_gpu_ratio"])}
    for name in ("whole_system", "per_role_pools"):
        ratios[f"{name}_throughput_x_cost_scale"] = (base[name]["throughput_batches_per_s"],
                                                     dilated[name]["throughput_batches_per_s"] * factor)
        ratios[f"{name}_min_role_busy"] = (base[name]["min_role_busy"], dilated[name]["min_role_busy"])
    change = {k: abs(rel(b, a)) for k, (a, b) in ratios.items()}
    return {"rounds": base["rounds"], "factor": factor, "values": ratios, "relative_change": change,
            "largest_change": max(change.values()), "tolerance": tolerance,
            "host_bound": max(change.values()) > tolerance}


def model_run(style, params, layout, **kw) -> dict:
    """`simulate` then `summarize`."""
    sim = simulate(style, params, layout, **kw)
    return summarize(sim["logs"], [e for e, _ in sim["batches"].values()])


def project(style, params, copies: dict[str, int], gpus_list: list[int], *, depth: int, batches_per_depth: int,
            orchestrator_s_per_call: float, router_s_per_batch: float, agent_host_s_per_call: float,
            **kw) -> dict:
    """Throughput and efficiency of G GPUs as G / (GPUs of `copies`) replicas of these pools, with the
    measured control-plane costs: one orchestrator per replica (as built) and one for all. Efficiency is
    throughput / (replicas x one replica's with the same host costs); `bound` names what saturates
    (the share of its time the devices, the busiest orchestrator or the router are busy). `saturates_at_gpus`:
    where the router (orchestrator per replica) or the one orchestrator is busy all the time at one
    replica's throughput per replica."""
    per_replica = sum(copies.values())
    host = dict(orchestrator_s_per_call=orchestrator_s_per_call, router_s_per_batch=router_s_per_batch,
                agent_host_s_per_call=agent_host_s_per_call)
    calls_per_batch = len(batch_calls(style, kw["rounds"], kw["latent_steps"], kw["max_new_tokens"]))
    one = model_run(style, params, [copies], depth=depth, num_batches=batches_per_depth * depth, **kw, **host)
    rows = []
    for gpus in gpus_list:
        n = max(1, gpus // per_replica)
        row = {"gpus": gpus, "replicas": n, "gpus_used": n * per_replica}
        for name, orchestrators in (("orchestrator_per_replica", 0), ("one_orchestrator", 1)):
            run = model_run(style, params, [copies] * n, depth=depth, num_batches=batches_per_depth * depth * n,
                            num_orchestrators=orchestrators, **kw, **host)
            x = run["throughput_batches_per_s"]
            load = {"devices": max(run["busy_by_role"].values()),
                    "orchestrator": x / (1 if orchestrators else n) * calls_per_batch * orchestrator_s_per_call,
                    "router": x * router_s_per_batch}
            row[name] = {"throughput_batches_per_s": x, "efficiency": x / (n * one["throughput_batches_per_s"]),
                         "min_role_busy": run["min_role_busy"], "load": load,
                         "bound": max(load, key=load.get)}
        rows.append(row)
    x1 = one["throughput_batches_per_s"]
    return {"one_replica_batches_per_s": x1, "calls_per_batch": calls_per_batch, "gpus_per_replica": per_replica,
            "rows": rows, "saturates_at_gpus": {
                "orchestrator_per_replica": per_replica / max(x1 * router_s_per_batch, 1e-12),
                "one_orchestrator": per_replica / max(x1 * calls_per_batch * orchestrator_s_per_call, 1e-12)}}


def pool_caps(costs: dict[str, float], copies: dict[str, int], n_whole: int) -> dict[str, float]:
    """The best pools / whole-system ratio per GPU a perfect scheduler gets: from any split of the GPUs
    (every GPU busy, against whole systems paced by their slowest role) and from these whole `copies` (the
    slowest role per copy), given each role's device time per batch (`costs`) and `n_whole` whole systems."""
    slowest = max(costs.values())
    return {"ideal_per_gpu_ratio": slowest * len(costs) / sum(costs.values()),
            "ideal_ratio_for_these_copies": min(copies[r] / costs[r] for r in costs) * slowest / n_whole}


def model_balance(args) -> list[dict]:
    """The balance series of `jobs.bench.scale` (a ScaleBenchConfig) in the model alone: whole-system replicas
    vs per-role pools at the production depth (two batches per agent actor) and twice it, routed when ready (as
    built) and at submission (the earlier build), long runs (`model_batches_per_depth`)."""
    plan = paper_plan(args)
    style, params = plan.style, {r: parse_sim_name(m) for r, m in plan.role_models.items()}
    roles, rows = list(style.roles), []
    n_whole = args.gpus // len(roles)
    for rounds in args.balance_rounds:
        kw = dict(rounds=rounds, latent_steps=args.latent_steps, max_new_tokens=args.tokens, batch_size=args.batch_size)
        costs = expected_role_ms(style, params, rounds, args.latent_steps, args.tokens, args.batch_size)
        copies = copies_from_costs(costs, budget=n_whole * len(roles))
        depth = 2 * len(roles)
        whole = model_run(style, params, [{r: 1 for r in roles}] * n_whole, depth=depth,
                          num_batches=args.model_batches_per_depth * depth * n_whole, **kw)
        row = {"rounds": rounds, "pool_copies": copies, "whole_system_busy": whole["busy_by_role"],
               **pool_caps(costs, copies, n_whole)}
        for depth_name, pool_depth in (("depth_2_per_actor", 2 * n_whole * len(roles)),
                                       ("depth_4_per_actor", 4 * n_whole * len(roles))):
            for when in ("ready", "submitted"):
                pools = model_run(style, params, [copies], depth=pool_depth, route_when=when,
                                  num_batches=args.model_batches_per_depth * pool_depth, **kw)
                row[f"{depth_name}_routed_when_{when}"] = {
                    "per_gpu_ratio": pools["throughput_batches_per_s"] / whole["throughput_batches_per_s"],
                    "busy_by_role": pools["busy_by_role"]}
        rows.append(row)
    return rows


def main(argv=None) -> int:
    """python -m jobs.bench.scale_model [scale flags]: the balance in the model alone, as JSON."""
    return run_job(lambda a: print(json.dumps(model_balance(a), indent=1)) or 0, ScaleBenchConfig, argv,
                   prog="python -m jobs.bench.scale_model", description=model_balance.__doc__)


if __name__ == "__main__":
    import sys

    sys.exit(main())
