"""Bulk dispatch (`distributed.bulk`): aligned calls of several batches leave as one Ray call, each batch still
getting its own call's results. The queue logic with stand-in handles; the whole path on the session cluster."""

import pytest
import ray
import torch

from recmas_ray.config.placement import PlacementConfig
from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.distributed.transports import Part, from_wire
from recmas_ray.distributed.bulk import Bulker
from recmas_ray.distributed.routing import DeferredCall, Pending


class _Method:
    def __init__(self, sent: list, name: str):
        self.sent, self.name, self.returns = sent, name, 1

    def options(self, num_returns: int):
        self.returns = num_returns
        return self

    def remote(self, *args):
        self.sent.append((self.name, args))
        return tuple(f"{self.name}-out{i}" for i in range(self.returns)) if self.returns > 1 else f"{self.name}-out"


class _Handle:
    def __init__(self):
        self.sent: list = []

    def __getattr__(self, name):
        return _Method(self.sent, name)


def _add(bulker, handle, users, latents, log, *, cancelled=False):
    return bulker.add(("copy0", "rollout", 4), handle, "rollout", (4, ("a->b",)), 2, users, [], latents,
                      sent=lambda ref, others, members: log.append(("sent", users[0], ref, len(members))),
                      failed=lambda: log.append(("failed", users[0])), cancelled=lambda: cancelled)


def test_queued_calls_leave_as_one_call_and_each_batch_gets_its_own_outputs():
    bulker, handle, log = Bulker(), _Handle(), []
    upstream = object()  # the stored messages of one earlier bulk call, read by both batches
    a = _add(bulker, handle, ["qa"], [Part(upstream, 0, 0)], log)
    b = _add(bulker, handle, ["qb"], [Part(upstream, 1, 0)], log)
    assert not handle.sent and not a[0].call.settled  # nothing leaves before the flush
    assert bulker.flush() == 1 and not bulker
    (name, args), = handle.sent
    assert name == "rollout_bulk" and args[:2] == (4, ("a->b",))
    calls, *distinct = args[2:]
    assert distinct == [upstream]  # one argument for both batches, each reading its own rows of it
    assert calls == [(["qa"], [], [(0, 0, 0)]), (["qb"], [], [(0, 1, 0)])]
    for j, outs in enumerate((a, b)):
        message, stats = (p.value(0) for p in outs)
        assert message == Part("rollout_bulk-out0", j, 0) and stats == f"rollout_bulk-out{j + 1}"  # its own return
    assert [e[:2] for e in log] == [("sent", "qa"), ("sent", "qb")] and log[0][3] == 2


def test_a_cancelled_or_orphaned_call_never_leaves_and_undoes_its_pick():
    bulker, handle, log = Bulker(), _Handle(), []
    never = DeferredCall()
    never.settle(None, "batch cancelled")
    gone = _add(bulker, handle, ["q-cancelled"], [], log, cancelled=True)
    orphan = _add(bulker, handle, ["q-orphan"], [Pending(never, 0)], log)
    kept = _add(bulker, handle, ["q-kept"], ["a value"], log)
    bulker.flush()
    (_, args), = handle.sent
    assert [c[0] for c in args[2]] == [["q-kept"]] and args[3:] == ("a value",)
    assert ("failed", "q-cancelled") in log and ("failed", "q-orphan") in log
    with pytest.raises(RuntimeError, match="batch cancelled"):
        gone[0].value(0)
    with pytest.raises(RuntimeError, match="batch cancelled"):
        orphan[0].value(0)
    assert kept[1].value(0) == "rollout_bulk-out1"


def test_a_queue_that_cannot_be_sent_fails_its_batches_and_not_the_others():
    class _Broken:
        def __getattr__(self, name):
            raise AttributeError(name)  # e.g. an agent class without bulk methods

    bulker, handle, log = Bulker(), _Handle(), []
    broken = bulker.add(("other", "decode"), _Broken(), "decode", (None,), 1, ["q-broken"], [], [],
                        sent=lambda *a: log.append("sent"), failed=lambda: log.append("failed"),
                        cancelled=lambda: False)
    ok = _add(bulker, handle, ["q-ok"], [], log)
    assert bulker.flush() == 1
    with pytest.raises(RuntimeError, match="bulk dispatch failed"):
        broken[0].value(0)
    assert ok[1].value(0) == "rollout_bulk-out1" and log.count("failed") == 1


