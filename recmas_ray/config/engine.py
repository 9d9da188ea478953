"""How an agent runs its model: KV cache kind, prefix KV reuse, compilation and decode host syncs.

Plain data (no torch import) so configs and the Ray layer can carry it; `recmas_ray/engine/agent.py` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from recmas_ray.config.checks import Range


@dataclass(kw_only=True)
class EngineConfig:
    """Execution choices of one agent; none changes what is computed (tests assert identity)."""

    static_cache: bool = True
    """Preallocated KV cache and attention mask for the latent rollout and the decode (no per-step
    concatenation); False uses transformers' growing DynamicCache (the earlier path, kept for checks)."""
    prefix_cache_mib: Annotated[float, Range(0, 1 << 20)] = 256.0
    """Memory (MiB) for the KV of prompt text before the first latent slot, reused by later calls whose
    prompt starts with the same tokens (later rounds, other questions sharing a template); 0 turns it off.
    Needs `static_cache`."""
    compile_step: bool = False
    """torch.compile the one-position step of the rollout and decode. Off by default: measured by
    `jobs/bench/speed.py` (figure g) it does not pay on CPU for the small models here (docs/results.md)."""
    continuous_batching: bool = True
    """Run static-cache rollouts and decodes through the agent's step scheduler (recmas_ray/engine/scheduler.py):
    the one-position steps of every call in flight share forward passes, rows leaving at their last step
    or EOS (agent actors then take several calls at once). Same latents and greedy tokens; False: each call
    runs alone on its own cache (`Agent._rollout_static` / `_decode_static`)."""
    decode_sync_every: Annotated[int, Range(1, 4096)] = 8
    """Decoded tokens between host checks of "every row reached EOS" (1: check every token, like the
    earlier loop). Tokens picked after the last row stopped are dropped, so outputs do not change."""
