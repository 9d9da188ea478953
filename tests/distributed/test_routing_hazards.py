"""Routing hazards, without Ray: a cancel racing a call's submission, a completion callback that raises, leases
of live and dead clients, and lease expiry that does not scan every lease."""

import threading
import time

import pytest

from tests.distributed.test_routing import _Clock, _dispatcher, _Refs

from recmas_ray.distributed.routing import LEASE_S, DeferredCall, LeaseKeeper, Pending, ReplicaRouter, RoleGroup

WAIT_S = 10.0


class _PausingGroup(RoleGroup):
    """A role group whose `pick` (the first thing a submission does once the call's inputs exist) lets another
    thread cancel the batch right then, and waits a moment for that cancel to finish."""

    def __init__(self, *a, on_pick, **kw):
        super().__init__(*a, **kw)
        self.on_pick = on_pick

    def pick(self, work, affinity=None):
        self.on_pick()
        return super().pick(work, affinity)


def test_a_cancel_between_arrival_and_submission_never_lets_the_call_run_unseen():
    """The batch is cancelled (`close`) after the call's inputs arrived and before it is submitted: either the
    call is never submitted, or `close` returns only after the submission (so the pool's cancel, which reads its
    submitted calls after `close`, finds and cancels it). Before, `close` returned first and the call then ran."""
    refs, events = _Refs(), []
    dispatcher = _dispatcher(refs)
    closed = threading.Event()

    def cancel_now():
        def cancel():
            dispatcher.close("batch cancelled")
            events.append("close returned")
            closed.set()
        threading.Thread(target=cancel).start()
        closed.wait(0.5)  # with the fix the cancel waits for this submission instead

    group = _PausingGroup("solver", ["s0"], on_pick=cancel_now)

    def submit(k, copy, args):
        events.append("submitted")
        return ["out"]

    upstream = refs.ref()
    (out,) = dispatcher.call(group, 4.0, "b", [upstream], submit, 1)
    refs.finish(upstream)
    assert closed.wait(WAIT_S)
    assert events in (["close returned"], ["submitted", "close returned"]), events
    if events == ["close returned"]:
        with pytest.raises(RuntimeError, match="batch cancelled"):
            out.value(0)


def test_a_completion_callback_that_raises_fails_the_call_with_its_message():
    """A callback run when an input arrives raises: the call fails at once with that message, instead of the
    exception vanishing on the completion thread and the reader waiting out its timeout."""
    refs = _Refs()

    def broken_when_ready(ref, fn):
        raise ValueError("watcher broke")

    from recmas_ray.distributed.routing import Dispatcher

    dispatcher = Dispatcher(lambda x: hasattr(x, "n"), broken_when_ready)
    upstream = DeferredCall()
    (out,) = dispatcher.call(RoleGroup("critic", ["c0"]), 4.0, "b", [Pending(upstream, 0)],
                             lambda k, copy, args: ["never"], 1)
    try:
        upstream.settle([refs.ref()])  # its output is a ref: the downstream call now watches it, and that raises
    except ValueError:
        pass  # (before the fix it escaped into whoever settled the upstream call)
    with pytest.raises(RuntimeError, match="watcher broke"):
        out.value(WAIT_S)

    # and an exception inside the arrival itself (here: the submission's routing) fails the call the same way
    dispatcher = _dispatcher(refs)
    upstream = refs.ref()

    class Broken(RoleGroup):
        def pick(self, work, affinity=None):
            raise KeyError("routing state")

    (out,) = dispatcher.call(Broken("critic", ["c0"]), 4.0, "b", [upstream], lambda k, copy, args: ["x"], 1)
    refs.finish(upstream)
    with pytest.raises(RuntimeError, match="routing state"):
        out.value(WAIT_S)


def test_leases_live_while_renewed_however_long_the_batch_and_die_within_lease_s_of_their_client():
    """The router's default lease is short (a dead client's share freed within LEASE_S, not 2 x timeout + 60 s);
    a running batch's lease is renewed by its client's keeper, so a batch longer than LEASE_S keeps it."""
    assert LEASE_S <= 30 and ReplicaRouter(1).lease_s == LEASE_S
    clock = _Clock()
    router = ReplicaRouter(2, lease_s=10.0, clock=clock)
    _, live = router.acquire(5.0)
    _, dead = router.acquire(5.0)
    for t in range(1, 40):  # 39 s: the live client renews every 2 s, the dead one never
        clock.now = float(t)
        if t % 2 == 0:
            assert router.renew_many([live]) == [True]
    stats = router.stats()
    assert stats["in_flight"] == [1, 0] and stats["expired_leases"] == 1
    assert router.renew_many([live, dead]) == [True, False]


def test_a_lease_keeper_renews_while_its_batches_run_and_stops_when_they_end():
    """Real threads and a real clock, a 0.4 s lease renewed every 0.05 s: a batch held for 1 s keeps its lease;
    once its client stops renewing (a dead driver), the lease expires within the lease time."""
    router = ReplicaRouter(1, lease_s=0.4)
    keeper = LeaseKeeper(router.renew_many, interval_s=0.05)
    _, lease = router.acquire(3.0)
    keeper.hold(lease)
    time.sleep(1.0)
    assert router.stats()["in_flight"] == [1] and keeper.renewals >= 3
    keeper.drop(lease)  # the client is gone without releasing (killed): nobody renews any more
    deadline = time.monotonic() + WAIT_S
    while router.stats()["in_flight"] != [0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert router.stats() == {"in_flight": [0], "queued": [0.0], "served": [1], "expired_leases": 1}
    time.sleep(0.2)
    assert keeper._thread is None  # the keeper's thread ends when it holds nothing


class _CountingDict(dict):
    """A dict that counts full passes over it (items / keys / values / iteration)."""

    passes = 0

    def items(self):
        type(self).passes += 1
        return super().items()

    def __iter__(self):
        type(self).passes += 1
        return super().__iter__()


def test_acquire_does_not_scan_every_lease_to_expire_old_ones():
    """10 000 leases held: acquiring, renewing and releasing more makes no pass over all of them (expiry reads a
    deadline heap), and leases still expire in deadline order, renewed ones later."""
    clock = _Clock()
    router = ReplicaRouter(4, lease_s=10.0, clock=clock)
    held = [router.acquire(1.0)[1] for _ in range(10_000)]
    router._leases = _CountingDict(router._leases)
    _CountingDict.passes = 0
    for t in range(200):
        clock.now = (t + 1) * 0.01
        lease = router.acquire(1.0)[1]
        router.renew(held[t])
        router.release(lease)
    assert _CountingDict.passes == 0
    clock.now = 10.005  # past the first leases' deadline (10 s), not the renewed ones' (10.01 s and later)
    assert router.stats()["expired_leases"] == 10_000 - 200
    clock.now = 13.0
    assert router.stats()["expired_leases"] == 10_000
