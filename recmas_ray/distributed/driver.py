"""Ray system: placement group + agent actors + the orchestrator actor that runs the recursion.

    job entrypoint (jobs/run.py)
        | build_ray_system(plan, placement)      check resources, create PG, actors, ready()
        v
    Orchestrator actor (num_cpus=1, threaded: several batches in flight)
        | run_batch(RayPool(handles), style, ...)  the same runner and schedule as in-process
        v
    planner.rollout ──ref──> critic.rollout ──ref──> solver.decode          (sequential, one round)
        ^                                               |
        └──────────── solver->planner message ref ──────┘ (rounds > 1)

    Latent messages are returned by agents as detached CPU tensors and passed on as ObjectRefs, so
    they go producer -> consumer through the object store and never through the orchestrator.
    The orchestrator only materialises small stats and texts. Several `solve` calls run at once
    (max_concurrency), so different agents work on different batches at the same time; agent actors
    execute calls in submission order, one at a time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from recmas_ray.distributed.actors import TRANSPORTS, AgentActor, RayPool, RDTAgentActor
from recmas_ray.distributed.placement import PlacementConfig, create_placement, plan_placement
from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.runner import run_batch
from recmas_ray.styles import StyleSpec
from recmas_ray.system.plan import SystemPlan

log = logging.getLogger(__name__)

AGENT_ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


@ray.remote(num_cpus=1, max_concurrency=16)
class Orchestrator:
    """Runs batches through the recursion against agent actor handles."""

    def __init__(self, style: StyleSpec, handles: dict, timeout_s: float, transport: str = "object_store"):
        self.style = style  # the plan's style object: it carries the run's prompt set
        self.handles, self.timeout_s, self.transport = handles, timeout_s, transport
        if transport != "object_store":
            # RDT checks the transport in the calling process, so the orchestrator creates the group.
            from ray.experimental.collective import create_collective_group

            create_collective_group(list(handles.values()), backend="torch_gloo" if transport == "rdt:gloo" else "nccl")

    def ready(self) -> bool:
        return True

    def solve(self, questions: list[str], tasks: list[str], cfg: RecursionConfig, batch_id: str = ""):
        pool = RayPool(self.handles, timeout_s=self.timeout_s, context=f", batch {batch_id}" if batch_id else "",
                       transport=self.transport)
        return run_batch(pool, self.style, questions, tasks, cfg)


@dataclass
class RaySystem:
    """Handles of a running system; `shutdown()` releases actors and the placement group."""

    plan: SystemPlan
    handles: dict
    orchestrator: object
    placement_group: object
    infos: dict
    timeout_s: float

    def solve(self, questions, tasks, cfg: RecursionConfig, batch_id: str = ""):
        """Submit one batch; returns an ObjectRef of list[SampleResult]."""
        return self.orchestrator.solve.remote(questions, tasks, cfg, batch_id)

    def shutdown(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for h in [*self.handles.values(), self.orchestrator]:
            try:
                ray.kill(h)
            except Exception:  # already dead: nothing to release
                pass
        try:
            remove_placement_group(self.placement_group)
        except Exception:
            pass


def build_ray_system(plan: SystemPlan, placement: PlacementConfig, *, timeout_s: float = 600.0,
                     torch_threads: int = 0, transport: str = "object_store") -> RaySystem:
    """Create the placement group, one actor per role, await `ready()`, then the orchestrator.

    `transport` moves latents through the object store (default) or by Ray Direct Transport
    (`rdt:gloo` on CPUs, `rdt:nccl` on GPUs; alpha in Ray 2.60), point to point between agents.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r}; expected one of {TRANSPORTS}")
    actor_cls = AgentActor if transport == "object_store" else RDTAgentActor
    roles = list(plan.style.roles)
    pplan = plan_placement(placement, roles)
    pg = create_placement(pplan, preset=placement.preset, timeout_s=placement.ready_timeout_s)
    env = dict(AGENT_ENV)
    if torch_threads > 0:  # Ray pins OMP threads to floor(num_cpus) (>= 1) otherwise
        env["OMP_NUM_THREADS"] = str(torch_threads)
    handles = {}
    try:
        for role in roles:
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg,
                                                        placement_group_bundle_index=pplan.bundle_of[role])
            handles[role] = actor_cls.options(
                num_cpus=pplan.cpus[role], num_gpus=pplan.gpus[role], scheduling_strategy=strategy,
                runtime_env={"env_vars": env}, name=None,
            ).remote(*plan.service_args(role), torch_threads)
        infos = {}
        for role, h in handles.items():
            try:
                infos[role] = ray.get(h.ready.remote(), timeout=placement.ready_timeout_s)
            except Exception as e:
                raise RuntimeError(f"agent {role} ({plan.role_models[role]}) failed to start: {e}") from e
            log.info("agent ready: %s", infos[role])
        orch = Orchestrator.remote(plan.style, handles, timeout_s, transport)
        if not ray.wait([orch.ready.remote()], timeout=placement.ready_timeout_s)[0]:
            raise RuntimeError(f"orchestrator actor (1 CPU) not scheduled after {placement.ready_timeout_s:g}s; "
                               f"available resources: {ray.available_resources()}")
    except BaseException:
        RaySystem(plan, handles, None, pg, {}, timeout_s).shutdown()
        raise
    return RaySystem(plan, handles, orch, pg, infos, timeout_s)


def init_ray(address: str | None = None, **kwargs) -> None:
    """Join a running cluster (RAY_ADDRESS / `ray start`) if there is one, else start a local one."""
    import os

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = address or os.environ.get("RAY_ADDRESS")
    if address and address != "local":
        ray.init(address=address, **kwargs)
        return
    if address != "local":
        # The address file written by `ray start` on this machine; unlike address="auto" this never
        # joins some other process's private cluster found by scanning running processes.
        from ray._private.utils import read_ray_address

        if read_ray_address():
            try:
                ray.init(**kwargs)
                return
            except ConnectionError:  # a stale address file: that cluster is gone
                pass
    # A fresh local cluster: workers inherit this environment, so a checkout that is not
    # pip-installed still imports in every actor.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Logical CPUs above the core count: agents, the orchestrator and Ray Data clients mostly
    # wait on each other, and Ray Data needs free CPUs for its read tasks.
    kwargs.setdefault("num_cpus", max(8, os.cpu_count() or 1))
    os.environ.pop("RAY_ADDRESS", None)
    ray.init(address="local", include_dashboard=False, **kwargs)
