"""Ray backend: same greedy predictions as in-process for all styles, fail-fast placement, dead agents."""

import dataclasses
import time

import pytest
import ray
import torch

from recmas_ray.config.recursion import DecodeConfig
from recmas_ray.distributed.replicas import build_ray_system
from recmas_ray.config.placement import PlacementConfig
from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.engine.runner import run_batch
from recmas_ray.engine.service import AgentService
from recmas_ray.system.launch import local_pool
from recmas_ray.system.plan import plan_system

QUESTIONS = ["What is 2 + 3?", "Tom has 4 apples and buys 3 more. How many?", "What is 6 * 7?"]
CFG = RecursionConfig(method="recursive_mas", num_recursive_rounds=2, latent_steps=6,
                      decode=DecodeConfig(max_new_tokens=8))


# One style in the default tier; every style in the integration tier (pytest -m integration).
@pytest.mark.parametrize("style", ["sequential_light", *[pytest.param(s, marks=pytest.mark.integration)
                                                         for s in ("mixture", "distillation", "deliberation")]])
def test_ray_backend_matches_local(ray_cluster, style):
    plan = plan_system(style, preset="tiny", seed=1)
    local = run_batch(local_pool(plan),
                      plan.style, QUESTIONS, ["math"] * 3, CFG)
    system = build_ray_system(plan, PlacementConfig(preset="cpu", cpus_per_agent=0.25), timeout_s=120)
    try:
        assert {i["role"] for i in system.infos.values()} == set(plan.style.roles)
        assert all(i["device"] == "cpu" and i["gpu_ids"] == [] for i in system.infos.values())
        # two batches in flight at once: agents overlap, results must not change
        refs = [system.solve(QUESTIONS, ["math"] * 3, CFG, batch_id=str(k)) for k in range(2)]
        text_cfg = RecursionConfig(method="recursive_textmas", num_recursive_rounds=2, decode=DecodeConfig(max_new_tokens=4))
        local_text = run_batch(local_pool(plan),
                               plan.style, QUESTIONS, ["math"] * 3, text_cfg)
        refs.append(system.solve(QUESTIONS, ["math"] * 3, text_cfg, batch_id="text"))
        *latent_runs, text_run = ray.get(refs, timeout=180)
        assert [r.prediction for r in text_run] == [r.prediction for r in local_text]
        for remote in latent_runs:
            assert [r.prediction for r in remote] == [r.prediction for r in local]
            assert [r.num_latent_steps for r in remote] == [r.num_latent_steps for r in local]
            assert [[t["role"] for t in r.trace] for r in remote] == [[t["role"] for t in r.trace] for r in local]
    finally:
        system.shutdown()


@pytest.fixture(scope="module")
def seq_system(ray_cluster):
    plan = plan_system("sequential_light", preset="tiny", seed=2)
    system = build_ray_system(plan, PlacementConfig(preset="cpu", cpus_per_agent=0.25), timeout_s=60)
    yield plan, system
    system.shutdown()


@pytest.mark.integration  # a Ray system of its own: minutes on a busy 2-core machine
def test_latents_travel_through_the_store_whatever_their_size_and_match_local(seq_system):
    plan, system = seq_system
    planner = system.handles["planner"]
    msg_ref, stats_ref = planner.rollout.options(num_returns=2).remote(QUESTIONS, [], 5, ("planner->critic",))
    local_msg, _ = AgentService(*plan.service_args("planner")).rollout(QUESTIONS, [], 5, ("planner->critic",))
    from recmas_ray.distributed.transports import WireMessage, from_wire

    stored = ray.get(msg_ref, timeout=60)
    # 5.6 KB: a return value that small would be inlined into the caller's reply (so through the
    # orchestrator); the agent stores it instead and the reply carries only its ref
    assert isinstance(stored, ray.ObjectRef)
    assert ray.experimental.get_object_locations([stored], timeout_ms=60_000)[stored]["node_ids"]
    wire = ray.get(stored, timeout=60)
    assert isinstance(wire, WireMessage) and not wire.array.flags.writeable  # mapped from the object store
    msg = from_wire(wire)
    assert msg.device.type == "cpu" and msg.shape == (3, 5, 96)
    assert torch.allclose(msg, local_msg, atol=1e-5)


