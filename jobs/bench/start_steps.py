"""The steps `System.build(backend="ray")` takes after its imports, each marked as it ends, for the phase split of
`jobs.bench.start`: its child process imports this module inside the timed "plan" phase, so the import of the Ray
layer and the system's modules counts there, as it does in `System.build`."""

from __future__ import annotations

import ray

from recmas_ray.config.placement import PlacementConfig
from recmas_ray.config.transport import OBJECT_STORE
from recmas_ray.distributed.cluster import start_ray
from recmas_ray.distributed.orchestrator import start_router
from recmas_ray.distributed.replicas import await_agents, await_orchestrator, start_orchestrator, start_system
from recmas_ray.distributed.systems import RayReplicas
from recmas_ray.system.config import SystemConfig
from recmas_ray.system.plan import plan_system


def build_by_phase(phases, style: str, preset: str) -> RayReplicas:
    """plan, ray_start, agents, orchestrator, each marked on `phases` (a `start.Phases`) as it ends; returns the
    running system's replicas (the caller shuts them down)."""
    plan = plan_system(SystemConfig(style=style, preset=preset), task="math")
    phases.mark("plan")
    start_ray()  # retries a start-up that timed out (a busy machine), as the jobs do
    phases.mark("ray_start")
    placement = PlacementConfig()
    system = start_system(plan, placement, timeout_s=600, torch_threads=0, transport=OBJECT_STORE, replica=0,
                          num_replicas=1, autoscaling=False, out_of_order=True, extra_env=None)
    router = start_router(1, timeout_s=600)  # as `build_replicas`: both start while the agents load
    start_orchestrator(system, placement, transport=OBJECT_STORE)
    await_agents(system, placement)
    phases.mark("agents")
    await_orchestrator(system, placement, transport=OBJECT_STORE)
    replicas = RayReplicas(plan, [system], router, 600)
    ray.get(replicas.router.acquire.remote(1.0), timeout=600)
    phases.mark("orchestrator")
    return replicas
