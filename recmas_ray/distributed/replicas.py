"""Running Ray systems: one replica's placement group, agent actors and orchestrator (`RaySystem`), a set of
replicas with their router (`RayReplicas`), and how they are built and awaited.

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

    Latent messages are returned by agents as detached CPU tensors and passed on as ObjectRefs, so
    they go producer -> consumer through the object store and never through the orchestrator.
    The orchestrator only materialises small stats and texts. Several `solve` calls run at once
    (max_concurrency), so different agents work on different batches at the same time; agent actors
    execute one call at a time, out of order: whichever submitted call has its inputs first.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from dataclasses import dataclass, field

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from recmas_ray.config.placement import PlacementConfig
from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.config.transport import OBJECT_STORE, Transport, get_transport
from recmas_ray.distributed.actors import AGENT_EXIT_AFTER, AgentActor, RDTAgentActor
from recmas_ray.distributed.ray_pool import RayPool, soon, when_done
from recmas_ray.distributed.orchestrator import Orchestrator, start_router
from recmas_ray.distributed.role_copies import role_copies
from recmas_ray.distributed.progress import start_relay
from recmas_ray.distributed.routing import LeaseKeeper, batch_work
from recmas_ray.distributed.placement import (ORCHESTRATOR_CPUS, ORCHESTRATOR_MAX_BATCHES, check_resources,
                                              create_placement, detect_autoscaling, gpu_count, plan_placement,
                                              resolve_num_replicas)
from recmas_ray.system.plan import SystemPlan

log = logging.getLogger(__name__)

AGENT_MAX_CALLS = 256
"""Calls an agent actor with continuous batching takes at once (each waits on its scheduler's steps)."""


@dataclass
class RaySystem:
    """Handles of one running replica; `shutdown()` releases actors and the placement group."""

    plan: SystemPlan
    handles: dict
    orchestrator: object
    placement_group: object
    infos: dict
    timeout_s: float
    replica: int = 0
    max_batches: int = ORCHESTRATOR_MAX_BATCHES
    """Batches its orchestrator runs at once."""
    copies: dict = field(default_factory=dict)
    """role -> every actor copy of the role (`handles[role]` is the first)."""
    bulk_roles: frozenset = frozenset()
    """Roles whose aligned calls of several batches leave the orchestrator as one Ray call (`distributed.bulk`)."""
    serial_roles: frozenset = frozenset()
    """Bulk roles whose agents run one call at a time (no continuous batching): their calls also wait while the
    copy has `bulk.SERIAL_WINDOW` bulk calls outstanding, and leave together (`RayPool`)."""
    arg_refs: list = field(default_factory=list)
    """Object-store copies of the agents' constructor arguments, kept so a restarted agent can
    rebuild itself (Ray frees creation arguments otherwise, ray#53727)."""

    def solve(self, questions, tasks, cfg: RecursionConfig, batch_id: str = "", **run_options):
        """Submit one batch; returns an ObjectRef of list[SampleResult] (`run_options`: see `run_batch`)."""
        return self.orchestrator.solve.remote(questions, tasks, cfg, batch_id, **run_options)

    def pool(self) -> RayPool:
        """A `pool.AgentPool` over this replica's agents (every copy, routed per call), for runs driven here."""
        return RayPool(self.copies or self.handles, timeout_s=self.timeout_s)

    def call_logs(self, clear: bool = False) -> dict[str, list[dict]]:
        """Each agent's own call log (method, first prompt, slots, start and end times)."""
        actors = self.actors()
        logs = ray.get([h.call_log.remote(clear) for h in actors.values()], timeout=self.timeout_s)
        return dict(zip(actors, logs))

    def actors(self) -> dict:
        """Every agent actor by name: the role for its first copy, ROLE#K for copy K > 0."""
        copies = self.copies or {r: [h] for r, h in self.handles.items()}
        return {(r if k == 0 else f"{r}#{k}"): h for r, hs in copies.items() for k, h in enumerate(hs)}

    def shutdown(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for h in [*self.handles.values(), *(h for hs in self.copies.values() for h in hs), self.orchestrator]:
            try:
                if h is not None:
                    ray.kill(h, no_restart=True)
            except Exception:  # already dead: nothing to release
                pass
        try:
            remove_placement_group(self.placement_group)
        except Exception:
            pass


@dataclass
class RayReplicas:
    """N independent replicas of one system plus the router actor that spreads batches over them.

    Every way in uses the same router: `solve` (the Python API, Serve, benchmarks through `solve_all`)
    and the evaluation clients (`eval.stream`) ask it for the replica with the least queued work.
    """

    plan: SystemPlan
    systems: list[RaySystem]
    router: object
    timeout_s: float
    placement: dict = field(default_factory=dict)
    progress_relay: object = None
    """Where final decodes report their stopped rows (`distributed.progress`), started with the agents so that
    it is up before the first batch (None: each progress bar starts its own)."""
    _running: dict = field(default_factory=dict, repr=False)
    """ObjectRef of a submitted batch -> (replica, batch id), until it finishes."""
    _releases: list = field(default_factory=list, repr=False)
    """Leases of finished batches not yet handed back to the router (`_finished`)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _keeper: LeaseKeeper | None = field(default=None, repr=False)
    """Renews the router leases of this client's running batches (`routing.LeaseKeeper`), made on first use."""

    @property
    def lease_keeper(self) -> LeaseKeeper:
        with self._lock:
            if self._keeper is None:
                router = self.router
                self._keeper = LeaseKeeper(lambda leases: router.renew_many.remote(leases))
            return self._keeper

    @property
    def num_replicas(self) -> int:
        return len(self.systems)

    def solve(self, questions: list[str], tasks: list[str], cfg: RecursionConfig, batch_id: str = "", *,
              replicas: int | None = None, **run_options):
        """Submit one batch to the replica the router names (among the first `replicas`); returns an
        ObjectRef of list[SampleResult]. The router's lease is released when the batch finishes."""
        return self.submit([(questions, tasks, batch_id)], cfg, replicas=replicas, **run_options)[0]

    def submit(self, batches: list[tuple[list[str], list[str], str]], cfg: RecursionConfig, *,
               replicas: int | None = None, **run_options) -> list:
        """`solve` for several (questions, tasks, batch id) at once: their leases are asked of the router in one
        call, so batches freed together also reach their orchestrators together; leases of batches that finish
        together go back in one call too."""
        works = [batch_work(self.plan.style, cfg, len(qs)) for qs, _, _ in batches]
        leases = ray.get(self.router.acquire_many.remote(works, replicas), timeout=self.timeout_s)
        refs: list = []
        for n, ((questions, tasks, batch_id), (replica, lease)) in enumerate(zip(batches, leases)):
            bid = batch_id or f"api-{os.urandom(6).hex()}"
            try:
                ref = self.systems[replica].orchestrator.solve.remote(questions, tasks, cfg, bid, **run_options)
            except BaseException:
                self.router.release_many.remote([unsent for _, unsent in leases[n:]])
                raise
            with self._lock:
                self._running[ref] = (replica, bid)
            self.lease_keeper.hold(lease)
            when_done(ref, self._finished(ref, lease))
            refs.append(ref)
        return refs

    def _finished(self, ref, lease):
        def finished(_):
            self.lease_keeper.drop(lease)
            with self._lock:
                self._running.pop(ref, None)
                self._releases.append(lease)
                first = len(self._releases) == 1
            if first:  # one router call for every batch whose completion is queued now (`soon` runs after them)
                soon(self._release)
        return finished

    def _release(self) -> None:
        with self._lock:
            leases, self._releases = self._releases, []
        if leases:
            self.router.release_many.remote(leases)

    def replica_of(self, ref) -> int | None:
        """The replica running a batch `solve` returned (None once it finished)."""
        with self._lock:
            return self._running.get(ref, (None, None))[0]

    def cancel(self, ref) -> None:
        """Stop a batch `solve` returned (e.g. after a timeout): its queued agent calls never run."""
        with self._lock:
            replica, bid = self._running.get(ref, (None, None))
        if replica is not None:
            self.systems[replica].orchestrator.cancel.remote(bid)
        ray.cancel(ref)

    def solve_all(self, batches: list[tuple[list[str], list[str]]], cfg: RecursionConfig, *,
                  in_flight_per_replica: int = 2, replicas: int | None = None) -> list[tuple[int, list]]:
        """Run question batches on the first `replicas` replicas through the router, keeping
        `in_flight_per_replica` batches in flight per replica; returns (replica, results) in input order."""
        n = min(replicas or len(self.systems), len(self.systems))
        pending: dict = {}
        out: list = [None] * len(batches)
        todo = list(enumerate(batches))[::-1]  # popped from the end: input order
        while todo or pending:
            room = in_flight_per_replica * n - len(pending)
            if todo and room > 0:  # every freed slot refilled at once (their leases in one round trip)
                take = [todo.pop() for _ in range(min(room, len(todo)))]
                refs = self.submit([(qs, ts, f"b{k}-{os.urandom(3).hex()}") for k, (qs, ts) in take], cfg,
                                   replicas=n)
                for (k, _), ref in zip(take, refs):
                    pending[ref] = (k, self.replica_of(ref))
            done, rest = ray.wait(list(pending), num_returns=1, timeout=self.timeout_s)
            if not done:
                for ref in pending:
                    self.cancel(ref)
                raise RuntimeError(f"no batch finished within {self.timeout_s:g}s")
            if rest:  # every batch that finished by now, not just the first
                done += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
            for ref in done:
                k, i = pending.pop(ref)
                out[k] = (i, ray.get(ref, timeout=self.timeout_s))
        return out

    def pool(self, replica: int = 0) -> RayPool:
        """A `pool.AgentPool` over one replica's agents, for runs driven in this process."""
        return self.systems[replica].pool()

    def call_logs(self, clear: bool = False) -> list[dict[str, list[dict]]]:
        return [s.call_logs(clear) for s in self.systems]

    def shutdown(self) -> None:
        for s in self.systems:
            s.shutdown()
        for actor in (self.router, self.progress_relay):
            try:
                if actor is not None:
                    ray.kill(actor)
            except Exception:
                pass


def actor_options(transport: Transport, max_restarts: int, *, out_of_order: bool = True) -> dict:
    """Ray options of agent actors: out-of-order execution, and restarts with retries of their
    idempotent calls (not where the transport keeps latents in the agents: a restart loses them)."""
    restarts = transport.actor_restarts(max_restarts)
    return {"allow_out_of_order_execution": out_of_order, "max_restarts": restarts, "max_task_retries": restarts}


def build_ray_system(plan: SystemPlan, placement: PlacementConfig, *, timeout_s: float = 600.0,
                     torch_threads: int = 0, transport: str | Transport = OBJECT_STORE, replica: int = 0,
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
                 transport: str | Transport, replica: int, num_replicas: int, autoscaling: bool | None, out_of_order: bool,
                 extra_env: dict | None, copies: dict[str, int] | None = None,
                 bulk_dispatch: bool | None = None) -> RaySystem:
    """First half of `build_ray_system`: placement group and agent actors, not yet awaited (so the
    agents of several replicas load their models at the same time). `bulk_dispatch`: see `build_replicas`."""
    transport = get_transport(transport)
    actor_cls = RDTAgentActor if transport.direct else AgentActor
    roles = list(plan.style.roles)
    transport.check_placement(placement, roles)
    transport.check_installed()
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
                       serial_roles=frozenset(r for r in bulk if not batching[r]))
    try:
        for role in roles:
            spec, inner, outer = plan.service_args(role)
            spec = dataclasses.replace(spec, num_devices=gpu_count(pplan.gpus[role]),
                                       keep_messages_on_device=transport.on_gpu)
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
                ).remote(spec, inner, outer, torch_threads, AGENT_EXIT_AFTER.get(role)))
            system.handles[role] = system.copies[role][0]
    except BaseException:
        system.shutdown()
        raise
    return system