def test_impossible_placement_fails_fast(ray_cluster):
    plan = plan_system("sequential_light", preset="tiny")
    with pytest.raises(ValueError, match="GPU: needs 3 .*cluster has 0"):
        build_ray_system(plan, PlacementConfig(preset="one_gpu_per_agent", ready_timeout_s=5))


@pytest.mark.integration  # a Ray system of its own: minutes on a busy 2-core machine
def test_killed_agent_fails_the_run_naming_the_role(seq_system):
    plan, system = seq_system  # runs last in this module: it kills the system's critic
    ray.kill(system.handles["critic"])
    with pytest.raises(RuntimeError, match="role critic, round 1 .*batch b7.*died"):
        ray.get(system.solve(QUESTIONS, ["math"] * 3, CFG, batch_id="b7"), timeout=90)
    system.shutdown()  # the remaining actors are released
    for role in ("planner", "solver"):
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(system.handles[role].ready.remote(), timeout=30)


@pytest.mark.integration
def test_ray_direct_transport_gloo_matches_object_store(ray_cluster):
    plan = plan_system("mixture", preset="tiny", seed=4)
    local = run_batch(local_pool(plan),
                      plan.style, QUESTIONS, ["math"] * 3, CFG)
    system = build_ray_system(plan, PlacementConfig(preset="cpu", cpus_per_agent=0.25), timeout_s=120,
                              transport="rdt:gloo")
    try:
        remote = ray.get(system.solve(QUESTIONS, ["math"] * 3, CFG, batch_id="rdt"), timeout=180)
        assert [r.prediction for r in remote] == [r.prediction for r in local]
        # concurrent batches without a batch id (the Python API's generate) must not share message keys
        both = ray.get([system.solve(QUESTIONS, ["math"] * 3, CFG), system.solve(QUESTIONS[::-1], ["math"] * 3, CFG)],
                       timeout=240)
        assert [r.prediction for r in both[0]] == [r.prediction for r in local]
        assert [r.prediction for r in both[1]] == [r.prediction for r in local][::-1]
        kept = ray.get([h.num_kept.remote() for h in system.handles.values()], timeout=60)
        assert kept == [0] * len(kept)  # every message was taken
        # a batch that fails after its rollout: the orchestrator's pool frees what the agents kept
        from recmas_ray.distributed.ray_pool import RayPool

        pool = RayPool(system.handles, timeout_s=60, transport="rdt:gloo")
        role = plan.style.roles[0]
        edge = next(e for e in plan.style.edges if e.split("->")[0] == role)
        ray.get(system.handles[role].rollout.remote(["x"], [], 2, (edge,), key=f"{pool.key_prefix}:1"), timeout=60)
        pool._holders.add((role, 0))  # (role, copy) that kept messages
        assert ray.get(system.handles[role].num_kept.remote(), timeout=60) == 1
        pool.release_kept()  # fire and forget: the agent may answer num_kept first (it runs calls concurrently)
        deadline = time.monotonic() + 60
        while ray.get(system.handles[role].num_kept.remote(), timeout=60) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ray.get(system.handles[role].num_kept.remote(), timeout=60) == 0
    finally:
        system.shutdown()


def test_rdt_agent_keeps_nothing_for_a_batch_already_dropped():
    """A call of a failed batch that finishes after the drop (out-of-order agents) keeps nothing."""
    from recmas_ray.distributed.actors import _AgentActorImpl
    from recmas_ray.engine.service import AgentSpec

    impl = _AgentActorImpl(AgentSpec(role="planner", model_name="sim:hidden=8,step_ms=0", system_prompt="",
                                     device="cpu"), {}, {}, transport="rdt:gloo")
    impl.rollout(["q"], [], 2, ("planner->critic",), key="a:1")
    impl.rollout(["q"], [], 2, ("planner->critic",), key="b:1")
    assert impl.drop_messages("a") == 1 and impl.num_kept() == 1
    impl.rollout(["q"], [], 2, ("planner->critic",), key="a:2")  # late call of the dropped batch
    assert impl.num_kept() == 1
    assert impl.take_message("b:1", "planner->critic").shape == (1, 2, 8)


