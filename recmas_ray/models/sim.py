"""A cost-simulated agent for scaling benchmarks: the `Agent` interface `AgentService` uses, no model.

Selected by a model name `sim:KEY=VALUE,...` (e.g. `sim:hidden=2048,step_ms=5,token_ms=5,tokens=32`).
Each latent step waits `step_ms`, each generated token `token_ms`, the prompt `prefill_ms`; the
messages it sends have the real shape [B, M, hidden] (float32), so the actors, the pool, the
orchestrator and the transport do exactly the work they do for a real model of that width. The
waits sleep, so two CPU cores can host dozens of these agents. No Ray here.

Legend: B batch, M latent steps, D hidden size.
"""

from __future__ import annotations

import time

import torch

from recmas_ray.agent import Decoded

DEFAULTS = {"hidden": 2048, "step_ms": 5.0, "token_ms": 5.0, "tokens": 32, "prefill_ms": 0.0}


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

    def latent_rollout(self, e_BLD, mask_BL, num_steps: int) -> torch.Tensor:
        """Wait prefill + num_steps * step_ms; return H_BMD of the real size."""
        time.sleep((self.params["prefill_ms"] + num_steps * self.params["step_ms"]) / 1000.0)
        return torch.full((e_BLD.shape[0], num_steps, self.hidden_size), 0.5)

    def messages(self, h_BMD: torch.Tensor, edges, *, device: str | None = "cpu") -> dict[str, torch.Tensor]:
        """One [B, M, D] message per edge (a copy each, as real outer links produce)."""
        return {e: h_BMD.clone() for e in edges}

    def decode(self, e_BLD, mask_BL, cfg) -> list[Decoded]:
        """Wait prefill + tokens * token_ms (capped by the decode budget)."""
        n = min(int(self.params["tokens"]), cfg.max_new_tokens)
        time.sleep((self.params["prefill_ms"] + n * self.params["token_ms"]) / 1000.0)
        return [Decoded("\\boxed{0}", n) for _ in range(e_BLD.shape[0])]

