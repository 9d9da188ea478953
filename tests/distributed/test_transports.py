"""distributed/transports.py: one strategy object per way latents move; nothing else asks which way it is."""

import pickle
import re
from pathlib import Path

import pytest
import ray

from recmas_ray.config.transport import OBJECT_STORE, RDT_GLOO, RDT_NCCL, TRANSPORT_NAMES
from recmas_ray.distributed.ray_pool import RayPool
from recmas_ray.distributed.transports import MessageStore, latent_transport

ROOT = Path(__file__).resolve().parents[2]
KIND_TEST = re.compile(r"\.direct\b|on_gpu")
"""What asks a transport which way it moves latents (issue 46: only the transport modules may)."""


def test_only_the_transport_modules_ask_which_way_latents_move():
    allowed = {"recmas_ray/config/transport.py", "recmas_ray/distributed/transports.py"}
    found = sorted({str(p.relative_to(ROOT)) for folder in ("recmas_ray", "jobs") for p in (ROOT / folder).rglob("*.py")
                    if KIND_TEST.search(p.read_text(encoding="utf-8"))})
    assert set(found) <= allowed, found
    assert set(found) == allowed  # (the pattern still finds the transports themselves: it is not stale)


def test_every_transport_has_a_strategy_that_travels_as_its_name():
    for name in TRANSPORT_NAMES:
        strategy = latent_transport(name)
        assert strategy.name == name and latent_transport(strategy) is strategy
        assert pickle.loads(pickle.dumps(strategy)) is strategy  # actors rebuild the same object from the name
    assert latent_transport(OBJECT_STORE).bulk and not latent_transport(RDT_GLOO).bulk
    assert latent_transport(RDT_NCCL).keeps_on_device and not latent_transport(RDT_GLOO).keeps_on_device


class _Method:
    def __init__(self, calls, name, options=None):
        self.calls, self.name, self.opts = calls, name, options or {}

    def options(self, **kw):
        return _Method(self.calls, self.name, {**self.opts, **kw})

    def remote(self, *args, **kw):
        self.calls.append((self.name, self.opts, args, kw))
        n = self.opts.get("num_returns", 1)
        out = [object() for _ in range(n)]
        return out if n > 1 else out[0]


class _Handle:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return _Method(self.calls, name)


@pytest.mark.parametrize("transport", [OBJECT_STORE.name, RDT_GLOO.name])
def test_the_pool_sends_a_rollout_the_way_its_transport_moves_messages(transport):
    """object_store: one call returning every message's stored ref and the stats; a direct transport: the rollout
    keeps its messages under a key, and each is fetched by a call with the transport's tensor_transport option."""
    handle = _Handle()
    pool = RayPool({"planner": handle}, transport=transport)
    edges = ("planner->critic", "planner->solver")
    msgs, _ = pool.rollout("planner", ["q"], [], 2, edges, [])
    names = [c[0] for c in handle.calls]
    if transport == OBJECT_STORE.name:
        assert names == ["rollout"] and handle.calls[0][1] == {"num_returns": 3} and handle.calls[0][3] == {}
    else:
        key = handle.calls[0][3]["key"]
        assert names == ["rollout", "take_message", "take_message"] and key.startswith(pool.key_prefix)
        assert [c[1] for c in handle.calls[1:]] == [{"tensor_transport": "gloo"}] * 2
        assert [c[2][:2] for c in handle.calls[1:]] == [(key, e) for e in edges]
    assert len(msgs) == 2
    pool.release_kept()  # a failed batch: only a transport that keeps messages in the agents asks them to drop
    dropped = [c[2] for c in handle.calls if c[0] == "drop_messages"]
    assert dropped == ([] if transport == OBJECT_STORE.name else [(pool.key_prefix,)])


def test_a_kept_message_is_handed_out_once_and_late_calls_of_a_dropped_batch_keep_nothing():
    store = MessageStore()
    direct = latent_transport(RDT_GLOO)
    assert direct.keep(store, "a:1", ["e"], ["m1"], "stats") == "stats" and len(store) == 1
    assert direct.keep(store, "b:1", ["e"], ["m2"], "stats") == "stats"
    assert store.drop("a") == 1
    direct.keep(store, "a:2", ["e"], ["m3"], "stats")  # a late rollout of the failed batch
    assert len(store) == 1 and store.take("b:1", "e") == "m2" and len(store) == 0


def test_the_object_store_keeps_nothing_in_the_agent(ray_cluster):
    import torch

    from recmas_ray.distributed.transports import from_wire

    store = MessageStore()
    x = torch.randn(1, 2, 4)
    *refs, stats = latent_transport(OBJECT_STORE).keep(store, "a:1", ["e"], [x], "stats")
    assert stats == "stats" and len(store) == 0
    assert torch.equal(from_wire(ray.get(refs[0], timeout=60)), x)
