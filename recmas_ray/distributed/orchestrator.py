"""The orchestrator actor (one per replica: runs batches through the recursion against its role groups) and the
replica router actor that every client of a set of replicas asks (`routing.ReplicaRouter`).

    Orchestrator actor (num_cpus=1, threaded: several batches in flight)
        | run_batch(RayPool(role groups), ...)   the same runner and schedule as in-process; each call,
        |                                        once its inputs exist, to the copy of its role with the
        |                                        least queued work
        v
    planner.rollout ──ref──> critic.rollout ──ref──> solver.decode          (sequential, one round)

Latent messages go producer -> consumer as the transport moves them (`distributed.transports`: through the object
store as ObjectRefs, or point to point), never through the orchestrator, which only materialises small stats and texts. Calls of several batches that reach the same copy
at the same step together leave as one Ray call (`bulk.py`; by default for roles with continuous batching).
"""

from __future__ import annotations

import threading

import ray

from recmas_ray.config.extensions import import_extensions
from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.config.transport import OBJECT_STORE, Transport
from recmas_ray.distributed.ray_pool import RayPool
from recmas_ray.distributed.placement import ORCHESTRATOR_CPUS, ORCHESTRATOR_MAX_BATCHES
from recmas_ray.distributed.routing import LEASE_S, ReplicaRouter, RoleGroup
from recmas_ray.distributed.transports import latent_transport
from recmas_ray.engine.runner import run_batch
from recmas_ray.styles import StyleSpec

class _OrchestratorImpl:
    """Runs batches through the recursion against the replica's role groups (one per replica).

    Every agent call of every batch goes to the copy its `RoleGroup` picks once the call's inputs exist (least
    queued work then); format retries go through the same groups. `cancel(batch_id)` stops a batch: its queued
    agent calls are cancelled and its next step fails, so a timed-out batch does not run on beside
    its retry.
    """

    def __init__(self, style: StyleSpec, copies: dict, timeout_s: float, transport: str | Transport = OBJECT_STORE,
                 bulk_roles=(), serial_roles=(), extensions=()):
        import_extensions(extensions)  # task families and styles registered from outside the package, by name here

        self.style = style  # the plan's style object: it carries the run's prompt set
        self.timeout_s, self.transport = timeout_s, latent_transport(transport)
        self.bulk_roles = frozenset(bulk_roles)  # roles whose aligned calls leave in bulk (`distributed.bulk`)
        self.serial_roles = frozenset(serial_roles)  # of those, agents that run one call at a time (`RayPool`)
        # role -> its copies (one each without --role_replicas) and their routing
        self.groups = {r: RoleGroup(r, list(h) if isinstance(h, (list, tuple)) else [h]) for r, h in copies.items()}
        self._running: dict[str, RayPool] = {}
        self._lock = threading.Lock()
        self.transport.connect([h for g in self.groups.values() for h in g.copies])  # (this process calls them)

    def ready(self) -> bool:
        return True

    def solve(self, questions: list[str], tasks: list[str], cfg: RecursionConfig, batch_id: str = "",
              **run_options):
        """One batch through `run_batch` (`run_options`: its keyword options, e.g. on_token, targets)."""
        self.transport.config.check_ablation(cfg.latent_ablation)  # Python callers skip EvalConfig
        self.transport.config.check_adaptive_rounds(cfg.adaptive_threshold)
        pool = RayPool(self.groups, timeout_s=self.timeout_s, context=f", batch {batch_id}" if batch_id else "",
                       transport=self.transport, bulk_roles=self.bulk_roles, serial_roles=self.serial_roles)
        key = batch_id or pool.key_prefix
        with self._lock:
            self._running[key] = pool
        try:
            return self.transport.strip_reply(run_batch(pool, self.style, questions, tasks, cfg, **run_options))
        except BaseException:
            pool.release_kept()  # messages a transport keeps in the agents would stay there otherwise
            raise
        finally:
            with self._lock:
                if self._running.get(key) is pool:
                    del self._running[key]
            pool.finish()

    def cancel(self, batch_id: str) -> int:
        """Cancel a running batch's unfinished agent calls; returns how many (0: not running here)."""
        with self._lock:
            pool = self._running.get(batch_id)
        return pool.cancel() if pool is not None else 0

    def retry_format(self, texts: list[str], suffixes: list[str], max_new_tokens: int, *, cfg, context=None):
        """The answer-format retry on the decoder copy its group picks (see `AgentService.retry_format`)."""
        pool = RayPool(self.groups, timeout_s=self.timeout_s, context=", format retry", transport=self.transport)
        try:
            return pool.get(pool.retry_format(self.style.decoder, texts, suffixes, max_new_tokens, cfg=cfg,
                                              context=context), what="format retry")
        finally:
            pool.finish()

    def group_stats(self) -> dict:
        """Per role and copy: work queued now, calls and work served."""
        return {r: g.stats() for r, g in self.groups.items()}


Orchestrator = ray.remote(num_cpus=ORCHESTRATOR_CPUS, max_concurrency=ORCHESTRATOR_MAX_BATCHES)(_OrchestratorImpl)


RouterActor = ray.remote(num_cpus=0, max_concurrency=64)(ReplicaRouter)


def start_router(num_replicas: int, *, timeout_s: float):
    """The replica router actor every client of these replicas asks (evaluation clients, API, Serve)."""
    return RouterActor.remote(num_replicas, lease_s=LEASE_S)  # (clients renew their running batches' leases)
