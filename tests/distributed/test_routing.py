"""Routing without Ray: a role group sends each call to the copy with the least queued work (its batch's
previous copy only breaks near-ties), and the replica router hands out expiring leases."""

import threading

import pytest

from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.distributed.routing import (DeferredCall, Dispatcher, Pending, ReplicaRouter, RoleGroup,
                                            batch_work)
from recmas_ray.styles import get_style


def test_each_call_goes_to_the_copy_with_the_least_queued_work():
    group = RoleGroup("solver", ["s0", "s1", "s2"])
    assert [group.pick(8 * 256) for _ in range(3)] == [0, 1, 2]  # three decodes of 8 rows x 256 tokens
    assert group.pick(8 * 32) == 0  # a ties-by-calls choice: every copy holds one decode
    group.done(1, 8 * 256)
    assert group.pick(8 * 32) == 1  # the copy whose decode finished has the least queued work
    assert group.stats()["queued"] == [8 * 256 + 8 * 32, 8 * 32, 8 * 256]


def test_a_batch_stays_on_its_copy_only_while_that_copy_is_nearly_as_free():
    group = RoleGroup("critic", ["c0", "c1"], affinity_slack=0.5)
    first = group.pick(100, affinity="batch-a")
    group.done(first, 100)
    other = group.pick(40, affinity="batch-b")  # the other batch's step keeps the copy the load ordering gives
    assert other == 1 - first or other == first
    # 40 queued on one copy: within 0.5 x 100 of the least, so batch a keeps its copy (its prefix KV)
    assert group.pick(100, affinity="batch-a") == first
    group.done(first, 100)
    group.pick(400, affinity="batch-c")  # now a long call sits on one copy
    busy = max(range(2), key=lambda k: group.queued[k])
    group._last["batch-a"] = busy
    assert group.pick(100, affinity="batch-a") != busy  # affinity never outweighs real load


def test_a_step_waiting_upstream_holds_no_downstream_copy():
    """The sticky per-batch choice counted a batch at the solver while it was still at the planner; per-step
    routing counts only calls submitted to that copy."""
    solver = RoleGroup("solver", ["s0", "s1"])
    busy = solver.pick(8 * 256, affinity="a")  # batch a decodes on one copy
    # batches b and c are at the planner: nothing of theirs is queued at the solver, so b's decode, when it
    # comes, goes to the free copy, and c's after b's to ... the other free-er one
    assert solver.pick(8 * 256, affinity="b") == 1 - busy
    solver.done(busy, 8 * 256)
    assert solver.pick(8 * 256, affinity="c") == busy


def test_group_accounting_is_thread_safe():
    group = RoleGroup("solver", ["s0", "s1", "s2"])

    def work():
        for _ in range(200):
            k = group.pick(3.0, affinity=str(threading.get_ident()))
            group.done(k, 3.0)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert group.stats()["queued"] == [0.0, 0.0, 0.0] and sum(group.stats()["calls"]) == 1600


class _Refs:
    """Stand-ins for ObjectRefs: `ref()` makes one, `finish(ref)` makes it exist and runs its callbacks."""

    def __init__(self):
        self.callbacks: dict[int, list] = {}
        self.done: set[int] = set()
        self.count = 0

    def ref(self) -> "_Ref":
        self.count += 1
        return _Ref(self.count)

    def when_ready(self, ref, fn):
        if ref.n in self.done:
            fn()
        else:
            self.callbacks.setdefault(ref.n, []).append(fn)

    def finish(self, ref):
        self.done.add(ref.n)
        for fn in self.callbacks.pop(ref.n, []):
            fn()


class _Ref:
    def __init__(self, n):
        self.n = n


def _dispatcher(refs):
    return Dispatcher(lambda x: isinstance(x, _Ref), refs.when_ready)


