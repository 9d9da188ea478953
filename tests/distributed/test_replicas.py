"""Replicas and out-of-order agents on the session cluster, with cost-simulated agents (no models).

Simulated agents (`sim:` model names) run inside the same actors, pool and orchestrator as real
ones; only their work is a wait. So these tests are light, and the order of calls they check is
the order the agents' own call logs record.
"""

import time

import pytest
import ray

from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.distributed.replicas import build_ray_system, build_replicas
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
    time.sleep(0.4)  # the orchestrator has chained all of A's steps by now (it never blocks on them)
    b = system.solve(["Question B: what is 6 * 7?"], ["math"], CFG, batch_id="B")
    ray.get([a, b], timeout=120)
    calls_a, calls_b = _planner_calls(system, "Question A"), _planner_calls(system, "Question B")
    assert [c["slots"] for c in calls_a] == [[], ["<<LATENT_FEEDBACK_SLOT>>"]]
    return calls_a[1], calls_b[0]


@pytest.mark.parametrize("out_of_order", [True, pytest.param(False, marks=pytest.mark.integration)],
                         ids=["out_of_order", "in_order"])
def test_ready_step_of_batch_b_runs_before_waiting_round2_step_of_batch_a(ray_cluster, out_of_order):
    """A's round-2 step is submitted only once its inputs exist, so B's ready round-1 step runs first even on
    actors that execute calls in submission order (routed at submission, those made B wait behind A)."""
    system = build_ray_system(simulated_plan("sequential_light", SIM), CPU, timeout_s=60, out_of_order=out_of_order)
    try:
        a_round2, b_round1 = _a_round2_and_b_round1(system)
    finally:
        system.shutdown()
    # B's first step ran while A's round-2 step still waited for A's solver
    assert b_round1["t1"] <= a_round2["t0"], (b_round1, a_round2)


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
        assert _router_settles(replicas)["in_flight"] == [0, 0]
        # Serve and the Python API call `solve` from several threads at once: one router, no lost turns
        import threading

        refs: list = []
        threads = [threading.Thread(target=lambda k=k: refs.append(replicas.solve([f"Thread {k}"], ["math"], CFG)))
                   for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(ray.get(refs, timeout=120)) == 6
        stats = _router_settles(replicas)
        assert stats["in_flight"] == [0, 0] and sum(stats["served"]) == 12 and min(stats["served"]) >= 5
    finally:
        replicas.shutdown()


def _router_settles(replicas, timeout_s: float = 30.0) -> dict:
    """The router's stats once every finished batch's lease is released (released as results arrive)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = ray.get(replicas.router.stats.remote(), timeout=30)
        if sum(stats["in_flight"]) == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.1)


class _Recorder:
    """A stand-in router / orchestrator: `<name>.remote(*args)` records the call; `solve` returns a stored ref."""

    def __init__(self):
        self.calls: list = []

    def __getattr__(self, name):
        recorder = self

        class _Method:
            @staticmethod
            def remote(*args):
                recorder.calls.append((name, args))
                if name == "acquire_many":
                    return ray.put([(0, 100 + k) for k in range(len(args[0]))])
                return ray.put(f"{name}-{len(recorder.calls)}")
        return _Method


def test_leases_are_asked_in_one_router_call_and_handed_back_in_few(ray_cluster):
    """Three batches submitted together: one `acquire_many` for the three (not one `acquire` each); once they
    finished, every lease goes back through `release_many` (one call per wave of completions, at most one each)."""
    from recmas_ray.distributed.systems import RayReplicas, RaySystem

    plan = simulated_plan("sequential_light", SIM)
    router, orchestrator = _Recorder(), _Recorder()
    system = RaySystem(plan, {}, orchestrator, None, {}, 30.0)
    replicas = RayReplicas(plan, [system], router, 30.0)
    refs = replicas.submit([([f"q{k}"], ["math"], f"b{k}") for k in range(3)], CFG)
    assert ray.get(refs, timeout=30) == ["solve-1", "solve-2", "solve-3"]
    assert [name for name, _ in router.calls[:1]] == ["acquire_many"] and len(router.calls[0][1][0]) == 3
    deadline = time.monotonic() + 30
    while sorted(lease for name, args in router.calls if name == "release_many" for lease in args[0]) != [
            100, 101, 102]:
        assert time.monotonic() < deadline, router.calls
        time.sleep(0.01)
    names = [name for name, _ in router.calls]
    assert "acquire" not in names and "release" not in names and 1 <= names.count("release_many") <= 3


SLOW_SOLVER = {"planner": "sim:step_ms=1", "critic": "sim:step_ms=1", "solver": "sim:step_ms=1,token_ms=500,tokens=4"}


@pytest.mark.integration  # ~20 s of simulated agents
def test_solve_sends_a_batch_to_the_replica_with_the_least_queued_work(ray_cluster):
    """A long batch holds replica 0; a short one ran on replica 1 and finished: the next batch goes to
    replica 1 (a turn-taking choice would send it to replica 0, behind the long one)."""
    plan = simulated_plan("sequential_light", SLOW_SOLVER)
    one = RecursionConfig(method="recursive_mas", num_recursive_rounds=1, latent_steps=2,
                          decode=DecodeConfig(max_new_tokens=4))
    short = RecursionConfig(method="recursive_mas", num_recursive_rounds=1, latent_steps=2,
                            decode=DecodeConfig(max_new_tokens=1))
    replicas = build_replicas(plan, PlacementConfig(preset="cpu", cpus_per_agent=0.1, num_replicas=2,
                                                    agent_max_restarts=0), timeout_s=60)
    try:
        long_ref = replicas.solve(["long question"] * 4, ["math"] * 4, one)
        first = replicas.replica_of(long_ref)
        short_ref = replicas.solve(["short question"], ["math"], short)
        assert replicas.replica_of(short_ref) == 1 - first
        ray.get(short_ref, timeout=60)
        next_ref = replicas.solve(["next question"], ["math"], short)
        assert replicas.replica_of(next_ref) == 1 - first
        ray.get([long_ref, next_ref], timeout=60)
        assert _router_settles(replicas)["in_flight"] == [0, 0]
    finally:
        replicas.shutdown()


SLOW_UPSTREAM = {"planner": "sim:step_ms=50", "critic": "sim:step_ms=50", "solver": "sim:step_ms=1,token_ms=100,tokens=64"}


def _one_round(latent_steps: int, tokens: int) -> RecursionConfig:
    return RecursionConfig(method="recursive_mas", num_recursive_rounds=1, latent_steps=latent_steps,
                           decode=DecodeConfig(max_new_tokens=tokens))


def test_a_step_is_routed_by_the_queues_when_its_inputs_exist_not_when_its_batch_is_submitted(ray_cluster):
    """Two copies per role. Batch A (4 s at the planner and critic, then a 1-token decode) is submitted first,
    then B (fast, a 0.4 s decode) and C (fast, a 6 s decode). Routed at submission, A's decode took solver copy
    0 (both idle), B's copy 1, C's copy 0 again (1 token queued there vs 4), so A's decode, ready at ~4 s,
    waited behind C's until ~6 s. Routed when its inputs exist, it sees C's decode on one copy and the other
    free, and runs there at once."""
    plan = simulated_plan("sequential_light", SLOW_UPSTREAM)
    placement = PlacementConfig(preset="cpu", cpus_per_agent=0.05, agent_max_restarts=0,
                                role_replicas={"planner": 2, "critic": 2, "solver": 2})
    replicas = build_replicas(plan, placement, timeout_s=60)
    try:
        refs = []
        for name, cfg in (("A", _one_round(40, 1)), ("B", _one_round(1, 4)), ("C", _one_round(1, 60))):
            refs.append(replicas.solve([f"Question {name}"], ["math"], cfg, batch_id=name))
            time.sleep(0.3)  # the orchestrator takes them in this order
        ray.get(refs, timeout=120)
        logs = replicas.call_logs()[0]
    finally:
        replicas.shutdown()

    def decode(name):
        (copy, call), = [(c, x) for c in ("solver", "solver#1") for x in logs[c]
                         if x["method"] == "decode" and f"Question {name}" in x["first_user"]]
        return copy, call

    (copy_a, a), (copy_c, c) = decode("A"), decode("C")
    assert copy_a != copy_c, (a, c)
    assert a["t0"] < c["t1"], (a, c)  # it did not wait for C's decode


@pytest.mark.integration  # ~15 s of simulated agents
@pytest.mark.parametrize("bulk", [None, True], ids=["default", "bulk_dispatch"])
def test_a_cancelled_batch_runs_none_of_its_remaining_steps(ray_cluster, bulk):
    plan = simulated_plan("sequential_light", SLOW_SOLVER)
    two = RecursionConfig(method="recursive_mas", num_recursive_rounds=2, latent_steps=2,
                          decode=DecodeConfig(max_new_tokens=4))
    replicas = build_replicas(plan, CPU, timeout_s=60, bulk_dispatch=bulk)
    try:
        # R = 2: the solver's feedback rollout, then round 2, then its 2 s decode; cancelled during round 1
        blocker = replicas.solve(["blocker"], ["math"], RecursionConfig(
            method="single_agent", decode=DecodeConfig(max_new_tokens=4)))  # keeps the solver busy 2 s
        ref = replicas.solve(["cancelled question"], ["math"], two)
        time.sleep(0.5)
        replicas.cancel(ref)
        with pytest.raises((ray.exceptions.RayTaskError, ray.exceptions.TaskCancelledError)):
            ray.get(ref, timeout=60)
        ray.get(blocker, timeout=60)
        time.sleep(1.0)
        logs = replicas.call_logs()[0]
    finally:
        replicas.shutdown()
    ran = [c for role in logs for c in logs[role] if "cancelled question" in c["first_user"]]
    assert not any(c["method"] == "decode" for c in ran), ran  # its final decode never ran
    assert len([c for c in logs["planner"] if "cancelled question" in c["first_user"]]) == 1  # nor round 2


@pytest.mark.integration  # tiny real models (the retry needs a tokenizer): ~1 min on the loaded machine
def test_format_retries_are_routed_and_counted_like_every_step(ray_cluster, tiny_cache):
    """Before: every retry went to the decoder's first copy, unseen by the routing."""
    from recmas_ray.system.plan import plan_system

    plan = plan_system("sequential_light", preset="tiny", seed=5)
    cpu = PlacementConfig(preset="cpu", cpus_per_agent=0.05, agent_max_restarts=0, role_replicas={"solver": 2},
                          ready_timeout_s=900)
    replicas = build_replicas(plan, cpu, timeout_s=120, torch_threads=1)
    try:
        orchestrator = replicas.systems[0].orchestrator
        retries = [ray.get(orchestrator.retry_format.remote(["x = 1"], ["\\boxed{"], 3, cfg=DecodeConfig()),
                           timeout=120) for _ in range(2)]
        groups = ray.get(orchestrator.group_stats.remote(), timeout=60)
    finally:
        replicas.shutdown()
    assert retries[0][0].text == retries[1][0].text  # greedy: either copy gives the same continuation
    assert groups["solver"]["calls"] == [1, 1] and groups["solver"]["queued"] == [0.0, 0.0], groups
