"""Simulated multi-node cluster check, run in its own process by `test_multinode.py`.

Only one `ray.init` is allowed per process and the test session already holds a local cluster, so
this script starts a `ray.cluster_utils.Cluster` (a 1-CPU head plus N nodes with fake GPUs), builds
the agent system once per placement preset, and prints one JSON report on its last stdout line:

  placements  per preset and role: node name, GPU ids, device (from torch: "cpu" with fake GPUs)
  impossible  the error of a placement no node can host, how long it took, pending groups after it
  spread      one sequential system with every agent on a different node: predictions and latent
              messages of the Ray run and of the in-process (LocalPool) run, plus where each
              message lived in the object store (it must cross nodes)
  replicas    two replicas of a one_gpu_per_agent system (3 GPUs each, so each fits one node):
              the node of every agent per replica, and the predictions of an evaluation run
              routed over both replicas next to those of the local backend

`max_direct_call_object_size` is lowered to 1 KiB so every latent message goes through the plasma
object store (and is pulled across nodes) instead of being inlined into the task reply.

    RAY_AUTH_MODE=disabled PYTHONPATH=. python tests/distributed/multinode_check.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import ray
import torch
from ray.cluster_utils import Cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from recmas_ray.config.recursion import DecodeConfig  # noqa: E402
from recmas_ray.distributed.transports import from_wire  # noqa: E402
from recmas_ray.distributed.ray_pool import RayPool  # noqa: E402
from recmas_ray.distributed.replicas import build_ray_system, build_replicas  # noqa: E402
from recmas_ray.distributed.routing import Pending  # noqa: E402
from recmas_ray.config.placement import PlacementConfig  # noqa: E402
from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.engine.runner import run_batch  # noqa: E402
from recmas_ray.system.launch import local_pool  # noqa: E402
from recmas_ray.system.plan import plan_system  # noqa: E402
from recmas_ray.system.config import SystemConfig  # noqa: E402

QUESTIONS = ["What is 2 + 3?", "Tom has 4 apples and buys 3 more. How many?", "What is 6 * 7?", "What is 9 - 4?"]
CFG = RecursionConfig(method="recursive_mas", num_recursive_rounds=2, latent_steps=6,
                      decode=DecodeConfig(max_new_tokens=8))


class RecordingPool:
    """Wraps a pool and keeps every latent message handle, so a run's messages can be compared."""

    def __init__(self, pool):
        self.pool, self.messages = pool, []

    def rollout(self, role, users, slot_names, num_steps, edges, latents):
        outs, stats = self.pool.rollout(role, users, slot_names, num_steps, edges, latents)
        self.messages += [(role, edge, out) for edge, out in zip(edges, outs)]
        return outs, stats

    def decode(self, role, users, slot_names, cfg, latents):
        return self.pool.decode(role, users, slot_names, cfg, latents)

    def get(self, handle, *, what):
        return self.pool.get(handle, what=what)