def await_system(system: RaySystem, placement: PlacementConfig, *, transport: str | Transport) -> RaySystem:
    """Second half of `build_ray_system`: the orchestrator started while the agents load (after them where the
    transport's collective group needs them up), every agent's `ready()` (with the timeout), the orchestrator's."""
    if not get_transport(transport).direct:
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


def start_orchestrator(system: RaySystem, placement: PlacementConfig, *, transport: str | Transport) -> None:
    """Create the replica's orchestrator actor over its agents' handles (not awaited; once)."""
    if system.orchestrator is not None:
        return
    transport = get_transport(transport)
    # The orchestrator sits in no bundle: it may land on any node with a free CPU.
    restarts = actor_options(transport, placement.agent_max_restarts)["max_restarts"]
    system.orchestrator = Orchestrator.options(max_restarts=restarts, max_concurrency=system.max_batches).remote(
        system.plan.style, system.copies or system.handles, system.timeout_s, transport, system.bulk_roles,
        system.serial_roles)


def await_orchestrator(system: RaySystem, placement: PlacementConfig, *, transport: str | Transport) -> RaySystem:
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
                   torch_threads: int = 0, transport: str | Transport = OBJECT_STORE, client_cpus: float = 0.0,
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
        if not get_transport(transport).direct:
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

