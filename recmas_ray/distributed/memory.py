"""The memory plan against a Ray cluster: its GPUs per node and their memory, before any agent starts.

`cluster_plan` places a job's replicas on the connected cluster's GPUs (`system.memory`); `--dry_run` prints it
and exits, and every GPU run refuses a plan that does not fit (`check_memory`) before any weight loads. GPU
memory comes from `--placement.gpu_memory_gib`, else from torch on this machine, else from one short probe task
per GPU node (skipped where no GPU answers in time: the plan is then printed but not checked).
"""

from __future__ import annotations

import logging

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from recmas_ray.config.placement import PlacementConfig
from recmas_ray.console import end_announced
from recmas_ray.distributed.placement import detect_autoscaling, plan_placement, replica_strategy, replicas_that_fit
from recmas_ray.distributed.role_copies import role_copies
from recmas_ray.system.memory import GIB, GpuShortfall, MemoryPlan, memory_plan, role_memory

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 60.0


def cluster_nodes() -> list[dict]:
    """Resources of every alive node (`{"CPU": .., "GPU": ..}`)."""
    return [{k: v for k, v in n["Resources"].items() if k in ("CPU", "GPU")} | {"NodeID": n["NodeID"]}
            for n in ray.nodes() if n.get("Alive")]


def planned_nodes(placement: PlacementConfig) -> list[dict]:
    """The nodes a plan is for: those --placement.plan_node_gpus describes (a dry run for other machines; CPUs
    are not what limits a GPU plan, so each has plenty), else the connected cluster's."""
    if placement.plan_node_gpus:
        return [{"CPU": 1024.0, "GPU": float(g), "NodeID": f"planned-{i}"} for i, g in enumerate(placement.plan_node_gpus)]
    return cluster_nodes()


def gpu_memory_bytes(placement: PlacementConfig, nodes: list[dict]) -> int | None:
    """Bytes of one GPU: the configured value, this machine's smallest GPU, or the smallest a probe reads."""
    if placement.gpu_memory_gib:
        return int(placement.gpu_memory_gib * GIB)

    if torch.cuda.is_available():
        return min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
    gpu_nodes = [n["NodeID"] for n in nodes if n.get("GPU", 0) > 0 and n.get("NodeID")]
    if not gpu_nodes:
        return None

    probe = ray.remote(num_cpus=0, num_gpus=0.01)(_device_memory)
    refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
            for node in gpu_nodes]
    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
    for ref in pending:
        ray.cancel(ref, force=True)
    found = [v for v in ray.get(ready, timeout=PROBE_TIMEOUT_S) if v]
    return min(found) if found else None


def _device_memory() -> int | None:
    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None


def cluster_plan(plan, placement: PlacementConfig, *, recursion, batch_size: int, calls_at_once: int,
                 num_systems: int = 1, nodes: list[dict] | None = None) -> MemoryPlan:
    """The memory plan of `num_systems` x `placement.num_replicas` replicas of `plan` on the cluster's GPUs
    (`nodes`: the cluster's, by default); `calls_at_once` batches of `batch_size` rows share an agent with
    continuous batching, one otherwise."""
    nodes = planned_nodes(placement) if nodes is None else nodes
    copies = role_copies(plan, placement, recursion)
    pplan = plan_placement(placement, list(plan.style.roles), copies)
    totals = [{k: v for k, v in n.items() if k in ("CPU", "GPU")} for n in nodes]
    replicas = placement.num_replicas or max(1, replicas_that_fit(pplan, totals, node_totals=totals))
    batching = any(spec.continuous_batching for spec in plan.specs.values())
    return memory_plan(plan, pplan, [int(n.get("GPU", 0)) for n in nodes], num_replicas=num_systems * replicas,
                       rows=batch_size * (max(1, calls_at_once) if batching else 1),
                       prompt_tokens=placement.plan_prompt_tokens, latent_steps=recursion.latent_steps,
                       max_new_tokens=recursion.decode.max_new_tokens,
                       capacity=gpu_memory_bytes(placement, nodes),
                       strict=replica_strategy(pplan, totals) == "STRICT_PACK")


def check_memory(plan, placement: PlacementConfig, **kwargs) -> MemoryPlan | None:
    """Refuse (ValueError, one line) a GPU placement whose plan does not fit; None without GPUs."""
    if not placement.wants_gpus():
        return None
    if detect_autoscaling() if placement.autoscaling is None else placement.autoscaling:
        return None  # the GPU nodes come later
    try:
        mp = cluster_plan(plan, placement, **kwargs)
    except GpuShortfall:  # too few GPUs at all: the resource check that follows names the shortfall
        return None
    if mp.capacity is None:
        log.warning("memory plan not checked: GPU memory unknown (set --placement.gpu_memory_gib)")
    mp.check_fit()
    return mp


def dry_run(plan, placement: PlacementConfig, *, echo=print, **kwargs) -> int:
    """`--dry_run`: print the plan per GPU (or per role without GPUs) and return 0; a plan that does not fit is
    printed, then refused (ValueError: one line, exit status 2). Nothing is loaded. With
    --placement.plan_node_gpus the GPUs are those (no Ray, no GPU needed here)."""
    end_announced("planned")  # a command line's "checking inputs ..." line ends before the plan is printed
    if not placement.wants_gpus():
        rc = kwargs["recursion"]
        roles = role_memory(plan, rows=kwargs["batch_size"], prompt_tokens=placement.plan_prompt_tokens,
                            latent_steps=rc.latent_steps, max_new_tokens=rc.decode.max_new_tokens, gpus={},
                            gpu=False)
        echo("memory plan: no GPUs asked for (--placement cpu); per agent, in CPU memory:")
        for line in MemoryPlan(roles=roles).lines():
            echo(line)
        return 0

    try:
        mp = cluster_plan(plan, placement, **kwargs)
    except GpuShortfall as e:
        where = ("--placement.plan_node_gpus" if placement.plan_node_gpus else
                 "the cluster's GPUs (or plan for others with --placement.plan_node_gpus)")
        raise ValueError(f"{e}: give more GPUs ({where}), fewer --num_replicas or --role_replicas, or fewer GPUs per "
                         "role (--role_gpus)") from None
    target = (f"{len(placement.plan_node_gpus)} planned node(s) with {','.join(map(str, placement.plan_node_gpus))} "
              "GPUs (--placement.plan_node_gpus)" if placement.plan_node_gpus else "the connected cluster")
    echo(f"memory plan: {len(mp.gpus)} GPUs used, on {target}")
    for line in mp.lines():
        echo(line)
    mp.check_fit()
    return 0
