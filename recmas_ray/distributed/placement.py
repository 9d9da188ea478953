"""Placement presets for agent actors, checked against the cluster before anything is scheduled.

  preset             placement group                       actor resources
  one_gpu_per_agent  PACK, one {GPU: g, CPU: c} bundle/role  num_gpus=g on its own bundle index
  colocated          one {GPU: 1, CPU: n*c} bundle           num_gpus=1/n each (no memory isolation)
  spread             SPREAD, one {GPU: g, CPU: c} bundle/role num_gpus=g, agents across nodes
  cpu                PACK, one {CPU: c} bundle per role      num_gpus=0

An infeasible placement group waits forever in Ray, so `check_resources` compares the request with
the cluster first and `create_placement` waits for readiness with a timeout; both fail with a
message that lists what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from recmas_ray.config.checks import OneOf, Range

PRESETS = ("one_gpu_per_agent", "colocated", "spread", "cpu")


@dataclass(kw_only=True)
class PlacementConfig:
    """Where agent actors go and what each one asks for."""

    preset: Annotated[str, OneOf(PRESETS)] = "cpu"
    """one_gpu_per_agent, colocated, spread or cpu."""
    role_gpus: Annotated[dict[str, float], Range(0, 64)] = field(default_factory=dict)
    """Per-role GPU override, e.g. {"science": 1, "math": 0.5} (a 7B expert on a whole GPU)."""
    role_cpus: Annotated[dict[str, float], Range(0, 1024)] = field(default_factory=dict)
    """Per-role logical CPU override."""
    cpus_per_agent: Annotated[float, Range(0, 1024)] = 0.25
    """Logical CPUs per agent actor (fractions leave room for Ray Data read tasks)."""
    ready_timeout_s: Annotated[float, Range(0, 86400, lo_open=True)] = 180.0
    """Seconds to wait for the placement group and for each actor to load its model and answer ready()."""

    def validate(self) -> None:
        """Settings that do not depend on the style."""
        if self.preset == "cpu" and any(v > 0 for v in self.role_gpus.values()):
            raise ValueError("--placement cpu cannot give GPUs to roles (--role_gpus); use one_gpu_per_agent "
                             "or colocated")

    def check_roles(self, roles) -> None:
        """Per-role overrides must name roles of the style."""
        self.validate()
        for name, table in (("role_gpus", self.role_gpus), ("role_cpus", self.role_cpus)):
            bad = [r for r in table if r not in roles]
            if bad:
                raise ValueError(f"--{name} names {bad}, not roles of this style {list(roles)}")


@dataclass
class PlacementPlan:
    """Bundles of the placement group and, per role, its bundle index and actor resources."""

    strategy: str
    bundles: list[dict[str, float]]
    bundle_of: dict[str, int]
    gpus: dict[str, float]
    cpus: dict[str, float]


def plan_placement(cfg: PlacementConfig, roles) -> PlacementPlan:
    """Translate a preset and overrides into bundles and per-actor resources (pure, no Ray calls)."""
    cfg.check_roles(roles)
    roles = list(roles)
    cpus = {r: cfg.role_cpus.get(r, cfg.cpus_per_agent) for r in roles}
    if cfg.preset == "cpu":
        gpus = {r: 0.0 for r in roles}
    elif cfg.preset == "colocated":
        gpus = {r: cfg.role_gpus.get(r, 1.0 / len(roles)) for r in roles}
    else:
        gpus = {r: cfg.role_gpus.get(r, 1.0) for r in roles}
    if cfg.preset == "colocated":
        total_gpu = sum(gpus.values())
        bundle = {"CPU": sum(cpus.values()), "GPU": float(max(1, round(total_gpu + 0.499)))}
        return PlacementPlan("PACK", [bundle], {r: 0 for r in roles}, gpus, cpus)
    bundles = [{k: v for k, v in (("CPU", cpus[r]), ("GPU", gpus[r])) if v > 0} for r in roles]
    strategy = "SPREAD" if cfg.preset == "spread" else "PACK"
    return PlacementPlan(strategy, bundles, {r: i for i, r in enumerate(roles)}, gpus, cpus)


def check_resources(plan: PlacementPlan, cluster_total: dict, node_totals: list[dict], *, preset: str) -> None:
    """Raise ValueError listing the shortfall if the cluster can never host the plan."""
    missing = []
    for res in ("CPU", "GPU"):
        need = sum(b.get(res, 0.0) for b in plan.bundles)
        have = cluster_total.get(res, 0.0)
        if need > have + 1e-9:
            per_role = ", ".join(f"{r} {(plan.gpus if res == 'GPU' else plan.cpus)[r]:g}" for r in plan.bundle_of)
            missing.append(f"{res}: needs {need:g} ({per_role}), cluster has {have:g}")
    for i, bundle in enumerate(plan.bundles):
        if not any(all(node.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items()) for node in node_totals):
            roles = [r for r, b in plan.bundle_of.items() if b == i]
            missing.append(f"bundle {i} {bundle} for {roles} fits on no single node")
    if missing:
        raise ValueError(f"placement {preset!r} cannot be satisfied by this cluster: " + "; ".join(missing))


def create_placement(plan: PlacementPlan, *, preset: str, timeout_s: float):
    """Check, create and await the placement group; never leaves a silent PENDING group behind."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    check_resources(plan, ray.cluster_resources(), nodes, preset=preset)
    pg = placement_group(plan.bundles, strategy=plan.strategy)
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        raise RuntimeError(f"placement {preset!r} not ready after {timeout_s:g}s: requested bundles {plan.bundles}, "
                           f"available now {ray.available_resources()}")
    return pg
