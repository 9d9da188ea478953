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


@ray.remote(max_restarts=0)
class AgentActor:
    """A GPU- (or CPU-) pinned agent holding its frozen model and links."""

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

    def call(self, method: str, *args, **kwargs):
        """Escape hatch for extensions (tool loop, training hooks) that live in the service."""
        return getattr(self.service, method)(*args, **kwargs)


class RayPool:
    """`runner.AgentPool` over actor handles: calls return ObjectRefs, latents never touch the caller."""

    def __init__(self, handles: dict, *, timeout_s: float = 600.0, context: str = ""):
        self.handles, self.timeout_s, self.context = handles, timeout_s, context

    def rollout(self, role, users, slot_names, num_steps, edges, latents):
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
