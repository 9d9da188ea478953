"""A cost-simulated agent for scaling benchmarks: the `Agent` interface `AgentService` uses, no model.

Selected by a model name `sim:KEY=VALUE,...` (e.g. `sim:hidden=2048,step_ms=5,token_ms=5,tokens=32`).
A call's simulated device time comes from `call_device_ms` (the one definition of the cost table, also
used by the discrete-event model in jobs/bench/scale_model.py):

    prefill   prefill_ms + prompt_tokens x prefill_token_ms x B     (one parallel forward, compute-bound)
    rollout   M x step_ms x (1 + row_share x (B - 1))               (every row runs every latent step)
    decode    sum over t of token_ms x (1 + token_row_share x (b_t - 1))  (b_t: rows still before their EOS)

The table is either tabulated (`paper_sim_models`: costs proportional to parameters) or fitted from measured
times of real agents (jobs/bench/scale_fit.py `fitted_sim_name`: each term is a measured a + b x rows).

and the agent sleeps that long (on one "device" per agent: calls never overlap), so two CPU cores can host
dozens of these agents. `device_s_total` counts the simulated device time; whatever else a call takes
(the actor, Ray, the transport) is host time. The messages it sends have the real shape [B, M, hidden]
(float32), so the actors, the pool, the orchestrator and the transport do exactly the work they do for a
real model of that width. No Ray here.

Legend: B batch, M latent steps, D hidden size.
"""

from __future__ import annotations

import random
import time

import torch

from recmas_ray.engine.decoding import Decoded

PREFILL_SPEEDUP = 20.0
"""How much cheaper a prompt token is than a sequential step (latent step or decoded token): the prompt
runs as one parallel forward. The same figure prices real models in `distributed.role_copies.call_cost`."""

DEFAULTS = {"hidden": 2048, "step_ms": 5.0, "token_ms": 5.0, "tokens": 32, "prefill_ms": 0.0, "row_share": 0.0,
            "eos_spread": 0.0, "prompt_tokens": 0, "prefill_token_ms": 0.0, "token_row_share": -1.0}
"""prefill_ms: a fixed cost per call; prompt_tokens x prefill_token_ms: each row's prompt, prefilled in
one parallel forward (linear in rows x tokens); row_share: each row beyond the first adds this share of a
sequential step's time (a device's cost grows with the batch); token_row_share: the same for a decoded token
(negative: row_share; a fit measures the two apart); eos_spread: each row stops after a number
of tokens drawn from [tokens x (1 - eos_spread), tokens] (seeded by its prompt), leaves the batch then,
and the call lasts until its longest row stops."""
KINDS = ("rollout", "decode")


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


def row_tokens(params: dict, budget: int, seed: int) -> int:
    """Tokens one row decodes before its EOS (or the budget)."""
    n = int(params["tokens"])
    spread = params["eos_spread"]
    if spread > 0:
        n = int(round(n * (1.0 - spread * random.Random(seed).random())))
    return max(1, min(n, budget))


def step_factor(params: dict, rows: int, kind: str = "rollout") -> float:
    """A sequential step's cost (`kind` rollout: a latent step; decode: a decoded token) at `rows` rows relative
    to one row."""
    share = params["row_share"]
    if kind == "decode" and params.get("token_row_share", -1.0) >= 0:
        share = params["token_row_share"]
    return 1.0 + share * max(0, rows - 1)


