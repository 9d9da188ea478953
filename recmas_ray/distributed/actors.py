"""Agent actors: one Ray actor per role around `AgentService`, plus the pool the runner talks to.

The actor adds only what Ray needs: device choice from torch (never from Ray's logical resources),
a `ready()` health check naming role, device, GPU ids and node, failure messages that name the
role, and a log of its own calls (start and end times) from which busy fractions and execution
order are read. Model code lives in `agent.py` and knows nothing about Ray.

Agents run calls out of order (`allow_out_of_order_execution=True`, set in replicas.py): a call
starts as soon as its input latents exist, so batch B's ready round-1 step never waits behind
batch A's round-2 step whose inputs are still being computed. A crashed agent is restarted by Ray
(it reloads its model in `__init__`) and its idempotent calls (rollout, decode) are retried.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import queue
import socket
import threading
import time
import uuid
from typing import Any

import ray

from recmas_ray.config.transport import OBJECT_STORE, Transport, get_transport
from recmas_ray.service import AgentService, AgentSpec

AGENT_EXIT_AFTER: dict[str, int] = {}
"""Fault injection by tests (the fixture `inject_faults`): role -> N makes that role's actors, built from now on,
exit hard before their (N+1)-th call, once (a restarted actor does not exit again). Empty in a real run."""
AGENT_ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
"""Set in an agent's process before its model loads (not as a runtime_env: actors without one start in Ray's
prestarted workers instead of fresh processes)."""
CALL_LOG_SIZE = 100_000


@dataclasses.dataclass
class WireMessage:
    """A latent message as it crosses the object store: the tensor's bytes as a numpy array.

    Ray ships numpy arrays as out-of-band pickle-5 buffers: the producer writes the bytes once into
    shared memory and a consumer on the same node maps them without a copy (a torch tensor is
    pickled through its storage instead, with copies on both sides). numpy has no bfloat16, so bf16
    travels as its int16 bit pattern with the dtype named beside it.
    """

    array: Any
    dtype: str


def to_wire(x):
    """A CPU tensor -> WireMessage (a view, no copy); anything else (CUDA tensors for NCCL) unchanged."""
    import torch

    if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
        return x
    x = x.detach().contiguous()
    name = str(x.dtype).removeprefix("torch.")
    return WireMessage((x.view(torch.int16) if x.dtype == torch.bfloat16 else x).numpy(), name)


def resolve_message(x):
    """A message as a caller or agent receives it: a stored message's ref is fetched, then `from_wire`."""
    if isinstance(x, ray.ObjectRef):
        x = ray.get(x)
    return from_wire(x)


def from_wire(x):
    """WireMessage -> tensor over the same memory (read-only when mapped from the object store; agents
    only read latents, converting them to their own dtype); anything else unchanged."""
    if not isinstance(x, WireMessage):
        return x
    import warnings

    import torch

    with warnings.catch_warnings():  # read-only shared memory: torch warns, we never write into it
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(x.array)
    return t.view(torch.bfloat16) if x.dtype == "bfloat16" else t


