"""Where work runs: one `RoleGroup` per role (its copies and the work queued on each) and one
`ReplicaRouter` over whole-system replicas. Pure Python, no Ray (tested without it); the Ray layer
wraps `ReplicaRouter` in an actor and the orchestrator's pool asks its role groups per call.

Work is counted in rows x steps: a rollout of B rows and m latent steps is B * m, a decode of B rows
with a budget of T tokens is B * T (the same forward-per-step unit the cost model uses).

    RoleGroup.pick(work, affinity)   every agent call, per step: the copy with the least queued work;
                                     the copy that ran the batch's previous step of this role (its prompt
                                     prefix KV) only breaks near-ties, within `affinity_slack` x work
    RoleGroup.done(copy, work)       when the call's result exists (or it failed / was cancelled)
    Dispatcher.call(group, ...)      a call is picked for and submitted only once its inputs exist (the
                                     upstream calls finished); until then its outputs are `Pending`
                                     handles, so a call waiting upstream holds no queued work downstream
    ReplicaRouter.acquire(work)      per batch: the replica with the least queued work, as a lease that
                                     expires after `lease_s` (`LEASE_S`) unless renewed: the client's
                                     `LeaseKeeper` renews its running batches' leases every few seconds, so a
                                     dead client's share is freed within `LEASE_S`; `release(lease)` when the
                                     batch ends (`acquire_many`, `release_many`: several batches in one call)

A fresh copy needs no state from another: a prompt prefix it has not seen is prefilled again there
(agents keep only a prefix cache, never a batch's messages, on the object store transport).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

from recmas_ray.styles import build_schedule

AFFINITY_SLACK = 0.5
"""A call stays on the copy that served its batch's previous step of the role while that copy's queued
work exceeds the least loaded copy's by at most this share of the call's own work."""
AFFINITY_KEYS = 4096
"""Batches whose last copy per role is remembered (least recently used forgotten first)."""
LEASE_S = 15.0
"""How long the replica router counts a batch's work without hearing from its client. Clients renew the leases of
their running batches every `LEASE_RENEW_S` (`LeaseKeeper`), however long a batch takes, so only a dead client's
leases run out: its share of the routing is freed within this many seconds."""
LEASE_RENEW_S = LEASE_S / 5
"""A client's renewal period (a few missed renewals, e.g. a busy driver, do not lose a live batch's lease)."""


class RoleGroup:
    """A role's copies (actor handles, or anything) and their routing; thread-safe."""

    def __init__(self, role: str, copies: list, *, affinity_slack: float = AFFINITY_SLACK):
        if not copies:
            raise ValueError(f"role {role!r} has no copies")
        self.role, self.copies, self.affinity_slack = role, list(copies), affinity_slack
        self.queued = [0.0] * len(self.copies)
        """Work (rows x steps) submitted to each copy and not yet finished."""
        self.calls = [0] * len(self.copies)
        self.work_served = [0.0] * len(self.copies)
        self._last: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.copies)

    def pick(self, work: float, affinity: str | None = None) -> int:
        """The copy for one call of `work` rows x steps; counted as queued until `done`."""
        with self._lock:
            least = min(self.queued)
            k = min(range(len(self.copies)), key=lambda i: (self.queued[i], self.calls[i], i))
            preferred = self._last.get(affinity) if affinity is not None else None
            if preferred is not None and self.queued[preferred] - least <= self.affinity_slack * work:
                k = preferred
            self.queued[k] += work
            self.calls[k] += 1
            self.work_served[k] += work
            if affinity is not None:
                self._last[affinity] = k
                self._last.move_to_end(affinity)
                while len(self._last) > AFFINITY_KEYS:
                    self._last.popitem(last=False)
            return k

    def done(self, k: int, work: float) -> None:
        with self._lock:
            self.queued[k] = max(0.0, self.queued[k] - work)

    def forget(self, affinity: str) -> None:
        """A batch ended: its affinity is no longer useful."""
        with self._lock:
            self._last.pop(affinity, None)

    def stats(self) -> dict:
        with self._lock:
            return {"queued": list(self.queued), "calls": list(self.calls), "work_served": list(self.work_served)}


