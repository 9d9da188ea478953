"""Start a system's agents: in this process (`LocalPool`, no Ray) or as Ray actors (`RayReplicas`).

    start_agents(plan, backend="local")  -> LocalPool          one `AgentService` per role, here
    start_agents(plan, backend="ray")    -> RayReplicas        placement group, actors, orchestrators;
                                                               `.pool()` is an AgentPool over replica 0

Both pools offer the whole `pool.AgentPool` protocol (rollout, decode, score, retry_format,
set_links, get), so code that drives a run itself works on either (`system.launch.set_plan_links`
swaps another plan's link weights into running agents). Ray is imported only for the Ray backend (a heavy
optional dependency: a local run never loads it).
"""

from __future__ import annotations

import dataclasses
import logging

from recmas_ray.config.choices import BACKENDS
from recmas_ray.config.placement import PlacementConfig
from recmas_ray.config.transport import OBJECT_STORE, Transport
from recmas_ray.system.launch import local_pool
from recmas_ray.system.plan import SystemPlan

log = logging.getLogger(__name__)


def start_agents(plan: SystemPlan, *, backend: str = "ray", placement: PlacementConfig | None = None,
                 timeout_s: float = 900.0, torch_threads: int = 0, transport: str | Transport = OBJECT_STORE,
                 num_replicas: int | None = None, client_cpus: float = 0.0, recursion=None, max_batches: int = 0,
                 progress_relay: bool = False):
    """The agents of `plan`: a `LocalPool` in this process (backend "local") or running `RayReplicas`
    (`placement.num_replicas` copies of the system, or `num_replicas` when given; 0: as many as fit).

    Ray backend: joins the cluster (`start_ray`, a no-op when Ray is up) and builds the replicas with
    `distributed.replicas.build_replicas` (`client_cpus`, `recursion`, `max_batches`, `progress_relay`: see there).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    placement = placement or PlacementConfig()
    if num_replicas is not None:
        placement = dataclasses.replace(placement, num_replicas=num_replicas)
    if backend == "local":
        if placement.num_replicas != 1:
            log.warning("num_replicas=%d is ignored by the local backend (one in-process system)",
                        placement.num_replicas)
        return local_pool(plan)
    # lazy: Ray reads env settings on import; this module loads before the console sets them
    from recmas_ray.distributed.cluster import start_ray
    # lazy: Ray reads env settings on import; this module loads before the console sets them
    from recmas_ray.distributed.replicas import build_replicas

    start_ray()  # a local start-up that timed out on a busy machine is retried
    return build_replicas(plan, placement, timeout_s=timeout_s, torch_threads=torch_threads, transport=transport,
                          client_cpus=client_cpus, recursion=recursion, max_batches=max_batches,
                          progress_relay=progress_relay)
