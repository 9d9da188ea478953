"""Role copies: copies sized by cost, and the same greedy predictions as one copy per role with
every step routed to the least loaded copy."""

import pytest
import ray

from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.distributed.role_copies import role_copies
from recmas_ray.distributed.replicas import build_replicas
from recmas_ray.config.placement import PlacementConfig
from recmas_ray.distributed.placement import plan_placement
from recmas_ray.distributed.role_copies import copies_from_costs, resolve_copies, role_costs
from recmas_ray.engine.runner import run_batch
from recmas_ray.system.launch import local_pool
from recmas_ray.styles import get_style
from recmas_ray.system.plan import plan_system, simulated_plan

pytestmark = pytest.mark.timeout(300)

CFG = RecursionConfig(method="recursive_mas", num_recursive_rounds=2, latent_steps=4,
                      decode=DecodeConfig(max_new_tokens=6))


# ----------------------------------------------------------------------------- pure

def test_costs_follow_the_schedule_and_size_the_role_copies():
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


def test_auto_role_replicas_prices_prompts_as_one_forward_and_rollouts_without_the_lm_head(tiny_cache):
    """Equal models, R = 1, m = 32, 256 tokens: the solver's decode costs ~6-7 rollouts (as the simulator's
    table says: 1/1/6), not ~2 (prompt tokens priced like decoded ones, the LM head on latent steps)."""
    from recmas_ray.distributed.role_copies import _params, call_cost
    from recmas_ray.models.sim import paper_sim_models
    from recmas_ray.system.presets import role_models

    style = get_style("sequential_light")
    same = {r: "tiny:llama" for r in style.roles}
    real = copies_from_costs(role_costs(style, same, num_rounds=1, latent_steps=32, max_new_tokens=256))
    planner = paper_sim_models(role_models("sequential_light", "paper"))["planner"]
    sims = {r: planner for r in style.roles}  # one model's table for every role
    table = copies_from_costs(role_costs(style, sims, num_rounds=1, latent_steps=32, max_new_tokens=256))
    assert table == {"planner": 1, "critic": 1, "solver": 6}
    assert real["planner"] == real["critic"] == 1 and abs(real["solver"] - table["solver"]) <= 1, real
    blocks, head = _params("tiny:llama")
    assert head > 0 and call_cost("tiny:llama", "rollout", 33) - call_cost("tiny:llama", "rollout", 32) == blocks


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
def test_per_step_routing_over_role_copies_matches_the_local_backend(ray_cluster, tiny_cache):
    plan = plan_system("sequential_light", preset="tiny", seed=5)
    local = local_pool(plan)
    want = [run_batch(local, plan.style, [q], ["math"], CFG)[0].prediction for q in QUESTIONS]
    pcfg = PlacementConfig(preset="cpu", cpus_per_agent=0.05, agent_max_restarts=0, ready_timeout_s=900,
                           role_replicas={"critic": 2, "solver": 2})  # five agents loading on a busy machine
    reps = build_replicas(plan, pcfg, timeout_s=120, torch_threads=1)
    try:
        assert reps.placement["role_copies"] == {"planner": 1, "critic": 2, "solver": 2}
        system = reps.systems[0]
        refs = [reps.solve([q], ["math"], CFG, batch_id=f"b{k}") for k, q in enumerate(QUESTIONS)]
        got = [ray.get(r, timeout=240)[0].prediction for r in refs]
        logs = system.call_logs()
        groups = ray.get(system.orchestrator.group_stats.remote(), timeout=60)
    finally:
        reps.shutdown()
    assert got == want  # greedy: the same tokens whichever copy ran each step
    for role in ("critic", "solver"):
        assert logs[role] and logs[f"{role}#1"], f"both copies of {role} served steps"
        assert groups[role]["queued"] == [0.0, 0.0] and sum(groups[role]["calls"]) == 2 * len(QUESTIONS)


@pytest.mark.integration  # tiny real models on the session cluster: ~2 min on the loaded 2-core machine
def test_agent_actors_with_continuous_batching_match_the_local_backend(ray_cluster, tiny_cache):
    """Agent actors that take several calls at once and merge their steps: the local backend's predictions."""
    import dataclasses

    plan = plan_system("sequential_light", preset="tiny", seed=5)
    local = local_pool(plan)
    want = [run_batch(local, plan.style, [q], ["math"], CFG)[0].prediction for q in QUESTIONS]
    plan.specs = {r: dataclasses.replace(s, continuous_batching=True) for r, s in plan.specs.items()}
    reps = build_replicas(plan, PlacementConfig(preset="cpu", cpus_per_agent=0.05, agent_max_restarts=0),
                          timeout_s=120, torch_threads=1)
    try:
        refs = [reps.solve([q], ["math"], CFG, batch_id=f"b{k}") for k, q in enumerate(QUESTIONS)]
        got = [ray.get(r, timeout=240)[0].prediction for r in refs]
        logs = reps.systems[0].call_logs()
    finally:
        reps.shutdown()
    assert got == want
    solver = sorted(logs["solver"], key=lambda c: c["t0"])
    # calls overlapped in the solver actor: one started before an earlier one ended
    assert any(b["t0"] < a["t1"] for a, b in zip(solver, solver[1:])), solver