class DeferredCall:
    """One agent call waiting for its inputs: submitted (`outputs`) or given up (`error`) exactly once."""

    def __init__(self):
        self.outputs: list | None = None
        self.error: str | None = None
        self.settled = False
        """Whether it was submitted or given up (`outputs` / `error` are then final)."""
        # created by the first `wait` only: two per agent call (its dispatch and its bulk queue entry) are
        # mostly settled before anyone waits, and an Event (a Condition and two locks) costs the orchestrator
        self._event: threading.Event | None = None
        self._listeners: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def settle(self, outputs: list | None, error: str | None = None) -> bool:
        """Record the submission's outputs (or why it was not submitted) and run the listeners; False when it
        had already settled."""
        with self._lock:
            if self.settled:
                return False
            self.outputs, self.error = outputs, error
            self.settled = True
            listeners, self._listeners = self._listeners, []
            event = self._event
        if event is not None:
            event.set()
        for fn in listeners:
            fn()
        return True

    def on_settled(self, fn: Callable[[], None]) -> None:
        """Call `fn()` once the call is submitted or given up (at once if it already is)."""
        with self._lock:
            if not self.settled:
                self._listeners.append(fn)
                return
        fn()

    def wait(self, timeout: float | None) -> list:
        """The outputs once submitted; TimeoutError when not settled in time, RuntimeError when given up."""
        if not self.settled:
            with self._lock:
                if not self.settled and self._event is None:
                    self._event = threading.Event()
                event = self._event
            if event is not None and not event.wait(timeout):
                raise TimeoutError("its inputs did not arrive in time")
        if self.error is not None:
            raise RuntimeError(self.error)
        return self.outputs


class Pending:
    """Output `index` of a call not submitted yet (its inputs do not exist yet); a pool's handle like any other.

    Crossing a process (pickled into a result), it becomes the submitted call's own handle."""

    __slots__ = ("call", "index")

    def __init__(self, call: DeferredCall, index: int):
        self.call, self.index = call, index

    def value(self, timeout: float | None = None) -> Any:
        """The submitted call's output (through any `Pending` it was submitted as: a call queued for bulk dispatch)."""
        out = self.call.wait(timeout)[self.index]
        return out.value(timeout) if isinstance(out, Pending) else out

    def __reduce__(self):
        if not self.call.settled or self.call.error is not None:
            raise RuntimeError(f"a handle of an agent call that was never submitted ({self.call.error or 'waiting'}) "
                               "cannot leave its process")
        return _same, (self.call.outputs[self.index],)


def _same(x):
    return x


