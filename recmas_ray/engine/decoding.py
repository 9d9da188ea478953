"""Decoding pieces shared by the agent's loops: the decoded result, the paused decode state, EOS ids
and the token picker (greedy, or top-k then top-p sampling in transformers' warper order).

Legend: B batch, L sequence, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from recmas_ray.config.recursion import DecodeConfig


@dataclass
class Decoded:
    """One sample's decoded text and the number of tokens generated for it (EOS included)."""

    text: str
    num_tokens: int
    tool_calls: list[dict] = field(default_factory=list)
    """Deliberation tool loop: one dict per executed call (kind, input, result, ok, seconds)."""


@dataclass
class DecodeState:
    """A paused KV-cached decode: the cache plus what is needed to append tokens and continue."""

    cache: object
    """The model's KV cache over every fed position."""
    mask_BL: torch.Tensor
    """Attention mask over every fed position (left padding 0)."""
    pos_BL: torch.Tensor
    """Position id of the last fed column, [B, 1]."""
    logits_BV: torch.Tensor
    """Next-token logits after the last fed column."""
    fed: int
    """Columns fed through the model so far (prompt, generated and appended tokens)."""
    pending_B: torch.Tensor | None = None
    """Tokens picked by `generate` but not yet fed (fed first by the next `feed`/`generate`)."""


@dataclass
class TargetScore:
    """One teacher-forced target under a prompt (`Agent.score_targets`): its token NLLs and greediness."""

    token_nll: list[float]
    """NLL of each scored token, in order."""
    greedy: bool
    """Whether argmax decoding picks every one of those tokens."""

    @property
    def mean_nll(self) -> float:
        return sum(self.token_nll) / max(len(self.token_nll), 1)

    @property
    def logprob(self) -> float:
        return -sum(self.token_nll)


def eos_ids(model, tokenizer) -> torch.Tensor:
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(model.generation_config, "eos_token_id", None)
    ids |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return torch.tensor(sorted(i for i in ids if i is not None), device=model.device)


# transformers' value for a generation config without top_k (GenerationConfig defaults): what
# the release samples with when its top_k is left unset (-1; docs/reproducing.md#sources).
HF_DEFAULT_TOP_K = 50


def model_top_k(model) -> int:
    """The top-k a model's generation config asks for (transformers' default 50 when it names none)."""
    k = getattr(getattr(model, "generation_config", None), "top_k", None)
    return int(k) if k is not None else HF_DEFAULT_TOP_K


def pick(logits_BV: torch.Tensor, cfg: DecodeConfig, gen) -> torch.Tensor:
    if not cfg.do_sample:
        return logits_BV.argmax(-1)
    probs_BV = torch.softmax(logits_BV / max(cfg.temperature, 1e-5), dim=-1)
    sorted_p, idx = probs_BV.sort(dim=-1, descending=True)
    if cfg.top_k > 0:  # top-k first, then top-p over the renormalised rest (transformers' warper order)
        sorted_p[:, cfg.top_k:] = 0
        sorted_p = sorted_p / sorted_p.sum(-1, keepdim=True)
    keep = sorted_p.cumsum(-1) - sorted_p < cfg.top_p  # always keeps the top token
    sorted_p = sorted_p * keep
    choice = torch.multinomial(sorted_p / sorted_p.sum(-1, keepdim=True), 1, generator=gen)
    return idx.gather(-1, choice).squeeze(-1)


def decode_loop(logits_BV: torch.Tensor, step: Callable[[torch.Tensor], torch.Tensor], cfg: DecodeConfig, *,
                gen, pick: Callable, eos: torch.Tensor, pad_id: int, sync_every: int,
                on_token: Callable[[list[int | None]], None] | None = None) -> list[list[int]]:
    """Pick up to `cfg.max_new_tokens` tokens per row; `step(ids_B1)` feeds the picks and returns the next logits.

    Picks stay on the device; "every row reached EOS" is read back every `sync_every` tokens, so up to
    `sync_every - 1` picks past the last EOS are made and dropped. A row is cut after its first EOS (kept);
    rows that stopped are fed the pad token, as `Agent.generate` does. `on_token(ids)` (streaming) gets the
    picks of every step at once (None for rows already done), which costs one host sync per token.
    """
    B, N = logits_BV.shape[0], cfg.max_new_tokens
    pad = torch.tensor(pad_id, device=logits_BV.device)
    tokens_BN = torch.full((B, N), pad_id, dtype=torch.long, device=logits_BV.device)
    done_B = torch.zeros(B, dtype=torch.bool, device=logits_BV.device)
    num_picked = 0
    for t in range(N):
        next_B = torch.where(done_B, pad, pick(logits_BV.float(), cfg, gen))
        tokens_BN[:, t] = next_B
        if on_token is not None:
            on_token([None if d else tok for d, tok in zip(done_B.tolist(), next_B.tolist())])
        done_B |= torch.isin(next_B, eos)
        num_picked = t + 1
        if t == N - 1 or (num_picked % sync_every == 0 and bool(done_B.all())):
            break
        logits_BV = step(next_B[:, None])
    eos_set = set(eos.tolist())
    out = []
    for row in tokens_BN[:, :num_picked].tolist():
        cut = next((i + 1 for i, tok in enumerate(row) if tok in eos_set), len(row))
        out.append(row[:cut])
    return out


class RowsStopped:
    """An `on_token` that reports each row of a decode once, at the first step it has stopped (its id is None):
    `report(rows)` gets the row indices newly stopped, and is called only when there are some. Picklable when
    `report` is, so it can run in an agent actor (per-question progress on Ray)."""

    def __init__(self, report: Callable[[list[int]], None]):
        self.report, self.reported = report, set()

    def __call__(self, ids: list) -> None:
        newly = [b for b, tok in enumerate(ids) if tok is None and b not in self.reported]
        if newly:
            self.reported.update(newly)
            self.report(newly)
