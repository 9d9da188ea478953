"""Agent actors: one Ray actor per role around `AgentService` (the pool the runner talks to is in ray_pool.py).

The actor adds only what Ray needs: device choice from torch (never from Ray's logical resources),
a `ready()` health check naming role, device, GPU ids and node, failure messages that name the
role, and a log of its own calls (start and end times) from which busy fractions and execution
order are read. Model code lives in `engine/agent.py` and knows nothing about Ray. The call surface is the service's:
`FORWARDED` lists the calls passed on as they are (latents received through the transport), and the actor defines
only what differs on Ray (a rollout's messages kept or stored, bulk calls, kept messages).

The pool submits a call only once its input latents exist (`ray_pool.RayPool`); agents also run calls
out of order (`allow_out_of_order_execution=True`, set in replicas.py), so a call whose arguments are
still being fetched never holds up one behind it. A crashed agent is restarted by Ray
(it reloads its model in `__init__`) and its idempotent calls (rollout, decode) are retried.
"""

from __future__ import annotations

import collections
import os
import socket
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import ray
import torch

from recmas_ray.config.transport import OBJECT_STORE, Transport
from recmas_ray.distributed.transports import LatentTransport, MessageStore, bulk_inputs, latent_transport, to_wire
from recmas_ray.engine.service import AgentService, AgentSpec

AGENT_EXIT_AFTER: dict[str, int] = {}
"""Fault injection by tests (the fixture `inject_faults`): role -> N makes that role's actors, built from now on,
exit hard before their (N+1)-th call, once (a restarted actor does not exit again). Empty in a real run."""
AGENT_ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
"""Set in an agent's process before its model loads (not as a runtime_env: actors without one start in Ray's
prestarted workers instead of fresh processes)."""
CALL_LOG_SIZE = 100_000
BULK_THREADS = 256
"""Sub-calls of bulk calls a continuous-batching agent runs at once (their rows then share its steps)."""


class _AgentActorImpl:
    """A GPU- (or CPU-) pinned agent holding its frozen model and links; the one agent actor class, made remote
    with the options its transport needs by `agent_actor` below (`transport`: how it hands out its messages)."""

    def __init__(self, spec: AgentSpec, inner_state: dict, outer_states: dict, torch_threads: int = 0,
                 exit_after: int | None = None, transport: str | Transport = OBJECT_STORE):
        for key, value in AGENT_ENV.items():
            os.environ.setdefault(key, value)

        if torch_threads > 0:
            torch.set_num_threads(torch_threads)
        self._log = collections.deque(maxlen=CALL_LOG_SIZE)
        self.transport = latent_transport(transport)
        self.messages = MessageStore()  # what the transport keeps here until a consumer fetches it
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

    def rollout(self, users, slot_names, num_steps, edges, *latents, key: str = ""):
        """The service's rollout; its messages go where the transport keeps them (`LatentTransport.keep`: stored
        in the object store, their refs returned with the stats; or kept here under the call key `key` until
        `take_message`); latents arrive as refs or values."""
        latents = [self.transport.receive(x) for x in latents]
        *msgs, stats = self._logged("rollout", users, slot_names,
                                    lambda: self.service.rollout(users, slot_names, num_steps, edges, *latents))
        return self.transport.keep(self.messages, key, edges, msgs, stats)

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
            self._threads = ThreadPoolExecutor(max_workers=BULK_THREADS, thread_name_prefix="bulk")
        return [f.result() for f in [self._threads.submit(fn, *c) for c in calls]]

    def take_message(self, key, edge, _after=None):
        """A kept message, handed out once (called with the transport's `tensor_transport` option; `_after`: the
        rollout's stats, so the call waits for it)."""
        return self.messages.take(key, edge)

    def drop_messages(self, prefix: str) -> int:
        """Free the kept messages of one batch (`prefix` of its keys) after it failed, and keep none that its
        still-running calls produce later; returns how many were freed."""
        return self.messages.drop(prefix)

    def num_kept(self) -> int:
        """Messages kept here, not yet taken (0 when no batch is in flight)."""
        return len(self.messages)

    def select_rows(self, positions, block):
        """Rows of a latent message, stored like a rollout's messages (adaptive rounds, `AgentService.select_rows`)."""
        return ray.put(to_wire(self.service.select_rows(self.transport.receive(block), positions)))


FORWARDED: dict[str, tuple[int, bool]] = {
    # AgentService method: (leading arguments before its latent messages, logged in `call_log`)
    "decode": (3, True),          # users, slot_names, cfg, *latents; on_token= (streaming)
    "rollout_text": (3, True),    # users, slot_names, num_steps, *latents
    "score": (3, False),          # users, slot_names, targets, *latents; continuation=
    "retry_format": (3, False),   # texts, suffixes, num_tokens, *latents; cfg=, users= slot_names= rows=
    "latent_change": (2, False),  # old_positions, num_blocks, *blocks
    "set_links": (2, False),      # inner_state, outer_states (no latents)
}
"""The calls the actor passes to its `AgentService` as they are, once their latent messages are received through the
transport: the one list of them (the service's docstrings are theirs). The actor's own methods are what Ray adds:
`rollout` (its messages kept or stored by the transport), the bulk calls, `select_rows` (its output stored), kept
messages (`take_message`, `drop_messages`, `num_kept`), `ready` and `call_log`."""


def _forward(name: str, num_leading: int, logged: bool):
    def call(self, *args, **kw):
        lead, latents = args[:num_leading], [self.transport.receive(x) for x in args[num_leading:]]
        run = lambda: getattr(self.service, name)(*lead, *latents, **kw)  # noqa: E731
        return self._logged(name, args[0], args[1], run) if logged else run()

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"`AgentService.{name}` in this actor (latent arguments received through the transport)."
    return call


for _name, (_num_leading, _logged) in FORWARDED.items():
    setattr(_AgentActorImpl, _name, _forward(_name, _num_leading, _logged))


def _reconstructed() -> bool:
    with warnings.catch_warnings():  # the property warns about an internal deprecated call
        warnings.simplefilter("ignore")
        return ray.get_runtime_context().was_current_actor_reconstructed


_ACTOR_CLASSES: dict = {}


def agent_actor(transport: str | Transport | LatentTransport):
    """The agent actor class (one, `_AgentActorImpl`) made remote with the options `transport` needs; restarts and
    retries are set per system in replicas.py (`agent_max_restarts`)."""
    transport = latent_transport(transport)
    if transport.name not in _ACTOR_CLASSES:
        _ACTOR_CLASSES[transport.name] = ray.remote(max_restarts=0, **transport.actor_options)(_AgentActorImpl)
    return _ACTOR_CLASSES[transport.name]
