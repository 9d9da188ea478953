"""`--num_clients` auto (0): enough batches in flight to keep every stage busy, capped by memory and CPUs;
several batches per client process (`--batches_per_client`), on threads."""

import pytest

from recmas_ray.eval.config import StreamConfig
from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.eval.stream import (CLIENTS_PER_ACTOR, batches_in_flight, client_pool, message_bytes,
                                    planned_client_cpus, planned_depth)
from recmas_ray.system.plan import simulated_plan

clients_per_replica = batches_in_flight


def test_auto_is_the_default_and_scales_with_the_agent_actors():
    auto = StreamConfig()
    assert auto.num_clients == 0
    assert clients_per_replica(auto, 3) == 3 * CLIENTS_PER_ACTOR == planned_depth(auto, 3)
    assert clients_per_replica(auto, 5) == 5 * CLIENTS_PER_ACTOR  # a role's copies are stages too
    assert clients_per_replica(StreamConfig(num_clients=3), 5, store_bytes=1, message_bytes_per_batch=10) == 3


def test_auto_depth_is_capped_by_object_store_memory_and_cpus():
    plan = simulated_plan("sequential_light", "sim:hidden=4096")
    per_batch = message_bytes(plan, RecursionConfig(latent_steps=64), batch_size=16)
    assert per_batch == len(plan.style.edges) * 16 * 64 * 4096 * 4
    auto = StreamConfig(client_cpus=0.25)
    roomy = clients_per_replica(auto, 3, message_bytes_per_batch=per_batch, store_bytes=64 * 2**30)
    tight = clients_per_replica(auto, 3, message_bytes_per_batch=per_batch, store_bytes=4 * per_batch)
    assert roomy == 6 and tight == 1  # 25% of a store of four batches' messages: one batch in flight
    one = StreamConfig(client_cpus=0.25, batches_per_client=1)  # a process per batch
    assert clients_per_replica(one, 3, free_cpus=1.0, num_replicas=2) == 2  # 1 CPU / (0.25 x 2 replicas)
    assert clients_per_replica(one, 3, free_cpus=0.1) == 1  # never below one
    # 4 batches per process: the same CPU holds four times the batches
    assert clients_per_replica(auto, 3, free_cpus=1.0, num_replicas=2) == 6  # 4 processes x 4 / 2, capped at 6
    assert clients_per_replica(auto, 3, free_cpus=0.25, num_replicas=2) == 2  # 1 process x 4 / 2
    # the client processes' memory: with a process per batch 8 replicas on 24 GiB get 1 each (not 6:
    # 48 x 400 MiB); with 4 batches per process the same 15 processes carry 6 each (60 / 8 = 7, capped at 6)
    from recmas_ray.eval.stream import CLIENT_BYTES

    assert clients_per_replica(one, 3, free_memory_bytes=24 * 2**30, num_replicas=8) == 1
    assert clients_per_replica(auto, 3, free_memory_bytes=24 * 2**30, num_replicas=8) == 3 * CLIENTS_PER_ACTOR
    assert clients_per_replica(one, 3, free_memory_bytes=24 * 2**30, num_replicas=1) == 3 * CLIENTS_PER_ACTOR
    assert clients_per_replica(one, 3, free_memory_bytes=16 * CLIENT_BYTES, num_replicas=2) == 2
    assert clients_per_replica(auto, 3, free_memory_bytes=4 * CLIENT_BYTES, num_replicas=8) == 1  # 1 x 4 / 8
    assert clients_per_replica(StreamConfig(num_clients=5), 3, free_memory_bytes=1.0) == 5  # explicit wins


def test_a_large_replica_is_not_capped_at_one_orchestrators_default_threads():
    """200 agent actors in a replica want 400 batches in flight (was capped at the orchestrator's 256); the
    replica is then built with an orchestrator of that many threads."""
    from recmas_ray.distributed.placement import ORCHESTRATOR_MAX_BATCHES

    assert clients_per_replica(StreamConfig(), 200) == 400 > ORCHESTRATOR_MAX_BATCHES
    assert planned_depth(StreamConfig(), 200) == 400


def test_client_processes_hold_several_batches_each():
    assert client_pool(6, 4) == (2, 3) and client_pool(8, 4) == (2, 4) and client_pool(7, 4) == (2, 4)
    assert client_pool(3, 1) == (3, 1) and client_pool(1, 4) == (1, 1) and client_pool(0, 4) == (1, 1)
    assert planned_client_cpus(StreamConfig(client_cpus=0.25), 3) == 0.5  # 6 batches: 2 processes
    assert planned_client_cpus(StreamConfig(client_cpus=0.25, batches_per_client=1), 3) == 1.5


SIM = {"planner": "sim:step_ms=40,prefill_ms=0", "critic": "sim:step_ms=40,prefill_ms=0",
       "solver": "sim:step_ms=40,token_ms=40,tokens=4"}


@pytest.mark.timeout(300)
def test_one_client_process_keeps_its_batches_in_flight_at_once(ray_cluster):
    """Three batches, one client process (3 per client): the agents' own logs show the batches overlapping
    (a batch's first step starts before another's last ends), and every sample comes back graded."""
    from recmas_ray.config.placement import PlacementConfig
    from recmas_ray.eval.stream import stream_samples
    from recmas_ray.distributed.launch import start_agents

    plan = simulated_plan("sequential_light", SIM)
    rc = RecursionConfig(method="recursive_mas", num_recursive_rounds=1, latent_steps=2,
                         decode=DecodeConfig(max_new_tokens=4))
    reps = start_agents(plan, backend="ray", timeout_s=120, torch_threads=1,
                        placement=PlacementConfig(preset="cpu", cpus_per_agent=0.05, agent_max_restarts=0))
    batches = [([{"doc_id": f"q{k}", "question": f"question {k}: what is {k} + 0?", "gold": str(k),
                  "task_type": "math", "benchmark": "t"}], 0) for k in range(3)]
    try:
        reps.call_logs(clear=True)
        records = list(stream_samples(reps, batches, "recursive_mas", rc, "strict", False,
                                      StreamConfig(num_clients=3, batches_per_client=3, client_cpus=0.05),
                                      timeout_s=120))
        logs = reps.call_logs()
    finally:
        reps.shutdown()
    assert sorted(r["doc_id"] for r in records) == ["q0", "q1", "q2"] and not any(r.get("error") for r in records)
    calls = [c for log in (logs if isinstance(logs, list) else [logs]) for cs in log.values() for c in cs]
    spans = {}
    for c in calls:
        k = next(k for k in range(3) if f"question {k}:" in c["first_user"])
        t0, t1 = spans.get(k, (c["t0"], c["t1"]))
        spans[k] = (min(t0, c["t0"]), max(t1, c["t1"]))
    assert len(spans) == 3
    overlapping = [(a, b) for a in spans for b in spans if a < b
                   and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]]
    assert overlapping, f"the three batches ran one after another: {spans}"
