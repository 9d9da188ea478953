"""The pool the runner talks to on Ray (`RayPool`: a batch's calls over the agent actors' copies, each routed when
its inputs exist) and `when_done`, the one place completion callbacks of ObjectRefs run in a process."""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
import uuid

import ray

from recmas_ray.config.transport import OBJECT_STORE, Transport
from recmas_ray.distributed.transports import LatentTransport, Part, latent_transport
from recmas_ray.distributed.bulk import SERIAL_WINDOW, Bulker
from recmas_ray.distributed.routing import Dispatcher, Pending, RoleGroup
from recmas_ray.engine.pool import retry_context_args

_done_calls: queue.SimpleQueue = queue.SimpleQueue()
_done_thread: list = []
_done_lock = threading.Lock()
_watched: dict = {}
"""ObjectRef -> the functions waiting for it: one Ray completion callback per ref, however many wait."""
_watch_lock = threading.Lock()
_bulker = Bulker(watch=lambda ref, fn: when_done(ref, fn))
"""This process's bulk-dispatch queues, flushed by the completion thread (`distributed.bulk`)."""


def when_done(ref, fn) -> None:
    """Call `fn(None)` once `ref` resolves (a value or an error), on one background thread of this
    process: Ray's completion callbacks run on its own threads, where nothing that calls Ray may run."""
    _start_done_thread()
    if not isinstance(ref, ray.ObjectRef):  # (test doubles of actor handles return plain objects)
        return
    with _watch_lock:
        waiting = _watched.get(ref)
        if waiting is not None:
            waiting.append(fn)
            return
        _watched[ref] = [fn]
    ref.future().add_done_callback(lambda _: _done_calls.put(lambda _: _fire(ref)))


def _start_done_thread() -> None:
    if not _done_thread:
        with _done_lock:
            if not _done_thread:
                t = threading.Thread(target=_run_done_calls, name="recmas-when-done", daemon=True)
                t.start()
                _done_thread.append(t)


def _fire(ref) -> None:
    with _watch_lock:
        fns = _watched.pop(ref, [])
    for fn in fns:
        try:
            fn(None)
        except Exception:  # noqa: BLE001 - bookkeeping must never stop the thread
            pass


def _run_done_calls() -> None:
    while True:
        fn = _done_calls.get()
        try:
            fn(None)
        except Exception:  # noqa: BLE001 - bookkeeping must never stop the thread
            pass
        # bulk queues leave once nothing else is ready to run here: calls that became ready together go together
        if _bulker and (_done_calls.empty() or _bulker.due()):
            try:
                _bulker.flush()
            except Exception:  # noqa: BLE001 - each call's error is settled on it
                pass


def soon(fn) -> None:
    """Call `fn()` on the completion thread after the completion callbacks already queued there (so it sees
    what all of them did: e.g. one message for every batch that finished together)."""
    _start_done_thread()
    _done_calls.put(lambda _: fn())


def _queue_bulk(*args, **kw) -> list:
    """`Bulker.add`, then the completion thread is woken (from any other thread) to flush it."""
    outputs = _bulker.add(*args, **kw)
    _start_done_thread()
    if threading.current_thread() is not _done_thread[0]:
        _done_calls.put(lambda _: None)
    return outputs


