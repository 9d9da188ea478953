"""`--num_clients` auto (0): enough batches in flight to keep every stage busy, capped by memory and CPUs."""

from recmas_ray.eval.config import StreamConfig
from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.eval.stream import CLIENTS_PER_ACTOR, clients_per_replica, message_bytes, planned_clients
from recmas_ray.system.plan import simulated_plan


def test_auto_is_the_default_and_scales_with_the_agent_actors():
    auto = StreamConfig()
    assert auto.num_clients == 0
    assert clients_per_replica(auto, 3) == 3 * CLIENTS_PER_ACTOR == planned_clients(auto, 3)
    assert clients_per_replica(auto, 5) == 5 * CLIENTS_PER_ACTOR  # a pool's copies are stages too
    assert clients_per_replica(StreamConfig(num_clients=3), 5, store_bytes=1, message_bytes_per_batch=10) == 3


def test_auto_depth_is_capped_by_object_store_memory_and_cpus():
    plan = simulated_plan("sequential_light", "sim:hidden=4096")
    per_batch = message_bytes(plan, RecursionConfig(latent_steps=64), batch_size=16)
    assert per_batch == len(plan.style.edges) * 16 * 64 * 4096 * 4
    auto = StreamConfig(client_cpus=0.25)
    roomy = clients_per_replica(auto, 3, message_bytes_per_batch=per_batch, store_bytes=64 * 2**30)
    tight = clients_per_replica(auto, 3, message_bytes_per_batch=per_batch, store_bytes=4 * per_batch)
    assert roomy == 6 and tight == 1  # 25% of a store of four batches' messages: one batch in flight
    assert clients_per_replica(auto, 3, free_cpus=1.0, num_replicas=2) == 2  # 1 CPU / (0.25 x 2 replicas)
    assert clients_per_replica(auto, 3, free_cpus=0.1) == 1  # never below one
    # the client processes' memory: 8 replicas on 24 GiB get 1 each (not 6: 48 x 400 MiB), one replica keeps 6
    from recmas_ray.eval.stream import CLIENT_BYTES

    assert clients_per_replica(auto, 3, free_memory_bytes=24 * 2**30, num_replicas=8) == 1
    assert clients_per_replica(auto, 3, free_memory_bytes=24 * 2**30, num_replicas=1) == 3 * CLIENTS_PER_ACTOR
    assert clients_per_replica(auto, 3, free_memory_bytes=16 * CLIENT_BYTES, num_replicas=2) == 2
    assert clients_per_replica(StreamConfig(num_clients=5), 3, free_memory_bytes=1.0) == 5  # explicit wins
