"""How running Ray systems are built and awaited: one replica's placement group, agent actors and orchestrator
(`RaySystem`), a set of replicas with their router (`RayReplicas`; both in systems.py).

    job entrypoint (jobs/run.py)
        | build_replicas(plan, placement)        check resources for N replicas, then per replica:
        |   build_ray_system(...)                create PG (STRICT_PACK when it fits a node), actors, ready()
        |   router actor (routing.ReplicaRouter)  replica with the least queued work per batch (leases)
        v
    Orchestrator actor, one per replica (num_cpus=1, threaded: several batches in flight)
        | run_batch(RayPool(role groups), ...)   the same runner and schedule as in-process; each call,
        |                                        once its inputs exist, to the copy of its role with the
        |                                        least queued work
        v
    planner.rollout ──ref──> critic.rollout ──ref──> solver.decode          (sequential, one round)
        ^                                               |
        └──────────── solver->planner message ref ──────┘ (rounds > 1)

    Latent messages go producer -> consumer as the transport moves them (`distributed.transports`; by default
    detached CPU tensors passed on as ObjectRefs through the object store), never through the orchestrator.
    The orchestrator only materialises small stats and texts. Several `solve` calls run at once
    (max_concurrency), so different agents work on different batches at the same time; agent actors
    execute one call at a time, out of order: whichever submitted call has its inputs first.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from recmas_ray.config.extensions import extension_modules
from recmas_ray.config.placement import PlacementConfig
from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.config.transport import OBJECT_STORE, Transport
from recmas_ray.distributed.actors import AGENT_EXIT_AFTER, agent_actor
from recmas_ray.distributed.orchestrator import Orchestrator, start_router
from recmas_ray.distributed.placement import (ORCHESTRATOR_CPUS, ORCHESTRATOR_MAX_BATCHES, check_resources,
                                              create_placement, detect_autoscaling, gpu_count, plan_placement,
                                              resolve_num_replicas)
from recmas_ray.distributed.progress import start_relay
from recmas_ray.distributed.role_copies import role_copies
from recmas_ray.distributed.systems import RayReplicas, RaySystem
from recmas_ray.distributed.transports import LatentTransport, latent_transport
from recmas_ray.system.plan import SystemPlan

log = logging.getLogger(__name__)

AGENT_MAX_CALLS = 256
"""Calls an agent actor with continuous batching takes at once (each waits on its scheduler's steps)."""


def actor_options(transport: str | Transport | LatentTransport, max_restarts: int, *,
                  out_of_order: bool = True) -> dict:
    """Ray options of agent actors: out-of-order execution, and restarts with retries of their
    idempotent calls (not where the transport keeps latents in the agents: a restart loses them)."""
    restarts = latent_transport(transport).config.actor_restarts(max_restarts)
    return {"allow_out_of_order_execution": out_of_order, "max_restarts": restarts, "max_task_retries": restarts}


def build_ray_system(plan: SystemPlan, placement: PlacementConfig, *, timeout_s: float = 600.0,
                     torch_threads: int = 0, transport: str | Transport | LatentTransport = OBJECT_STORE,
                     replica: int = 0,
                     num_replicas: int = 1, autoscaling: bool | None = None, out_of_order: bool = True,
                     extra_env: dict | None = None, copies: dict[str, int] | None = None) -> RaySystem:
    """Create one replica: its placement group, one actor per role, await `ready()`, then the orchestrator.

    `transport` moves latents through the object store (default) or by Ray Direct Transport
    (gloo on CPUs, NCCL on GPUs; alpha in Ray 2.60), point to point between agents (`config.transport`).
    `num_replicas` is the size of the whole request, checked against the cluster up front.
    """
    system = start_system(plan, placement, timeout_s=timeout_s, torch_threads=torch_threads, transport=transport,
                          replica=replica, num_replicas=num_replicas, autoscaling=autoscaling,
                          out_of_order=out_of_order, extra_env=extra_env, copies=copies)
    return await_system(system, placement, transport=transport)


def start_system(plan: SystemPlan, placement: PlacementConfig, *, timeout_s: float, torch_threads: int,
                 transport: str | Transport | LatentTransport, replica: int, num_replicas: int,
                 autoscaling: bool | None, out_of_order: bool,
                 extra_env: dict | None, copies: dict[str, int] | None = None,
                 bulk_dispatch: bool | None = None) -> RaySystem:
    """First half of `build_ray_system`: placement group and agent actors, not yet awaited (so the
    agents of several replicas load their models at the same time). `bulk_dispatch`: see `build_replicas`."""
    transport = latent_transport(transport)
    actor_cls = agent_actor(transport)
    roles = list(plan.style.roles)
    transport.config.check_placement(placement, roles)
    transport.config.check_installed()
    pplan = plan_placement(placement, roles, copies)
    scaling = detect_autoscaling() if autoscaling is None else autoscaling
    pg = create_placement(pplan, preset=placement.preset, timeout_s=placement.ready_timeout_s, autoscaling=scaling,
                          placement_timeout_s=placement.placement_timeout_s, num_replicas=num_replicas,
                          name=f"recmas-replica{replica}-{os.urandom(4).hex()}")  # unique: Serve replicas build one each
    # No runtime_env unless the caller adds variables: the agents then start in Ray's prestarted workers
    # (AGENT_ENV is set in the actor; torch_threads by torch.set_num_threads there).
    env = {"runtime_env": {"env_vars": dict(extra_env)}} if extra_env else {}
    opts = actor_options(transport, placement.agent_max_restarts, out_of_order=out_of_order)
    batching = {r: plan.service_args(r)[0].continuous_batching for r in roles}
    bulk = frozenset(r for r in roles if (batching[r] if bulk_dispatch is None else bulk_dispatch))
    system = RaySystem(plan, {}, None, pg, {}, timeout_s, replica, bulk_roles=bulk,
                       serial_roles=frozenset(r for r in bulk if not batching[r]), transport=transport)
    try:
        for role in roles:
            spec, inner, outer = plan.service_args(role)
            spec = dataclasses.replace(spec, num_devices=gpu_count(pplan.gpus[role]),
                                       keep_messages_on_device=transport.keeps_on_device)
            inner, outer = ray.put(inner), ray.put(outer)
            system.arg_refs += [inner, outer]
            system.copies[role] = []
            for bundle in pplan.copy_bundles[role]:
                strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle)
                system.copies[role].append(actor_cls.options(
                    num_cpus=pplan.cpus[role], num_gpus=pplan.gpus[role], scheduling_strategy=strategy,
                    name=None, **env, **opts,
                    # continuous batching: calls of several batches run at once, their steps merged
                    **({"max_concurrency": AGENT_MAX_CALLS} if batching[role] else {}),
                ).remote(spec, inner, outer, torch_threads, AGENT_EXIT_AFTER.get(role), transport.config))
            system.handles[role] = system.copies[role][0]
    except BaseException:
        system.shutdown()
        raise
    return system


