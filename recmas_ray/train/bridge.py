"""The ridge "bridge" initialisations of the outer links (non-reference, `--outer_init bridge` and
`--outer_init state_bridge`; docs/training.md).

An outer link receives the source's inner-link output, which the inner loop trains to sit in the source's
input-embedding space, and must emit vectors in the target's input-embedding space. Tokens whose text is
the same in both vocabularies give paired rows (source embedding, target embedding); the ridge regression
between them is a linear map that already sends a source token's embedding near the target's embedding of
the same text. `links.init_bridge` puts it into `residual_proj` (MLP ~0, output scale matched).
`state_bridge_outer_links` fits the links of stages that send their rollout on rollout states instead (below).
"""

from __future__ import annotations

import copy
import gc

import torch

from recmas_ray.engine.agent import Agent
from recmas_ray.engine.links import init_bridge
from recmas_ray.models import loader
from recmas_ray.models.loader import resolve_dtype
from recmas_ray.styles import build_schedule, render_prompt


def vocabulary_strings(tokenizer, *, blanks: bool = False) -> dict[str, int]:
    """Decoded text -> token id for every ordinary token (special tokens, duplicates and, unless `blanks`,
    whitespace-only tokens left out). Where several tokens decode to one text, the one the tokenizer itself
    writes for it wins: Gemma's byte-fallback tokens (<0x32>) decode like its digit tokens and come first by
    id, but text never holds them, so pairing them would teach a bridge embeddings no prompt contains."""
    special = set(tokenizer.all_special_ids)
    out: dict[str, int] = {}
    clashes: set[str] = set()
    for i in range(len(tokenizer)):
        if i in special:
            continue
        text = tokenizer.decode([i])
        if text and (blanks or text.strip()) and "\ufffd" not in text:
            if text in out:
                clashes.add(text)
            else:
                out[text] = i
    for text in clashes:
        own = tokenizer(text, add_special_tokens=False).input_ids
        if len(own) == 1 and own[0] not in special:
            out[text] = own[0]
    return out


def shared_token_pairs(src_tokenizer, dst_tokenizer, *, max_pairs: int | None = 20000,
                       blanks: bool = False) -> tuple[list[int], list[int]]:
    """(source ids, target ids) of tokens with the same text in both vocabularies (at most `max_pairs`, the
    lowest source ids first: byte-pair vocabularies put their frequent tokens there; None: all of them)."""
    return shared_pairs(vocabulary_strings(src_tokenizer, blanks=blanks),
                        vocabulary_strings(dst_tokenizer, blanks=blanks), max_pairs=max_pairs)


def shared_pairs(src: dict[str, int], dst: dict[str, int], *, max_pairs: int | None) -> tuple[list[int], list[int]]:
    """`shared_token_pairs` on two `vocabulary_strings` tables (workers that hold one tokenizer each trade these)."""
    pairs = sorted((i, dst[t]) for t, i in src.items() if t in dst)[:max_pairs]
    if len(pairs) < 16:
        raise ValueError(f"only {len(pairs)} tokens have the same text in both vocabularies: too few for a bridge")
    return [a for a, _ in pairs], [b for _, b in pairs]


@torch.no_grad()
def bridge_outer_links(plan, *, ridge: float, dtype: str = "float32", max_pairs: int = 20000) -> dict[str, int]:
    """Initialise every outer link of `plan` (in place) as the ridge bridge between its roles' token embeddings.

    Loads each role's base model once on CPU (before training starts). Returns edge -> number of paired tokens.
    """
    loaded: dict[str, tuple] = {}  # by model name: roles on one base model share it

    def model_of(role):
        name = plan.role_models[role]
        if name not in loaded:
            loaded[name] = loader.load_frozen_model(name, dtype=resolve_dtype(dtype, torch.device("cpu")),
                                             device=torch.device("cpu"))
        return loaded[name]

    counts = {}
    for edge, link in plan.links.outer.items():
        src, dst = edge.split("->")
        (src_model, src_tok), (dst_model, dst_tok) = model_of(src), model_of(dst)
        src_ids, dst_ids = shared_token_pairs(src_tok, dst_tok, max_pairs=max_pairs)
        x_ND = src_model.get_input_embeddings()(torch.tensor(src_ids)).float()
        y_NE = dst_model.get_input_embeddings()(torch.tensor(dst_ids)).float()  # the module's own scaling included
        init_bridge(link, x_ND, y_NE, ridge=ridge)
        counts[edge] = len(src_ids)
        print(f"[outer] bridge init {edge}: ridge fit on {len(src_ids)} shared tokens", flush=True)
    loaded.clear()  # the training workers load their own models: free these before they start

    gc.collect()
    return counts


# ----------------------------------------------------------------------------- rollout-state bridge
# `--outer_init state_bridge` (non-reference): the token-pair bridge maps token embeddings, but what a first
# stage sends at inference is inner(h) of its m-step latent rollout, which sits far from any token embedding
# pair the fit saw. Fitting instead on (rollout latent z_t, target embedding of the source's own next-token
# argmax at h_t) starts the link as "say in the target's vocabulary what the source would have said": this
# one-hop init carried the fact where the token-pair bridge did not (docs/learning_runs.md, diag4-diag7).


