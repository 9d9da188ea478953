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
                                     expires after `lease_s` unless renewed, so a killed client's share
                                     is freed; `release(lease)` when the batch ends (`acquire_many`,
                                     `release_many`: several batches in one call)

A fresh copy needs no state from another: a prompt prefix it has not seen is prefilled again there
(agents keep only a prefix cache, never a batch's messages, on the object store transport).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

AFFINITY_SLACK = 0.5
"""A call stays on the copy that served its batch's previous step of the role while that copy's queued
work exceeds the least loaded copy's by at most this share of the call's own work."""
AFFINITY_KEYS = 4096
"""Batches whose last copy per role is remembered (least recently used forgotten first)."""


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
        self._lock = threading.Lock()

    def call(self, group: RoleGroup, work: float, affinity: str | None, inputs: list,
             submit: Callable[[int, Any, list], list], num_outputs: int) -> list:
        """Submit `submit(copy index, copy, inputs)` on the copy `group` picks once every input exists; returns
        its `num_outputs` outputs (submitted now) or `Pending` handles of them. A failed submission undoes
        its pick."""
        if self.closed is not None:
            raise RuntimeError(self.closed)
        waits = [x for x in inputs if isinstance(x, Pending) or self.is_waitable(x)]
        if not waits:
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
            with self._lock:
                self._waiting.discard(call)
                reason = self.closed
            if reason is not None:
                call.settle(None, reason)
                return
            upstream = next((x.call.error for x in inputs if isinstance(x, Pending) and x.call.error), None)
            if upstream is not None:
                call.settle(None, upstream)
                return
            args = [x.call.outputs[x.index] if isinstance(x, Pending) else x for x in inputs]
            try:
                call.settle(self._submit(group, work, affinity, args, submit))
            except Exception as e:  # noqa: BLE001 - the caller reads it where it waits for this call
                call.settle(None, f"submission failed: {e!r}")

        for x in waits:
            if isinstance(x, Pending):
                x.call.on_settled(lambda x=x: arrived() if x.call.error is not None
                                  else self.when_ready(x.call.outputs[x.index], arrived))
            else:
                self.when_ready(x, arrived)
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

    def __init__(self, num_replicas: int, *, lease_s: float = 3600.0, clock: Callable[[], float] = time.monotonic):
        if num_replicas < 1:
            raise ValueError(f"num_replicas={num_replicas}; expected >= 1")
        self.num_replicas, self.lease_s, self.clock = num_replicas, lease_s, clock
        self.queued = [0.0] * num_replicas
        self.in_flight = [0] * num_replicas
        self.served = [0] * num_replicas
        self.expired = 0
        self._leases: dict[int, tuple[int, float, float]] = {}  # id -> (replica, work, deadline)
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
        """Extend a lease by `lease_s`; False when it had already expired (its work no longer counted)."""
        with self._lock:
            self._expire()
            if lease not in self._leases:
                return False
            i, work, _ = self._leases[lease]
            self._leases[lease] = (i, work, self.clock() + self.lease_s)
            return True

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
        now = self.clock()
        for lease in [k for k, (_, _, deadline) in self._leases.items() if deadline <= now]:
            self._drop(lease)
            self.expired += 1

    def stats(self) -> dict:
        with self._lock:
            self._expire()
            return {"in_flight": list(self.in_flight), "queued": list(self.queued), "served": list(self.served),
                    "expired_leases": self.expired}


def batch_work(style, cfg, num_rows: int) -> float:
    """Rows x steps of one batch over the whole schedule (every rollout's m, every decode's budget)."""
    from recmas_ray.styles import build_schedule

    if cfg.method == "single_agent":
        return float(num_rows * cfg.decode.max_new_tokens)
    latent = cfg.method == "recursive_mas"
    rounds = 1 if cfg.method == "textmas" else cfg.num_recursive_rounds
    steps = 0
    for step in build_schedule(style, rounds, decode_every_round=latent and cfg.decode_every_round):
        if step.decode or step.discard_decode or not latent:
            steps += cfg.decode.max_new_tokens
        if step.outputs and latent:
            steps += cfg.latent_steps
    return float(num_rows * steps)
