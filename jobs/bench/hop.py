"""One latent hop between agent actors: object store vs Ray Direct Transport over gloo (`rdt:gloo`), across
the nodes of the simulated 2-node cluster of jobs/bench/scale.py (and on one node, for reference).

A sender actor holds float32 latents shaped like a message, [B, M, D] (`--batch_size` B, `--hidden` D, M from
the size), and a receiver actor takes one and returns a checksum of its bytes (the sum of its 32-bit words mod
2**64: it reads every byte). One hop runs from the driver asking the sender for the message to the driver holding
the receiver's checksum, and counts only if that checksum equals the sender's: a lazy or zero-copy path that never
delivered the bytes cannot pass. The two ways are the production ones (`config/transport.py`):

  object_store  the sender puts the message (`ray.put` of a zero-copy WireMessage, as an agent's `rollout` does)
                and returns its ref; the receiver's call gets the ref and pulls the bytes to its node
  rdt:gloo      the message stays in the sender; the receiver's call takes the ref of the sender's call made
                with `.options(tensor_transport="gloo")`, and Ray moves the tensor over a torch_gloo collective
                group of the actors (as `RayPool` fetches a kept message)

Pairs: `cross_node` (sender on node 1, receiver on node 2) and `same_node` (a second receiver on node 1). Every
(pair, size, transport) runs `--warmup` untimed hops, then `--repeats` timed ones, interleaved (each repeat runs
every size, pair and transport, the transports' order rotating) so load drift hits both transports alike. Figures
per pair, size and transport: median seconds per hop, MiB/s (size / median), the receiver's median read time; per
pair and size the ratio rdt:gloo / object_store (of the medians, and the median of each repeat's ratio), a ratio
within one run since the machine may be shared. Every raw time is kept.

  python -m jobs.bench.hop                                   # 1 / 16 / 64 MiB, 7 repeats: ~30 s
  python -m jobs.bench.hop --sizes_mib 1 4 --repeats 15 --pairs cross_node

Writes <output_path>/bench_hop.json (figures, raw times, checksums, actors' nodes, machine and load) and
config.json. Exit 1 when a hop failed or a checksum differed (recorded in the JSON).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated

import numpy as np
import ray
import torch
from ray.experimental.collective import create_collective_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from jobs.bench.backend import machine
from jobs.bench.scale_setup import simulated_cluster
from recmas_ray.config.checks import NonEmpty, OneOf, Range, WritableDir
from recmas_ray.config.cli import run_job
from recmas_ray.config.transport import OBJECT_STORE, RDT_GLOO
from recmas_ray.config.tree import save_config
from recmas_ray.distributed.transports import from_wire, latent_transport

MIB = 2**20
HOP_TRANSPORTS = (OBJECT_STORE.name, RDT_GLOO.name)
"""The CPU transports (rdt:nccl moves CUDA tensors; the simulated nodes have fake GPUs)."""
PAIRS = ("cross_node", "same_node")
WORD_BYTES = 4  # float32


@dataclass(kw_only=True)
class HopBenchConfig:
    """What the latent-hop benchmark runs (see the module docstring)."""

    sizes_mib: Annotated[list[float], Range(0, 1024, lo_open=True), NonEmpty()] = field(
        default_factory=lambda: [1.0, 16.0, 64.0])
    """Message sizes in MiB; each becomes [batch_size, M, hidden] float32 with M the nearest whole number of
    latent steps (the bytes actually sent are in the JSON)."""
    transports: Annotated[list[str], OneOf(HOP_TRANSPORTS), NonEmpty()] = field(
        default_factory=lambda: list(HOP_TRANSPORTS))
    """Transports compared."""
    pairs: Annotated[list[str], OneOf(PAIRS), NonEmpty()] = field(default_factory=lambda: list(PAIRS))
    """cross_node: sender on node 1, receiver on node 2; same_node: both on node 1 (the reference)."""
    repeats: Annotated[int, Range(1, 1000)] = 7
    """Timed hops per pair, size and transport (interleaved; medians reported)."""
    warmup: Annotated[int, Range(0, 100)] = 1
    """Untimed hops per pair, size and transport first (gloo connects, the object store maps its pages)."""
    batch_size: Annotated[int, Range(1, 4096)] = 4
    """B of the message."""
    hidden: Annotated[int, Range(1, 65536)] = 2048
    """D of the message (2048: a 1.5B model's hidden size; 1 MiB is then m = 32 latent steps at B = 4)."""
    cpus_per_node: Annotated[int, Range(1, 1024)] = 4
    """Logical CPUs per simulated node."""
    timeout_s: Annotated[float, Range(0, 86400, lo_open=True)] = 300.0
    """Timeout of every wait, in seconds."""
    output_path: Annotated[str, WritableDir()] = "out/bench_hop"
    """Where bench_hop.json and config.json go."""

    def validate(self) -> None:
        step = self.batch_size * self.hidden * WORD_BYTES
        small = [s for s in self.sizes_mib if s * MIB < step / 2]
        if small:
            raise ValueError(f"--sizes_mib {small[0]:g}: below one latent step ([{self.batch_size}, 1, {self.hidden}] "
                             f"float32 = {step / MIB:g} MiB); lower --hidden or --batch_size")


def message_shape(size_mib: float, batch_size: int, hidden: int) -> list[int]:
    """[B, M, D] of about `size_mib` MiB of float32: M the nearest whole number of latent steps (at least 1)."""
    return [batch_size, max(1, round(size_mib * MIB / (batch_size * hidden * WORD_BYTES))), hidden]


def checksum(array) -> int:
    """The sum of a numpy array's 32-bit words mod 2**64: reads every byte, exact, independent of the order."""
    return int(array.reshape(-1).view(np.uint32).sum(dtype=np.uint64))


class HopActor:
    """Sender or receiver of the benchmark (one class, so that all three actors join one collective group)."""

    def __init__(self, timeout_s: float, loopback: bool):
        torch.set_num_threads(1)
        if loopback:  # the simulated nodes are 127.0.0.1: keep gloo's sockets there whatever the host name says
            os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        self.timeout_s = timeout_s
        self.messages: dict = {}

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def make(self, name: str, shape: list[int], seed: int) -> int:
        """Hold a random message under `name`; returns its checksum."""
        msg = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
        self.messages[name] = msg
        return checksum(msg.numpy())

    def hand_out(self, name: str, transport: str):
        """The message as `transport` hands it out, as an agent's rollout does (`LatentTransport.hand_out`):
        object_store: put into this node's object store, its ref returned; rdt:gloo (called with
        tensor_transport="gloo"): the tensor, which stays here until a receiver's call takes it."""
        return latent_transport(transport).hand_out(self.messages[name])

    def read(self, message) -> dict:
        """Take the message (a stored one's ref is fetched to this node) and read every byte of it."""
        t0 = time.perf_counter()
        fetched = isinstance(message, ray.ObjectRef)  # a direct transport's tensor arrives before the call starts
        if fetched:
            message = ray.get(message, timeout=self.timeout_s)
        t1 = time.perf_counter()
        tensor = from_wire(message)
        total = checksum(tensor.numpy())
        return {"checksum": total, "shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch."),
                "fetch_s": t1 - t0 if fetched else None, "read_s": time.perf_counter() - t1}


