"""Agent actors: one Ray actor per role around `AgentService` (the pool the runner talks to is in ray_pool.py).

The actor adds only what Ray needs: device choice from torch (never from Ray's logical resources),
a `ready()` health check naming role, device, GPU ids and node, failure messages that name the
role, and a log of its own calls (start and end times) from which busy fractions and execution
order are read. Model code lives in `agent.py` and knows nothing about Ray.

The pool submits a call only once its input latents exist (`ray_pool.RayPool`); agents also run calls
out of order (`allow_out_of_order_execution=True`, set in replicas.py), so a call whose arguments are
still being fetched never holds up one behind it. A crashed agent is restarted by Ray
(it reloads its model in `__init__`) and its idempotent calls (rollout, decode) are retried.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import socket
import time
from typing import Any

import ray

from recmas_ray.service import AgentService, AgentSpec

AGENT_EXIT_AFTER: dict[str, int] = {}
"""Fault injection by tests (the fixture `inject_faults`): role -> N makes that role's actors, built from now on,
exit hard before their (N+1)-th call, once (a restarted actor does not exit again). Empty in a real run."""
AGENT_ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
"""Set in an agent's process before its model loads (not as a runtime_env: actors without one start in Ray's
prestarted workers instead of fresh processes)."""
CALL_LOG_SIZE = 100_000
BULK_THREADS = 256
"""Sub-calls of bulk calls a continuous-batching agent runs at once (their rows then share its steps)."""


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


@dataclasses.dataclass(frozen=True)
class Part:
    """A message of one sub-call of a bulk call (`distributed.bulk`): `ref` is the call's stored messages, this is
    [index][edge] of them (`edge` None: [index] of a list `ref` holds)."""

    ref: Any
    index: int
    edge: int | None = None

    def value(self, timeout: float | None = None):
        """The message (a tensor) or the result, fetched here."""
        v = ray.get(self.ref, timeout=timeout)
        if self.edge is None:
            return v[self.index]
        return from_wire(ray.get(v, timeout=timeout)[self.index][self.edge])


def resolve_message(x):
    """A message as a caller or agent receives it: a stored message's ref is fetched, then `from_wire`."""
    if isinstance(x, Part):
        return x.value()
    if isinstance(x, ray.ObjectRef):
        x = ray.get(x)
    return from_wire(x)


def bulk_inputs(args: tuple, where: list) -> list:
    """The latent blocks of one sub-call of a bulk call: `where[i]` = (argument, sub-call, edge) locates block i
    among the call's distinct arguments `args` (stored bulk messages: fetched once per call; sub-call None: a
    whole message or a value)."""
    out = []
    for a, j, e in where:
        v = args[a]
        out.append(from_wire(v if j is None else v[j][e]))
    return out


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
        self._threads = None  # bulk calls' sub-calls under continuous batching
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

    def _logged(self, method, users, slot_names, fn, bulk: int = 1):
        if self._exit_after is not None and len(self._log) >= self._exit_after:
            os._exit(1)  # test hook: die like a killed process, mid-run
        t0 = time.time()
        agent = self.service.agent
        device0 = getattr(agent, "device_s_total", None)  # simulated agents count device time and bytes read
        read0 = getattr(agent, "bytes_read_total", None)
        try:
            return fn()
        finally:
            self._log.append({"method": method, "first_user": users[0] if users else "", "slots": list(slot_names),
                              "batch_size": len(users), "t0": t0, "t1": time.time(), "bulk": bulk,
                              "device_s": None if device0 is None else agent.device_s_total - device0,
                              "bytes_read": None if read0 is None else agent.bytes_read_total - read0})

    def call_log(self, clear: bool = False) -> list[dict]:
        """This actor's calls: method, first prompt, slot names, start and end (time.time()), and the simulated
        device time (`device_s`, simulated agents only: the rest of t1 - t0 is host time) and bytes of received
        latents read (`bytes_read`, simulated agents only)."""
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

    def rollout_text(self, users, slot_names, num_steps, *latents):
        """The rollout read out as its argmax tokens, as text (`AgentService.rollout_text`; rollout_as_text)."""
        latents = [resolve_message(x) for x in latents]
        return self._logged("rollout_text", users, slot_names,
                            lambda: self.service.rollout_text(users, slot_names, num_steps, *latents))

    def rollout_bulk(self, num_steps, edges, calls, *args):
        """Rollouts of several batches in one Ray call (`distributed.bulk`): `calls` = (users, slot_names, where) per
        batch, each run as its own `rollout` (the same result as one call each); returns the ref of every batch's
        messages, stored once ([batch][edge]), then each batch's stats as a return of its own (a batch reads
        only its own)."""
        args = self._fetch(args)
        outs = self._each(calls, lambda users, slot_names, where: self._logged(
            "rollout", users, slot_names, lambda: self.service.rollout(users, slot_names, num_steps, edges,
                                                                       *bulk_inputs(args, where)), bulk=len(calls)))
        return (ray.put([[to_wire(m) for m in o[:-1]] for o in outs]), *[o[-1] for o in outs])

    def decode_bulk(self, cfg, calls, *args):
        """Decodes of several batches in one Ray call (see `rollout_bulk`); returns each batch's (decoded, stats), each
        as a return of its own (one call: the value itself)."""
        args = self._fetch(args)
        outs = self._each(calls, lambda users, slot_names, where: self._logged(
            "decode", users, slot_names, lambda: self.service.decode(users, slot_names, cfg, *bulk_inputs(args, where)),
            bulk=len(calls)))
        return tuple(outs) if len(outs) > 1 else outs[0]

    @staticmethod
    def _fetch(args: tuple) -> list:
        """A bulk call's distinct arguments, stored ones fetched (each once, whatever number of batches read it)."""
        refs = [i for i, a in enumerate(args) if isinstance(a, ray.ObjectRef)]
        values = list(args)
        for i, v in zip(refs, ray.get([args[i] for i in refs])):
            values[i] = v
        return values

    def _each(self, calls, fn) -> list:
        """fn(*call) for every sub-call: at once on threads where continuous batching merges their rows (as separate
        Ray calls would run), one after another otherwise (one call at a time, as separate calls would)."""
        if len(calls) == 1 or not self.service.spec.continuous_batching:
            return [fn(*c) for c in calls]
        if self._threads is None:
            from concurrent.futures import ThreadPoolExecutor

            self._threads = ThreadPoolExecutor(max_workers=BULK_THREADS, thread_name_prefix="bulk")
        return [f.result() for f in [self._threads.submit(fn, *c) for c in calls]]

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
