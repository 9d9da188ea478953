"""Placement presets for agent actors, checked against the cluster before anything is scheduled.

  preset             placement group (one per replica)       actor resources
  one_gpu_per_agent  PACK, one {GPU: g, CPU: c} bundle/role  num_gpus=g on its own bundle index
  colocated          one {GPU: 1, CPU: n*c} bundle           num_gpus=1/n each (no memory isolation)
  spread             SPREAD, one {GPU: g, CPU: c} bundle/role num_gpus=g, agents across nodes
  cpu                PACK, one {CPU: c} bundle per role      num_gpus=0

Replicas: `num_replicas` copies of the system, each with its own placement group. A replica whose
bundles fit on one node is created STRICT_PACK, so its latents never leave that node.

A cluster that cannot grow: `check_resources` compares the request with the cluster first and
fails at once, listing the shortfall (an infeasible placement group would wait forever). A cluster
with an autoscaler (detected, or `autoscaling=True`): the request is made and awaited for up to
`placement_timeout_s`, with a progress line every 30 s.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Annotated

from recmas_ray.config.checks import OneOf, Range

log = logging.getLogger(__name__)

PRESETS = ("one_gpu_per_agent", "colocated", "spread", "cpu")
ORCHESTRATOR_CPUS = 1.0
"""Logical CPUs of each replica's orchestrator actor (see driver.Orchestrator)."""


@dataclass(kw_only=True)
class PlacementConfig:
    """Where agent actors go, what each one asks for, and how many copies of the system run."""

    preset: Annotated[str, OneOf(PRESETS)] = "cpu"
    """one_gpu_per_agent, colocated, spread or cpu (applies to every replica)."""
    role_gpus: Annotated[dict[str, float], Range(0, 64)] = field(default_factory=dict)
    """Per-role GPU override, e.g. {"science": 1, "math": 0.5}; above 1 a whole number K, and the
    role's model is split over its K GPUs (device map)."""
    role_cpus: Annotated[dict[str, float], Range(0, 1024)] = field(default_factory=dict)
    """Per-role logical CPU override."""
    cpus_per_agent: Annotated[float, Range(0, 1024)] = 0.25
    """Logical CPUs per agent actor (fractions leave room for Ray Data read tasks)."""
    role_replicas: Annotated[dict[str, int], Range(1, 64)] = field(default_factory=dict)
    """Actor copies of a role inside each replica (a per-role pool), e.g. {"solver": 3}: each batch's
    steps for that role go to its least-loaded copy, and stay there (distributed/pools.py)."""
    auto_role_replicas: bool = False
    """Size every role's pool (not named in role_replicas) from its cost per batch, parameters x
    tokens (sim: agents: their configured times), the cheapest role one copy."""
    num_replicas: Annotated[int, Range(0, 1024)] = 1
    """Independent copies of the system (own placement group and orchestrator each); batches go to
    whichever replica is free. 0 = auto: as many as the cluster's resources hold now."""
    ready_timeout_s: Annotated[float, Range(0, 86400, lo_open=True)] = 180.0
    """Seconds to wait for each actor to load its model and answer ready() (and for a placement
    group on a cluster that cannot grow)."""
    autoscaling: bool | None = None
    """The cluster can grow (an autoscaler is configured): requests wait for resources instead of
    failing at once. Unset: detected from the Ray cluster."""
    placement_timeout_s: Annotated[float, Range(0, 7 * 86400, lo_open=True)] = 1800.0
    """With autoscaling: seconds to wait for each replica's placement group, progress every 30 s."""
    agent_max_restarts: Annotated[int, Range(-1, 10_000)] = 2
    """Restarts of a crashed agent actor (it reloads its model; idempotent calls are retried); -1
    no limit, 0 fail fast. Ray Direct Transport agents never restart (their latents live in them)."""

    def validate(self) -> None:
        """Settings that do not depend on the style."""
        if self.preset == "cpu" and any(v > 0 for v in self.role_gpus.values()):
            raise ValueError("--placement cpu cannot give GPUs to roles (--role_gpus); use one_gpu_per_agent "
                             "or colocated")
        odd = {r: g for r, g in self.role_gpus.items() if g > 1 and g != int(g)}
        if odd:
            raise ValueError(f"--role_gpus {' '.join(f'{r}={g:g}' for r, g in odd.items())}: above one GPU a role "
                             "needs a whole number of GPUs (its model is split over them)")

    def check_roles(self, roles) -> None:
        """Per-role overrides must name roles of the style."""
        self.validate()
        for name, table in (("role_gpus", self.role_gpus), ("role_cpus", self.role_cpus),
                            ("role_replicas", self.role_replicas)):
            bad = [r for r in table if r not in roles]
            if bad:
                raise ValueError(f"--{name} names {bad}, not roles of this style {list(roles)}")

    def check_transport(self, transport: str, roles, *, device: str = "auto") -> None:
        """Refuse transports this placement cannot carry (before any model loads).

        NCCL moves CUDA tensors between distinct GPUs: every agent needs at least one whole GPU of
        its own (NCCL cannot have two ranks on one device).
        """
        if transport != "rdt:nccl":
            return
        if device == "cpu":
            raise ValueError("--transport rdt:nccl moves CUDA tensors between GPUs; it cannot work with --device cpu")
        if self.preset == "cpu":
            raise ValueError("--transport rdt:nccl moves CUDA tensors between GPUs; it cannot work with "
                             "--placement cpu")
        if self.preset == "colocated" and len(roles) > 1:
            raise ValueError(f"--transport rdt:nccl needs one GPU per agent, but --placement colocated puts "
                             f"{len(roles)} agents on one GPU (two NCCL ranks cannot share a device); use "
                             "--placement one_gpu_per_agent or spread, or --transport object_store")
        shared = {r: g for r, g in self.role_gpus.items() if r in roles and g < 1}
        if shared:
            raise ValueError(f"--transport rdt:nccl needs a whole GPU per agent, but --role_gpus gives "
                             f"{' '.join(f'{r}={g:g}' for r, g in shared.items())} (NCCL cannot put two ranks "
                             "on one GPU); use --transport object_store")


