"""One agent: a frozen Hugging Face causal LM plus its inner link (and the outer links of its outgoing edges).

Plain torch + transformers, no Ray: the same object runs in-process and inside a Ray actor.
What it does, per batch of prompts:
  embed    chat-template the (system, user) prompt as text, split it at latent slot markers,
           embed the text pieces, splice latent blocks [M, D] into the slots, left-pad the batch
  rollout  m latent steps with the KV cache: h_t (last layer, last position) -> inner(h_t) -> next input
  message  outer_{edge}(inner(H)) for each outgoing edge, detached on CPU
  decode   greedy or sampled text decoding from embeddings, with the KV cache; resumable
           (prefill / generate / feed) so the tool loop can append results and continue
Rollout and `decode` run on a preallocated cache and mask (`kv_cache.py`) and reuse the stored KV of
prompt text before the first slot across calls; `engine` (config/engine.py) chooses.

Legend: B batch, L sequence, M latent steps, D this agent's hidden size, E target hidden size.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from recmas_ray.config.choices import LATENT_NORMS
from recmas_ray.config.engine import EngineConfig
from recmas_ray.config.recursion import DecodeConfig
from recmas_ray.engine.decoding import Decoded, DecodeState, decode_loop, model_top_k
from recmas_ray.engine.decoding import eos_ids as _eos_ids
from recmas_ray.engine.decoding import pick as _pick  # tests replace agent._pick
from recmas_ray.engine.kv_cache import PrefixStore, cache_kw, left_pad, out_cache, positions
from recmas_ray.engine.kv_cache import prefill as prefill_static
from recmas_ray.engine.links import InnerLink, OuterLink, mean_embedding_norm, rescale_rows
from recmas_ray.models.loader import output_device
from recmas_ray.engine.scoring import TeacherForcing

_SLOT_RE = re.compile(r"<<[A-Z_]+_SLOT>>")


def find_slots(text: str) -> list[str]:
    """Slot markers in order of appearance."""
    return _SLOT_RE.findall(text)


class Agent(TeacherForcing):
    """A frozen causal LM with its inner link; outer links of outgoing edges are attached by name."""

    def __init__(self, model, tokenizer, inner_link: InnerLink, *, role: str, model_name: str,
                 system_prompt: str = "You are a helpful assistant.", engine: EngineConfig | None = None):
        hidden = model.config.get_text_config().hidden_size
        if inner_link.hidden_size != hidden:
            raise ValueError(f"role {role}: inner link has hidden size {inner_link.hidden_size}, "
                             f"but base model {model_name} has {hidden}")
        self.model, self.tokenizer, self.inner_link = model, tokenizer, inner_link
        self.role, self.model_name, self.system_prompt = role, model_name, system_prompt
        self.hidden_size = hidden
        self.outer_links: dict[str, OuterLink] = {}
        self._turn_end: str | None = None
        self.device = output_device(model)  # links sit with the last layer (models split over GPUs)
        self.dtype = next(model.parameters()).dtype
        self.inner_link.to(self.device, self.dtype)
        self.latent_norm: float | None = None
        """Non-reference (config.choices.LATENT_NORMS): spliced latent rows are rescaled to this norm; None as the release."""
        self.engine = engine or EngineConfig()
        self.prefix_store = PrefixStore(int(self.engine.prefix_cache_mib * 2**20))
        # prompt tokens run (tokens_prefilled) and copied from the prefix store (tokens_reused) by the
        # latest static-cache rollout or decode (the benchmark reports them per round)
        self.last_prefill: dict[str, int] = {}
        self._compiled: dict[str, object] = {}

    @property
    def scheduler(self):
        """This agent's step scheduler (continuous batching), made on first use."""
        if getattr(self, "_scheduler", None) is None:
            # lazy: transformers reads env settings on import; this module loads before the console sets them
            from recmas_ray.engine.scheduler import StepScheduler

            self._scheduler = StepScheduler(self)
        return self._scheduler

    def close(self) -> None:
        """End the step scheduler's thread, if one was made (`StepScheduler.close`); a later call starts it again."""
        if getattr(self, "_scheduler", None) is not None:
            self._scheduler.close()

    # ----------------------------------------------------------------------------- links
    def attach_outer_link(self, edge: str, link: OuterLink) -> None:
        """Attach the outer link of an outgoing edge `role->target` (source dim must equal ours)."""
        if link.in_dim != self.hidden_size:
            raise ValueError(f"outer link {edge}: in_dim {link.in_dim} does not match {self.role}'s "
                             f"hidden size {self.hidden_size} ({self.model_name})")
        self.outer_links[edge] = link.to(self.device, self.dtype)

    def set_latent_norm(self, mode: str) -> None:
        """'embedding' (non-reference, LatentMAS): rescale spliced latents to this model's mean token-embedding
        norm from now on; 'none' (the release): splice them as they come."""

        if mode not in LATENT_NORMS:
            raise ValueError(f"latent_norm {mode!r}; expected one of {LATENT_NORMS}")
        self.latent_norm = None if mode == "none" else mean_embedding_norm(
            self.model.get_input_embeddings(), len(self.tokenizer), device=self.device)

    # ----------------------------------------------------------------------------- prompts
    def render_chat(self, user: str, *, system: str | None = None) -> str:
        """Chat template as text (system + user, generation prompt, thinking off).

        Templates that refuse a system turn (Gemma, Mistral) get the system text merged into the user turn.
        """
        from jinja2.exceptions import TemplateError  # lazy: jinja2 loads only when a chat template fails

        system = self.system_prompt if system is None else system
        kw = dict(tokenize=False, add_generation_prompt=True, enable_thinking=False)
        try:
            return self.tokenizer.apply_chat_template(
                [{"role": "system", "content": system}, {"role": "user", "content": user}], **kw)
        except TemplateError:
            return self.tokenizer.apply_chat_template([{"role": "user", "content": f"{system}\n\n{user}"}], **kw)

    def _embed_ids(self, ids: list[int]) -> torch.Tensor:
        # Always the model's own embedding module: Gemma3 scales by sqrt(d) inside it.
        e_LD = self.model.get_input_embeddings()(torch.tensor(ids, dtype=torch.long, device=self.device))
        return e_LD.to(self.device)  # a model split over GPUs embeds on its first one

    def embed_prompt(self, user: str, latents: dict[str, torch.Tensor] | None = None, *,
                     suffix_text: str = "", literal_slots: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings [L, D] of one chat prompt with latent blocks spliced into its slots.

        Returns (embeddings, token_ids) where token_ids is -100 at latent positions. `suffix_text`
        (e.g. a gold assistant turn) is appended after the generation prompt. `literal_slots` keeps
        slot markers as plain text (deliberation's inner training does this).
        """
        latents = latents or {}
        text = self.render_chat(user)
        markers = [] if literal_slots else find_slots(text)
        missing = [m for m in markers if m not in latents]
        unused = [m for m in latents if m not in markers]
        if missing or unused:
            raise ValueError(f"role {self.role}: prompt slots {markers} but latents given for {sorted(latents)}; "
                             f"slots without latents {missing}, latents without a slot {unused}")
        pieces = _SLOT_RE.split(text) if markers else [text]
        embeds, ids = [], []
        for i, piece in enumerate(pieces):
            if i == len(pieces) - 1:
                piece = piece + suffix_text
            piece_ids = self.tokenizer(piece, add_special_tokens=False).input_ids if piece else []
            if piece_ids:
                embeds.append(self._embed_ids(piece_ids))
                ids.extend(piece_ids)
            if i < len(markers):
                block_MD = latents[markers[i]].to(self.device, self.dtype)
                if block_MD.dim() != 2 or block_MD.shape[-1] != self.hidden_size:
                    raise ValueError(f"role {self.role}: latent for slot {markers[i]} has shape {tuple(block_MD.shape)}, "
                                     f"expected [M, {self.hidden_size}]")
                if self.latent_norm is not None:  # non-reference option, see set_latent_norm
                    block_MD = rescale_rows(block_MD, self.latent_norm)
                embeds.append(block_MD)
                ids.extend([-100] * block_MD.shape[0])
        return torch.cat(embeds, dim=0), torch.tensor(ids, dtype=torch.long)

    def embed_batch(self, users: list[str], latents: dict[str, torch.Tensor] | None = None):
        """Left-padded batch: (E_BLD, mask_BL). `latents` maps slot -> [B, M, D]."""
        return self.embed_batch_with_prefix(users, latents)[:2]

    def embed_batch_with_prefix(self, users: list[str], latents: dict[str, torch.Tensor] | None = None):
        """(E_BLD, mask_BL, prefix_ids): `prefix_ids[b]` are row b's tokens before its first latent block
        (the whole prompt without slots), the part whose KV `latent_rollout`/`decode` can reuse."""
        latents = latents or {}
        rows, prefix_ids = [], []
        for b, u in enumerate(users):
            e_LD, ids_L = self.embed_prompt(u, {k: v[b] for k, v in latents.items()})
            ids = ids_L.tolist()
            rows.append(e_LD)
            prefix_ids.append(ids[:ids.index(-100)] if -100 in ids else ids)
        return (*left_pad(rows), prefix_ids)

    def forward_hidden(self, e_BLD: torch.Tensor, mask_BL: torch.Tensor) -> torch.Tensor:
        """Last-layer hidden states [B, L, D] (after the final norm), no cache; grad as the caller enables."""
        return self.model.get_decoder()(inputs_embeds=e_BLD, attention_mask=mask_BL, position_ids=positions(mask_BL),
                                        use_cache=False).last_hidden_state

    def logits(self, h_BLD: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits from hidden states (applies the final soft-capping some families use)."""
        logits = self.model.get_output_embeddings()(h_BLD)
        cap = getattr(self.model.config.get_text_config(), "final_logit_softcapping", None)
        return torch.tanh(logits / cap) * cap if cap else logits

    # ----------------------------------------------------------------------------- latent thinking
    def _decoder_step(self, e_BLD, mask_BL, pos_BL, cache=None):
        kw = {cache_kw(): cache} if cache is not None else {}
        out = self.model.get_decoder()(inputs_embeds=e_BLD, attention_mask=mask_BL, position_ids=pos_BL,
                                       use_cache=True, **kw)
        return out.last_hidden_state, out_cache(out)

    @torch.no_grad()
    def latent_rollout(self, e_BLD: torch.Tensor, mask_BL: torch.Tensor, num_steps: int, *,
                       use_cache: bool = True, prefix_ids: list[list[int]] | None = None) -> torch.Tensor:
        """m latent steps; returns the raw last-layer states H_BMD (before any link).

        With the cache, the prompt is prefilled once and each inner(h) is one new position; without it,
        the whole prefix is re-run every step (the reference's O(m) full forwards; kept for checks).
        `prefix_ids` (from `embed_batch_with_prefix`) lets the prompt text before the first slot reuse
        the KV stored by earlier calls (static cache only).
        """
        if num_steps < 0:
            raise ValueError(f"latent_steps must be >= 0, got {num_steps}")
        B = e_BLD.shape[0]
        if num_steps == 0:
            return e_BLD.new_zeros(B, 0, self.hidden_size)
        if use_cache and self.engine.static_cache:
            if self.engine.continuous_batching and not torch.is_grad_enabled():
                return self.scheduler.merged_rollout(e_BLD, mask_BL, num_steps, prefix_ids=prefix_ids)
            return self._rollout_static(e_BLD, mask_BL, num_steps, prefix_ids)
        if use_cache:
            return self._rollout_dynamic(e_BLD, mask_BL, num_steps)
        hs = []
        for step in range(num_steps):
            out = self.model.get_decoder()(inputs_embeds=e_BLD, attention_mask=mask_BL,
                                           position_ids=positions(mask_BL), use_cache=False)
            h_BD = out.last_hidden_state[:, -1]
            hs.append(h_BD)
            e_BLD = torch.cat([e_BLD, self.inner_link(h_BD)[:, None]], dim=1)
            mask_BL = torch.cat([mask_BL, mask_BL.new_ones(B, 1)], dim=1)
        return torch.stack(hs, dim=1)

    def latent_rollout_with_grad(self, e_BLD: torch.Tensor, mask_BL: torch.Tensor, num_steps: int, *,
                                 detach_feedback: bool = False) -> torch.Tensor:
        """The m-step rollout with its autograd graph kept (outer training through an agent that receives
        latents): the growing dynamic cache (every step concatenates, nothing is written in place), the same
        steps as `latent_rollout`'s non-static cached path. Grad as the caller enables. `detach_feedback`: each
        fed-back inner(h) is cut from the graph (same values; gradient only through attention to the input)."""
        if num_steps < 1:
            raise ValueError(f"latent_steps must be >= 1 for a rollout with grad, got {num_steps}")
        return self._rollout_dynamic(e_BLD, mask_BL, num_steps, detach_feedback=detach_feedback)

    def _rollout_dynamic(self, e_BLD, mask_BL, num_steps: int, *, detach_feedback: bool = False) -> torch.Tensor:
        B, pos_BL, hs = e_BLD.shape[0], positions(mask_BL), []
        h_BLD, cache = self._decoder_step(e_BLD, mask_BL, pos_BL)
        for step in range(num_steps):
            h_BD = h_BLD[:, -1]
            hs.append(h_BD)
            if step == num_steps - 1:
                break
            mask_BL = torch.cat([mask_BL, mask_BL.new_ones(B, 1)], dim=1)
            pos_BL = pos_BL[:, -1:] + 1
            fed_BD = self.inner_link(h_BD)
            fed_BD = fed_BD.detach() if detach_feedback else fed_BD
            h_BLD, cache = self._decoder_step(fed_BD[:, None], mask_BL, pos_BL, cache)
        return torch.stack(hs, dim=1)

    def _prefill_static(self, run, e_BLD, mask_BL, extra: int, prefix_ids):
        store = self.prefix_store if self.engine.prefix_cache_mib > 0 else None
        out, pre = prefill_static(self.model, run, e_BLD, mask_BL, extra, prefix_ids=prefix_ids, store=store)
        self.last_prefill = {"tokens_prefilled": pre.tokens_prefilled, "tokens_reused": pre.tokens_reused}
        return out, pre

    def _hidden_run(self, e_BTD, mask_BS, pos_BT, cache):
        return self.model.get_decoder()(inputs_embeds=e_BTD, attention_mask=mask_BS, position_ids=pos_BT,
                                        use_cache=True, **{cache_kw(): cache}).last_hidden_state

    def _logits_run(self, e_BTD, mask_BS, pos_BT, cache, ids_BT=None):
        inputs = {"input_ids": ids_BT} if ids_BT is not None else {"inputs_embeds": e_BTD}
        return self.model(**inputs, attention_mask=mask_BS, position_ids=pos_BT, use_cache=True,
                          logits_to_keep=1, **{cache_kw(): cache}).logits[:, -1]

    def _step_fn(self, name: str):
        """The one-position step (`hidden` or `logits`), compiled when `engine.compile_step`."""
        fn = self._hidden_run if name == "hidden" else self._logits_run
        if not self.engine.compile_step:
            return fn
        if name not in self._compiled:
            self._compiled[name] = torch.compile(fn, dynamic=False)
        return self._compiled[name]

    def _rollout_static(self, e_BLD, mask_BL, num_steps: int, prefix_ids) -> torch.Tensor:
        """The cached rollout on a preallocated cache: H_BMD written in place, one position per step."""
        B = e_BLD.shape[0]
        h_BLD, pre = self._prefill_static(self._hidden_run, e_BLD, mask_BL, num_steps - 1, prefix_ids)
        h_BMD = h_BLD.new_empty(B, num_steps, h_BLD.shape[-1])
        h_BMD[:, 0] = h_BLD[:, -1]
        step, pos_B1 = self._step_fn("hidden"), pre.pos_B1
        for t in range(1, num_steps):
            pos_B1 = pos_B1 + 1
            h_BMD[:, t] = step(self.inner_link(h_BMD[:, t - 1])[:, None], pre.mask_BS, pos_B1, pre.cache)[:, -1]
        return h_BMD

    def messages(self, h_BMD: torch.Tensor, edges: tuple[str, ...] | list[str], *,
                 device: str | None = "cpu") -> dict[str, torch.Tensor]:
        """outer_{edge}(inner(H)) per edge, detached, on `device` (None: where computed, for NCCL)."""
        missing = [e for e in edges if e not in self.outer_links]
        if missing:
            raise ValueError(f"role {self.role}: no outer link attached for edges {missing}")
        with torch.no_grad():
            z_BMD = self.inner_link(h_BMD)
            out = {e: self.outer_links[e](z_BMD).detach() for e in edges}
            return out if device is None else {e: m.to(device) for e, m in out.items()}

    # ----------------------------------------------------------------------------- text
    @torch.no_grad()
    def decode(self, e_BLD: torch.Tensor, mask_BL: torch.Tensor, cfg: DecodeConfig, *,
               prefix_ids: list[list[int]] | None = None, on_token=None) -> list[Decoded]:
        """Decode text from embeddings with the KV cache; stops per sample at EOS or the budget.

        `prefix_ids` (from `embed_batch_with_prefix`) reuses stored prompt-prefix KV (static cache only).
        `on_token(ids)`, when given, is called after every decoding step with the token id picked per
        row (None for rows already done): what token-by-token streaming reads.
        """
        if cfg.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {cfg.max_new_tokens}")
        if self.engine.static_cache:
            tokens = self._decode_static(e_BLD, mask_BL, cfg, prefix_ids, on_token=on_token)
        else:
            state = self.prefill(e_BLD, mask_BL)
            tokens = self.generate(state, cfg, max_new_tokens=cfg.max_new_tokens, gen=self.make_generator(cfg),
                                   on_token=on_token)
        return [Decoded(self.detokenize(toks), len(toks)) for toks in tokens]

    def _decode_static(self, e_BLD, mask_BL, cfg: DecodeConfig, prefix_ids, *, on_token=None) -> list[list[int]]:
        """Decode on a preallocated cache (`decode_loop`: same picks as `generate`, fewer host syncs)."""
        if self.engine.continuous_batching:
            return self.scheduler.merged_decode(e_BLD, mask_BL, cfg, prefix_ids=prefix_ids, on_token=on_token)
        if cfg.do_sample and cfg.top_k < 0:
            cfg = dataclasses.replace(cfg, top_k=model_top_k(self.model))
        logits_BV, pre = self._prefill_static(self._logits_run, e_BLD, mask_BL, cfg.max_new_tokens - 1, prefix_ids)
        run, pos = self._step_fn("logits"), [pre.pos_B1]

        def step(ids_B1):
            pos[0] = pos[0] + 1
            return run(None, pre.mask_BS, pos[0], pre.cache, ids_B1)

        return decode_loop(logits_BV, step, cfg, gen=self.make_generator(cfg), pick=_pick,
                           eos=_eos_ids(self.model, self.tokenizer).to(self.device),
                           pad_id=self.tokenizer.pad_token_id or 0, sync_every=self.engine.decode_sync_every,
                           on_token=on_token)

    # Resumable decoding (the deliberation tool loop): prefill once, generate until a stop, feed the
    # tool result into the same cache, generate again. `decode` is prefill + one generate.
    def make_generator(self, cfg: DecodeConfig, seed_offset: int = 0) -> torch.Generator | None:
        """The sampling generator for `cfg` (None when greedy)."""
        if not cfg.do_sample:
            return None
        return torch.Generator(device=self.device).manual_seed(cfg.seed + seed_offset)

    @torch.no_grad()
    def prefill(self, e_BLD: torch.Tensor, mask_BL: torch.Tensor) -> DecodeState:
        """Run the prompt embeddings once and return the paused state (cache + next-token logits)."""
        pos_BL = positions(mask_BL)
        out = self.model(inputs_embeds=e_BLD, attention_mask=mask_BL, position_ids=pos_BL, use_cache=True,
                         logits_to_keep=1)
        return DecodeState(cache=out_cache(out), mask_BL=mask_BL, pos_BL=pos_BL[:, -1:],
                           logits_BV=out.logits[:, -1], fed=e_BLD.shape[1])

    @torch.no_grad()
    def feed(self, state: DecodeState, ids_BT: torch.Tensor, *, replace_pending: bool = False) -> None:
        """Append tokens [B, T] to the cache (after the pending token, unless `replace_pending` drops it)."""
        ids_BT = ids_BT.to(self.device)
        if state.pending_B is not None and not replace_pending:
            ids_BT = torch.cat([state.pending_B[:, None], ids_BT], dim=1)
        state.pending_B = None
        B, T = ids_BT.shape
        if T == 0:
            return
        mask_BL = torch.cat([state.mask_BL, state.mask_BL.new_ones(B, T)], dim=1)
        pos_BT = state.pos_BL + torch.arange(1, T + 1, device=state.pos_BL.device)
        out = self.model(input_ids=ids_BT, attention_mask=mask_BL, position_ids=pos_BT, use_cache=True,
                         logits_to_keep=1, **{cache_kw(): state.cache})
        state.cache, state.mask_BL, state.pos_BL = out_cache(out), mask_BL, pos_BT[:, -1:]
        state.logits_BV, state.fed = out.logits[:, -1], state.fed + T

    @torch.no_grad()
    def generate(self, state: DecodeState, cfg: DecodeConfig, *, max_new_tokens: int, gen=None,
                 stop_fn=None, on_token=None) -> list[list[int]]:
        """Generate up to `max_new_tokens` per row from a paused state; returns the new tokens per row.

        A row stops at EOS (kept in its list), at the budget, or when `stop_fn(row, tokens)` is true.
        The last picked token is left unfed in `state.pending_B`: `feed` (or the next `generate`)
        puts it into the cache first, so a caller can append text and continue where it stopped.
        """
        B = state.logits_BV.shape[0]
        eos = _eos_ids(self.model, self.tokenizer).to(self.device)
        if cfg.do_sample and cfg.top_k < 0:
            cfg = dataclasses.replace(cfg, top_k=model_top_k(self.model))
        tokens = [[] for _ in range(B)]
        done = torch.zeros(B, dtype=torch.bool, device=self.device)
        for _ in range(max_new_tokens):
            if state.pending_B is not None:
                self.feed(state, state.pending_B.new_zeros(B, 0))
            next_B = _pick(state.logits_BV.float(), cfg, gen)
            next_B = torch.where(done, torch.full_like(next_B, self.tokenizer.pad_token_id or 0), next_B)
            if on_token is not None:  # streaming: the picked token of every row still decoding
                on_token([None if done[b] else int(next_B[b]) for b in range(B)])
            for b in range(B):
                if not done[b]:
                    tokens[b].append(int(next_B[b]))
                    if stop_fn is not None and stop_fn(b, tokens[b]):
                        done[b] = True
            done |= torch.isin(next_B, eos)
            state.pending_B = next_B
            if bool(done.all()):
                break
        return tokens

    def detokenize(self, token_ids: list[int]) -> str:
        """Text of generated tokens, EOS and special tokens removed."""
        eos_list = set(_eos_ids(self.model, self.tokenizer).tolist())
        return self.tokenizer.decode([t for t in token_ids if t not in eos_list], skip_special_tokens=True)