def start_actors(args: HopBenchConfig, loopback: bool) -> dict:
    """The sender and the node-2 receiver on the two simulated nodes, the node-1 receiver beside the sender,
    each pinned by node affinity; the torch_gloo collective group of all three when rdt:gloo is measured."""
    workers = sorted(n["NodeID"] for n in ray.nodes()
                     if n["Alive"] and "node:__internal_head__" not in n["Resources"])
    if len(workers) < 2:
        raise RuntimeError(f"the simulated cluster has {len(workers)} worker nodes alive; the hop needs 2")
    actor = ray.remote(num_cpus=0.5, max_restarts=0, enable_tensor_transport=True)(HopActor)

    def on(node: str):
        return actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
            args.timeout_s, loopback)

    actors = {"sender": on(workers[0]), "cross_node": on(workers[1]), "same_node": on(workers[0])}
    nodes = dict(zip(actors, ray.get([a.node.remote() for a in actors.values()], timeout=args.timeout_s)))
    if nodes["cross_node"] == nodes["sender"] or nodes["same_node"] != nodes["sender"]:
        raise RuntimeError(f"actors landed on the wrong nodes: {nodes}")
    group_error = None
    if RDT_GLOO.name in args.transports:
        try:
            with_timeout(lambda: create_group(list(actors.values())), args.timeout_s, "creating the gloo group")
        except Exception as e:  # noqa: BLE001 - recorded; the object store is still measured
            group_error = f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"
    return {"actors": actors, "nodes": nodes, "group_error": group_error}