def check_ablation_transport(latent_ablation: str, transport: str) -> None:
    """Refuse `--latent_ablation` with Ray Direct Transport (before any model loads): the ablation
    rewrites received latents in the orchestrator, which can read object-store messages but not RDT
    ones (they live in the producing agent and move only agent to agent)."""
    if latent_ablation != "none" and transport != "object_store":
        raise ValueError(f"--latent_ablation {latent_ablation} needs --transport object_store (the orchestrator "
                         f"rewrites the latents, and --transport {transport} keeps them inside the agents)")


@dataclass
class PlacementPlan:
    """Bundles of one replica's placement group and, per role, its bundle index and actor resources."""

    strategy: str
    bundles: list[dict[str, float]]
    bundle_of: dict[str, int]
    """Bundle of each role's first copy."""
    gpus: dict[str, float]
    cpus: dict[str, float]
    copy_bundles: dict[str, list[int]] = field(default_factory=dict)
    """Bundle of every copy of each role (one per copy; all 0 for colocated)."""


def plan_placement(cfg: PlacementConfig, roles, copies: dict[str, int] | None = None) -> PlacementPlan:
    """Translate a preset and overrides into bundles and per-actor resources (pure, no Ray calls).

    `copies`: actor copies per role (per-role pools, default one each); every copy has its own
    bundle, with the role's resources.
    """
    if cfg.preset not in PRESETS:
        raise ValueError(f"unknown placement preset {cfg.preset!r}; expected one of {PRESETS}")
    cfg.check_roles(roles)
    roles = list(roles)
    copies = {r: int((copies or {}).get(r, 1)) for r in roles}
    num_actors = sum(copies.values())
    cpus = {r: cfg.role_cpus.get(r, cfg.cpus_per_agent) for r in roles}
    if cfg.preset == "cpu":
        gpus = {r: 0.0 for r in roles}
    elif cfg.preset == "colocated":
        gpus = {r: cfg.role_gpus.get(r, 1.0 / num_actors) for r in roles}
    else:
        gpus = {r: cfg.role_gpus.get(r, 1.0) for r in roles}
    if cfg.preset == "colocated":
        total_gpu = sum(gpus[r] * copies[r] for r in roles)
        bundle = {"CPU": sum(cpus[r] * copies[r] for r in roles), "GPU": float(max(1, round(total_gpu + 0.499)))}
        return PlacementPlan("PACK", [bundle], {r: 0 for r in roles}, gpus, cpus, {r: [0] * copies[r] for r in roles})
    bundles, copy_bundles = [], {}
    for r in roles:
        copy_bundles[r] = list(range(len(bundles), len(bundles) + copies[r]))
        bundles += [{k: v for k, v in (("CPU", cpus[r]), ("GPU", gpus[r])) if v > 0} for _ in range(copies[r])]
    strategy = "SPREAD" if cfg.preset == "spread" else "PACK"
    return PlacementPlan(strategy, bundles, {r: b[0] for r, b in copy_bundles.items()}, gpus, cpus, copy_bundles)


