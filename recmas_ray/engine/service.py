"""The call surface one agent offers the recursion runner, identical in-process and inside a Ray actor.

`AgentService` owns an `Agent` (model + links) and exposes two calls whose arguments and results are
plain picklable values, so a Ray actor can wrap it unchanged and pass latents as top-level ObjectRefs:

  rollout(users, slot_names, num_steps, edges, *latents) -> (*messages_per_edge, stats)
  decode(users, slot_names, cfg, *latents)               -> (list[Decoded], stats)
  rollout_text(users, slot_names, num_steps, *latents)   -> (list[Decoded], stats)   (the rollout's argmax tokens)

`latents[i]` is the [B, M, D] block for `slot_names[i]`; messages are detached CPU tensors [B, M, E]
(on the producer's GPU when `keep_messages_on_device`, for the NCCL transport).
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from recmas_ray.engine.agent import Agent
from recmas_ray.config.engine import EngineConfig
from recmas_ray.engine.decoding import Decoded
from recmas_ray.engine.kv_cache import left_pad
from recmas_ray.config.recursion import DecodeConfig
from recmas_ray.engine.links import (InnerLink, OuterLink, TokenLink, inner_link_from_state_dict, link_from_state,
                                     link_state, token_channel)
from recmas_ray.models.loader import load_frozen_model, resolve_dtype
from recmas_ray.models.registry import model_kind

if TYPE_CHECKING:
    from recmas_ray.tools.loop import ToolLoopConfig


@dataclass(kw_only=True)
class AgentSpec:
    """Everything needed to build one agent anywhere (a local process or a remote actor)."""

    role: str
    """Role name in its style, e.g. "planner"."""
    model_name: str
    """A model name of any kind in `models.registry`: tiny:<family>, pkg:<name>, sim:..., a HF id or a local path."""
    system_prompt: str
    """The style's system prompt."""
    dtype: str = "auto"
    """Model dtype: auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16."""
    device: str = "auto"
    """auto picks CUDA when torch sees a GPU, else CPU."""
    message_dtype: str = "auto"
    """Dtype of latents sent to other agents: auto (bf16 on CUDA, fp32 on CPU), float32/fp32 or
    bfloat16/bf16 (half the bytes per message; receivers compute in their own dtype)."""
    tools: ToolLoopConfig | None = None
    """Deliberation toolcaller only: decode with the tool loop (keys are read where the agent runs)."""
    num_devices: int = 1
    """CUDA devices the model is split over (a role given K > 1 GPUs; the Ray layer sets it)."""
    keep_messages_on_device: bool = False
    """Messages stay on the producer's device (NCCL transport) instead of moving to CPU."""
    continuous_batching: bool = True
    """Rollouts and decodes of every call in flight share forward passes (`config.engine.EngineConfig`); the Ray
    layer then also sends aligned calls of several batches as one Ray call (`distributed.bulk`)."""
    outer_targets: dict[str, str] = field(default_factory=dict)
    """Base model of each outgoing edge's receiver (edge -> model name): a token link's target table is that
    model's input embedding of its token ids (set by `plan_system`)."""
    latent_norm: str = "none"
    """Non-reference: "embedding" rescales latents spliced into this agent's prompts to its token-embedding norm
    (set from the outer checkpoint's training config, config.choices.LATENT_NORMS); "none" as the release."""


