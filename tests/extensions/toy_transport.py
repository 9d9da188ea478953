"""A toy transport, added in this one file (docs/architecture.md, "Adding a transport"): latent messages cross the
object store as the bytes of `torch.save` (a copy, not a zero-copy view), and every message handed out and
received is recorded (its shape and the sum of its values) by a named actor, when the test has started one.

Registering it makes `--transport toy:bytes` a choice of every job and of `System.build(transport=...)`; the
config layer's checks read the declaration and the Ray layer builds `BytesTransport` wherever agents run.
"""

from __future__ import annotations

import dataclasses
import io

import ray
import torch

from recmas_ray.config.transport import Transport, register_transport
from recmas_ray.distributed.transports import LatentTransport

COUNTER_NAME = "toy-transport-counter"
"""The named actor that counts messages (started by the test; without it nothing is counted)."""


@dataclasses.dataclass(frozen=True)
class BytesMessage:
    """A latent message as `torch.save` bytes."""

    data: bytes


@ray.remote(num_cpus=0)
class MessageCounter:
    """The messages by what happened to them ("sent": handed out by a producer, "received": unpacked by a
    consumer), each as (shape, sum of its values)."""

    def __init__(self):
        self.seen: dict[str, list] = {"sent": [], "received": []}

    def add(self, what: str, summary: tuple) -> None:
        self.seen[what].append(summary)

    def get(self) -> dict[str, list]:
        return self.seen


def _count(what: str, msg: torch.Tensor) -> None:
    try:
        counter = ray.get_actor(COUNTER_NAME)
    except ValueError:  # no test is counting
        return
    summary = (tuple(msg.shape), float(msg.double().sum()))
    ray.get(counter.add.remote(what, summary), timeout=60)  # recorded before the message moves on


class BytesTransport(LatentTransport):
    """Each rollout message is serialized to bytes in the producer, stored, and deserialized in the consumer."""

    def keep(self, store, key, edges, msgs, stats):
        return (*[self.hand_out(m) for m in msgs], stats)

    def hand_out(self, msg):
        buf = io.BytesIO()
        torch.save(msg.detach().cpu().clone(), buf)
        _count("sent", msg)
        return ray.put(BytesMessage(buf.getvalue()))

    def send(self, handle, key, users, slot_names, num_steps, edges, args):
        refs = handle.rollout.options(num_returns=len(edges) + 1).remote(users, slot_names, num_steps, edges, *args)
        return list(refs[:-1]), refs[-1]

    def receive(self, x):
        x = super().receive(x)
        if not isinstance(x, BytesMessage):
            return x
        msg = torch.load(io.BytesIO(x.data), weights_only=True)
        _count("received", msg)
        return msg


TOY_BYTES = register_transport(Transport("toy:bytes", strategy=BytesTransport))