def fits_one_node(plan: PlacementPlan, node_totals: list[dict]) -> bool:
    """True when some node could hold all of the plan's bundles at once."""
    need: dict[str, float] = {}
    for b in plan.bundles:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    return any(all(n.get(k, 0.0) + 1e-9 >= v for k, v in need.items()) for n in node_totals)


def replica_strategy(plan: PlacementPlan, node_totals: list[dict]) -> str:
    """STRICT_PACK for a PACK replica that fits on one node (its latents stay there), else the preset's."""
    return "STRICT_PACK" if plan.strategy == "PACK" and fits_one_node(plan, node_totals) else plan.strategy


def replicas_that_fit(plan: PlacementPlan, node_free: list[dict], *, extra_cpus_per_replica: float = 0.0,
                      reserve_cpus: float = 0.0, node_totals: list[dict] | None = None) -> int:
    """How many replicas (bundles + one orchestrator CPU + `extra_cpus_per_replica` for its
    clients each) fit into the nodes' free resources, with `reserve_cpus` left for Ray Data reads.

    Counted the way they are created: a replica whose strategy is STRICT_PACK (it fits one node of
    `node_totals`, default `node_free`; see `replica_strategy`) needs all its bundles on one node;
    otherwise bundle by bundle (first fit). The orchestrator and the clients sit in no bundle, so
    they may take CPUs on any node. Pure: tested without Ray.
    """
    free = [dict(n) for n in node_free]
    if free and reserve_cpus:
        biggest = max(free, key=lambda n: n.get("CPU", 0.0))
        biggest["CPU"] = biggest.get("CPU", 0.0) - reserve_cpus
    strict = replica_strategy(plan, node_totals if node_totals is not None else node_free) == "STRICT_PACK"
    loose = [{"CPU": ORCHESTRATOR_CPUS}] + ([{"CPU": extra_cpus_per_replica}] if extra_cpus_per_replica > 0 else [])
    count = 0
    while count < 1024:
        trial = [dict(n) for n in free]
        placed = _place_together(plan.bundles, trial) if strict else _place_each(plan.bundles, trial)
        if not placed or not _place_each(loose, trial, whole_first=True):
            return count
        free, count = trial, count + 1
    return count


def _fits(node: dict, need: dict) -> bool:
    return all(node.get(k, 0.0) + 1e-9 >= v for k, v in need.items())


def _take(node: dict, need: dict) -> None:
    for k, v in need.items():
        node[k] = node.get(k, 0.0) - v


def _sum(items: list[dict]) -> dict:
    total: dict[str, float] = {}
    for b in items:
        for k, v in b.items():
            total[k] = total.get(k, 0.0) + v
    return total


def _place_together(items: list[dict], free: list[dict]) -> bool:
    """All of `items` on one node (STRICT_PACK), first fit; False when no node holds them."""
    total = _sum(items)
    node = next((n for n in free if _fits(n, total)), None)
    if node is None:
        return False
    _take(node, total)
    return True


def _place_each(items: list[dict], free: list[dict], *, whole_first: bool = True) -> bool:
    """`items` on one node when one holds them all, else each on the first node it fits."""
    if whole_first and _place_together(items, free):
        return True
    for b in items:
        node = next((n for n in free if _fits(n, b)), None)
        if node is None:
            return False
        _take(node, b)
    return True


def _times(n: int) -> str:
    return f"{n} copies x " if n > 1 else ""


