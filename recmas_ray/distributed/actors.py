"""Agent actors: one Ray actor per role around `AgentService`, plus the pool the runner talks to.

The actor adds only what Ray needs: device choice from torch (never from Ray's logical resources),
a `ready()` health check naming role, device, GPU ids and node, and failure messages that name the
role. Model code lives in `agent.py` and knows nothing about Ray.
"""

from __future__ import annotations

import os
import socket

import ray

from recmas_ray.service import AgentService, AgentSpec


TRANSPORTS = ("object_store", "rdt:gloo", "rdt:nccl")


class _AgentActorImpl:
    """A GPU- (or CPU-) pinned agent holding its frozen model and links (wrapped by `ray.remote` below)."""

    def __init__(self, spec: AgentSpec, inner_state: dict, outer_states: dict, torch_threads: int = 0):
        import torch

        if torch_threads > 0:
            torch.set_num_threads(torch_threads)
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

    def rollout(self, users, slot_names, num_steps, edges, *latents):
        return self.service.rollout(users, slot_names, num_steps, edges, *latents)

    def decode(self, users, slot_names, cfg, *latents):
        return self.service.decode(users, slot_names, cfg, *latents)

    def rollout_keep(self, key, users, slot_names, num_steps, edges, *latents):
        """Ray Direct Transport path: keep the messages here until `take_message` hands one out.

        RDT methods have a single return value, so each edge's message is fetched by its own call;
        the tensor then moves point to point (gloo / NCCL) and never enters the object store.
        """
        *msgs, stats = self.service.rollout(users, slot_names, num_steps, edges, *latents)
        self._kept = getattr(self, "_kept", {})
        self._kept.update({(key, e): m for e, m in zip(edges, msgs)})
        return stats

    def take_message(self, key, edge, _after=None):
        return self._kept.pop((key, edge))

    def call(self, method: str, *args, **kwargs):
        """Escape hatch for extensions (tool loop, training hooks) that live in the service."""
        return getattr(self.service, method)(*args, **kwargs)


AgentActor = ray.remote(max_restarts=0)(_AgentActorImpl)
RDTAgentActor = ray.remote(max_restarts=0, enable_tensor_transport=True)(_AgentActorImpl)


class RayPool:
    """`runner.AgentPool` over actor handles: calls return ObjectRefs, latents never touch the caller."""

    def __init__(self, handles: dict, *, timeout_s: float = 600.0, context: str = "", transport: str = "object_store"):
        self.handles, self.timeout_s, self.context, self.transport = handles, timeout_s, context, transport
        self._num_calls = 0

    def rollout(self, role, users, slot_names, num_steps, edges, latents):
        if self.transport != "object_store":
            self._num_calls += 1
            key = f"{self.context}:{self._num_calls}"
            stats = self.handles[role].rollout_keep.remote(key, users, slot_names, num_steps, tuple(edges), *latents)
            backend = self.transport.split(":")[1]
            take = self.handles[role].take_message.options(tensor_transport=backend)
            return [take.remote(key, e, stats) for e in edges], stats
        refs = self.handles[role].rollout.options(num_returns=len(edges) + 1).remote(
            users, slot_names, num_steps, tuple(edges), *latents)
        return list(refs[:-1]), refs[-1]

    def decode(self, role, users, slot_names, cfg, latents):
        return self.handles[role].decode.remote(users, slot_names, cfg, *latents)

    def get(self, handle, *, what):
        try:
            return ray.get(handle, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            raise RuntimeError(f"{what}{self.context}: no answer within {self.timeout_s:g}s") from e
        except ray.exceptions.RayActorError as e:
            raise RuntimeError(f"{what}{self.context}: agent actor died ({type(e).__name__})") from e
        except ray.exceptions.RayTaskError as e:
            raise RuntimeError(f"{what}{self.context}: agent raised {e.cause!r}") from e