def call_device_ms(params: dict, kind: str, rows: int, steps: int, row_counts: list[int] | None = None) -> float:
    """Simulated device time (ms) of one call: `kind` rollout of `steps` latent steps, or decode whose rows
    stop after `row_counts` tokens (default: every row `steps` tokens); prefill included."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}; expected one of {KINDS}")
    ms = params["prefill_ms"] + params["prompt_tokens"] * params["prefill_token_ms"] * rows
    if kind == "rollout":
        return ms + steps * params["step_ms"] * step_factor(params, rows)
    counts = sorted(row_counts if row_counts is not None else [steps] * rows)
    active, t = len(counts), 0
    for n in counts:  # rows leave in order of their lengths: between two leavings `active` rows step together
        ms += (n - t) * params["token_ms"] * step_factor(params, active, "decode")
        t, active = n, active - 1
    return ms


def sim_call_cost(name: str, kind: str, num_tokens: int) -> float:
    """Relative cost of one call of a `sim:` model (`distributed.role_copies.call_cost`): its own table at its
    reference batch (`PREFILL_REF_ROWS`), every row to the end."""
    p = parse_sim_name(name)
    steps = num_tokens if kind == "rollout" else min(num_tokens, int(p["tokens"]))
    return call_device_ms(p, kind, PREFILL_REF_ROWS, steps)


class SimulatedAgent:
    """Waits instead of computing; answers every question with \\boxed{0}."""

    def __init__(self, name: str, *, role: str):
        self.params = parse_sim_name(name)
        self.role, self.model_name = role, name
        self.hidden_size = int(self.params["hidden"])
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.outer_links: dict = {}
        self.device_s_total = 0.0
        """Simulated device time of every call so far (seconds)."""
        self.bytes_read_total = 0
        """Bytes of every latent message received so far, each read once (a real agent copies them into its
        input embeddings), so a transport's figure includes reading what it delivered."""
        self.latent_checksum = 0.0
        """Sum of the last call's received latents (what reading them computed)."""

    def _run_device(self, ms: float) -> None:
        self.device_s_total += ms / 1000.0
        if ms > 0:  # sleep(0) still hands the GIL to Ray's threads and waits to get it back: zero cost means none
            time.sleep(ms / 1000.0)

    def embed_batch(self, users: list[str], latents: dict | None = None):
        """(E_BLD, mask_BL) placeholders: one position per sample; every received latent is read once."""
        B = len(users)
        blocks = list((latents or {}).values())
        self.latent_checksum = sum(float(x.double().sum()) for x in blocks)
        self.bytes_read_total += sum(x.numel() * x.element_size() for x in blocks)
        return torch.zeros(B, 1, 1), torch.ones(B, 1, dtype=torch.long)

    def latent_rollout(self, e_BLD, mask_BL, num_steps: int, *, seeds=None) -> torch.Tensor:
        """Wait the rollout's device time; return H_BMD of the real size."""
        self._run_device(call_device_ms(self.params, "rollout", e_BLD.shape[0], num_steps))
        return torch.full((e_BLD.shape[0], num_steps, self.hidden_size), 0.5)

    def messages(self, h_BMD: torch.Tensor, edges, *, device: str | None = "cpu") -> dict[str, torch.Tensor]:
        """One [B, M, D] message per edge (a copy each, as real outer links produce)."""
        return {e: h_BMD.clone() for e in edges}

    def decode(self, e_BLD, mask_BL, cfg, *, seeds: list[int] | None = None) -> list[Decoded]:
        """Wait the decode's device time; each row's tokens are capped by the decode budget and, with
        eos_spread, drawn per row from `seeds` (its prompt's hash)."""
        B = e_BLD.shape[0]
        counts = [self.row_tokens(cfg.max_new_tokens, (seeds or [b for b in range(B)])[b]) for b in range(B)]
        self._run_device(call_device_ms(self.params, "decode", B, max(counts), counts))
        return [Decoded("\\boxed{0}", n) for n in counts]

    def row_tokens(self, budget: int, seed: int) -> int:
        """Tokens one row decodes before its EOS (or the budget)."""
        return row_tokens(self.params, budget, seed)



# (parameters in billions, hidden size) of the paper systems' base models (the styles' `paper` presets), from
# their model cards; the hidden sizes are their configs' (the width of the messages they send).
PAPER_MODEL_SIZES = {
    "Qwen/Qwen3-1.7B": (1.72, 2048), "meta-llama/Llama-3.2-1B-Instruct": (1.24, 2048),
    "Qwen/Qwen2.5-Math-1.5B-Instruct": (1.54, 1536), "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": (1.78, 1536),
    "Qwen/Qwen2.5-Coder-3B-Instruct": (3.09, 2048), "BioMistral/BioMistral-7B": (7.24, 4096),
    "Qwen/Qwen3.5-2B": (2.0, 2048),
}


PREFILL_REF_ROWS = 4
"""Rows at which the paper table's prefill equals PREFILL_SPEEDUP per prompt token per call (the benchmark's
batch): a row's prompt token costs token_ms / (PREFILL_SPEEDUP x PREFILL_REF_ROWS), so bigger batches pay more."""
ROW_SHARE = 0.02
"""Share of a decode or latent step one more row adds: a small-batch step reads the weights once and is
launch-bound; one row's KV (500 tokens of a 1.5B model with 2 KV heads of 128 over 28 layers, bf16: ~14 MB)
is ~0.5% of the weights' 3 GB, 2% allows for its compute."""
EOS_SPREAD = 0.5
"""Rows stop uniformly between half and all of `tokens` (an assumption: no measured length distribution of
the paper systems is in the repo)."""


def paper_sim_models(models: dict[str, str], *, ms_per_gparam: float = 1.0, tokens: int = 256,
                     prompt_tokens: int = 200, prefill_speedup: float = PREFILL_SPEEDUP, row_share: float = ROW_SHARE,
                     eos_spread: float = EOS_SPREAD) -> dict[str, str]:
    """`sim:` names for each role of a paper system (`models`: role -> paper base model, a style's `paper`
    preset), costs proportional to parameters: a latent step or a decoded token takes `ms_per_gparam` x parameters
    (B) ms at one row, `row_share` more per extra row; each row's `prompt_tokens` are prefilled on every call
    (PREFILL_REF_ROWS); decoded rows stop at EOS after `tokens` x [1 - eos_spread, 1]."""
    unknown = sorted(m for m in models.values() if m not in PAPER_MODEL_SIZES)
    if unknown:
        raise ValueError(f"no parameter count for {unknown}; expected models of {sorted(PAPER_MODEL_SIZES)}")
    out = {}
    for role, model in models.items():
        params_b, hidden = PAPER_MODEL_SIZES[model]
        token_ms = ms_per_gparam * params_b
        out[role] = (f"sim:hidden={hidden},step_ms={token_ms:.4g},token_ms={token_ms:.4g},tokens={tokens},"
                     f"prompt_tokens={prompt_tokens},"
                     f"prefill_token_ms={token_ms / (prefill_speedup * PREFILL_REF_ROWS):.4g},"
                     f"row_share={row_share:.4g},eos_spread={eos_spread:.4g}")
    return out