def await_system(system: RaySystem, placement: PlacementConfig, *,
                 transport: str | Transport | LatentTransport) -> RaySystem:
    """Second half of `build_ray_system`: the orchestrator started while the agents load (after them where the
    transport's collective group needs them up), every agent's `ready()` (with the timeout), the orchestrator's."""
    if not latent_transport(transport).orchestrator_after_agents:
        start_orchestrator(system, placement, transport=transport)
    await_agents(system, placement)
    return await_orchestrator(system, placement, transport=transport)


def await_agents(system: RaySystem, placement: PlacementConfig) -> RaySystem:
    """Wait for every agent actor's `ready()` (models loaded), within `placement.ready_timeout_s`."""
    plan, replica = system.plan, system.replica
    try:
        refs = {name: h.ready.remote() for name, h in system.actors().items()}
        ray.wait(list(refs.values()), num_returns=len(refs), timeout=placement.ready_timeout_s)
        for role, ref in refs.items():
            try:
                system.infos[role] = ray.get(ref, timeout=1.0)
            except Exception as e:
                model = plan.role_models[role.split("#")[0]]
                raise RuntimeError(f"agent {role} ({model}) of replica {replica} failed to start "
                                   f"within {placement.ready_timeout_s:g}s: {e}") from e
            log.info("agent ready (replica %d): %s", replica, system.infos[role])
    except BaseException:
        system.shutdown()
        raise
    return system


def start_orchestrator(system: RaySystem, placement: PlacementConfig, *,
                       transport: str | Transport | LatentTransport) -> None:
    """Create the replica's orchestrator actor over its agents' handles (not awaited; once)."""
    if system.orchestrator is not None:
        return
    transport = latent_transport(transport)
    # The orchestrator sits in no bundle: it may land on any node with a free CPU.
    restarts = actor_options(transport, placement.agent_max_restarts)["max_restarts"]
    system.orchestrator = Orchestrator.options(max_restarts=restarts, max_concurrency=system.max_batches).remote(
        system.plan.style, system.copies or system.handles, system.timeout_s, transport.config, system.bulk_roles,
        system.serial_roles, extension_modules())


