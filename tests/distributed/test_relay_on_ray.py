"""The text rows over RecursiveMAS's senders (`recmas_ray/engine/relay.py`) on Ray actors: the same texts, prompts and
predictions as in-process (`AgentService.rollout_text` through `RayPool`, the sender's decode for text_relay)."""

import ray

from recmas_ray.config.placement import PlacementConfig
from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.distributed.replicas import build_ray_system
from recmas_ray.engine.runner import run_batch
from recmas_ray.styles.role_context import with_role_context
from recmas_ray.system.launch import local_pool
from recmas_ray.system.plan import plan_system

QUESTIONS = [with_role_context("What is x?", {"planner": "x = 65."}), "What is 2 + 3?"]


def test_text_relay_and_rollout_as_text_match_local_on_ray(ray_cluster):
    plan = plan_system("sequential_light", preset="tiny", seed=4)
    cfgs = [RecursionConfig(method=m, num_recursive_rounds=2, latent_steps=4, decode=DecodeConfig(max_new_tokens=5))
            for m in ("text_relay", "rollout_as_text")]
    pool = local_pool(plan)
    local = [run_batch(pool, plan.style, QUESTIONS, ["math"] * 2, c) for c in cfgs]
    pool.shutdown()
    system = build_ray_system(plan, PlacementConfig(preset="cpu", cpus_per_agent=0.25), timeout_s=120)
    try:
        remote = ray.get([system.solve(QUESTIONS, ["math"] * 2, c, batch_id=c.method) for c in cfgs], timeout=300)
    finally:
        system.shutdown()
    for want, got in zip(local, remote):
        assert [r.prediction for r in got] == [r.prediction for r in want]
        assert [[(t["role"], t["action"], t.get("text")) for t in r.trace] for r in got] == \
            [[(t["role"], t["action"], t.get("text")) for t in r.trace] for r in want]
    readouts = [t for t in remote[1][0].trace if t["action"] == "rollout_text"]
    assert len(readouts) == 5 and all(t["latent_steps"] == 4 for t in readouts)  # every step but the final decode