class Dispatcher:
    """Routes each call of a batch when its inputs exist, so a copy is chosen by the queued work at that time.

    `is_waitable(x)`: whether an input is a handle whose value may not exist yet (an ObjectRef on Ray);
    `when_ready(x, fn)`: call `fn()` once it exists (a value or an error). `Pending` inputs (calls of this or
    another dispatcher not yet submitted) count as waiting until their call is submitted and its output exists.
    Calls whose inputs all exist are picked and submitted at once, on the caller's thread; the others on the
    thread `when_ready` calls back on. Thread-safe.
    """

    def __init__(self, is_waitable: Callable[[Any], bool], when_ready: Callable[[Any, Callable[[], None]], None]):
        self.is_waitable, self.when_ready = is_waitable, when_ready
        self.closed: str | None = None
        self._waiting: set[DeferredCall] = set()
        # held while a call is checked and submitted, so that `close` (a cancel) either comes first and the call
        # never runs, or waits until the submitted call is where its pool's cancel finds it (re-entrant: a submit
        # may settle a call whose listeners submit another)
        self._lock = threading.RLock()

    def call(self, group: RoleGroup, work: float, affinity: str | None, inputs: list,
             submit: Callable[[int, Any, list], list], num_outputs: int) -> list:
        """Submit `submit(copy index, copy, inputs)` on the copy `group` picks once every input exists; returns
        its `num_outputs` outputs (submitted now) or `Pending` handles of them. A failed submission undoes
        its pick."""
        waits = [x for x in inputs if isinstance(x, Pending) or self.is_waitable(x)]
        if not waits:
            with self._lock:
                if self.closed is not None:
                    raise RuntimeError(self.closed)
                return self._submit(group, work, affinity, inputs, submit)
        call = DeferredCall()
        with self._lock:
            self._waiting.add(call)
        remaining = [len(waits)]
        count = threading.Lock()

        def arrived():
            with count:
                remaining[0] -= 1
                if remaining[0]:
                    return
            upstream = next((x.call.error for x in inputs if isinstance(x, Pending) and x.call.error), None)
            outputs = None
            with self._lock:  # checked and submitted at once: a `close` meanwhile waits (see __init__)
                self._waiting.discard(call)
                reason = self.closed or upstream
                if reason is None:
                    args = [x.call.outputs[x.index] if isinstance(x, Pending) else x for x in inputs]
                    try:
                        outputs = self._submit(group, work, affinity, args, submit)
                    except Exception as e:  # noqa: BLE001 - the caller reads it where it waits for this call
                        reason = f"submission failed: {e!r}"
            call.settle(outputs, reason)

        def guarded(fn):
            """A completion callback whose exception fails this call with its message (instead of being lost
            on the thread that ran it, and the call's reader waiting out its timeout)."""
            def run(*_):
                try:
                    fn()
                except Exception as e:  # noqa: BLE001
                    call.settle(None, f"completion callback failed: {e!r}")
            return run

        for x in waits:
            if isinstance(x, Pending):
                x.call.on_settled(guarded(lambda x=x: arrived() if x.call.error is not None
                                          else self.when_ready(x.call.outputs[x.index], guarded(arrived))))
            else:
                self.when_ready(x, guarded(arrived))
        return [Pending(call, i) for i in range(num_outputs)]

    @staticmethod
    def _submit(group: RoleGroup, work: float, affinity: str | None, args: list, submit) -> list:
        k = group.pick(work, affinity)
        try:
            return list(submit(k, group.copies[k], args))
        except BaseException:
            group.done(k, work)
            raise

    def close(self, reason: str) -> int:
        """Submit nothing more: calls still waiting give up with `reason`; returns how many."""
        with self._lock:
            self.closed = reason
            waiting, self._waiting = list(self._waiting), set()
        for call in waiting:
            call.settle(None, reason)
        return len(waiting)


