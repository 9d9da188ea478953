"""How latent messages move between agent actors, as strategy objects: one per way (`config.transport` names
them and checks their flags; this module is what each way does on Ray).

    ObjectStoreTransport  object_store: a rollout puts each message into the object store as a zero-copy
                          `WireMessage` and returns its ref; a consumer's call gets the ref (`resolve_message`)
    DirectTransport       rdt:gloo / rdt:nccl (Ray Direct Transport): a rollout keeps its messages in the agent
                          (`MessageStore`); each is fetched by a call made with Ray's `tensor_transport` option,
                          and the tensor moves point to point between the agents of a collective group

Every user (the pool, the replicas, the orchestrator) calls the object and never asks which way it is:

    producer agent  rollout -> transport.keep(store, key, edges, msgs, stats)   what the Ray call returns
                    transport.hand_out(msg)                                   one message as it leaves
    consumer agent  transport.receive(x)                                      an argument -> the tensor (or value)
    pool            transport.send(handle, key, ...) -> (message handles, stats) one rollout, its messages' handles
                    transport.fetch(handle.take_message, ...)                  a kept message's handle (in `send`)
                    transport.release(handle, prefix)                         a failed batch's kept messages freed
                    transport.receive(value)                                  what a `get` returns
    orchestrator    transport.connect(actors); transport.strip_reply(results)
    replicas        transport.actor_options, keeps_on_device, orchestrator_after_agents

Adding a transport is one file: a `LatentTransport` subclass and `register_transport(Transport(name, ...,
strategy=TheClass))` (config/transport.py: its flag name and checks); `latent_transport(name)` then builds it
wherever the agents run (docs/architecture.md, "Adding a transport"; tests/extensions/toy_transport.py).
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from typing import Any

import ray
import torch
from ray.experimental.collective import create_collective_group

from recmas_ray.config.transport import Transport, get_transport

KEPT_PREFIXES_MAX = 100_000
"""Prefixes of failed batches an agent remembers (bounded: the oldest half is forgotten)."""


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
    if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
        return x
    x = x.detach().contiguous()
    name = str(x.dtype).removeprefix("torch.")
    return WireMessage((x.view(torch.int16) if x.dtype == torch.bfloat16 else x).numpy(), name)


def from_wire(x):
    """WireMessage -> tensor over the same memory (read-only when mapped from the object store; agents
    only read latents, converting them to their own dtype); anything else unchanged."""
    if not isinstance(x, WireMessage):
        return x

    with warnings.catch_warnings():  # read-only shared memory: torch warns, we never write into it
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(x.array)
    return t.view(torch.bfloat16) if x.dtype == "bfloat16" else t


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
    """A message as a caller or agent receives it: a stored message's ref is fetched, then `from_wire` (a message
    of a direct transport arrives as the tensor itself and passes through)."""
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


class MessageStore:
    """The messages one agent keeps until a consumer fetches them ((key, edge) -> tensor), and the key prefixes of
    failed batches, whose late rollouts keep nothing. Empty where the transport keeps nothing in the agents."""

    def __init__(self):
        self.kept: dict = {}
        self.dropped: set[str] = set()

    def put(self, key: str, edges, msgs) -> None:
        if key.rsplit(":", 1)[0] not in self.dropped:  # its batch failed while this call waited: keep nothing
            self.kept.update({(key, e): m for e, m in zip(edges, msgs)})

    def take(self, key: str, edge: str):
        return self.kept.pop((key, edge))

    def drop(self, prefix: str) -> int:
        """Free the kept messages of one batch (`prefix` of its keys), and keep none that its still-running calls
        produce later; returns how many were freed."""
        self.dropped.add(prefix)
        if len(self.dropped) > KEPT_PREFIXES_MAX:  # bounded: forget the oldest half
            self.dropped = set(list(self.dropped)[KEPT_PREFIXES_MAX // 2:])
        gone = [k for k in self.kept if k[0].rsplit(":", 1)[0] == prefix]
        for k in gone:
            del self.kept[k]
        return len(gone)

    def __len__(self) -> int:
        return len(self.kept)


class LatentTransport:
    """One way latent messages move between agent actors: what each way implements (see the module docstring)."""

    bulk = False
    """Whether aligned calls of several batches may leave as one Ray call (`distributed.bulk`): their messages
    are then stored together, which only the object store can hand out by part."""
    keeps_on_device = False
    """Messages stay on the producer's device (`AgentSpec.keep_messages_on_device`) instead of moving to CPU."""
    orchestrator_after_agents = False
    """The orchestrator builds the agents' collective group (`connect`), so it starts once they are up."""
    actor_options: dict = {}
    """Options of the agent actor class (`ray.remote`) this transport needs."""

    def __init__(self, config: Transport):
        self.config = config

    @property
    def name(self) -> str:
        return self.config.name

    def __str__(self) -> str:
        return self.config.name

    def __reduce__(self):  # travels to actors as its declaration (a strategy class by reference: its module is
        return latent_transport, (self.config,)  # imported there); rebuilt there by `latent_transport`

    def connect(self, actors: list) -> None:
        """Before the first batch, in the process that will make the calls: join `actors` for this transport."""

    def keep(self, store: MessageStore, key: str, edges, msgs: list, stats) -> Any:
        """In the producing agent: what its rollout call returns for messages `msgs` of `edges` (and `stats`)."""
        raise NotImplementedError

    def send(self, handle, key: str, users, slot_names, num_steps: int, edges: tuple, args) -> tuple[list, Any]:
        """In the pool: one rollout on agent `handle` (its call key `key`); returns (one handle per edge's message,
        the ref of the rollout's stats), each handle passable to a consumer's call."""
        raise NotImplementedError

    def hand_out(self, msg):
        """In the producing agent: message `msg` as the call that hands it out returns it."""
        return msg

    def receive(self, x):
        """In a consumer (an agent's call, or the pool's `get`): argument or result `x` as the tensor or value it
        carries (a stored message's ref fetched, a wire message unpacked; anything else passes through)."""
        return resolve_message(x)

    def fetch(self, method, *args):
        """The call `method.remote(*args)` (an actor method that hands out a message), made so that a consumer's
        call given its result receives the message."""
        return method.remote(*args)

    def release(self, handle, prefix: str) -> None:
        """After a failed batch: agent `handle` frees what it keeps for keys starting `prefix` (fire and forget)."""

    def strip_reply(self, results: list) -> list:
        """A batch's results as the orchestrator returns them."""
        return results