def test_a_serial_copys_calls_wait_while_its_window_is_full_then_leave_together():
    """A copy that runs one call at a time (window 1 here) gets no second bulk call while one is outstanding: the
    calls ready meanwhile wait (a flush leaves them, however long they waited) and leave as ONE call when it ends;
    an unwindowed queue of another copy leaves at once."""
    import time

    from recmas_ray.distributed import bulk

    watched = []
    bulker, handle, other, log = Bulker(watch=lambda ref, fn: watched.append((ref, fn))), _Handle(), _Handle(), []

    def add(h, users, window):
        return bulker.add((id(h), "rollout"), h, "rollout", (4, ("a->b",)), 2, users, [], [],
                          sent=lambda *a: log.append(users[0]), failed=lambda: None, cancelled=lambda: False,
                          window=window)

    first = add(handle, ["q0"], 1)
    assert bulker.flush() == 1 and first[1].call.settled and len(watched) == 1
    later = [add(handle, [f"q{k}"], 1) for k in (1, 2)]
    free = add(other, ["q-other"], 0)
    time.sleep(bulk.FLUSH_AFTER_S)
    assert bulker.flush() == 1 and free[1].call.settled  # only the other copy's call left
    assert not bulker.due() and bulker.flush() == 0 and len(handle.sent) == 1
    assert not any(p.call.settled for outs in later for p in outs)
    ref, ended = watched.pop()
    assert ref == "rollout_bulk-out0"
    ended(None)  # its Ray call ended: the two waiting calls leave together
    assert bulker.flush() == 1 and len(handle.sent) == 2 and not bulker
    (_, args) = handle.sent[1]
    assert [c[0] for c in args[2]] == [["q1"], ["q2"]] and log == ["q0", "q-other", "q1", "q2"]
    assert [outs[1].value(0) for outs in later] == ["rollout_bulk-out1", "rollout_bulk-out2"]


SIM = "sim:hidden=64,step_ms=2,token_ms=1,tokens=3"
CPU = PlacementConfig(preset="cpu", cpus_per_agent=0.1, agent_max_restarts=0)


def _answers(out):
    return [[(r.prediction, r.num_latent_steps, [(t["role"], t["round"], t["action"]) for t in r.trace])
             for r in results] for _, results in out]


def test_bulk_dispatched_batches_match_one_call_each_and_none_is_lost(ray_cluster):
    """The same 12 batches with bulk dispatch on and off: the same results, every logical call run once, and with
    bulk on some Ray calls carried several batches (otherwise nothing was tested)."""
    from recmas_ray.distributed.replicas import build_replicas
    from recmas_ray.system.plan import simulated_plan

    plan = simulated_plan("sequential_light", SIM)
    cfg = RecursionConfig(method="recursive_mas", num_recursive_rounds=2, latent_steps=3,
                          decode=DecodeConfig(max_new_tokens=3))
    batches = [([f"q{k}.{i} what is {k} + {i}?" for i in range(k % 3 + 1)], ["math"] * (k % 3 + 1))
               for k in range(12)]
    runs, logs = {}, {}
    for bulk in (False, True):
        replicas = build_replicas(plan, CPU, timeout_s=60, max_batches=8, bulk_dispatch=bulk)
        try:
            runs[bulk] = replicas.solve_all(batches, cfg, in_flight_per_replica=8)
            logs[bulk] = replicas.call_logs()[0]
            # simulated agents run one call at a time: forced into bulk dispatch, their calls are windowed
            assert replicas.systems[0].serial_roles == (set(plan.style.roles) if bulk else set())
            stats = ray.get(replicas.systems[0].orchestrator.group_stats.remote(), timeout=60)
        finally:
            replicas.shutdown()
        assert all(q == [0.0] for g in stats.values() for q in [g["queued"]]), stats  # every pick was done
    assert _answers(runs[True]) == _answers(runs[False])
    ran = {bulk: sorted((role, c["method"], c["first_user"], tuple(c["slots"])) for role, v in logs[bulk].items()
                        for c in v) for bulk in (False, True)}
    assert len(ran[True]) == 6 * len(batches) and ran[True] == ran[False]  # 6 calls per batch (R = 2), the same
    sizes = [c["bulk"] for v in logs[True].values() for c in v]
    assert max(sizes) > 1 and set(c["bulk"] for v in logs[False].values() for c in v) == {1}


