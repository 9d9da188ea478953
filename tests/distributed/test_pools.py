"""Per-role agent pools: copies sized by cost, least-loaded routing, a batch's steps kept on one copy,
and the same greedy predictions as one copy per role."""

import threading

import pytest
import ray

from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.distributed.driver import build_ray_system, build_replicas, role_copies
from recmas_ray.config.placement import PlacementConfig
from recmas_ray.distributed.placement import plan_placement
from recmas_ray.distributed.pools import CopyRouter, copies_from_costs, resolve_copies, role_costs
from recmas_ray.runner import run_batch
from recmas_ray.system.launch import local_pool
from recmas_ray.styles import get_style
from recmas_ray.system.plan import plan_system, simulated_plan

pytestmark = pytest.mark.timeout(300)

CFG = RecursionConfig(method="recursive_mas", num_recursive_rounds=2, latent_steps=4,
                      decode=DecodeConfig(max_new_tokens=6))


# ----------------------------------------------------------------------------- pure

def test_costs_follow_the_schedule_and_size_the_pools():
    style = get_style("sequential_light")
    sims = {"planner": "sim:step_ms=10,token_ms=10,tokens=256", "critic": "sim:step_ms=10,token_ms=10,tokens=256",
            "solver": "sim:step_ms=10,token_ms=10,tokens=256"}
    costs = role_costs(style, sims, num_rounds=1, latent_steps=32, max_new_tokens=256)
    assert costs == {"planner": 320.0, "critic": 320.0, "solver": 2560.0}  # R = 1: solver only decodes
    costs3 = role_costs(style, sims, num_rounds=3, latent_steps=32, max_new_tokens=256)
    assert costs3["planner"] == 3 * 320 and costs3["solver"] == 2 * 320 + 2560  # feedback rollouts, one decode
    assert copies_from_costs(costs) == {"planner": 1, "critic": 1, "solver": 8}
    assert resolve_copies({"solver": 3}, False, style.roles, None) == {"planner": 1, "critic": 1, "solver": 3}
    assert resolve_copies({"solver": 2}, True, style.roles, costs) == {"planner": 1, "critic": 1, "solver": 2}
    with pytest.raises(ValueError, match=r"--role_replicas names \['judge'\]"):
        resolve_copies({"judge": 2}, False, style.roles, None)


def test_each_copy_gets_its_own_bundle():
    plan = plan_placement(PlacementConfig(preset="one_gpu_per_agent"), ["planner", "critic", "solver"],
                          {"solver": 3})
    assert len(plan.bundles) == 5 and plan.copy_bundles == {"planner": [0], "critic": [1], "solver": [2, 3, 4]}
    colo = plan_placement(PlacementConfig(preset="colocated"), ["planner", "solver"], {"solver": 3})
    assert colo.gpus == {"planner": 0.25, "solver": 0.25} and colo.copy_bundles["solver"] == [0, 0, 0]


def test_router_sends_a_batch_to_the_least_loaded_copy_and_keeps_it_there():
    router = CopyRouter({"planner": ["p0"], "solver": ["s0", "s1", "s2"]})
    a, b, c = router.acquire(), router.acquire(), router.acquire()
    assert [x["solver"] for x in (a, b, c)] == [0, 1, 2] and {x["planner"] for x in (a, b, c)} == {0}
    router.release(b)
    assert router.acquire()["solver"] == 1  # the copy that just became free
    assert router.handles(a) == {"planner": "p0", "solver": "s0"}
    threads = [threading.Thread(target=lambda: router.release(router.acquire())) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert router.stats()["in_flight"]["solver"] == [1, 1, 1]  # a, c and the fourth still hold theirs


def test_auto_role_replicas_uses_the_runs_recursion():
    plan = simulated_plan("sequential_light", {"planner": "sim:step_ms=5", "critic": "sim:step_ms=5",
                                               "solver": "sim:step_ms=5,token_ms=5,tokens=256"})
    auto = PlacementConfig(preset="cpu", auto_role_replicas=True)
    rc = RecursionConfig(num_recursive_rounds=1, latent_steps=32, decode=DecodeConfig(max_new_tokens=256))
    assert role_copies(plan, auto, rc) == {"planner": 1, "critic": 1, "solver": 8}
    assert role_copies(plan, PlacementConfig(preset="cpu"), rc) == {"planner": 1, "critic": 1, "solver": 1}


# ----------------------------------------------------------------------------- on the session cluster

QUESTIONS = [f"Question {k}: what is {k} + {k + 1}?" for k in range(4)]


@pytest.mark.integration  # tiny real models on the session cluster: ~2 min on the loaded 2-core machine
def test_per_role_pools_match_one_copy_per_role_and_keep_each_batch_on_one_copy(ray_cluster, tiny_cache):
    plan = plan_system("sequential_light", preset="tiny", seed=5)
    local = local_pool(plan)
    want = [run_batch(local, plan.style, [q], ["math"], CFG)[0].prediction for q in QUESTIONS]
    pcfg = PlacementConfig(preset="cpu", cpus_per_agent=0.05, agent_max_restarts=0,
                           role_replicas={"critic": 2, "solver": 2})
    reps = build_replicas(plan, pcfg, timeout_s=120, torch_threads=1)
    try:
        assert reps.placement["role_copies"] == {"planner": 1, "critic": 2, "solver": 2}
        system = reps.systems[0]
        refs = [system.solve([q], ["math"], CFG, batch_id=f"b{k}") for k, q in enumerate(QUESTIONS)]
        got = [ray.get(r, timeout=240)[0].prediction for r in refs]
        logs = system.call_logs()
    finally:
        reps.shutdown()
    assert got == want  # greedy: the same tokens whichever copy ran each step
    for role in ("critic", "solver"):
        names = [role, f"{role}#1"]
        assert all(logs[n] for n in names), f"both copies of {role} served batches"
        for q in QUESTIONS:  # round 1 and round 2 of a batch on the same copy (its KV state stays there)
            holders = [n for n in names if any(q in c["first_user"] for c in logs[n])]
            assert len(holders) == 1, (role, q, holders)
            assert sum(q in c["first_user"] for c in logs[holders[0]]) == 2  # R = 2: two steps each
