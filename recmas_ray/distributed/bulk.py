"""Bulk dispatch: the calls of several batches to one agent copy, for the same role, method and step (aligned
batches), leave the orchestrator as ONE Ray call that runs each batch's call as it would have run alone.

    batch threads / completion thread           Bulker (one per process)             agent copy
    pool.rollout(...) once its inputs exist ──> queue[(copy, method, steps, edges)] ──> rollout_bulk(calls, *args)
                                                flushed when the completion thread     each batch's rollout, its
                                                has nothing left to run (or after      messages stored ONCE for
                                                FLUSH_AFTER_S): everything that        all of them; stats per batch
                                                became ready together goes together

Why: with agents that cost nothing, one call costs the orchestrator a Ray submission and completion callbacks,
the agent a task and its messages one object each, and the raylet that object's life; with 16 batches in flight
those costs, not the agents, set the rate. Batches that move through the schedule together (their upstream
call was one bulk call, so their inputs exist at the same moment) stay together at no added wait: a queue is
flushed as soon as nothing else is ready to run, so a call alone still leaves at once.

Every batch still makes its own logical call (its rows, its prompts, its routing pick and work, its own log entry
in the agent, `bulk` = the number of calls its Ray call carried), with the same inputs, so its results are the
ones it gets alone. Continuous-batching agents run a bulk call's batches at once (their rows merge, as separate
calls' would); other agents one after another, so a bulk call's results all exist only when its last batch
finishes: that is why bulk dispatch is on by default only for continuous-batching roles (`bulk_roles`).

Where it is forced on for agents that run one call at a time (`serial_roles`), a copy's queue is also held while
the copy has `SERIAL_WINDOW` bulk calls outstanding: such a copy would only queue a second call behind the one it
runs, so holding it here costs the copy at most one round trip, and every call that became ready meanwhile then
leaves in ONE Ray call. Aligned groups of batches then merge instead of only ever splitting.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import ray

from recmas_ray.distributed.transports import Part
from recmas_ray.distributed.routing import DeferredCall, Pending

FLUSH_AFTER_S = 0.005
"""A queued call leaves after this long even while the completion thread still has work (it never starves)."""
SERIAL_WINDOW = 1
"""Ray calls a copy that runs one call at a time (no continuous batching) may have outstanding; calls for it
that become ready meanwhile wait in its queue and leave together when that one ends. One, not two: with two the
copy has its next call at hand while a completion travels back here (it idles for that round trip with one),
but bulk calls carry fewer batches: 725-849 Ray calls for 2160 agent calls against 515-552, and 2.4-3.6 ms of CPU
per agent call against 2.2-2.5 (`jobs.bench.control` at 16 in flight, 240 batches, 3 runs each)."""


@dataclass
class _Entry:
    """One batch's call waiting in a queue."""

    call: DeferredCall
    users: list
    slot_names: list
    latents: list
    sent: Callable[[Any, list, list], None]
    """sent(the ref that tells the call ended, its other refs, each carried batch's `cancelled`): the pool's
    bookkeeping (queued work until it ends; cancelled only once every batch it carries is)."""
    failed: Callable[[], None]
    """Its pick is undone (it never left)."""
    cancelled: Callable[[], bool]


@dataclass
class _Queue:
    handle: Any
    method: str
    shared: tuple
    num_outputs: int
    window: int
    entries: list = field(default_factory=list)
    since: float = 0.0