def test_rdt_message_keys_differ_between_batches_without_a_batch_id():
    """api.py's generate submits no batch id: two pools (two batches) must still key their messages apart."""
    from recmas_ray.distributed.ray_pool import RayPool

    keys = []

    class _Method:
        def __init__(self, name):
            self.name = name

        def options(self, **_):
            return self

        def remote(self, *args, **kw):
            if self.name == "rollout":
                keys.append(kw["key"])
            return object()

    class _Handle:
        def __getattr__(self, name):
            return _Method(name)

    for _ in range(2):
        RayPool({"planner": _Handle()}, transport="rdt:gloo").rollout("planner", ["q"], [], 2, ("planner->critic",), [])
    assert len(keys) == 2 and keys[0] != keys[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_messages_cross_the_object_store_as_zero_copy_buffers(ray_cluster, dtype):
    """fp32 and bf16 messages: a numpy view out (no copy), the same bits back, mapped read-only on get."""
    from recmas_ray.distributed.transports import WireMessage, from_wire, to_wire

    x = torch.randn(2, 64, 256).to(dtype)
    wire = to_wire(x)
    assert isinstance(wire, WireMessage) and wire.array.ctypes.data == x.data_ptr()  # a view, not a copy
    back = from_wire(ray.get(ray.put(wire), timeout=60))
    assert back.dtype == dtype and torch.equal(back, x)
    assert from_wire(wire).data_ptr() == x.data_ptr()
    got = ray.get(ray.put(wire), timeout=60)
    assert not got.array.flags.writeable  # served from shared memory, not unpickled into a fresh copy
    assert to_wire("text") == "text" and from_wire(x) is x  # everything else passes through


def test_message_dtype_auto_is_fp32_on_cpu_and_bf16_halves_the_bytes():
    from recmas_ray.engine.service import AgentService

    plan = plan_system("sequential_light", preset="tiny", seed=0)
    spec, inner, outer = plan.service_args("planner")
    assert spec.message_dtype == "auto"
    auto_msg, _ = AgentService(spec, inner, outer).rollout(QUESTIONS[:1], [], 3, ("planner->critic",))
    import dataclasses

    bf16_msg, _ = AgentService(dataclasses.replace(spec, message_dtype="bf16"), inner, outer).rollout(
        QUESTIONS[:1], [], 3, ("planner->critic",))
    assert auto_msg.dtype == torch.float32 and bf16_msg.dtype == torch.bfloat16
    assert torch.allclose(bf16_msg.float(), auto_msg, rtol=1e-2, atol=1e-2)
    plan16 = plan_system("sequential_light", preset="tiny", seed=0, message_dtype="bf16")
    assert {s.message_dtype for s in plan16.specs.values()} == {"bf16"}


def test_adaptive_rounds_on_ray_stop_the_same_questions_as_in_process(ray_cluster):
    # the runner is shared: the stop check and the row cuts run on the agents, the decisions match in-process
    plan = plan_system("sequential_light", preset="tiny", seed=3)
    pool = local_pool(plan)
    base = RecursionConfig(num_recursive_rounds=4, latent_steps=4, decode=DecodeConfig(max_new_tokens=6))
    probe = run_batch(pool, plan.style, QUESTIONS, ["math"] * 3, dataclasses.replace(base, adaptive_threshold=0.0))
    threshold = min(r.round_changes[0] for r in probe) * 1.0000001  # one question stops at round 2
    c = dataclasses.replace(base, adaptive_threshold=threshold)
    local = run_batch(pool, plan.style, QUESTIONS, ["math"] * 3, c)
    assert sorted({r.num_rounds for r in local}) == [2, 3]
    system = build_ray_system(plan, PlacementConfig(preset="cpu", cpus_per_agent=0.25), timeout_s=120)
    try:
        remote = ray.get(system.solve(QUESTIONS, ["math"] * 3, c, batch_id="adaptive"), timeout=180)
    finally:
        system.shutdown()
    assert [r.num_rounds for r in remote] == [r.num_rounds for r in local]
    assert [r.prediction for r in remote] == [r.prediction for r in local]
    assert [[t["action"] for t in r.trace] for r in remote] == [[t["action"] for t in r.trace] for r in local]
    for a, b in zip(remote, local):
        assert a.round_changes == pytest.approx(b.round_changes, rel=1e-3, abs=1e-6)  # fp32 noise near 0