class _AgentActorImpl:
    """A GPU- (or CPU-) pinned agent holding its frozen model and links (wrapped by `ray.remote` below)."""

    def __init__(self, spec: AgentSpec, inner_state: dict, outer_states: dict, torch_threads: int = 0,
                 exit_after: int | None = None):
        for key, value in AGENT_ENV.items():
            os.environ.setdefault(key, value)
        import torch

        if torch_threads > 0:
            torch.set_num_threads(torch_threads)
        self._log = collections.deque(maxlen=CALL_LOG_SIZE)
        self._kept: dict = {}  # (key, edge) -> message, Ray Direct Transport only
        self._dropped: set[str] = set()  # key prefixes of failed batches
        self._exit_after = None if exit_after is None or _reconstructed() else exit_after
        if spec.device == "auto":
            # Ray narrows CUDA_VISIBLE_DEVICES per actor; with fake GPUs torch still sees none -> CPU.
            use_cuda = torch.cuda.is_available() and len(ray.get_gpu_ids()) > 0
            spec.device = "cuda" if use_cuda else "cpu"
        self.service = AgentService(spec, inner_state, outer_states)

    def ready(self) -> dict:
        """Health check after creation: role, device, GPU ids, node."""
        ctx = ray.get_runtime_context()
        return {**self.service.info(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "node": ctx.get_node_id(),
                "hostname": socket.gethostname(), "pid": os.getpid()}

    def _logged(self, method, users, slot_names, fn):
        if self._exit_after is not None and len(self._log) >= self._exit_after:
            os._exit(1)  # test hook: die like a killed process, mid-run
        t0 = time.time()
        device0 = getattr(self.service.agent, "device_s_total", None)  # simulated agents count device time
        try:
            return fn()
        finally:
            self._log.append({"method": method, "first_user": users[0] if users else "", "slots": list(slot_names),
                              "batch_size": len(users), "t0": t0, "t1": time.time(),
                              "device_s": None if device0 is None else self.service.agent.device_s_total - device0})

    def call_log(self, clear: bool = False) -> list[dict]:
        """This actor's calls: method, first prompt, slot names, start and end (time.time()), and the simulated
        device time (`device_s`, simulated agents only: the rest of t1 - t0 is host time)."""
        out = list(self._log)
        if clear:
            self._log.clear()
        return out

    def rollout(self, users, slot_names, num_steps, edges, *latents):
        """The service's rollout; each message is put into the object store here, whatever its size, and
        leaves as the ref of a zero-copy `WireMessage` (a small return value would be inlined into the
        caller's reply instead, so the orchestrator would carry it); latents arrive as refs or values.
        This agent owns its stored messages: if it dies before a consumer read one, that consumer's call
        fails and the batch is retried (a restart reruns only calls that had not finished)."""
        latents = [resolve_message(x) for x in latents]
        *msgs, stats = self._logged("rollout", users, slot_names,
                                    lambda: self.service.rollout(users, slot_names, num_steps, edges, *latents))
        return (*[ray.put(to_wire(m)) for m in msgs], stats)

    def decode(self, users, slot_names, cfg, *latents, **stream):
        latents = [resolve_message(x) for x in latents]
        return self._logged("decode", users, slot_names,
                            lambda: self.service.decode(users, slot_names, cfg, *latents, **stream))

    def rollout_keep(self, key, users, slot_names, num_steps, edges, *latents):
        """Ray Direct Transport path: keep the messages here until `take_message` hands one out.

        RDT methods have a single return value, so each edge's message is fetched by its own call;
        the tensor then moves point to point (gloo / NCCL) and never enters the object store.
        """
        latents = [resolve_message(x) for x in latents]
        *msgs, stats = self._logged("rollout", users, slot_names,
                                    lambda: self.service.rollout(users, slot_names, num_steps, edges, *latents))
        prefix = key.rsplit(":", 1)[0]
        if prefix not in self._dropped:  # its batch failed while this call waited: keep nothing
            self._kept.update({(key, e): m for e, m in zip(edges, msgs)})
        return stats

    def take_message(self, key, edge, _after=None):
        return self._kept.pop((key, edge))

    def drop_messages(self, prefix: str) -> int:
        """Free the kept messages of one batch (`prefix` of its keys) after it failed, and keep none
        that its still-running calls produce later; returns how many were freed."""
        self._dropped.add(prefix)
        if len(self._dropped) > CALL_LOG_SIZE:  # bounded: forget the oldest half
            self._dropped = set(list(self._dropped)[CALL_LOG_SIZE // 2:])
        gone = [k for k in self._kept if k[0].rsplit(":", 1)[0] == prefix]
        for k in gone:
            del self._kept[k]
        return len(gone)

    def num_kept(self) -> int:
        """Messages held for Ray Direct Transport, not yet taken (0 when no batch is in flight)."""
        return len(self._kept)

    def retry_format(self, texts, suffixes, num_tokens, *latents, cfg, **context):
        """The answer-format retry on this agent (see `AgentService.retry_format`; `context`: users,
        slot_names, rows of the decoder's input, whose latents come positionally)."""
        return self.service.retry_format(texts, suffixes, num_tokens, *[resolve_message(x) for x in latents], cfg=cfg,
                                         **context)

    def score(self, users, slot_names, targets, *latents, continuation: bool = False):
        """Mean NLL of target texts after the prompts, or continuations' log p (see `AgentService.score`)."""
        return self.service.score(users, slot_names, targets, *[resolve_message(x) for x in latents],
                                  continuation=continuation)

    def select_rows(self, positions, block):
        """Rows of a latent message, stored like a rollout's messages (adaptive rounds, `AgentService.select_rows`)."""
        return ray.put(to_wire(self.service.select_rows(resolve_message(block), positions)))

    def latent_change(self, old_positions, num_blocks, *blocks):
        """Per question, the relative change of its latent input between two rounds (`AgentService.latent_change`)."""
        return self.service.latent_change(old_positions, num_blocks, *[resolve_message(x) for x in blocks])

    def set_links(self, *links):
        """Swap this agent's links without reloading its model (see `AgentService.set_links`)."""
        return self.service.set_links(*links)


def _reconstructed() -> bool:
    import warnings

    with warnings.catch_warnings():  # the property warns about an internal deprecated call
        warnings.simplefilter("ignore")
        return ray.get_runtime_context().was_current_actor_reconstructed


# Restarts and retries are set per system in replicas.py (`agent_max_restarts`).
AgentActor = ray.remote(max_restarts=0)(_AgentActorImpl)
RDTAgentActor = ray.remote(max_restarts=0, enable_tensor_transport=True)(_AgentActorImpl)


_done_calls: queue.SimpleQueue = queue.SimpleQueue()
_done_thread: list = []
_done_lock = threading.Lock()


def when_done(ref, fn) -> None:
    """Call `fn(None)` once `ref` resolves (a value or an error), on one background thread of this
    process: Ray's completion callbacks run on its own threads, where nothing that calls Ray may run."""
    if not _done_thread:
        with _done_lock:
            if not _done_thread:
                t = threading.Thread(target=_run_done_calls, name="recmas-when-done", daemon=True)
                t.start()
                _done_thread.append(t)
    if isinstance(ref, ray.ObjectRef):  # (test doubles of actor handles return plain objects)
        ref.future().add_done_callback(lambda _: _done_calls.put(fn))


def _run_done_calls() -> None:
    while True:
        fn = _done_calls.get()
        try:
            fn(None)
        except Exception:  # noqa: BLE001 - bookkeeping must never stop the thread
            pass


class RayPool:
    """`pool.AgentPool` over actor copies: calls return ObjectRefs, latents never touch the caller.

    `handles`: role -> an actor handle, a list of copies, or a `RoleGroup`. Every call goes to the copy
    its role group picks (least queued work, this batch's previous copy as a near-tie break) and counts
    as queued there until its result exists. `cancel()` cancels every call not yet finished and makes
    later calls fail (a batch that timed out does not keep working while its retry runs).
    """

    def __init__(self, handles: dict, *, timeout_s: float = 600.0, context: str = "",
                 transport: str | Transport = OBJECT_STORE):
        from recmas_ray.distributed.routing import RoleGroup

        self.groups = {r: h if isinstance(h, RoleGroup) else RoleGroup(r, list(h) if isinstance(h, (list, tuple))
                                                                        else [h]) for r, h in handles.items()}
        self.handles = {r: g.copies[0] for r, g in self.groups.items()}
        self.timeout_s, self.context = timeout_s, context
        self.transport = get_transport(transport)
        self._num_calls = 0
        # Keys of kept RDT messages: unique per pool (one pool per batch), whatever batch id the caller
        # gave, so concurrent batches without one (the Python API, serving) never collide.
        self.key_prefix = uuid.uuid4().hex
        self._holders: set = set()  # (role, copy) that kept RDT messages of this batch
        self._pending: dict = {}  # ObjectRef -> True, calls not finished yet (cancelled on `cancel`)
        self._lock = threading.Lock()
        self.cancelled = False

    def _route(self, role: str, work: float):
        """(copy index, handle) for one call of `work` rows x steps on `role`."""
        if self.cancelled:
            raise RuntimeError(f"role {role}{self.context}: batch cancelled")
        group = self.groups[role]
        k = group.pick(work, affinity=self.key_prefix)
        return k, group.copies[k]

    def _track(self, role: str, k: int, work: float, ref, others=()):
        """Count `work` as queued on copy k of `role` until `ref` resolves; remember refs to cancel."""
        group = self.groups[role]
        with self._lock:
            for r in (ref, *others):
                self._pending[r] = True

        def finished(_):
            group.done(k, work)
            with self._lock:
                for r in (ref, *others):
                    self._pending.pop(r, None)

        when_done(ref, finished)
        return ref

    def rollout(self, role, users, slot_names, num_steps, edges, latents):
        work = len(users) * num_steps
        k, handle = self._route(role, work)
        if self.transport.direct:
            self._num_calls += 1
            key = f"{self.key_prefix}:{self._num_calls}"
            self._holders.add((role, k))
            stats = self._track(role, k, work, handle.rollout_keep.remote(key, users, slot_names, num_steps,
                                                                          tuple(edges), *latents))
            take = handle.take_message.options(tensor_transport=self.transport.tensor_transport)
            return [take.remote(key, e, stats) for e in edges], stats
        refs = handle.rollout.options(num_returns=len(edges) + 1).remote(
            users, slot_names, num_steps, tuple(edges), *latents)
        self._track(role, k, work, refs[-1], refs[:-1])
        return list(refs[:-1]), refs[-1]

    def decode(self, role, users, slot_names, cfg, latents, **stream):  # stream: on_token (picklable)
        work = len(users) * cfg.max_new_tokens
        k, handle = self._route(role, work)
        return self._track(role, k, work, handle.decode.remote(users, slot_names, cfg, *latents, **stream))

    def score(self, role, users, slot_names, targets, latents, **kw):
        """Answer likelihood in the agent that holds the prompt's latents (see `AgentService.score`)."""
        work = len(users)  # one teacher-forced forward per row
        k, handle = self._route(role, work)
        return self._track(role, k, work, handle.score.remote(users, slot_names, targets, *latents, **kw))

    def retry_format(self, role, texts, suffixes, max_new_tokens, *, cfg, context=None):
        """The answer-format retry on a copy of the role, routed and counted like every other call
        (see `AgentService.retry_format`)."""
        from recmas_ray.pool import retry_context_args

        latents, kw = retry_context_args(context)
        work = len(texts) * max_new_tokens
        k, handle = self._route(role, work)
        return self._track(role, k, work, handle.retry_format.remote(texts, suffixes, max_new_tokens, *latents,
                                                                     cfg=cfg, **kw))

    def select_rows(self, role, handle, positions):
        """Rows `positions` of a message, cut on a copy of the role that will read them (adaptive rounds)."""
        work = len(positions)
        k, copy = self._route(role, work)
        return self._track(role, k, work, copy.select_rows.remote(list(positions), handle))

    def latent_change(self, role, old_positions, old_handles, new_handles):
        """Per-question change of the role's latent input between two rounds, computed on a copy of the role."""
        work = len(old_positions)
        k, copy = self._route(role, work)
        return self._track(role, k, work, copy.latent_change.remote(list(old_positions), len(old_handles),
                                                                    *old_handles, *new_handles))

    def set_links(self, role, inner_state, outer_states):
        """Swap the role's links in every copy, the models staying loaded (see `AgentService.set_links`);
        one handle that resolves when all copies have them."""
        refs = [h.set_links.remote(inner_state, outer_states) for h in self.groups[role].copies]
        return refs[0] if len(refs) == 1 else _AllOf(refs)

    def cancel(self) -> int:
        """Cancel this batch's unfinished calls (queued ones never run); later calls raise. Returns how many."""
        self.cancelled = True
        with self._lock:
            refs = list(self._pending)
        for ref in refs:
            try:
                ray.cancel(ref)
            except Exception:  # noqa: BLE001 - already finished, or its actor is gone
                pass
        self.release_kept()
        return len(refs)

    def finish(self) -> None:
        """The batch ended: its copies no longer need to be preferred for it."""
        for group in self.groups.values():
            group.forget(self.key_prefix)

    def release_kept(self) -> None:
        """After a failed batch: every agent that kept RDT messages for it frees them (fire and forget)."""
        for role, k in self._holders:
            try:
                self.groups[role].copies[k].drop_messages.remote(self.key_prefix)
            except Exception:  # noqa: BLE001 - a dead agent holds nothing
                pass

    def get(self, handle, *, what):
        try:
            if isinstance(handle, _AllOf):
                return [resolve_message(v) for v in ray.get(handle.refs, timeout=self.timeout_s)][0]
            return resolve_message(ray.get(handle, timeout=self.timeout_s))
        except ray.exceptions.GetTimeoutError as e:
            raise RuntimeError(f"{what}{self.context}: no answer within {self.timeout_s:g}s") from e
        except ray.exceptions.TaskCancelledError as e:
            raise RuntimeError(f"{what}{self.context}: batch cancelled") from e
        except ray.exceptions.RayActorError as e:
            raise RuntimeError(f"{what}{self.context}: agent actor died ({type(e).__name__})") from e
        except ray.exceptions.RayTaskError as e:
            raise RuntimeError(f"{what}{self.context}: agent raised {e.cause!r}") from e


@dataclasses.dataclass
class _AllOf:
    """A handle over several refs (a call made on every copy of a role)."""

    refs: list