def test_a_call_picks_its_copy_when_its_inputs_exist_not_when_it_is_chained():
    """A batch whose upstream is slow: its decode, chained at once, is picked for only when the upstream message
    exists, so it sees the solver copies' queues then (copy 0 busy with a long decode, copy 1 free), not the
    queues of the moment it was chained (both idle, so copy 0)."""
    refs, solver = _Refs(), RoleGroup("solver", ["s0", "s1"])
    dispatcher, submitted = _dispatcher(refs), []

    def submit(k, copy, args):
        submitted.append((k, args))
        out = refs.ref()
        return [out]

    upstream = refs.ref()  # the slow batch's critic message, not there yet
    (slow_decode,) = dispatcher.call(solver, 8.0, "slow", [upstream], submit, 1)
    assert isinstance(slow_decode, Pending) and submitted == [] and solver.queued == [0.0, 0.0]
    (long_decode,) = dispatcher.call(solver, 100.0, "fast", ["a ready latent"], submit, 1)  # inputs exist: now
    assert submitted == [(0, ["a ready latent"])]
    refs.finish(upstream)
    assert submitted[-1] == (1, [upstream])  # the free copy, with the upstream's own handle as its input
    assert slow_decode.value(0) is not long_decode and solver.queued == [100.0, 8.0]


def test_pending_handles_chain_and_a_closed_dispatcher_submits_nothing_more():
    refs, planner, critic = _Refs(), RoleGroup("planner", ["p0"]), RoleGroup("critic", ["c0"])
    dispatcher, order = _dispatcher(refs), []

    def submit(name):
        def run(k, copy, args):
            order.append((name, args))
            return [refs.ref()]
        return run

    first = refs.ref()
    (planned,) = dispatcher.call(planner, 4.0, "b", [first], submit("planner"), 1)
    (critiqued,) = dispatcher.call(critic, 4.0, "b", [planned], submit("critic"), 1)
    assert order == []
    refs.finish(first)
    assert [n for n, _ in order] == ["planner"]  # the critic waits for the planner's output to exist
    refs.finish(planned.value(0))
    assert order[-1] == ("critic", [planned.value(0)])
    # crossing a process, a pending handle becomes the submitted call's own
    assert type(pickle_roundtrip(critiqued)) is _Ref and pickle_roundtrip(critiqued).n == critiqued.value(0).n
    late = refs.ref()
    (never,) = dispatcher.call(critic, 4.0, "b", [late], submit("critic"), 1)
    assert dispatcher.close("batch cancelled") == 1
    refs.finish(late)
    assert len(order) == 2 and critic.queued == [4.0]  # nothing submitted after the close, nothing queued for it
    with pytest.raises(RuntimeError, match="batch cancelled"):
        never.value(0)
    with pytest.raises(RuntimeError, match="batch cancelled"):
        dispatcher.call(critic, 4.0, "b", [], submit("critic"), 1)


def test_a_failed_submission_undoes_its_pick():
    refs, solver = _Refs(), RoleGroup("solver", ["s0", "s1"])
    dispatcher = _dispatcher(refs)

    def broken(k, copy, args):
        raise ValueError("actor gone")

    upstream = refs.ref()
    (out,) = dispatcher.call(solver, 8.0, "b", [upstream], broken, 1)
    refs.finish(upstream)
    with pytest.raises(RuntimeError, match="actor gone"):
        out.value(0)
    assert solver.queued == [0.0, 0.0]


def pickle_roundtrip(x):
    import pickle

    return pickle.loads(pickle.dumps(x))


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_lease_not_released_expires_and_frees_its_replica():
    clock = _Clock()
    router = ReplicaRouter(2, lease_s=10.0, clock=clock)
    dead_client, _ = router.acquire(1000.0)  # a client acquires, then is killed: it never releases
    live, lease = router.acquire(10.0)
    assert live != dead_client
    assert router.acquire(10.0)[0] == live  # the dead client's work still counts
    clock.now = 11.0
    assert router.renew(lease) is False  # a lease past its time is gone, renewing it says so
    stats = router.stats()
    assert stats["in_flight"] == [0, 0] and stats["expired_leases"] == 3


