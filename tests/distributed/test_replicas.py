"""Replicas and out-of-order agents on the session cluster, with cost-simulated agents (no models).

Simulated agents (`sim:` model names) run inside the same actors, pool and orchestrator as real
ones; only their work is a wait. So these tests are light, and the order of calls they check is
the order the agents' own call logs record.
"""

import time

import pytest
import ray

from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.distributed.driver import build_ray_system, build_replicas
from recmas_ray.config.placement import PlacementConfig
from recmas_ray.system.plan import simulated_plan

# 6 latent steps of 60 ms: each rollout takes ~0.36 s, long next to Ray's per-call cost.
SIM = "sim:hidden=256,step_ms=60,token_ms=20,tokens=4"
CFG = RecursionConfig(method="recursive_mas", num_recursive_rounds=2, latent_steps=6,
                      decode=DecodeConfig(max_new_tokens=4))
CPU = PlacementConfig(preset="cpu", cpus_per_agent=0.1, agent_max_restarts=0)

pytestmark = pytest.mark.timeout(240)


def _planner_calls(system, question: str) -> list[dict]:
    log = system.call_logs()["planner"]
    return sorted((c for c in log if question in c["first_user"]), key=lambda c: c["t0"])


def _a_round2_and_b_round1(system):
    """Submit batch A, then (once A's calls are queued) batch B; return the planner's A round-2 call
    (it waits for A's solver) and B round-1 call (ready at once)."""
    a = system.solve(["Question A: what is 2 + 3?"], ["math"], CFG, batch_id="A")
    time.sleep(0.4)  # the orchestrator has submitted all of A's steps by now (it never blocks on them)
    b = system.solve(["Question B: what is 6 * 7?"], ["math"], CFG, batch_id="B")
    ray.get([a, b], timeout=120)
    calls_a, calls_b = _planner_calls(system, "Question A"), _planner_calls(system, "Question B")
    assert [c["slots"] for c in calls_a] == [[], ["<<LATENT_FEEDBACK_SLOT>>"]]
    return calls_a[1], calls_b[0]


@pytest.mark.parametrize("out_of_order", [True, pytest.param(False, marks=pytest.mark.integration)],
                         ids=["out_of_order", "in_order_control"])
def test_ready_step_of_batch_b_runs_before_waiting_round2_step_of_batch_a(ray_cluster, out_of_order):
    system = build_ray_system(simulated_plan("sequential_light", SIM), CPU, timeout_s=60, out_of_order=out_of_order)
    try:
        a_round2, b_round1 = _a_round2_and_b_round1(system)
    finally:
        system.shutdown()
    if out_of_order:
        # B's first step ran while A's round-2 step still waited for A's solver
        assert b_round1["t1"] <= a_round2["t0"], (b_round1, a_round2)
    else:  # the control: Ray's default in-order execution makes B wait behind A
        assert b_round1["t0"] >= a_round2["t1"], (b_round1, a_round2)


@pytest.mark.integration
def test_two_replicas_share_the_work_and_give_the_same_answers(ray_cluster):
    plan = simulated_plan("sequential_light", SIM)
    replicas = build_replicas(plan, PlacementConfig(preset="cpu", cpus_per_agent=0.1, num_replicas=2,
                                                    agent_max_restarts=0), timeout_s=60)
    try:
        assert replicas.num_replicas == 2
        batches = [([f"Question {k}"] * 2, ["math"] * 2) for k in range(6)]
        out = replicas.solve_all(batches, CFG, in_flight_per_replica=2)
        assert {i for i, _ in out} == {0, 1}
        assert all([r.prediction for r in res] == ["\\boxed{0}"] * 2 for _, res in out)
        logs = replicas.call_logs()
        # every batch ran on exactly one replica: 2 planner calls per batch (R = 2), 12 in all
        assert sum(len(log["planner"]) for log in logs) == 12 and all(log["planner"] for log in logs)
        assert ray.get(replicas.router.stats.remote(), timeout=30)["in_flight"] == [0, 0]
    finally:
        replicas.shutdown()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v", "-x"]))


@pytest.mark.integration  # ~40 s: the solver serves 20 decodes of 1.6 s one after another
def test_one_orchestrator_runs_every_batch_in_flight_at_once(ray_cluster):
    """20 batches submitted to one replica all start before the first one ends: the orchestrator's threads
    do not cap a replica's depth (at 16 threads, 4 batches waited; a pool with 36 in flight ran 16)."""
    from recmas_ray.distributed.placement import ORCHESTRATOR_MAX_BATCHES

    plan = simulated_plan("sequential_light", {"planner": "sim:step_ms=1", "critic": "sim:step_ms=1",
                                               "solver": "sim:step_ms=1,token_ms=400,tokens=4"})
    one = RecursionConfig(method="recursive_mas", num_recursive_rounds=1, latent_steps=2,
                          decode=DecodeConfig(max_new_tokens=4))
    system = build_ray_system(plan, CPU, timeout_s=120)
    try:
        refs = [system.solve([f"Question {k}: what is {k} + 1?"], ["math"], one, batch_id=f"b{k}") for k in range(20)]
        ray.get(refs, timeout=180)
        logs = system.call_logs()
    finally:
        system.shutdown()
    first_done = min(c["t1"] for c in logs["solver"])  # the first batch's decode (1.6 s) ends
    started = {c["first_user"] for c in logs["planner"] if c["t0"] < first_done}
    assert ORCHESTRATOR_MAX_BATCHES >= 20 and len(started) == 20, len(started)
