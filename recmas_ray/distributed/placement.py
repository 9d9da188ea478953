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

import json
import logging
import math
import time
from dataclasses import dataclass, field

import ray
from ray._private.state import available_resources_per_node
from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized
from ray.util.placement_group import placement_group, remove_placement_group

from recmas_ray.config.placement import PRESETS, PlacementConfig

log = logging.getLogger(__name__)

ORCHESTRATOR_CPUS = 1.0
"""Logical CPUs of each replica's orchestrator actor (see orchestrator.Orchestrator)."""
ORCHESTRATOR_MAX_BATCHES = 256
"""Batches one orchestrator runs at once by default (its threads; each mostly waits on agents); a replica
asked for more in flight (`build_replicas(max_batches=...)`) gets an orchestrator with that many. At the
earlier fixed 16, a pool of 18 agents with 36 batches in flight ran 16 at a time (bench_scale, light
system, R = 3: 0.57 batches/s where its costs allow 0.93)."""


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

    `copies`: actor copies per role (role copies, default one each); every copy has its own
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


def resolve_num_replicas(placement: PlacementConfig, pplan: PlacementPlan, *, client_cpus: float = 0.0) -> int:
    """`num_replicas`, or with 0 (auto) as many as the cluster's free resources hold now (at least 1),
    each with `client_cpus` for its evaluation clients and one CPU left for Ray Data's reads."""
    if placement.num_replicas > 0:
        return placement.num_replicas

    totals = [nd["Resources"] for nd in ray.nodes() if nd.get("Alive")]
    n = replicas_that_fit(pplan, _free_per_node(), extra_cpus_per_replica=client_cpus, reserve_cpus=1.0,
                          node_totals=totals)
    if n < 1:  # let the resource check name the shortfall
        return 1
    log.info("num_replicas auto: %d replicas fit the cluster", n)
    return n


def _free_per_node() -> list[dict]:
    return [{k: v for k, v in res.items() if k in ("CPU", "GPU")} for res in available_resources_per_node().values()]