class RayPool:
    """`pool.AgentPool` over actor copies: calls return ObjectRefs, latents never touch the caller.

    `handles`: role -> an actor handle, a list of copies, or a `RoleGroup`. A call is routed when its inputs
    exist (`routing.Dispatcher`): the runner chains a batch's calls at once, and each goes to the copy its role
    group picks when its upstream calls have finished (least queued work, this batch's previous copy as a
    near-tie break), counted as queued there until its result exists; until then its handles are `Pending`.
    `cancel()` cancels every call not yet finished and makes later calls fail (a batch that timed out does
    not keep working while its retry runs). Rollouts and decodes of `bulk_roles` leave in bulk with those of
    other batches of this process at the same copy and step (`distributed.bulk`; object-store transport); those of
    `serial_roles` (bulk roles whose agents run one call at a time) also wait while their copy already has
    `SERIAL_WINDOW` bulk calls outstanding, so that calls ready meanwhile leave together.
    """

    def __init__(self, handles: dict, *, timeout_s: float = 600.0, context: str = "",
                 transport: str | Transport | LatentTransport = OBJECT_STORE, bulk_roles=(), serial_roles=()):
        self.groups = {r: h if isinstance(h, RoleGroup) else RoleGroup(r, list(h) if isinstance(h, (list, tuple))
                                                                        else [h]) for r, h in handles.items()}
        self.handles = {r: g.copies[0] for r, g in self.groups.items()}
        self.timeout_s, self.context = timeout_s, context
        self.transport = latent_transport(transport)
        self.bulk_roles = frozenset(bulk_roles if self.transport.bulk else ())
        self.serial_roles = frozenset(serial_roles) & self.bulk_roles
        self._num_calls = 0
        # Keys of a batch's rollouts (messages a transport keeps in the agents): unique per pool (one pool per
        # batch), whatever batch id the caller gave, so concurrent batches without one (the Python API, serving)
        # never collide.
        self.key_prefix = uuid.uuid4().hex
        self._holders: set = set()  # (role, copy) that ran rollouts of this batch (`release_kept`)
        self._pending: dict = {}  # ObjectRef -> True, calls not finished yet (cancelled on `cancel`)
        # output ref -> the ref whose completion says it exists: a call's returns all exist together, and a
        # message a transport keeps in its agent must not be fetched here to learn that (its rollout's stats say it)
        self._ready_by: dict = {}
        self._shared: dict = {}  # ref of a bulk call -> whether each batch it carries is cancelled (callables)
        self._lock = threading.Lock()
        self.cancelled = False
        self.dispatcher = Dispatcher(lambda x: isinstance(x, (ray.ObjectRef, Part)), self._when_ready)

    def _when_ready(self, ref, fn) -> None:
        if isinstance(ref, Pending):  # a queued bulk call's output: once it left, once its output exists
            ref.call.on_settled(lambda: fn() if ref.call.error is not None
                                else self._when_ready(ref.call.outputs[ref.index], fn))
            return
        if isinstance(ref, Part):
            ref = ref.ref
        with self._lock:
            ref = self._ready_by.get(ref, ref)
        when_done(ref, lambda _: fn())

    def _bulk(self, role: str, work: float, method: str, shared: tuple, key: tuple, num_outputs: int,
              users, slot_names):
        """A `submit` that queues the call for bulk dispatch (`distributed.bulk`) on the copy picked."""
        group = self.groups[role]

        def submit(k, handle, args):
            def sent(ref, others, members):
                with self._lock:
                    for r in (ref, *others):
                        self._shared[r] = members
                self._track(role, k, work, ref, others)

            return _queue_bulk((id(handle), method, *key), handle, method, shared, num_outputs, users, slot_names,
                               args, sent=sent, failed=lambda: group.done(k, work), cancelled=lambda: self.cancelled,
                               window=SERIAL_WINDOW if role in self.serial_roles else 0)
        return submit

    def _call(self, role: str, work: float, inputs: list, submit, num_outputs: int = 1) -> list:
        """`submit(copy index, copy, inputs)` on the copy of `role` picked once `inputs` exist (see `Dispatcher`)."""
        if self.cancelled:
            raise RuntimeError(f"role {role}{self.context}: batch cancelled")
        return self.dispatcher.call(self.groups[role], work, self.key_prefix, list(inputs), submit, num_outputs)

    def _track(self, role: str, k: int, work: float, ref, others=()):
        """Count `work` as queued on copy k of `role` until `ref` resolves; remember refs to cancel."""
        group = self.groups[role]
        with self._lock:
            for r in (ref, *others):
                self._pending[r] = True
                if r is not ref:
                    self._ready_by[r] = ref

        def finished(_):
            group.done(k, work)
            with self._lock:
                for r in (ref, *others):
                    self._pending.pop(r, None)

        when_done(ref, finished)
        return ref

    def rollout(self, role, users, slot_names, num_steps, edges, latents):
        work = len(users) * num_steps
        edges = tuple(edges)
        if role in self.bulk_roles:
            submit = self._bulk(role, work, "rollout", (num_steps, edges), (num_steps, edges), len(edges) + 1,
                                users, slot_names)
        else:
            self._num_calls += 1
            key = f"{self.key_prefix}:{self._num_calls}"

            def submit(k, handle, args):
                with self._lock:
                    self._holders.add((role, k))
                msgs, stats = self.transport.send(handle, key, users, slot_names, num_steps, edges, args)
                self._track(role, k, work, stats, msgs)
                return [*msgs, stats]
        *msgs, stats = self._call(role, work, latents, submit, len(edges) + 1)
        return msgs, stats

    def decode(self, role, users, slot_names, cfg, latents, **stream):  # stream: on_token (picklable)
        work = len(users) * cfg.max_new_tokens
        if role in self.bulk_roles and not stream:  # (a streamed decode calls back per token: alone)
            return self._call(role, work, latents, self._bulk(role, work, "decode", (cfg,), (repr(cfg),), 1, users,
                                                              slot_names))[0]
        return self._call(role, work, latents, lambda k, h, args: [self._track(
            role, k, work, h.decode.remote(users, slot_names, cfg, *args, **stream))])[0]

    def rollout_text(self, role, users, slot_names, num_steps, latents):
        """The rollout read out as text on a copy of the role, routed like a rollout (`AgentService.rollout_text`)."""
        work = len(users) * max(num_steps, 1)
        return self._call(role, work, latents, lambda k, h, args: [self._track(
            role, k, work, h.rollout_text.remote(users, slot_names, num_steps, *args))])[0]

    def score(self, role, users, slot_names, targets, latents, **kw):
        """Answer likelihood in the agent that holds the prompt's latents (see `AgentService.score`)."""
        work = len(users)  # one teacher-forced forward per row
        return self._call(role, work, latents, lambda k, h, args: [self._track(
            role, k, work, h.score.remote(users, slot_names, targets, *args, **kw))])[0]

    def retry_format(self, role, texts, suffixes, max_new_tokens, *, cfg, context=None):
        """The answer-format retry on a copy of the role, routed and counted like every other call
        (see `AgentService.retry_format`)."""
        latents, kw = retry_context_args(context)
        work = len(texts) * max_new_tokens
        return self._call(role, work, latents, lambda k, h, args: [self._track(
            role, k, work, h.retry_format.remote(texts, suffixes, max_new_tokens, *args, cfg=cfg, **kw))])[0]

    def select_rows(self, role, handle, positions):
        """Rows `positions` of a message, cut on a copy of the role that will read them (adaptive rounds)."""
        work = len(positions)
        return self._call(role, work, [handle], lambda k, h, args: [self._track(
            role, k, work, h.select_rows.remote(list(positions), *args))])[0]

    def latent_change(self, role, old_positions, old_handles, new_handles):
        """Per-question change of the role's latent input between two rounds, computed on a copy of the role."""
        work = len(old_positions)
        return self._call(role, work, [*old_handles, *new_handles], lambda k, h, args: [self._track(
            role, k, work, h.latent_change.remote(list(old_positions), len(old_handles), *args))])[0]

    def set_links(self, role, inner_state, outer_states):
        """Swap the role's links in every copy, the models staying loaded (see `AgentService.set_links`);
        one handle that resolves when all copies have them."""
        refs = [h.set_links.remote(inner_state, outer_states) for h in self.groups[role].copies]
        return refs[0] if len(refs) == 1 else _AllOf(refs)

    def cancel(self) -> int:
        """Cancel this batch's unfinished calls (queued ones never run, waiting ones are never submitted); later
        calls raise. Returns how many."""
        self.cancelled = True
        waiting = self.dispatcher.close(f"batch cancelled{self.context}")
        with self._lock:
            refs = list(self._pending)
            shared = dict(self._shared)
        for ref in refs:
            if ref in shared and not all(c() for c in shared[ref]):
                continue  # a bulk call that other batches still need
            try:
                ray.cancel(ref)
            except Exception:  # noqa: BLE001 - already finished, or its actor is gone
                pass
        self.release_kept()
        return len(refs) + waiting

    def finish(self) -> None:
        """The batch ended: calls still waiting for inputs are never submitted, and its copies no longer need to
        be preferred for it."""
        self.dispatcher.close(f"batch ended{self.context}")
        for group in self.groups.values():
            group.forget(self.key_prefix)

    def release_kept(self) -> None:
        """After a failed batch: every agent that ran its rollouts frees what the transport keeps there for it
        (fire and forget)."""
        with self._lock:
            holders = list(self._holders)
        for role, k in holders:
            try:
                self.transport.release(self.groups[role].copies[k], self.key_prefix)
            except Exception:  # noqa: BLE001 - a dead agent holds nothing
                pass

    def get_all(self, handles: list, *, whats: list[str]) -> list:
        """`get` of every handle with ONE `ray.get` of their refs (a batch's results: not one wait and one
        round of Ray's Python per call). A failure is read again handle by handle, in order, so the error names
        the first call that failed, as `get` would; a timeout names the last handle."""
        deadline = time.monotonic() + self.timeout_s
        try:
            # the last call first: once it is submitted its upstream calls are, so this thread wakes once here
            refs = [h.value(max(deadline - time.monotonic(), 0.001)) if isinstance(h, Pending) else h
                    for h in reversed(handles)][::-1]
            plain = [i for i, r in enumerate(refs) if isinstance(r, ray.ObjectRef)]
            left = max(deadline - time.monotonic(), 0.001)
            got = dict(zip(plain, ray.get([refs[i] for i in plain], timeout=left)))
        except (TimeoutError, ray.exceptions.GetTimeoutError) as e:
            raise RuntimeError(f"{whats[-1]}{self.context}: no answer within {self.timeout_s:g}s") from e
        except Exception:  # noqa: BLE001 - read in order: the first failed call is named
            return [self.get(h, what=w) for h, w in zip(handles, whats)]
        return [self.transport.receive(got[i]) if i in got else self.get(r, what=w)
                for i, (r, w) in enumerate(zip(refs, whats))]

    def get(self, handle, *, what):
        deadline = time.monotonic() + self.timeout_s
        try:
            if isinstance(handle, Pending):  # its call waits for its inputs: wait until it is submitted
                handle = handle.value(self.timeout_s)
            left = max(deadline - time.monotonic(), 0.001)
            if isinstance(handle, Part):
                return handle.value(left)
            if isinstance(handle, _AllOf):
                return [self.transport.receive(v) for v in ray.get(handle.refs, timeout=left)][0]
            return self.transport.receive(ray.get(handle, timeout=left))
        except (TimeoutError, ray.exceptions.GetTimeoutError) as e:
            raise RuntimeError(f"{what}{self.context}: no answer within {self.timeout_s:g}s") from e
        except ray.exceptions.TaskCancelledError as e:
            raise RuntimeError(f"{what}{self.context}: batch cancelled") from e
        except ray.exceptions.RayActorError as e:
            raise RuntimeError(f"{what}{self.context}: agent actor died ({type(e).__name__})") from e
        except ray.exceptions.RayTaskError as e:
            raise RuntimeError(f"{what}{self.context}: agent raised {e.cause!r}") from e
        except RuntimeError as e:  # a call never submitted (cancelled, or its upstream never was)
            raise RuntimeError(f"{what}{self.context}: {e}") from e


@dataclasses.dataclass
class _AllOf:
    """A handle over several refs (a call made on every copy of a role)."""

    refs: list
