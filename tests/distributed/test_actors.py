"""The agent actor's call surface is its `AgentService`'s: the plain calls are forwarded from one declared list
(`actors.FORWARDED`), their latent arguments received through the transport on the way."""

import collections
import inspect

import torch

from recmas_ray.distributed.actors import FORWARDED, _AgentActorImpl
from recmas_ray.distributed.transports import latent_transport, to_wire
from recmas_ray.engine.service import AgentService

OWN = {"rollout", "select_rows"}
"""Service calls the actor wraps itself (the transport keeps or stores what they return)."""
AT_START = {"info", "configure_tools"}
"""Service methods the actor calls at creation (`ready` reports `info`), not per call."""


def test_every_service_call_is_forwarded_once_or_wrapped_by_the_actor():
    public = {n for n, f in inspect.getmembers(AgentService, callable) if not n.startswith("_")}
    assert set(FORWARDED) | OWN | AT_START == public and not set(FORWARDED) & OWN
    for name in public - AT_START:
        assert callable(getattr(_AgentActorImpl, name))


class _Service:
    """Records what each call received."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args, **kw: self.calls.append((name, args, kw)) or name


def _actor(transport="object_store"):
    impl = object.__new__(_AgentActorImpl)  # no model: the service is a recorder
    impl.service, impl.transport, impl._log, impl._exit_after = _Service(), latent_transport(transport), \
        collections.deque(), None
    return impl


def test_a_forwarded_call_receives_its_latents_and_passes_the_rest_as_given():
    impl = _actor()
    x = torch.arange(6.0).reshape(1, 2, 3)
    assert impl.score(["u"], ["s"], ["t"], to_wire(x), continuation=True) == "score"
    name, args, kw = impl.service.calls[-1]
    assert (name, args[:3], kw) == ("score", (["u"], ["s"], ["t"]), {"continuation": True})
    assert torch.equal(args[3], x)  # a wire message arrived as the tensor
    assert impl.decode(["u"], ["s"], "cfg", to_wire(x), on_token=print) == "decode"
    assert impl.service.calls[-1][2] == {"on_token": print}
    assert impl.set_links({"w": 1}, {}) == "set_links" and impl.service.calls[-1][1] == ({"w": 1}, {})
    # decode and rollout_text are logged, as the actor's own rollout is
    assert [e["method"] for e in impl.call_log()] == ["decode"]