def start_cluster(num_nodes: int, gpus_per_node: int) -> tuple[Cluster, dict]:
    """Head with 1 CPU (like a 0-CPU head, it cannot host the agents) plus GPU nodes named node0...

    Nodes have 3 logical CPUs: two replicas' agents, orchestrators and evaluation clients fit.
    """
    from recmas_ray.distributed.cluster import loopback_only

    with loopback_only():  # every node and the driver on 127.0.0.1 (tests never use other addresses)
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "object_store_memory": 80 * 2**20, "include_dashboard": False,
            "node_ip_address": "127.0.0.1", "_system_config": {"max_direct_call_object_size": 1024}})
        for i in range(num_nodes):
            cluster.add_node(num_cpus=3, num_gpus=gpus_per_node, object_store_memory=80 * 2**20,
                             resources={f"node{i}": 1}, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    # The GPUs are the simulated nodes' Ray resources, as on a real cluster `ray job submit` names: this host's own
    # CUDA (none) says nothing about them, so the jobs' GPU-visibility check defers to Ray here too.
    os.environ["RAY_ADDRESS"] = cluster.address
    names = {}
    for node in ray.nodes():
        own = [k for k in node["Resources"] if k.startswith("node") and k[4:].isdigit()]
        names[node["NodeID"]] = own[0] if own else "head"
    return cluster, names


def describe(system, names: dict) -> dict:
    return {role: {"node": names.get(i["node"], i["node"]), "gpu_ids": i["gpu_ids"], "device": i["device"]}
            for role, i in system.infos.items()}


def check_impossible(plan) -> dict:
    """A role asking for more GPUs than any node has must fail before a placement group exists."""
    t0 = time.perf_counter()
    try:
        build_ray_system(plan, PlacementConfig(preset="one_gpu_per_agent", role_gpus={"solver": 4},
                                               ready_timeout_s=30))
        error = None
    except ValueError as e:
        error = str(e)
    seconds = time.perf_counter() - t0
    pending = [pg for pg in ray.util.placement_group_table().values() if pg["state"] != "REMOVED"]
    return {"error": error, "seconds": seconds, "pending_groups": len(pending)}


def check_spread_equivalence(system, plan, names, timeout_s: float) -> dict:
    """Predictions through the orchestrator and every latent message, Ray vs in-process."""
    tasks = ["math"] * len(QUESTIONS)
    remote = ray.get(system.solve(QUESTIONS, tasks, CFG, batch_id="spread"), timeout=timeout_s)
    rec_ray = RecordingPool(RayPool(system.handles, timeout_s=timeout_s, context=", batch spread-rec"))
    run_batch(rec_ray, plan.style, QUESTIONS, tasks, CFG)
    # Locations are read before the driver fetches anything, so they show agent-to-agent pulls only.
    # A message's handle is the call's ref, or a Pending for a call routed once its inputs existed (by now it
    # is submitted: the batch finished); either resolves to the agent's reply, the message's stored ref.
    handles = [ref.value(timeout_s) if isinstance(ref, Pending) else ref for _, _, ref in rec_ray.messages]
    refs = ray.get(handles, timeout=timeout_s)
    # One ref per call: with refs of several owners (each agent owns its messages) Ray sends one request per
    # owner and can settle its promise twice when a reply lands while it still sends, aborting the driver
    # (ray-project/ray#65523; seen in CI). A single owner is a single request.
    locations = {}
    for stored in refs:
        locations.update(ray.experimental.get_object_locations([stored], timeout_ms=int(timeout_s * 1000)))
    ray_msgs = [from_wire(m) for m in ray.get(refs, timeout=timeout_s)]
    rec_local = RecordingPool(local_pool(plan))
    local = run_batch(rec_local, plan.style, QUESTIONS, tasks, CFG)
    messages = []
    for (role, edge, _), stored, msg, (_, _, ref_msg) in zip(rec_ray.messages, refs, ray_msgs, rec_local.messages):
        loc = locations[stored]
        messages.append({"role": role, "edge": edge, "shape": list(msg.shape), "device": str(msg.device),
                         "max_abs_diff": float((msg - ref_msg).abs().max()),
                         "object_size": loc.get("object_size"),
                         "stored_on": sorted(names.get(n, n) for n in loc.get("node_ids", []))})
    return {"ray_predictions": [r.prediction for r in remote], "local_predictions": [r.prediction for r in local],
            "ray_latent_steps": [r.num_latent_steps for r in remote],
            "local_latent_steps": [r.num_latent_steps for r in local],
            "ray_trace_roles": [t["role"] for t in remote[0].trace],
            "local_trace_roles": [t["role"] for t in local[0].trace], "messages": messages,
            "local_edges": [edge for _, edge, _ in rec_local.messages]}


def check_auto_replicas(names: dict, timeout_s: float) -> dict:
    """--num_replicas 0 on the 3 x 3-GPU nodes with 2-GPU systems (the solver CPU-only): one strictly
    packed replica per node = 3; the old count also planned a 4th over the three nodes' spare GPUs,
    which its STRICT_PACK group never places. Every planned replica must come up."""
    from recmas_ray.system.plan import simulated_plan

    plan = simulated_plan("sequential_light", "sim:hidden=8,step_ms=0,token_ms=0,tokens=1")
    pcfg = PlacementConfig(preset="one_gpu_per_agent", role_gpus={"solver": 0}, cpus_per_agent=0.05,
                           num_replicas=0, ready_timeout_s=min(timeout_s, 60), agent_max_restarts=0)
    t0 = time.perf_counter()
    try:
        replicas = build_replicas(plan, pcfg, timeout_s=timeout_s)
    except Exception as e:  # noqa: BLE001 - reported, the test names it
        return {"error": f"{type(e).__name__}: {str(e)[:500]}", "seconds": time.perf_counter() - t0}
    try:
        nodes = [sorted({names.get(i["node"], i["node"]) for r, i in s.infos.items() if r != "solver"})
                 for s in replicas.systems]
        return {"num_replicas": replicas.num_replicas, "gpu_nodes": nodes, "error": None,
                "seconds": time.perf_counter() - t0}
    finally:
        replicas.shutdown()


def check_replicas(names: dict, timeout_s: float, workdir: str) -> dict:
    """Two replicas on the fake-GPU nodes, an evaluation streamed over both, and the local backend."""
    from recmas_ray.eval.config import EvalConfig, StreamConfig
    from recmas_ray.eval.run import evaluate
    from recmas_ray.eval.samples import read_samples

    qfile = os.path.join(workdir, "questions.jsonl")
    with open(qfile, "w") as f:
        for a, b in [(2, 3), (10, 7), (4, 4), (21, 5), (6, 1), (9, 9)]:
            f.write(json.dumps({"question": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n")
    pcfg = PlacementConfig(preset="one_gpu_per_agent", num_replicas=2, ready_timeout_s=timeout_s)

    def cfg(backend: str) -> EvalConfig:
        return EvalConfig(system=SystemConfig(style="sequential_light", seed=3), dataset=qfile, backend=backend,
                          batch_size=1,
                          placement=pcfg if backend == "ray" else PlacementConfig(),  # local: one in-process system
                          recursion=CFG, stream=StreamConfig(num_clients=2), output_path=os.path.join(workdir, backend),
                          progress=False, timeout_s=timeout_s)

    plan = plan_system("sequential_light", preset="tiny", seed=3, task="math")
    replicas = build_replicas(plan, pcfg, timeout_s=timeout_s, torch_threads=1)
    try:
        nodes = [sorted({names.get(i["node"], i["node"]) for i in s.infos.values()}) for s in replicas.systems]
        gpus = [[(names.get(i["node"]), g) for i in s.infos.values() for g in i["gpu_ids"]] for s in replicas.systems]
        ray_out = evaluate(cfg("ray"), progress=False, system=replicas)
    finally:
        replicas.shutdown()
    local_out = evaluate(cfg("local"), progress=False)
    ray_rows, local_rows = read_samples(ray_out["samples_path"]), read_samples(local_out["samples_path"])
    return {"nodes": nodes, "gpus": gpus,
            "ray_predictions": {r["doc_id"]: r["prediction"] for r in ray_rows},
            "local_predictions": {r["doc_id"]: r["prediction"] for r in local_rows},
            "replica_of": {r["doc_id"]: r["replica"] for r in ray_rows}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--gpus_per_node", type=int, default=3)
    p.add_argument("--timeout_s", type=float, default=60.0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    plan = plan_system("sequential_light", preset="tiny", seed=3)
    cluster, names = start_cluster(args.nodes, args.gpus_per_node)
    report = {"nodes": sorted(names.values()), "placements": {}}
    cases = {
        # solver asks for two GPUs: a role's GPU count may exceed one (its own 2-GPU bundle)
        "one_gpu_per_agent": PlacementConfig(preset="one_gpu_per_agent", role_gpus={"solver": 2}),
        "colocated": PlacementConfig(preset="colocated"),
        "cpu": PlacementConfig(preset="cpu", cpus_per_agent=0.5),
        "spread": PlacementConfig(preset="spread"),
    }
    try:
        report["startup_s"] = time.perf_counter() - t_start
        report["impossible"] = check_impossible(plan)
        report["auto_replicas"] = check_auto_replicas(names, args.timeout_s)
        for preset, pcfg in cases.items():
            pcfg.ready_timeout_s = args.timeout_s
            t0 = time.perf_counter()
            system = build_ray_system(plan, pcfg, timeout_s=args.timeout_s, torch_threads=1)
            try:
                report["placements"][preset] = describe(system, names)
                report.setdefault("build_s", {})[preset] = time.perf_counter() - t0
                if preset == "spread":
                    report["spread"] = check_spread_equivalence(system, plan, names, args.timeout_s)
            finally:
                system.shutdown()
        import tempfile

        t0 = time.perf_counter()
        report["replicas"] = check_replicas(names, args.timeout_s, tempfile.mkdtemp(prefix="rmn-eval"))
        report.setdefault("build_s", {})["replicas+eval"] = time.perf_counter() - t0
        report["seconds"] = time.perf_counter() - t_start
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