def await_orchestrator(system: RaySystem, placement: PlacementConfig, *,
                       transport: str | Transport | LatentTransport) -> RaySystem:
    """Start the replica's orchestrator if it is not yet, and wait until it answers."""
    replica = system.replica
    try:
        start_orchestrator(system, placement, transport=transport)
        if not ray.wait([system.orchestrator.ready.remote()], timeout=placement.ready_timeout_s)[0]:
            raise RuntimeError(f"orchestrator actor of replica {replica} ({ORCHESTRATOR_CPUS:g} CPU) not scheduled "
                               f"after {placement.ready_timeout_s:g}s; available resources: {ray.available_resources()}")
    except BaseException:
        system.shutdown()
        raise
    return system


def build_replicas(plan: SystemPlan, placement: PlacementConfig, *, timeout_s: float = 600.0,
                   torch_threads: int = 0, transport: str | Transport | LatentTransport = OBJECT_STORE,
                   client_cpus: float = 0.0,
                   out_of_order: bool = True, extra_env: dict | None = None,
                   recursion: RecursionConfig | None = None, max_batches: int = 0,
                   progress_relay: bool = False, bulk_dispatch: bool | None = None) -> RayReplicas:
    """`placement.num_replicas` independent systems (0: as many as fit) and their router.

    On a cluster that cannot grow, the whole request is checked before any actor starts, so a
    shortfall fails at once naming it; `client_cpus` per replica are kept free for its clients
    when counting how many replicas fit (auto); `max_batches`: batches each replica's orchestrator must run
    at once (its threads; at least `ORCHESTRATOR_MAX_BATCHES`); `progress_relay`: start the relay per-question
    progress bars read (`RayReplicas.progress_relay`), with the agents; `bulk_dispatch`: whether the aligned calls
    of several batches to one agent copy leave as one Ray call (`distributed.bulk`): None (default) for the roles
    with continuous batching (their rows merge anyway), True for every role (agents without it then run a bulk
    call's batches one after another and return them together), False for none.
    """
    roles = list(plan.style.roles)
    copies = role_copies(plan, placement, recursion)
    pplan = plan_placement(placement, roles, copies)
    n = resolve_num_replicas(placement, pplan, client_cpus=client_cpus)
    scaling = detect_autoscaling() if placement.autoscaling is None else placement.autoscaling
    if not scaling:
        nodes = [nd["Resources"] for nd in ray.nodes() if nd.get("Alive")]
        check_resources(pplan, ray.cluster_resources(), nodes, preset=placement.preset, num_replicas=n)
    systems: list[RaySystem] = []
    relay = start_relay() if progress_relay else None  # no CPU: its process starts while the agents load
    router = None
    try:
        for i in range(n):  # every replica's agents load their models at once, then all are awaited
            systems.append(start_system(plan, placement, timeout_s=timeout_s, torch_threads=torch_threads,
                                        transport=transport, replica=i, num_replicas=1, autoscaling=scaling,
                                        out_of_order=out_of_order, extra_env=extra_env, copies=copies,
                                        bulk_dispatch=bulk_dispatch))
            systems[-1].max_batches = max(ORCHESTRATOR_MAX_BATCHES, int(max_batches))
        router = start_router(n, timeout_s=timeout_s)  # it and the orchestrators start while the agents load
        if not latent_transport(transport).orchestrator_after_agents:
            for system in systems:
                start_orchestrator(system, placement, transport=transport)
        for system in systems:
            await_system(system, placement, transport=transport)
    except BaseException:
        for s in systems:
            s.shutdown()
        for actor in (router, relay):
            if actor is not None:
                ray.kill(actor)
        raise
    return RayReplicas(plan, systems, router, timeout_s, progress_relay=relay,
                       placement={"num_replicas": n, "autoscaling": scaling, "role_copies": copies})


def as_replicas(system) -> RayReplicas:
    """A RayReplicas view of a single RaySystem (one replica, its own router)."""
    if isinstance(system, RayReplicas):
        return system
    return RayReplicas(system.plan, [system], start_router(1, timeout_s=system.timeout_s), system.timeout_s)

