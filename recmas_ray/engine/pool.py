"""The agent pool: what the runner needs from a set of agents (`AgentPool`), and the in-process one (`LocalPool`).

A pool hides where agents live: its calls return handles (values in-process, ObjectRefs on Ray, where
`distributed` offers the same protocol over actors), which the runner chains from step to step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from recmas_ray.config.recursion import DecodeConfig


class AgentPool(Protocol):
    """What the runner needs from a set of agents (see `service.AgentService` for the semantics)."""

    def rollout(self, role: str, users: list[str], slot_names: list[str], num_steps: int,
                edges: tuple[str, ...], latents: list[Any]) -> tuple[list[Any], Any]: ...

    def decode(self, role: str, users: list[str], slot_names: list[str], cfg: DecodeConfig,
               latents: list[Any]) -> Any: ...

    def get(self, handle: Any, *, what: str) -> Any: ...

    def rollout_text(self, role: str, users: list[str], slot_names: list[str], num_steps: int,
                     latents: list[Any]) -> Any:
        """Only for `rollout_as_text`: handle of the rollout read out as text (`AgentService.rollout_text`)."""

    def score(self, role: str, users: list[str], slot_names: list[str], targets: list[str], latents: list[Any],
              *, continuation: bool = False) -> Any:
        """Only when `run_batch` gets `targets` (answer likelihood): handle of (per sample: mean NLL, or
        (sum log p, greedy?) with continuation=True; stats)."""

    def retry_format(self, role: str, texts: list[str], suffixes: list[str], max_new_tokens: int, *,
                     cfg: DecodeConfig, context: tuple[DecoderInput, list[int]] | None = None) -> Any:
        """Handle of the answer-format retry's continuations (see `AgentService.retry_format`); `context`: the
        decoder's input of the batch and the rows retried, so each reply is continued after its own prompt."""

    def set_links(self, role: str, inner_state: dict, outer_states: dict[str, dict]) -> Any:
        """Handle of swapping a role's links in place, the model staying loaded (`AgentService.set_links`)."""

    def select_rows(self, role: str, handle: Any, positions: list[int]) -> Any:
        """Adaptive rounds only: handle of rows `positions` of a message, cut where `role` will read it."""

    def latent_change(self, role: str, old_positions: list[int], old_handles: list[Any],
                      new_handles: list[Any]) -> Any:
        """Adaptive rounds only: handle of the per-question change between two rounds' latent inputs of `role`
        (`AgentService.latent_change`)."""


@dataclass
class DecoderInput:
    """The final decode's input for one batch: the decoder's prompts and the latent blocks spliced into them
    (pool handles: tensors in-process, ObjectRefs on Ray; after any ablation), in the order of its slots."""

    role: str
    users: list[str]
    slot_names: list[str]
    latents: list[Any]


def retry_context_args(context: tuple[DecoderInput, list[int]] | None) -> tuple[list, dict]:
    """(latent handles, keyword arguments) of `AgentService.retry_format` for a retry `context` (none: the bare
    continuation); the latents go positionally so Ray resolves them."""
    if context is None:
        return [], {}
    inp, rows = context
    return list(inp.latents), {"users": list(inp.users), "slot_names": list(inp.slot_names), "rows": list(rows)}


class LocalPool:
    """In-process pool: handles are plain values and every call runs immediately."""

    def __init__(self, services: dict):
        self.services = services

    def rollout(self, role, users, slot_names, num_steps, edges, latents):
        *msgs, stats = self.services[role].rollout(users, slot_names, num_steps, edges, *latents)
        return msgs, stats

    def decode(self, role, users, slot_names, cfg, latents, **stream):
        return self.services[role].decode(users, slot_names, cfg, *latents, **stream)

    def rollout_text(self, role, users, slot_names, num_steps, latents):
        return self.services[role].rollout_text(users, slot_names, num_steps, *latents)

    def score(self, role, users, slot_names, targets, latents, **kw):
        return self.services[role].score(users, slot_names, targets, *latents, **kw)

    def retry_format(self, role, texts, suffixes, max_new_tokens, *, cfg, context=None):
        latents, kw = retry_context_args(context)
        return self.services[role].retry_format(texts, suffixes, max_new_tokens, *latents, cfg=cfg, **kw)

    def set_links(self, role, inner_state, outer_states):
        return self.services[role].set_links(inner_state, outer_states)

    def select_rows(self, role, handle, positions):
        return self.services[role].select_rows(handle, positions)

    def latent_change(self, role, old_positions, old_handles, new_handles):
        return self.services[role].latent_change(old_positions, len(old_handles), *old_handles, *new_handles)

    def get(self, handle, *, what):
        return handle

    def shutdown(self) -> None:
        """End the agents' step threads (continuous batching), so the process exits with none inside a forward."""
        for service in self.services.values():
            close = getattr(service.agent, "close", None)  # (simulated agents have no scheduler)
            if close is not None:
                close()
