"""A cost-simulated agent for scaling benchmarks: the `Agent` interface `AgentService` uses, no model.

Selected by a model name `sim:KEY=VALUE,...` (e.g. `sim:hidden=2048,step_ms=5,token_ms=5,tokens=32`).
Each latent step waits `step_ms`, each generated token `token_ms`, the prompt `prefill_ms`; the
messages it sends have the real shape [B, M, hidden] (float32), so the actors, the pool, the
orchestrator and the transport do exactly the work they do for a real model of that width. The
waits sleep, so two CPU cores can host dozens of these agents. No Ray here.

Legend: B batch, M latent steps, D hidden size.
"""

from __future__ import annotations

import random
import time

import torch

from recmas_ray.decoding import Decoded

PREFILL_SPEEDUP = 20.0
"""How much cheaper a prompt token is than a sequential step (latent step or decoded token): the prompt
runs as one parallel forward. The same figure prices real models in `distributed.pools.call_cost`."""

DEFAULTS = {"hidden": 2048, "step_ms": 5.0, "token_ms": 5.0, "tokens": 32, "prefill_ms": 0.0, "row_share": 0.0,
            "eos_spread": 0.0}
"""row_share: each row beyond the first adds this share of a call's time (a device's cost grows with the
batch); eos_spread: each row stops after a number of tokens drawn from [tokens x (1 - eos_spread), tokens]
(seeded by its prompt), and the call lasts until its longest row stops."""


def parse_sim_name(name: str) -> dict:
    """`sim:hidden=2048,step_ms=5` -> the full parameter dict (unknown keys are errors)."""
    if not name.startswith("sim:"):
        raise ValueError(f"not a simulated model name: {name!r}")
    out = dict(DEFAULTS)
    for item in filter(None, name[4:].split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in DEFAULTS:
            raise ValueError(f"model {name!r}: item {item!r}; expected KEY=VALUE with KEY in {sorted(DEFAULTS)}")
        out[key] = type(DEFAULTS[key])(float(value)) if isinstance(DEFAULTS[key], int) else float(value)
    return out


class SimulatedAgent:
    """Waits instead of computing; answers every question with \\boxed{0}."""

    def __init__(self, name: str, *, role: str):
        self.params = parse_sim_name(name)
        self.role, self.model_name = role, name
        self.hidden_size = int(self.params["hidden"])
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.outer_links: dict = {}

    def embed_batch(self, users: list[str], latents: dict | None = None):
        """(E_BLD, mask_BL) placeholders: one position per sample (the latents are only received)."""
        B = len(users)
        return torch.zeros(B, 1, 1), torch.ones(B, 1, dtype=torch.long)

    def _batch_factor(self, rows: int) -> float:
        return 1.0 + self.params["row_share"] * max(0, rows - 1)

    def latent_rollout(self, e_BLD, mask_BL, num_steps: int, *, seeds=None) -> torch.Tensor:
        """Wait (prefill + num_steps * step_ms) x the batch factor; return H_BMD of the real size."""
        ms = (self.params["prefill_ms"] + num_steps * self.params["step_ms"]) * self._batch_factor(e_BLD.shape[0])
        time.sleep(ms / 1000.0)
        return torch.full((e_BLD.shape[0], num_steps, self.hidden_size), 0.5)

    def messages(self, h_BMD: torch.Tensor, edges, *, device: str | None = "cpu") -> dict[str, torch.Tensor]:
        """One [B, M, D] message per edge (a copy each, as real outer links produce)."""
        return {e: h_BMD.clone() for e in edges}

    def decode(self, e_BLD, mask_BL, cfg, *, seeds: list[int] | None = None) -> list[Decoded]:
        """Wait (prefill + longest row's tokens * token_ms) x the batch factor; each row's tokens are capped
        by the decode budget and, with eos_spread, drawn per row from `seeds` (its prompt's hash)."""
        B = e_BLD.shape[0]
        counts = [self.row_tokens(cfg.max_new_tokens, (seeds or [b for b in range(B)])[b]) for b in range(B)]
        ms = (self.params["prefill_ms"] + max(counts) * self.params["token_ms"]) * self._batch_factor(B)
        time.sleep(ms / 1000.0)
        return [Decoded("\\boxed{0}", n) for n in counts]

    def row_tokens(self, budget: int, seed: int) -> int:
        """Tokens one row decodes before its EOS (or the budget)."""
        n = int(self.params["tokens"])
        spread = self.params["eos_spread"]
        if spread > 0:
            n = int(round(n * (1.0 - spread * random.Random(seed).random())))
        return max(1, min(n, budget))



# Parameters (billions) of the paper systems' base models (recmas_ray/system/presets.py PAPER), from
# their model cards; the hidden sizes are their configs' (the width of the messages they send).
PAPER_MODELS = {
    "light": {"planner": (1.72, 2048), "critic": (1.24, 2048), "solver": (1.54, 1536)},
    "mixture": {"math": (1.78, 1536), "code": (3.09, 2048), "science": (7.24, 4096), "summarizer": (2.0, 2048)},
}
PAPER_STYLES = {"light": "sequential_light", "mixture": "mixture"}


def paper_sim_models(system: str, *, ms_per_gparam: float = 1.0, tokens: int = 256, prompt_tokens: int = 200,
                     prefill_speedup: float = PREFILL_SPEEDUP) -> dict[str, str]:
    """`sim:` names for each role of a paper system, costs proportional to parameters: a latent step or
    a decoded token takes `ms_per_gparam` x parameters (B) ms; the prompt's `prompt_tokens` are
    prefilled `prefill_speedup` times faster per token (one parallel forward), on every call."""
    if system not in PAPER_MODELS:
        raise ValueError(f"unknown paper system {system!r}; expected one of {sorted(PAPER_MODELS)}")
    out = {}
    for role, (params_b, hidden) in PAPER_MODELS[system].items():
        token_ms = ms_per_gparam * params_b
        out[role] = (f"sim:hidden={hidden},step_ms={token_ms:.4g},token_ms={token_ms:.4g},tokens={tokens},"
                     f"prefill_ms={token_ms * prompt_tokens / prefill_speedup:.4g}")
    return out