def pick_device(requested: str) -> torch.device:
    """The torch device: from torch itself, never from Ray's logical resources."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {requested!r} requested but torch sees no CUDA device")
    if requested not in ("cpu",) and not requested.startswith("cuda"):
        raise ValueError(f"unknown device {requested!r}; expected auto, cpu or cuda[:N]")
    return torch.device(requested)


class AgentService:
    """Builds an Agent from a spec plus link weights and serves rollout/decode calls."""

    def __init__(self, spec: AgentSpec, inner_state: dict, outer_states: dict[str, dict]):
        self.spec = spec
        kind = model_kind(spec.model_name)
        if not kind.has_weights:  # a stand-in agent (cost-simulated, benchmarks): no model, no links
            self.agent = kind.stand_in_agent(spec.model_name, role=spec.role)
        else:
            device = pick_device(spec.device)
            model, tokenizer = load_frozen_model(spec.model_name, dtype=resolve_dtype(spec.dtype, device),
                                                 device=device, num_devices=spec.num_devices)
            self.agent = Agent(model, tokenizer,
                               inner_link_from_state_dict(inner_state, what=f"inner link of {spec.role}"),
                               role=spec.role, model_name=spec.model_name, system_prompt=spec.system_prompt,
                               engine=EngineConfig(continuous_batching=spec.continuous_batching))
            self._attach_outer(outer_states)
            if spec.latent_norm != "none":
                self.agent.set_latent_norm(spec.latent_norm)
        self.message_dtype = resolve_dtype(spec.message_dtype, self.agent.device)
        self.toolbox = None
        if spec.tools is not None:
            self.configure_tools(spec.tools)

    def configure_tools(self, cfg: ToolLoopConfig | None, *, search_backend=None) -> None:
        """Turn the tool loop on for every decode (None turns it off); `search_backend` replaces Tavily."""
        # lazy: transformers reads env settings on import; this module loads before the console sets them
        from recmas_ray.tools.loop import Toolbox

        self.toolbox = None if cfg is None else Toolbox(cfg, search_backend=search_backend)

    def info(self) -> dict:
        """Role, model, device and hidden size (the Ray actor adds node and GPU ids)."""
        return {"role": self.spec.role, "model": self.spec.model_name, "device": str(self.agent.device),
                "hidden_size": self.agent.hidden_size, "dtype": str(self.agent.dtype)}

    def _embed(self, users, slot_names, latents):
        if len(slot_names) != len(latents):
            raise ValueError(f"role {self.spec.role}: {len(slot_names)} slot names but {len(latents)} latent blocks")
        if isinstance(self.agent, Agent):  # prompt-prefix KV reuse needs each row's tokens before its first slot
            e_BLD, mask_BL, prefix_ids = self.agent.embed_batch_with_prefix(list(users), dict(zip(slot_names, latents)))
            return e_BLD, mask_BL, {"prefix_ids": prefix_ids}
        # a simulated agent draws each row's decode length from its prompt
        seeds = [zlib.crc32(u.encode()) for u in users]
        return (*self.agent.embed_batch(list(users), dict(zip(slot_names, latents))), {"seeds": seeds})

    def rollout(self, users, slot_names, num_steps: int, edges, *latents):
        """Latent rollout, then one message per outgoing edge; returns (*messages, stats)."""
        t0 = time.perf_counter()
        e_BLD, mask_BL, reuse = self._embed(users, slot_names, latents)
        h_BMD = self.agent.latent_rollout(e_BLD, mask_BL, num_steps, **reuse)
        msgs = self.agent.messages(h_BMD, tuple(edges), device=None if self.spec.keep_messages_on_device else "cpu")
        stats = {"role": self.spec.role, "latent_steps": num_steps, "text_tokens": [0] * len(users),
                 "seconds": time.perf_counter() - t0, "prompt_tokens": self._prompt_tokens(mask_BL, latents)}
        channel = self._channel(h_BMD, edges)
        if channel:  # token links only: what crosses, per edge and question (the results' `channel`)
            stats["channel"] = channel
        return (*[msgs[e].to(self.message_dtype) for e in edges], stats)

    def _channel(self, h_BMD, edges) -> dict:
        """Per token-link edge: each question's mean top-1 probability, mean residual share and the message's
        nearest tokens as text (`links.token_channel` of inner(H)); {} when no edge has a token link."""
        token_edges = [e for e in edges if isinstance(self.agent.outer_links.get(e), TokenLink)]
        if not token_edges or h_BMD.shape[1] == 0:
            return {}

        with torch.no_grad():
            z_BMD = self.agent.inner_link(h_BMD)
        out = {}
        for e in token_edges:
            c = token_channel(self.agent.outer_links[e], z_BMD)
            out[e] = {"top1": c["top1_BM"].mean(dim=1).tolist(),
                      "residual_share": c["residual_share_BM"].mean(dim=1).tolist(),
                      "nearest": [self.agent.tokenizer.decode(row) for row in c["source_ids_BM"].tolist()]}
        return out

    def rollout_text(self, users, slot_names, num_steps: int, *latents):
        """The rollout `rollout` computes, read out as text (the `rollout_as_text` method, `relay.py`): each of the
        m steps' last hidden state h_t -> its argmax token through this agent's own LM head; returns
        (list[Decoded] of those m tokens as text, stats with the token ids per row in `token_ids`)."""
        if not isinstance(self.agent, Agent):
            raise ValueError(f"role {self.spec.role}: rollout_as_text needs a model with an LM head "
                             f"({self.spec.model_name} is simulated)")
        t0 = time.perf_counter()
        e_BLD, mask_BL, reuse = self._embed(users, slot_names, latents)
        h_BMD = self.agent.latent_rollout(e_BLD, mask_BL, num_steps, **reuse)
        ids_BM = readout_ids(self.agent, h_BMD)
        out = [Decoded(self.agent.tokenizer.decode(row, skip_special_tokens=True), len(row)) for row in ids_BM]
        stats = {"role": self.spec.role, "latent_steps": num_steps, "text_tokens": [num_steps] * len(users),
                 "seconds": time.perf_counter() - t0, "prompt_tokens": self._prompt_tokens(mask_BL, latents),
                 "token_ids": ids_BM}
        return out, stats

    @staticmethod
    def _prompt_tokens(mask_BL, latents) -> list[int]:
        """Text tokens of each prompt as this agent read it (chat template included, latent positions not)."""
        if mask_BL is None:  # the tool loop embeds its own prompts
            return []
        num_latent = sum(int(x.shape[1]) for x in latents)
        return [int(n) - num_latent for n in mask_BL.sum(dim=1).tolist()]

    def decode(self, users, slot_names, cfg: DecodeConfig, *latents, on_token=None):
        """Text decode (latents spliced when given); returns (list[Decoded], stats).

        `on_token`: streaming callback of `Agent.decode` (not called by the tool loop)."""
        t0 = time.perf_counter()
        mask_BL = None
        if self.toolbox is not None:
            # lazy: transformers reads env settings on import; this module loads before the console sets them
            from recmas_ray.tools.loop import decode_with_tools

            if len(slot_names) != len(latents):
                raise ValueError(f"role {self.spec.role}: {len(slot_names)} slot names but {len(latents)} latent blocks")
            out = decode_with_tools(self.agent, list(users), dict(zip(slot_names, latents)), cfg, self.toolbox)
        else:
            e_BLD, mask_BL, reuse = self._embed(users, slot_names, latents)
            out = self.agent.decode(e_BLD, mask_BL, cfg, **reuse, **({} if on_token is None else {"on_token": on_token}))
        stats = {"role": self.spec.role, "latent_steps": 0, "text_tokens": [d.num_tokens for d in out],
                 "seconds": time.perf_counter() - t0, "prompt_tokens": self._prompt_tokens(mask_BL, latents)}
        return out, stats

    def score(self, users, slot_names, targets, *latents, continuation: bool = False):
        """Answer likelihood: mean token NLL of each `targets[b]` (+ EOS) teacher-forced after the prompt
        `decode` would start from (same chat template, same latents); returns (list[float], stats).
        `continuation`: each target is a raw continuation of that prompt instead, scored as
        [sum log p, greedy?] (lm-eval's loglikelihood)."""
        t0 = time.perf_counter()
        if len(slot_names) != len(latents) or len(targets) != len(users):
            raise ValueError(f"role {self.spec.role}: score got {len(users)} prompts, {len(targets)} targets, "
                             f"{len(slot_names)} slot names and {len(latents)} latent blocks")
        scored = self.agent.score_targets(list(users), dict(zip(slot_names, latents)), list(targets),
                                          continuation=continuation)
        nlls = [[s.logprob, s.greedy] for s in scored] if continuation else [s.mean_nll for s in scored]
        stats = {"role": self.spec.role, "latent_steps": 0, "text_tokens": [0] * len(users),
                 "seconds": time.perf_counter() - t0}
        return nlls, stats

    def set_links(self, inner_state: dict, outer_states: dict[str, dict]) -> None:
        """Replace the inner link and the outer links in place (the model stays loaded)."""
        link = inner_link_from_state_dict(inner_state, what=f"inner link of {self.spec.role}")
        self.agent.inner_link = link.to(self.agent.device, self.agent.dtype)
        self.agent.outer_links = {}
        self._attach_outer(outer_states)

    def _attach_outer(self, outer_states: dict[str, dict]) -> None:
        """Build each outgoing edge's link from its tensors (any registered kind) and attach it; a token link
        is bound to this model's embeddings and its receiver's (`token_tables`) first."""
        for edge, sd in outer_states.items():
            link = link_from_state(sd, place="outer", what=f"outer link {edge}")
            if isinstance(link, TokenLink):
                target = self.spec.outer_targets.get(edge)
                if target is None:
                    raise ValueError(f"outer link {edge} is a token link, but the spec of {self.spec.role} names no "
                                     "receiver model for it (AgentSpec.outer_targets)")
                link.bind(*token_tables(self.agent, target, link, what=f"token link {edge}"))
            self.agent.attach_outer_link(edge, link)

    def retry_format(self, texts: list[str], suffixes: list[str], max_new_tokens: int, *latents,
                     cfg: DecodeConfig | None = None, users: list[str] | None = None, slot_names=(),
                     rows: list[int] | None = None) -> list[Decoded]:
        """Answer-format retry: continue each reply `texts[i] + suffixes[i]` where it was written.

        With `users` (the decoder's prompts of the batch, as `decode` got them, with `latents` [B, M, D] for
        `slot_names`), reply i is continued after prompt `users[rows[i]]` with its latents spliced in, i.e.
        after everything the agent received, so a reply that stated a value is boxed from that context.
        Without `users` the reply alone is continued by the base model, no chat template and no latents (the
        release's behaviour, which can append a value unrelated to the question). Returns the continuations.
        """
        if len(texts) != len(suffixes):
            raise ValueError(f"retry_format: {len(texts)} texts but {len(suffixes)} suffixes")
        cfg = dataclasses.replace(cfg or DecodeConfig(), max_new_tokens=max_new_tokens)
        with torch.no_grad():
            if users is None:
                rows_e = [self.agent._embed_ids(self.agent.tokenizer(t + s).input_ids) for t, s in zip(texts, suffixes)]
            else:
                rows = list(range(len(texts))) if rows is None else list(rows)
                if len(rows) != len(texts) or len(slot_names) != len(latents):
                    raise ValueError(f"retry_format: {len(texts)} texts for rows {rows}; {len(slot_names)} slot "
                                     f"names but {len(latents)} latent blocks")
                rows_e = [self.agent.embed_prompt(users[b], {n: x[b] for n, x in zip(slot_names, latents)},
                                                  suffix_text=t + s)[0]
                          for t, s, b in zip(texts, suffixes, rows)]
            return self.agent.decode(*left_pad(rows_e), cfg)

    @staticmethod
    def select_rows(block, positions: list[int]):
        """Rows `positions` of a latent block [B, M, E] (a question that stopped early, or the ones that go on)."""
        return block[list(positions)].contiguous()

    @staticmethod
    def latent_change(old_positions: list[int], num_blocks: int, *blocks) -> list[float]:
        """Per question: ||x_new - x_old|| / ||x_old|| over its latent blocks flattened (fp32), where `blocks` are
        the `num_blocks` old blocks [B_old, M, E] then as many new ones [B, M, E] and the new row i is the old
        row `old_positions[i]` (the adaptive-rounds check, `RecursionConfig.adaptive_threshold`)."""
        if len(blocks) != 2 * num_blocks:
            raise ValueError(f"latent_change: {len(blocks)} blocks for {num_blocks} old and {num_blocks} new")
        old = [b[list(old_positions)] for b in blocks[:num_blocks]]
        new = list(blocks[num_blocks:])
        if not new:  # no latent input at all: nothing changes
            return [0.0] * len(old_positions)
        old_BN = torch.cat([b.float().reshape(b.shape[0], -1) for b in old], dim=1)
        new_BN = torch.cat([b.float().reshape(b.shape[0], -1).to(old_BN.device) for b in new], dim=1)
        diff_B = (new_BN - old_BN).norm(dim=1)
        base_B = old_BN.norm(dim=1)
        # an all-zero old input (m = 0, a zero ablation): change 0 if the new one is zero too, else infinite
        change_B = torch.where(base_B > 0, diff_B / base_B.clamp_min(torch.finfo(torch.float32).tiny),
                               torch.where(diff_B > 0, torch.full_like(diff_B, float("inf")), torch.zeros_like(diff_B)))
        return [float(c) for c in change_B.tolist()]


@torch.no_grad()
def readout_ids(agent: Agent, h_BMD: torch.Tensor) -> list[list[int]]:
    """Each latent step's nearest token: argmax of the agent's own LM head at its last hidden state h_t
    (`Agent.logits`, final soft-capping included), as token ids per row."""
    if h_BMD.shape[1] == 0:
        return [[] for _ in range(h_BMD.shape[0])]
    return agent.logits(h_BMD).argmax(dim=-1).tolist()


def link_states(inner: InnerLink, outer: dict[str, OuterLink]) -> tuple[dict, dict[str, dict]]:
    """CPU state dicts to ship to a service (small next to the model, sent once at creation)."""
    return ({k: v.detach().cpu() for k, v in inner.state_dict().items()},
            {e: link_state(m) for e, m in outer.items()})


_EMBEDDINGS: dict[str, torch.nn.Module] = {}  # receiver model -> its input embedding (CPU fp32), once per process


@torch.no_grad()
def token_tables(agent: Agent, target_model: str, link: TokenLink, *, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(source [K, D], target [K, E]) tables of a token link sent by `agent`: its own input embeddings of the
    source ids and `target_model`'s of the target ids (this agent's model when the receiver runs the same one;
    else that model's embedding layer, loaded once per process on the CPU, the rest of it dropped)."""
    own = agent.model.get_input_embeddings()
    if target_model == agent.model_name:
        other = own
    else:
        other = _EMBEDDINGS.get(target_model)
        if other is None:
            model, _ = load_frozen_model(target_model, dtype=torch.float32, device="cpu")
            other = _EMBEDDINGS[target_model] = model.get_input_embeddings()
            del model
    for ids, table, name in ((link.source_ids, own, agent.model_name), (link.target_ids, other, target_model)):
        vocab = int(table.weight.shape[0])
        if len(ids) and int(ids.max()) >= vocab:
            raise ValueError(f"{what}: token id {int(ids.max())} is outside {name}'s vocabulary of {vocab} (links "
                             "made for other models?)")
    device = own.weight.device
    return (own(link.source_ids.to(device)).float(),
            other(link.target_ids.to(other.weight.device)).float().to(device))