MIN_STATE_PAIRS = 16
"""Fewest usable rollout states for a rollout-state fit (as for the token pairs); fewer keep the token bridge."""


def state_token_pairs(source, z_ND: torch.Tensor, h_ND: torch.Tensor,
                      target_vocab: dict[str, int]) -> tuple[torch.Tensor, list[int]]:
    """(x_KD, target ids): the rollout latents z_t of `source` whose argmax text at h_t is also a token of the
    target (`target_vocab`, from `vocabulary_strings`), and that token's target id, row for row."""
    texts = [source.tokenizer.decode([t]) for t in source.logits(h_ND).argmax(-1).tolist()]
    keep = [i for i, t in enumerate(texts) if t in target_vocab]
    return z_ND[keep].float(), [target_vocab[texts[i]] for i in keep]


@torch.no_grad()
def rollout_state_pairs(source, users: list[str], target_tokenizer, target_embeddings: torch.nn.Module, *,
                        num_steps: int, batch_size: int = 16,
                        cache: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(x_ND, y_NE, num_states): x = inner(h_t) of `source`'s m-step rollout from each prompt in `users` (what
    `train.outer.rollout_stage` and the service's rollout send), y = `target_embeddings` of the token whose
    text is the source's argmax at h_t, for the states whose argmax text is also a target token (the others
    are dropped; num_states counts all; x may be empty). `cache` receives every prompt's z [m, D] under the
    key `train.outer.rollout_stage` uses, so training need not roll the same questions out again."""
    dst = vocabulary_strings(target_tokenizer)
    xs, ids, num_states = [], [], 0
    for k in range(0, len(users), batch_size):
        e_BLD, mask_BL = source.embed_batch(users[k:k + batch_size])
        h_ND = source.latent_rollout(e_BLD, mask_BL, num_steps).reshape(-1, source.hidden_size)
        z_ND = source.inner_link(h_ND)
        if cache is not None:
            cache.update({(source.role, num_steps, u): z for u, z in zip(users[k:k + batch_size],
                                                                        z_ND.reshape(-1, num_steps, z_ND.shape[-1]))})
        x_KD, keep_ids = state_token_pairs(source, z_ND, h_ND, dst)
        xs.append(x_KD)
        ids += keep_ids
        num_states += len(h_ND)
    y_NE = target_embeddings(torch.tensor(ids, dtype=torch.long, device=target_embeddings.weight.device)).float()
    return torch.cat(xs), y_NE, num_states


def first_stage_edges(style, num_rounds: int) -> dict[str, object]:
    """Outer edge -> the schedule step that sends it without having received latents (round 1's first
    stages: planner, expert, the mixture experts), i.e. the stages whose messages are their rollouts."""
    out = {}
    for step in build_schedule(style, num_rounds):
        if not step.inputs and step.role != style.decoder:
            out.update({e: step for e in step.outputs if e not in out})
    return out


@torch.no_grad()
def state_bridge_outer_links(plan, questions: list[str], *, task: str, num_steps: int, num_rounds: int,
                             ridge: float, dtype: str = "float32", max_pairs: int = 20000,
                             rollouts: dict | None = None) -> dict[str, int]:
    """`--outer_init state_bridge`: every outer link whose source stage receives no latents is fitted on the
    rollouts of `questions` (the training questions, each rolled out once; `rollouts` receives them in
    `train.outer.rollout_stage`'s cache layout); every other link gets the token-pair bridge
    (`bridge_outer_links`). In place; returns edge -> number of fitted pairs."""
    counts = bridge_outer_links(plan, ridge=ridge, dtype=dtype, max_pairs=max_pairs)
    style, loaded = plan.style, {}

    def model_of(role):
        name = plan.role_models[role]
        if name not in loaded:
            loaded[name] = loader.load_frozen_model(name, dtype=resolve_dtype(dtype, torch.device("cpu")),
                                             device=torch.device("cpu"))
        return loaded[name]

    for edge, step in first_stage_edges(style, num_rounds).items():
        src, dst = edge.split("->")
        model, tok = model_of(src)
        # a copy of the inner link: Agent casts it to the model's dtype in place
        source = Agent(model, tok, copy.deepcopy(plan.links.inner[src]), role=src, model_name=plan.role_models[src],
                       system_prompt=style.system_prompt)
        users = [render_prompt(style, src, step.variant, task, q) for q in questions]
        dst_model, dst_tok = model_of(dst)
        x_ND, y_NE, num_states = rollout_state_pairs(source, users, dst_tok, dst_model.get_input_embeddings(),
                                                     num_steps=num_steps, cache=rollouts)
        if len(x_ND) < MIN_STATE_PAIRS:  # e.g. tiny random vocabularies sharing little text: keep the token bridge
            print(f"[outer] state bridge init {edge}: only {len(x_ND)} of {num_states} rollout states have an "
                  f"argmax token {dst} also holds; kept the token bridge", flush=True)
            continue
        init_bridge(plan.links.outer[edge], x_ND, y_NE, ridge=ridge)
        counts[edge] = len(x_ND)
        print(f"[outer] state bridge init {edge}: ridge fit on {len(x_ND)} of {num_states} rollout states "
              f"({len(questions)} questions x {num_steps} steps)", flush=True)
    loaded.clear()

    gc.collect()
    return counts