class ObjectStoreTransport(LatentTransport):
    """Messages go producer -> consumer through the object store: each rollout message is put into the store in
    the producing agent, whatever its size, and leaves as the ref of a zero-copy `WireMessage` (a small return
    value would be inlined into the caller's reply instead, so the orchestrator would carry it). The agent owns
    its stored messages: if it dies before a consumer read one, that consumer's call fails and the batch is
    retried (a restart reruns only calls that had not finished)."""

    bulk = True

    def keep(self, store, key, edges, msgs, stats):
        return (*[self.hand_out(m) for m in msgs], stats)

    def hand_out(self, msg):
        return ray.put(to_wire(msg))

    def send(self, handle, key, users, slot_names, num_steps, edges, args):
        refs = handle.rollout.options(num_returns=len(edges) + 1).remote(users, slot_names, num_steps, edges, *args)
        return list(refs[:-1]), refs[-1]


class DirectTransport(LatentTransport):
    """Ray Direct Transport: a rollout keeps its messages in the agent until `take_message` hands one out (RDT
    methods have a single return value, so each edge's message is fetched by its own call); the tensor then moves
    point to point (gloo / NCCL) and never enters the object store. Messages are taken once, so an agent cannot
    restart (`Transport.actor_restarts`) and a retry continues the bare reply (`strip_reply`)."""

    orchestrator_after_agents = True
    actor_options = {"enable_tensor_transport": True}

    def __init__(self, config: Transport):
        super().__init__(config)
        self.keeps_on_device = config.on_gpu

    def connect(self, actors):
        # RDT checks the transport in the calling process, so the caller (the orchestrator) creates the group.
        create_collective_group(actors, backend=self.config.collective_backend)

    def keep(self, store, key, edges, msgs, stats):
        store.put(key, edges, msgs)
        return stats

    def send(self, handle, key, users, slot_names, num_steps, edges, args):
        stats = handle.rollout.remote(users, slot_names, num_steps, edges, *args, key=key)
        return [self.fetch(handle.take_message, key, e, stats) for e in edges], stats  # taken once it finished

    def fetch(self, method, *args):
        return method.options(tensor_transport=self.config.tensor_transport).remote(*args)

    def release(self, handle, prefix):
        handle.drop_messages.remote(prefix)

    def strip_reply(self, results):
        for res in results:  # messages are taken once: a retry continues the bare reply
            res.decoder_input = None
        return results


_STRATEGIES: dict[Transport, LatentTransport] = {}
"""One strategy object per declaration, built on first use in each process."""


def latent_transport(transport: str | Transport | LatentTransport) -> LatentTransport:
    """The strategy of a flag value or a `config.transport.Transport` (a strategy passes through): an instance
    of its declared `strategy` class, the same object on every call in this process."""
    if isinstance(transport, LatentTransport):
        return transport
    config = get_transport(transport)
    strategy = _STRATEGIES.get(config)
    if strategy is None:
        cls = config.strategy
        if isinstance(cls, str):  # "module:Class" (the package's own: no Ray import in the config layer)
            module, _, name = cls.partition(":")
            cls = getattr(importlib.import_module(module), name)
        if not (isinstance(cls, type) and issubclass(cls, LatentTransport)):
            raise ValueError(f"transport {config.name!r}: strategy {config.strategy!r} is no LatentTransport class")
        strategy = _STRATEGIES.setdefault(config, cls(config))
    return strategy