class Bulker:
    """Queues of calls per (copy, method, shared arguments); `flush()` sends each queue as one Ray call.

    `watch(ref, fn)` calls `fn(None)` once `ref` resolves (`ray_pool.when_done`); it tells when a windowed
    queue's copy has a Ray call fewer outstanding (see `add`)."""

    def __init__(self, watch: Callable[[Any, Callable], None] | None = None):
        self._queues: dict[tuple, _Queue] = {}
        self._outstanding: dict[int, int] = {}  # id(copy) -> its windowed Ray calls not ended yet
        self._watch = watch
        self._lock = threading.Lock()

    def add(self, key: tuple, handle, method: str, shared: tuple, num_outputs: int, users, slot_names, latents,
            *, sent, failed, cancelled, window: int = 0) -> list:
        """Queue one batch's call of `handle.<method>_bulk(*shared, calls, *args)`; returns `Pending` handles of
        its `num_outputs` outputs (once it left: `Part`s of the call's stored messages, then its own result's ref).
        `window` > 0: the queue leaves only while its copy has fewer Ray calls of windowed queues outstanding
        (a copy that runs one call at a time: `SERIAL_WINDOW`); 0: at the next flush."""
        call = DeferredCall()
        with self._lock:
            q = self._queues.get(key)
            if q is None:
                q = self._queues[key] = _Queue(handle, method, shared, num_outputs, window, since=time.monotonic())
            q.entries.append(_Entry(call, list(users), list(slot_names), list(latents), sent, failed, cancelled))
        return [Pending(call, i) for i in range(num_outputs)]

    def _held(self, q: _Queue) -> bool:
        return q.window > 0 and self._outstanding.get(id(q.handle), 0) >= q.window

    def due(self) -> bool:
        """Whether a queued call that may leave has waited `FLUSH_AFTER_S`."""
        now = time.monotonic()
        with self._lock:
            return any(now - q.since >= FLUSH_AFTER_S and not self._held(q) for q in self._queues.values())

    def __bool__(self) -> bool:
        return bool(self._queues)

    def flush(self) -> int:
        """Send every queue that may leave as one Ray call each (oldest first); returns how many calls left."""
        with self._lock:
            queues = []
            for key, q in list(self._queues.items()):
                if self._held(q):
                    continue
                del self._queues[key]
                queues.append(q)
                if q.window:  # counted before it leaves, so a second queue of the same copy sees it
                    self._outstanding[id(q.handle)] = self._outstanding.get(id(q.handle), 0) + 1
        sent = 0
        for q in queues:
            ref = None
            try:
                ref = _send(q)
            except Exception as exc:  # noqa: BLE001 - a queue that fails fails its own batches, never hangs them
                for e in q.entries:
                    if e.call.settle(None, f"bulk dispatch failed: {exc!r}"):
                        e.failed()
            sent += ref is not None
            if q.window:
                if ref is not None and self._watch is not None:
                    self._watch(ref, lambda _, copy=id(q.handle): self._ended(copy))
                else:
                    self._ended(id(q.handle))
        return sent

    def _ended(self, copy: int) -> None:
        """A windowed Ray call of `copy` ended (or never left): its queue may leave at the next flush."""
        with self._lock:
            n = self._outstanding.get(copy, 0) - 1
            if n > 0:
                self._outstanding[copy] = n
            else:
                self._outstanding.pop(copy, None)


def _send(q: _Queue):
    """Send one queue as one Ray call; returns the ref that tells it ended (None: nothing left)."""
    entries = []
    for e in q.entries:
        if e.cancelled():
            e.failed()
            e.call.settle(None, "batch cancelled")
            continue
        latents = [_submitted(x) for x in e.latents]
        error = next((x for x in latents if isinstance(x, _Failed)), None)
        if error is not None:
            e.failed()
            e.call.settle(None, error.reason)
            continue
        entries.append((e, latents))
    if not entries:
        return None
    # each distinct argument once (a bulk call's messages feed every batch that rode in it)
    args: list = []
    index: dict = {}
    calls = []
    for e, latents in entries:
        where = []
        for x in latents:
            ref, j, edge = (x.ref, x.index, x.edge) if isinstance(x, Part) else (x, None, None)
            k = ref if isinstance(ref, ray.ObjectRef) else id(ref)
            if k not in index:
                index[k] = len(args)
                args.append(ref)
            where.append((index[k], j, edge))
        calls.append((e.users, e.slot_names, where))
    method = getattr(q.handle, f"{q.method}_bulk")
    rollout = q.num_outputs > 1  # (stored messages, then one result per batch); a decode: one result per batch
    try:
        refs = method.options(num_returns=len(entries) + rollout).remote(*q.shared, calls, *args)
    except Exception as exc:  # noqa: BLE001 - each batch reads it where it waits for its call
        for e, _ in entries:
            e.failed()
            e.call.settle(None, f"submission failed: {exc!r}")
        return None
    refs = list(refs) if isinstance(refs, (list, tuple)) else [refs]
    messages, results = (refs[0], refs[1:]) if rollout else (None, refs)
    members = [e.cancelled for e, _ in entries]
    for j, (e, _) in enumerate(entries):
        # every return of a Ray call exists once the call ends: one of them tells every batch (one callback)
        e.sent(refs[0], [r for r in (messages, results[j]) if r is not None and r is not refs[0]], members)
        e.call.settle([*(Part(messages, j, i) for i in range(q.num_outputs - 1)), results[j]])
    return refs[0]


@dataclass
class _Failed:
    reason: str


def _submitted(x):
    """An input as it left its own call: a `Pending` of a call that was sent is its output (`_Failed` if it was
    never sent); anything else as is."""
    while isinstance(x, Pending):
        if not x.call.settled:
            return _Failed("an input's call was never sent")
        if x.call.error is not None:
            return _Failed(x.call.error)
        x = x.call.outputs[x.index]
    return x