def check_resources(plan: PlacementPlan, cluster_total: dict, node_totals: list[dict], *, preset: str,
                    num_replicas: int = 1) -> None:
    """Raise ValueError listing the shortfall if the cluster can never host `num_replicas` copies of the plan."""
    missing = []
    for res in ("CPU", "GPU"):
        need = num_replicas * sum(b.get(res, 0.0) for b in plan.bundles)
        have = cluster_total.get(res, 0.0)
        if need > have + 1e-9:
            per_role = ", ".join(f"{r} {_times(len(plan.copy_bundles.get(r, [0])))}"
                                 f"{(plan.gpus if res == 'GPU' else plan.cpus)[r]:g}" for r in plan.bundle_of)
            times = f"{num_replicas} replicas x " if num_replicas > 1 else ""
            missing.append(f"{res}: needs {need:g} ({times}{per_role}), cluster has {have:g}")
    for i, bundle in enumerate(plan.bundles):
        if not any(all(node.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items()) for node in node_totals):
            roles = [r for r, b in plan.bundle_of.items() if b == i]
            missing.append(f"bundle {i} {bundle} for {roles} fits on no single node")
    if missing:
        raise ValueError(f"placement {preset!r} cannot be satisfied by this cluster: " + "; ".join(missing))


def autoscaling_from_status(raw: bytes | str | None) -> bool:
    """Whether an autoscaler status report (GCS key `__autoscaling_status`) comes from an autoscaler
    that can launch nodes: its node types are names from a cluster config (`gpu_worker`), whereas
    the read-only monitor of a cluster without one names each node's type after the node itself."""
    import json

    if not raw:
        return False
    try:
        report = (json.loads(raw) or {}).get("autoscaler_report") or {}
    except ValueError:
        return False
    if report.get("pending_launches") or report.get("pending_nodes"):
        return True
    mapping = report.get("node_type_mapping") or {}
    return any(node_type != f"node_{node_id}" for node_id, node_type in mapping.items())


def detect_autoscaling() -> bool:
    """True when the connected cluster runs an autoscaler that can add nodes (`ray up` configs,
    KubeRay's in-tree autoscaler); pass `--autoscaling` where detection cannot see it."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized

    if not _internal_kv_initialized():
        return False
    try:
        return autoscaling_from_status(_internal_kv_get("__autoscaling_status"))
    except Exception:  # noqa: BLE001 - no report readable: treat as a fixed cluster
        return False


def create_placement(plan: PlacementPlan, *, preset: str, timeout_s: float, autoscaling: bool = False,
                     placement_timeout_s: float = 1800.0, num_replicas: int = 1, progress_every_s: float = 30.0,
                     name: str = ""):
    """Check, create and await one replica's placement group; never leaves a silent PENDING group behind.

    Without autoscaling the whole request (`num_replicas` copies) is checked first and the group
    must be ready within `timeout_s`; with autoscaling the check is skipped and the wait lasts up
    to `placement_timeout_s`, logging what is still missing every `progress_every_s` seconds.
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if not autoscaling:
        check_resources(plan, ray.cluster_resources(), nodes, preset=preset, num_replicas=num_replicas)
    pg = placement_group(plan.bundles, strategy=replica_strategy(plan, nodes), name=name)
    limit = placement_timeout_s if autoscaling else timeout_s
    t0 = time.monotonic()
    while True:
        left = limit - (time.monotonic() - t0)
        ready, _ = ray.wait([pg.ready()], timeout=max(0.0, min(progress_every_s, left)))
        if ready:
            return pg
        if time.monotonic() - t0 >= limit:
            remove_placement_group(pg)
            raise RuntimeError(f"placement {preset!r} {name} not ready after {limit:g}s: requested bundles "
                               f"{plan.bundles}, available now {ray.available_resources()}"
                               + (" (the autoscaler did not add the nodes in time; raise --placement_timeout_s)"
                                  if autoscaling else ""))
        log.warning("placement %s %s: waiting %.0fs of %.0fs for bundles %s; cluster has %s, free %s", preset, name,
                    time.monotonic() - t0, limit, plan.bundles, ray.cluster_resources(), ray.available_resources())


def gpu_count(gpus: float) -> int:
    """Devices a role's model is split over (1 for fractional or single GPUs)."""
    return max(1, int(math.floor(gpus + 1e-9)))
