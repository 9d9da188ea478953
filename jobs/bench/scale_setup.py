"""The scaling benchmark's setup: its config (`ScaleBenchConfig`, the `quick` recipe), the simulated cluster it
starts (`simulated_cluster`, every process on 127.0.0.1) and the simulated system it runs (`paper_plan`).

Shared by the benchmark (jobs/bench/scale.py) and its discrete-event model (jobs/bench/scale_model.py), which
both read the config and the plan; apart from scale.py so neither imports the other.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Annotated

import ray
from ray.cluster_utils import Cluster

from jobs.bench.scale_fit import fitted_sim_name, load_fit
from recmas_ray.config.checks import NonEmpty, OneOf, Range, WritableDir
from recmas_ray.config.recursion import MAX_LATENT_STEPS, MAX_ROUNDS
from recmas_ray.distributed.cluster import loopback_only
from recmas_ray.models.sim import EOS_SPREAD, PAPER_MODEL_SIZES, ROW_SHARE, paper_sim_models
from recmas_ray.styles import get_style
from recmas_ray.system.plan import simulated_plan
from recmas_ray.system.presets import role_models

PAPER_SYSTEMS = {"light": "sequential_light", "mixture": "mixture"}
"""The paper systems the scaling benchmark simulates (its --system choices) -> the style each runs."""
SYSTEMS = tuple(PAPER_SYSTEMS)


def paper_roles(system: str) -> tuple[str, ...]:
    """The roles of a paper system (its style's)."""
    return get_style(PAPER_SYSTEMS[system]).roles


@dataclass(kw_only=True)
class ScaleBenchConfig:
    """What the scaling benchmark runs."""

    system: Annotated[str, OneOf(SYSTEMS)] = "light"
    """Paper system whose per-role costs are simulated: light (sequential) or mixture."""
    gpus: Annotated[int, Range(1, 1024)] = 27
    """GPUs (one per agent actor) of the balance comparison, the same for both layouts (27: nine light
    systems, or one pool of 4 / 3 / 20 copies at R = 1, 7 / 5 / 15 at R = 3). Whole copies round each
    role's share: at 18 GPUs (5 / 3 / 10) they cap the pools at 1.606x at R = 3 with a perfect scheduler,
    at 27 at 1.667x (any split of these costs: 1.72x); `python -m jobs.bench.scale_model --gpus N` lists
    them."""
    balance_rounds: Annotated[list[int], Range(1, MAX_ROUNDS), NonEmpty()] = field(default_factory=lambda: [1, 3])
    """R of the balance comparison."""
    dilation: Annotated[float, Range(0, 100, lo_open=True)] = 0.5
    """The dilation check runs the balance of `dilation_rounds` again with every cost x this (0.5: the run's
    costs x k against x k / 2, i.e. k' and 2k' with k' = k / 2, at half a run's time)."""
    dilation_rounds: Annotated[list[int], Range(1, MAX_ROUNDS)] = field(default_factory=lambda: [3])
    """R of the dilation check (empty: none)."""
    dilation_tolerance: Annotated[float, Range(0, 1)] = 0.02
    """Largest relative change of a ratio under dilation before the run counts as host-bound."""
    model_tolerance: Annotated[float, Range(0, 1)] = 0.03
    """Largest relative difference of Ray's throughput from the model's (devices only) for a match."""
    num_batches: Annotated[int, Range(1, 100_000)] = 96
    """Batches per whole-system replica's share of the GPUs (96 x 9 = 864 at 27 GPUs). The steady window
    needs more than twice the batches in flight (6 per light replica by default). In the model (10 seeds, R = 3)
    one run's pools / whole ratio spreads by 1.0% (standard deviation) at 48 per share and 0.55% at 96: window
    edges fall between bunched completions, and the window holds a draw of decode lengths."""
    model_batches_per_depth: Annotated[int, Range(3, 10_000)] = 30
    """Batches per batch in flight of the model's long runs (the figures it gives beside Ray's) and of the
    projection (4 at most there: the largest runs are big)."""
    batch_size: Annotated[int, Range(1, 4096)] = 4
    """Questions per batch."""
    num_clients: Annotated[int, Range(0, 1024)] = 0
    """Batches in flight in all, the same total for both layouts (0: the production default, two per agent
    actor, `eval.stream.CLIENTS_PER_ACTOR`; given explicitly, so the memory cap of auto depth, sized for
    real models' clients on a real cluster, does not shrink it on one host); the model is given the depth
    the run shows."""
    batches_per_client: Annotated[int, Range(1, 64)] = 8
    """Batches each client process holds (`--stream.batches_per_client`): fewer processes on one host."""
    latent_steps: Annotated[int, Range(0, MAX_LATENT_STEPS)] = 32
    """m."""
    tokens: Annotated[int, Range(1, 100_000)] = 256
    """Decode budget; each row stops at its EOS after [1 - eos_spread, 1] x this."""
    ms_per_gparam: Annotated[float, Range(0, 10_000)] = 10.0
    """Simulated ms per latent step or token per billion parameters at one row. 10: the 1.54B solver takes
    15 ms per token, about an eager Hugging Face decode step of a 1-2B model on one GPU at a small batch
    (launch-bound, not FLOPs); the dilation check says whether this machine's host keeps up."""
    prompt_tokens: Annotated[int, Range(0, 100_000)] = 200
    """Prompt tokens per row prefilled on every call (models.sim.PREFILL_REF_ROWS prices them)."""
    row_share: Annotated[float, Range(0, 100)] = ROW_SHARE
    """Share of a step one more row adds (models.sim.ROW_SHARE)."""
    eos_spread: Annotated[float, Range(0, 1)] = EOS_SPREAD
    """Rows stop uniformly in [1 - eos_spread, 1] x tokens (models.sim.EOS_SPREAD)."""
    costs: str | None = None
    """Price each role's simulated agent by this fitted cost table (jobs.bench.scale_fit: measured prefill, latent
    step and decoded token times vs rows of the demo preset's model for the role) instead of the paper table
    (parameters x ms_per_gparam, a tabulated guess: the figures are then modelled, not measured)."""
    project_gpus: Annotated[list[int], Range(1, 1_000_000)] = field(default_factory=lambda: [64, 256, 1024])
    """GPU counts of the projection (empty: none)."""
    control_batches: Annotated[int, Range(0, 100_000)] = 48
    """Batches of the zero-cost control-plane measurement (0: skip it and the projection)."""
    nodes: Annotated[int, Range(1, 64)] = 2
    """Simulated nodes (ignored with address)."""
    gpus_per_node: Annotated[int, Range(0, 1024)] = 15
    """Fake GPUs per simulated node (15: a light system's three agents pack onto one node, five per node)."""
    object_store_mib: Annotated[int, Range(64, 1 << 20)] = 6144
    """Object store of each simulated node, MiB (pages are taken as messages are stored). The in-flight batches'
    messages and their copies on the other node must fit with room: under pressure Ray asks every worker for a
    Python `gc.collect()`, which on 2 cores stalled each agent for up to ~3 s at a time (simulated device time
    then reads as host time). At 384 MiB host time per call was 0.1-0.17 s, at 2 GiB 29 ms in the R = 3 pools
    (2 ms in the whole systems, whose messages stay on one node), at 6 GiB 2.5 ms. GPU nodes have tens of GiB."""
    cpus_per_node: Annotated[int, Range(1, 1024)] = 16
    """Logical CPUs per simulated node (agents, orchestrators and clients mostly wait)."""
    ray_call: bool = False
    """Also time Ray's cost per agent call by message size."""
    call_chain: Annotated[int, Range(1, 100_000)] = 60
    """Zero-cost calls timed per ray_call figure."""
    real: bool = False
    """Also check tiny real models on 1 vs 2 replicas."""
    address: str | None = None
    """Join this Ray cluster (HOST:PORT or auto) instead of simulating one."""
    timeout_s: Annotated[float, Range(0, 86400, lo_open=True)] = 600.0
    """Timeout of every wait, in seconds."""
    output_path: Annotated[str, WritableDir()] = "out/bench_scale"
    """Where bench_scale.json, bench_scale.png and config.json go."""


def quick() -> ScaleBenchConfig:
    """9 GPUs, fewer batches; R = 1 only; no dilation, projection to 64 GPUs."""
    return ScaleBenchConfig(balance_rounds=[1], dilation_rounds=[], gpus=9, num_batches=16, control_batches=16,
                            project_gpus=[64])


def start_cluster(args):
    """A head without resources plus `--nodes` nodes with fake GPUs, every process on 127.0.0.1 (or the
    cluster at --address, which must answer within 10 s)."""
    if args.address:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address=args.address, log_to_driver=False)
        return None
    return simulated_cluster(args.nodes, cpus_per_node=args.cpus_per_node, gpus_per_node=args.gpus_per_node,
                             object_store_memory=args.object_store_mib * 2**20)