class ReplicaRouter:
    """Hands each batch to the replica with the least queued work (rows x steps), as an expiring lease.

    `acquire` -> (replica, lease id); `release(lease)` frees it, `renew(lease)` extends it. A lease not
    released within `lease_s` (a client killed mid-batch) is dropped and its work no longer counts.
    Thread-safe (Serve runs several batches of one process at once; the Ray actor several calls).
    """

    def __init__(self, num_replicas: int, *, lease_s: float = LEASE_S, clock: Callable[[], float] = time.monotonic):
        if num_replicas < 1:
            raise ValueError(f"num_replicas={num_replicas}; expected >= 1")
        self.num_replicas, self.lease_s, self.clock = num_replicas, lease_s, clock
        self.queued = [0.0] * num_replicas
        self.in_flight = [0] * num_replicas
        self.served = [0] * num_replicas
        self.expired = 0
        self._leases: dict[int, tuple[int, float, float]] = {}  # id -> (replica, work, deadline)
        self._deadlines: list[tuple[float, int]] = []  # heap of (deadline, lease); stale after a renew or release
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def acquire(self, work: float = 1.0, replicas: int | None = None) -> tuple[int, int]:
        """(replica, lease) for one batch of `work`; among the first `replicas` replicas when given."""
        with self._lock:
            self._expire()
            n = min(replicas or self.num_replicas, self.num_replicas)
            i = min(range(n), key=lambda k: (self.queued[k], self.in_flight[k], self.served[k], k))
            lease = next(self._ids)
            self._leases[lease] = (i, float(work), self.clock() + self.lease_s)
            heapq.heappush(self._deadlines, (self._leases[lease][2], lease))
            self.queued[i] += work
            self.in_flight[i] += 1
            self.served[i] += 1
            return i, lease

    def acquire_many(self, works: list[float], replicas: int | None = None) -> list[tuple[int, int]]:
        """`acquire` for several batches in one call (one actor call for a client's whole refill), in order: each
        sees the work of the ones before it, as separate calls in a row would."""
        return [self.acquire(work, replicas) for work in works]

    def release_many(self, leases: list[int]) -> None:
        """`release` of several leases in one call (batches that finished together)."""
        with self._lock:
            for lease in leases:
                self._drop(lease)

    def renew(self, lease: int) -> bool:
        """Extend a lease to `lease_s` from now; False when it had already expired (its work no longer counted)."""
        return self.renew_many([lease])[0]

    def renew_many(self, leases: list[int]) -> list[bool]:
        """`renew` of several leases in one call (a client's `LeaseKeeper`)."""
        with self._lock:
            self._expire()
            out = []
            for lease in leases:
                entry = self._leases.get(lease)
                if entry is not None:
                    deadline = self.clock() + self.lease_s
                    self._leases[lease] = (entry[0], entry[1], deadline)
                    if len(self._deadlines) > 4 * len(self._leases) + 64:  # renewals left stale entries behind
                        self._deadlines = [(d, k) for k, (_, _, d) in self._leases.items()]
                        heapq.heapify(self._deadlines)
                    else:
                        heapq.heappush(self._deadlines, (deadline, lease))
                out.append(entry is not None)
            return out

    def release(self, lease: int) -> None:
        with self._lock:
            self._drop(lease)

    def _drop(self, lease: int) -> None:
        entry = self._leases.pop(lease, None)
        if entry is not None:
            i, work, _ = entry
            self.queued[i] = max(0.0, self.queued[i] - work)
            self.in_flight[i] = max(0, self.in_flight[i] - 1)

    def _expire(self) -> None:
        """Drop the leases past their deadline: the heap's earliest entries only (an entry is stale when its lease
        was renewed or released since), not a scan of every lease."""
        now = self.clock()
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, lease = heapq.heappop(self._deadlines)
            entry = self._leases.get(lease)
            if entry is not None and entry[2] == deadline:
                self._drop(lease)
                self.expired += 1

    def stats(self) -> dict:
        with self._lock:
            self._expire()
            return {"in_flight": list(self.in_flight), "queued": list(self.queued), "served": list(self.served),
                    "expired_leases": self.expired}


class LeaseKeeper:
    """A client's side of its leases: renews those of its running batches every `interval_s` (one
    `renew(leases)` call for all of them) on a daemon thread that runs while it holds any. `hold(lease)` when a
    batch starts, `drop(lease)` when it ends. A renewal that fails (the router restarting) is retried next time."""

    def __init__(self, renew: Callable[[list[int]], Any], *, interval_s: float = LEASE_RENEW_S):
        self.renew, self.interval_s = renew, interval_s
        self._held: set[int] = set()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self.renewals = 0

    def hold(self, lease: int) -> None:
        with self._wake:
            self._held.add(lease)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="recmas-lease-keeper", daemon=True)
                self._thread.start()

    def drop(self, lease: int) -> None:
        with self._wake:
            self._held.discard(lease)
            if not self._held:
                self._wake.notify_all()

    def held(self) -> list[int]:
        with self._wake:
            return sorted(self._held)

    def _run(self) -> None:
        while True:
            with self._wake:
                self._wake.wait(self.interval_s)
                leases = sorted(self._held)
                if not leases:
                    self._thread = None
                    return
            try:
                self.renew(leases)
                self.renewals += 1
            except Exception:  # noqa: BLE001 - the next period tries again; the lease outlives a few misses
                pass


def batch_work(style, cfg, num_rows: int) -> float:
    """Rows x steps of one batch over the whole schedule (every rollout's m, every decode's budget)."""
    if cfg.method == "single_agent":
        return float(num_rows * cfg.decode.max_new_tokens)
    latent = cfg.method in ("recursive_mas", "rollout_as_text")
    rounds = 1 if cfg.method in ("textmas", "text_relay") else cfg.num_recursive_rounds
    steps = 0
    for step in build_schedule(style, rounds, decode_every_round=latent and cfg.decode_every_round):
        if step.decode or step.discard_decode or not latent:
            steps += cfg.decode.max_new_tokens
        if step.outputs and latent:
            steps += cfg.latent_steps
    return float(num_rows * steps)