def test_a_renewed_lease_survives_and_a_released_one_frees_at_once():
    clock = _Clock()
    router = ReplicaRouter(2, lease_s=10.0, clock=clock)
    i, lease = router.acquire(5.0)
    clock.now = 8.0
    assert router.renew(lease)
    clock.now = 15.0
    assert router.stats()["in_flight"][i] == 1
    router.release(lease)
    router.release(lease)  # twice: harmless
    assert router.stats()["in_flight"] == [0, 0] and router.stats()["queued"] == [0.0, 0.0]


def test_a_deferred_call_makes_its_event_only_for_a_waiter():
    """Most calls are settled before anyone waits (the orchestrator makes two per agent call): those never build
    an Event; a waiter on another thread still wakes when the call settles, and a later waiter returns at once."""
    quick = DeferredCall()
    quick.settle(["out"])
    assert quick.wait(0) == ["out"] and quick._event is None
    slow, got = DeferredCall(), []
    waiter = threading.Thread(target=lambda: got.append(slow.wait(10)))
    waiter.start()
    while slow._event is None:  # the waiter is in wait()
        threading.Event().wait(0.001)
    slow.settle(["late"])
    waiter.join(10)
    assert got == [["late"]] and slow.wait(0) == ["late"]
    given_up = DeferredCall()
    given_up.settle(None, "batch cancelled")
    with pytest.raises(RuntimeError, match="batch cancelled"):
        given_up.wait(0)
    with pytest.raises(TimeoutError):
        DeferredCall().wait(0.01)


def test_many_leases_in_one_call_match_one_call_each():
    """`acquire_many` / `release_many` (one router call for a client's refill, one for the batches that finished
    together): the same replicas and leases as calls one after another, and everything freed."""
    works = [100.0, 10.0, 10.0, 50.0, 1.0]
    one_by_one, together = ReplicaRouter(3), ReplicaRouter(3)
    assert together.acquire_many(works) == [one_by_one.acquire(w) for w in works]
    assert [i for i, _ in together.acquire_many([5.0, 5.0], replicas=1)] == [0, 0]
    together.release_many([lease for lease in range(1, 8)] + [7])  # (a lease twice: harmless)
    assert together.stats()["in_flight"] == [0, 0, 0] and together.stats()["queued"] == [0.0, 0.0, 0.0]


def test_the_replica_router_weighs_work_not_batch_counts_and_is_thread_safe():
    router = ReplicaRouter(2)
    big, _ = router.acquire(1000.0)
    small = [router.acquire(10.0)[0] for _ in range(5)]
    assert set(small) == {1 - big}  # five small batches weigh less than one big one
    assert router.acquire(10.0, replicas=1)[0] == 0  # limited to the first replica

    def cycle():
        for _ in range(100):
            router.release(router.acquire(2.0)[1])

    threads = [threading.Thread(target=cycle) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(router.stats()["in_flight"]) == 7  # only the seven never released above


def test_batch_work_counts_rows_times_steps_of_the_schedule():
    style = get_style("sequential_light")
    cfg = RecursionConfig(method="recursive_mas", num_recursive_rounds=2, latent_steps=4,
                          decode=DecodeConfig(max_new_tokens=6))
    # R = 2: planner, critic twice, solver rolls out feedback once and decodes once
    assert batch_work(style, cfg, 3) == 3 * (5 * 4 + 6)
    text = RecursionConfig(method="textmas", decode=DecodeConfig(max_new_tokens=6))
    assert batch_work(style, text, 2) == 2 * 3 * 6


def test_a_group_needs_a_copy_and_a_router_a_replica():
    with pytest.raises(ValueError, match="no copies"):
        RoleGroup("solver", [])
    with pytest.raises(ValueError, match="num_replicas=0"):
        ReplicaRouter(0)