def simulated_cluster(nodes: int, *, cpus_per_node: int, gpus_per_node: int = 0,
                      object_store_memory: int = 384 * 2**20):
    """Start a simulated cluster on 127.0.0.1 and connect this process to it: a 1-CPU head plus `nodes` nodes of
    `cpus_per_node` logical CPUs, `gpus_per_node` fake GPUs and `object_store_memory` bytes of object store
    each. Returns the `ray.cluster_utils.Cluster` (the caller shuts it down after `ray.shutdown()`)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # The workers (they inherit this environment) import this checkout: the repository root, above jobs/.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    # A private temp dir: the simulated cluster's address file must not replace the machine's own
    # (`ray.init()` / init_ray elsewhere would join it); short, for Ray's 108-byte socket paths.
    if "RAY_TMPDIR" not in os.environ:
        os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rbs", dir="/tmp")
    # Each simulated node gets its share of this host's free memory: left alone, every node would declare
    # the whole host's, and memory-aware sizing (the clients' auto depth) would plan for several hosts.
    node_memory = int(0.7 * os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / (nodes + 1))
    with loopback_only():
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                                "object_store_memory": 256 * 2**20,
                                                                "memory": node_memory,
                                                                "node_ip_address": "127.0.0.1"})
        for _ in range(nodes):
            cluster.add_node(num_cpus=cpus_per_node, num_gpus=gpus_per_node, memory=node_memory,
                             object_store_memory=object_store_memory, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    return cluster


def paper_plan(args, scale: float = 1.0):
    """The simulated system: the paper table's costs, or with `costs` the fitted table of the demo preset's
    model per role (every time x `scale`)."""
    style = PAPER_SYSTEMS[args.system]
    paper = role_models(style, "paper")
    if getattr(args, "costs", None):
        fit, demo = load_fit(args.costs), role_models(style, "demo")
        missing = sorted({m for m in demo.values() if m not in fit})
        if missing:
            raise ValueError(f"--costs {args.costs}: no fit for {missing}; expected the demo models' "
                             "(python -m jobs.bench.scale_fit)")
        models = {}
        for role, model in demo.items():
            f = {**fit[model], "sim_params": {k: v * scale if k.endswith("_ms") else v
                                              for k, v in fit[model]["sim_params"].items()}}
            models[role] = fitted_sim_name(f, hidden=PAPER_MODEL_SIZES[paper[role]][1], tokens=args.tokens,
                                           eos_spread=args.eos_spread)
        return simulated_plan(style, models)
    models = paper_sim_models(paper, ms_per_gparam=args.ms_per_gparam * scale, tokens=args.tokens,
                              prompt_tokens=args.prompt_tokens, row_share=args.row_share, eos_spread=args.eos_spread)
    return simulated_plan(style, models)
