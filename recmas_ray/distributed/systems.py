"""Running Ray systems: one replica's placement group, agent actors and orchestrator (`RaySystem`), and a set of
replicas with the router that spreads batches over them (`RayReplicas`); they are built in replicas.py."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import ray
from ray.util.placement_group import remove_placement_group

from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.config.transport import OBJECT_STORE
from recmas_ray.distributed.placement import ORCHESTRATOR_MAX_BATCHES
from recmas_ray.distributed.ray_pool import RayPool, soon, when_done
from recmas_ray.distributed.routing import LeaseKeeper, batch_work
from recmas_ray.system.plan import SystemPlan


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
    transport: object = OBJECT_STORE
    """How its agents move latents (a `config.transport.Transport` or its `distributed.transports` strategy)."""

    def solve(self, questions, tasks, cfg: RecursionConfig, batch_id: str = "", **run_options):
        """Submit one batch; returns an ObjectRef of list[SampleResult] (`run_options`: see `run_batch`)."""
        return self.orchestrator.solve.remote(questions, tasks, cfg, batch_id, **run_options)

    def pool(self) -> RayPool:
        """A `pool.AgentPool` over this replica's agents (every copy, routed per call), for runs driven here."""
        return RayPool(self.copies or self.handles, timeout_s=self.timeout_s, transport=self.transport)

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