def create_group(actors: list) -> None:
    create_collective_group(actors, backend=RDT_GLOO.collective_backend)


def with_timeout(fn, timeout_s: float, what: str):
    """fn() on a thread, waited for at most `timeout_s` (Ray's group creation waits on its actors unbounded)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True, name=what)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise RuntimeError(f"{what}: no answer within {timeout_s:g}s")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def hop(sender, receiver, name: str, transport: str, timeout_s: float) -> tuple[float, dict]:
    """One hop of message `name` from sender to receiver over `transport`: (seconds, the receiver's reply)."""
    t = latent_transport(transport)
    t0 = time.perf_counter()
    ref = t.fetch(sender.hand_out, name, transport)  # object_store: the stored message's ref, fetched by the receiver
    reply = ray.get(receiver.read.remote(ref), timeout=timeout_s)
    return time.perf_counter() - t0, reply


def delivered(reply: dict, sent_checksum: int, shape: list[int]) -> bool:
    """The receiver read the message the sender holds: the same checksum, shape and dtype."""
    return reply["checksum"] == sent_checksum and reply["shape"] == shape and reply["dtype"] == "float32"


def measure(args: HopBenchConfig, actors: dict, transports: list[str]) -> dict:
    """Every hop over `transports`, interleaved; each reply checked against the sender's checksum and the
    message's shape."""
    sender = actors["sender"]
    sizes = {f"{s:g}MiB": message_shape(s, args.batch_size, args.hidden) for s in args.sizes_mib}
    seeds = {label: k for k, label in enumerate(sizes)}  # torch.randn(*shape) under manual_seed(seed)
    sums = dict(zip(sizes, ray.get([sender.make.remote(label, shape, seeds[label]) for label, shape in sizes.items()],
                                   timeout=args.timeout_s)))
    pairs, transports = list(dict.fromkeys(args.pairs)), list(dict.fromkeys(transports))  # each once
    runs = {(p, s, t): {"times_s": [], "fetch_s": [], "read_s": [], "received": set()} for p in pairs
            for s in sizes for t in transports}
    errors: dict = {}
    mismatches: list = []
    verified = 0
    n = len(transports)
    for rep in range(-args.warmup, args.repeats):
        for label in sizes:
            for pair in pairs:
                for transport in transports[rep % n:] + transports[:rep % n]:
                    key = f"{pair}/{label}/{transport}"
                    if key in errors:
                        continue
                    try:
                        seconds, reply = hop(sender, actors[pair], label, transport, args.timeout_s)
                    except Exception as e:  # noqa: BLE001 - recorded; the other transports still run
                        errors[key] = " ".join(str(e).split())[:500]
                        print(f"{key} failed: {errors[key]}", file=sys.stderr, flush=True)
                        continue
                    run = runs[(pair, label, transport)]
                    run["received"].add(reply["checksum"])
                    if not delivered(reply, sums[label], sizes[label]):
                        mismatches.append({"hop": key, "repeat": rep, "sent": sums[label], **reply})
                        continue
                    verified += 1
                    if rep >= 0:
                        run["times_s"].append(seconds)
                        run["fetch_s"].append(reply["fetch_s"])
                        run["read_s"].append(reply["read_s"])
    return {"sizes": sizes, "seeds": seeds, "checksums_sent": sums, "runs": runs, "errors": errors,
            "mismatches": mismatches, "hops_verified": verified,
            "hops_planned": len(runs) * (args.warmup + args.repeats)}


def figures(measured: dict) -> dict:
    """pair -> size -> per transport: s_per_hop (median), mib_per_s, read_s (the receiver's checksum of the
    bytes, inside the hop), fetch_s (object_store: the receiver's get of the stored message, inside the hop),
    every raw time and the distinct checksums the receiver returned; and the ratio rdt:gloo / object_store."""
    out: dict = {}
    for (pair, label, transport), run in measured["runs"].items():
        shape = measured["sizes"][label]
        row = out.setdefault(pair, {}).setdefault(label, {"shape": shape, "bytes": WORD_BYTES * _prod(shape)})
        if not run["times_s"]:
            continue
        received = sorted(run["received"])  # one value, the sender's, when every hop delivered
        median = statistics.median(run["times_s"])
        row[transport] = {"s_per_hop": median, "mib_per_s": row["bytes"] / MIB / median,
                          "read_s": statistics.median(run["read_s"]), "times_s": run["times_s"],
                          "read_times_s": run["read_s"], "checksums_received": received}
        if None not in run["fetch_s"]:  # (a direct transport's tensor arrives before the call starts)
            row[transport].update(fetch_s=statistics.median(run["fetch_s"]), fetch_times_s=run["fetch_s"])
    for pair in out.values():
        for row in pair.values():
            rdt, store = row.get(RDT_GLOO.name), row.get(OBJECT_STORE.name)
            if rdt and store:
                row["ratio_rdt_gloo_to_object_store"] = rdt["s_per_hop"] / store["s_per_hop"]
                # each repeat ran both transports back to back: its own ratio is the least drift-prone
                row["ratio_median_of_repeats"] = statistics.median(
                    a / b for a, b in zip(rdt["times_s"], store["times_s"]))
    return out


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def table(report: dict) -> str:
    """The figures as a small text table."""
    lines = [f"{'pair':<11} {'size':>8} {'transport':<13} {'s/hop':>9} {'MiB/s':>9} {'read s':>8} {'rdt/os':>7}"]
    for pair, rows in report["figures"].items():
        for label, row in rows.items():
            for transport in HOP_TRANSPORTS:
                if transport not in row:
                    continue
                f = row[transport]
                ratio = row.get("ratio_rdt_gloo_to_object_store") if transport == RDT_GLOO.name else None
                lines.append(f"{pair:<11} {label:>8} {transport:<13} {f['s_per_hop']:>9.4f} {f['mib_per_s']:>9.1f} "
                             f"{f['read_s']:>8.4f} {'' if ratio is None else f'{ratio:.2f}':>7}")
    return "\n".join(lines)


def bench(args: HopBenchConfig) -> int:
    """Start the simulated cluster, measure, write the JSON and the config, print the table."""
    save_config(args, args.output_path)
    t_start = time.perf_counter()
    report: dict = {"errors": {}, "machine": machine(1)}  # (its load average: before the cluster starts)
    largest = WORD_BYTES * max(_prod(message_shape(s, args.batch_size, args.hidden)) for s in args.sizes_mib)
    # room for a few stored copies of the largest message on each node (freed as each hop's refs go)
    cluster = simulated_cluster(2, cpus_per_node=args.cpus_per_node,
                                object_store_memory=max(384 * MIB, 4 * largest))
    try:
        started = start_actors(args, loopback=True)
        transports = list(args.transports)
        if started["group_error"]:  # rdt:gloo cannot run here: said in the report and on stderr, not fatal
            transports = [t for t in transports if t != RDT_GLOO.name]
            report["errors"][RDT_GLOO.name] = started["group_error"]
            print(f"{RDT_GLOO.name} not measured: {started['group_error']}", file=sys.stderr, flush=True)
        measured = measure(args, started["actors"], transports)
        report["errors"].update(measured["errors"])
        report.update(nodes=started["nodes"], message_dtype="float32", sizes=measured["sizes"],
                      message_seeds=measured["seeds"], checksums_sent=measured["checksums_sent"],
                      hops_verified=measured["hops_verified"], mismatches=measured["mismatches"],
                      # every hop ran and returned the sender's checksum (warm-up hops included)
                      checksums_match=measured["hops_verified"] == measured["hops_planned"],
                      figures=figures(measured), cluster=ray.cluster_resources())
    except (RuntimeError, TimeoutError, ray.exceptions.RayError) as e:  # the actors did not come up: recorded
        report["errors"]["setup"] = " ".join(str(e).split())[:500]
        print(f"setup failed: {report['errors']['setup']}", file=sys.stderr, flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    report["machine"]["loadavg_1_5_15_after"] = list(os.getloadavg())
    report["seconds"] = time.perf_counter() - t_start
    path = os.path.join(args.output_path, "bench_hop.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    if report.get("figures"):
        print(table(report))
    print(f"checksums match on every receiver: {report.get('checksums_match')} ({report.get('hops_verified', 0)} "
          f"hops); load average {report['machine']['loadavg_1_5_15'][0]:.2f} -> "
          f"{report['machine']['loadavg_1_5_15_after'][0]:.2f}; wrote {path}")
    return 1 if report["errors"] or report.get("mismatches") else 0


def main(argv=None) -> int:
    return run_job(bench, HopBenchConfig, argv, prog="python -m jobs.bench.hop", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