def test_bulk_calls_of_continuous_batching_agents_give_each_batch_its_local_answers(ray_cluster):
    """Tiny real models (latents decide the answers) with continuous batching, so bulk dispatch is on by default
    and a bulk call's batches run at once in the agent: every batch as `run_batch` gives it in-process."""
    import dataclasses

    from recmas_ray.distributed.replicas import build_replicas
    from recmas_ray.engine.runner import run_batch
    from recmas_ray.system.launch import local_pool
    from recmas_ray.system.plan import plan_system

    plan = plan_system("sequential_light", preset="tiny", seed=1)
    cfg = RecursionConfig(method="recursive_mas", num_recursive_rounds=2, latent_steps=4,
                          decode=DecodeConfig(max_new_tokens=6))
    batches = [(["What is 2 + 3?", "What is 6 * 7?"], ["math"] * 2), (["Tom has 4 apples and buys 3."], ["math"]),
               (["What is 9 - 4?", "What is 1 + 1?", "What is 5 * 5?"], ["math"] * 3)]
    pool = local_pool(plan)
    local = [run_batch(pool, plan.style, qs, ts, cfg) for qs, ts in batches]
    for role, spec in plan.specs.items():
        plan.specs[role] = dataclasses.replace(spec, continuous_batching=True)
    replicas = build_replicas(plan, dataclasses.replace(CPU, cpus_per_agent=0.25), timeout_s=120)
    try:
        assert replicas.systems[0].bulk_roles == set(plan.style.roles) and not replicas.systems[0].serial_roles
        remote = replicas.solve_all(batches, cfg, in_flight_per_replica=3)
        # the answer-format retry continues from the decoder's input, whose latents are parts of bulk calls
        got = remote[2][1][1]
        retried = ray.get(replicas.systems[0].orchestrator.retry_format.remote(
            [got.prediction], ["\\boxed{"], 3, cfg=DecodeConfig(), context=(got.decoder_input, [got.decoder_row])),
            timeout=120)
        # and one bulk call of two batches, run at once in the agent, against one call each
        planner, edges = replicas.systems[0].handles["planner"], ("planner->critic",)
        calls = [(qs, [], []) for qs, _ in batches[:2]]
        stored, *stats = planner.rollout_bulk.options(num_returns=3).remote(4, edges, calls)
        alone = [planner.rollout.options(num_returns=2).remote(qs, [], 4, edges)[0] for qs, _ in batches[:2]]
        bulk_msgs = [Part(stored, j, 0).value(60) for j in range(2)]
        alone_msgs = [from_wire(ray.get(ray.get(r, timeout=60), timeout=60)) for r in alone]
        logs = replicas.call_logs()[0]
    finally:
        replicas.shutdown()
    want = local[2][1]
    local_retry = pool.retry_format(plan.style.decoder, [want.prediction], ["\\boxed{"], 3, cfg=DecodeConfig(),
                                    context=(want.decoder_input, [want.decoder_row]))
    assert [d.text for d in retried] == [d.text for d in local_retry] and len(retried) == 1
    for (_, got), want in zip(remote, local):
        assert [r.prediction for r in got] == [r.prediction for r in want]
        assert [r.num_latent_steps for r in got] == [r.num_latent_steps for r in want]
    # (rows merged into shared forwards by continuous batching: the same up to float rounding, as separate calls)
    assert all(a.shape == b.shape and torch.allclose(a, b, atol=1e-5) for a, b in zip(bulk_msgs, alone_msgs))
    assert [len(s["text_tokens"]) for s in ray.get(stats, timeout=60)] == [2, 1]
    assert sum(c["bulk"] == 2 for c in logs["planner"]) >= 2  # (the batches above may have gone in bulk too)
