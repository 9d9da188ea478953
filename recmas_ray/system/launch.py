"""A system's agents in this process, no Ray: `local_pool(plan)` is a `LocalPool` (one `AgentService` per
role), and `set_plan_links` swaps another plan's link weights into running agents (a local pool or Ray
replica 0's pool: both offer the whole `pool.AgentPool` protocol). The launcher that picks the local
pool or Ray replicas is `distributed.launch.start_agents`.
"""

from __future__ import annotations

from recmas_ray.engine.pool import LocalPool
from recmas_ray.engine.service import AgentService
from recmas_ray.system.plan import SystemPlan


def local_pool(plan: SystemPlan, *, pool_cls: type[LocalPool] = LocalPool) -> LocalPool:
    """The plan's agents in this process: one `AgentService` per role (`pool_cls`: a LocalPool subclass
    that records calls, e.g. for measurements)."""
    return pool_cls({r: AgentService(*plan.service_args(r)) for r in plan.style.roles})


def set_plan_links(pool, plan: SystemPlan) -> None:
    """Swap `plan`'s link weights into every role of a running pool (local or Ray), models staying loaded."""
    handles = [pool.set_links(role, *plan.service_args(role)[1:]) for role in plan.style.roles]
    for role, h in zip(plan.style.roles, handles):
        pool.get(h, what=f"set_links of role {role}")
