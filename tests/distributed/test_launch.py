"""One launcher, one pool protocol: `distributed.launch.start_agents` gives a local pool or Ray replicas, and both
pools run retry_format and set_links the same way."""

import pytest
import torch

from recmas_ray.config.placement import PlacementConfig
from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.engine.pool import AgentPool, LocalPool
from recmas_ray.engine.runner import run_batch
from recmas_ray.distributed.launch import start_agents
from recmas_ray.system.launch import local_pool, set_plan_links
from recmas_ray.system.plan import plan_system

QUESTIONS = ["What is 2 + 3?", "What is 6 * 7?"]
CFG = RecursionConfig(method="recursive_mas", num_recursive_rounds=1, latent_steps=3,
                      decode=DecodeConfig(max_new_tokens=4))
METHODS = ("rollout", "decode", "score", "retry_format", "set_links", "get")


def _inner(pool: LocalPool, role: str) -> dict:
    return {k: v.clone() for k, v in pool.services[role].agent.inner_link.state_dict().items()}


def test_protocol_names_every_pool_method():
    assert all(callable(getattr(AgentPool, m, None)) for m in METHODS)
    assert all(callable(getattr(LocalPool, m, None)) for m in METHODS)


def test_start_agents_local_and_link_swap(tiny_cache):
    plan = plan_system("sequential_light", preset="tiny", seed=0)
    pool = start_agents(plan, backend="local")
    assert isinstance(pool, LocalPool) and set(pool.services) == set(plan.style.roles)
    before = _inner(pool, "planner")
    set_plan_links(pool, plan_system("sequential_light", preset="tiny", seed=7))
    assert any(not torch.equal(before[k], v) for k, v in _inner(pool, "planner").items())
    set_plan_links(pool, plan)
    assert all(torch.equal(before[k], v) for k, v in _inner(pool, "planner").items())
    decoder = plan.style.decoder
    got = pool.get(pool.retry_format(decoder, ["x = 1"], [" so"], 2, cfg=DecodeConfig()), what="format retry")
    assert len(got) == 1 and got[0].num_tokens <= 2
    with pytest.raises(ValueError, match="unknown backend"):
        start_agents(plan, backend="slurm")


@pytest.mark.integration  # the default tier already runs a RayPool (tests/distributed/test_ray_backend.py)
def test_ray_pool_matches_local_pool(tiny_cache, ray_cluster):
    """The same retry and link swap through a RayPool (replica 0 of `start_agents(..., backend="ray")`)."""
    plan = plan_system("sequential_light", preset="tiny", seed=0)
    local = local_pool(plan)
    reps = start_agents(plan, backend="ray", timeout_s=120,
                        placement=PlacementConfig(preset="cpu", cpus_per_agent=0.25))
    try:
        pool = reps.pool()
        decoder = plan.style.decoder
        args = (decoder, ["x = 1"], [" so"], 3)
        ray_retry = pool.get(pool.retry_format(*args, cfg=DecodeConfig()), what="format retry")
        assert [d.text for d in ray_retry] == [d.text for d in local.retry_format(*args, cfg=DecodeConfig())]
        other = plan_system("sequential_light", preset="tiny", seed=7)
        set_plan_links(pool, other)
        set_plan_links(local, other)
        tasks = ["math"] * len(QUESTIONS)
        assert [r.prediction for r in run_batch(pool, plan.style, QUESTIONS, tasks, CFG)] == \
            [r.prediction for r in run_batch(local, plan.style, QUESTIONS, tasks, CFG)]
    finally:
        reps.shutdown()


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
