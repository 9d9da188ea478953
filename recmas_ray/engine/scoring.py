"""Teacher forcing on an agent: the assistant turn a target becomes, and THE scorer of targets after a prompt.

`Agent` inherits these methods; they need its `tokenizer`, `embed_prompt`, `_embed_ids`, `forward_hidden`,
`logits` and `device`. Training (inner and outer loops) builds its inputs with `embed_teacher_forced`; answer
likelihoods (the demo's NLL, lm-eval's loglikelihood) come from `score_targets`.
"""

from __future__ import annotations

import torch

from recmas_ray.engine.decoding import TargetScore
from recmas_ray.engine.kv_cache import left_pad


class TeacherForcing:
    """Target-side methods of `Agent` (see the module docstring)."""

    def assistant_turn_end(self) -> str:
        """What the chat template writes after an assistant message's text (Qwen: `<|im_end|>` and a newline),
        found by rendering [user, assistant]; the EOS token when the template shows none."""
        from jinja2.exceptions import TemplateError  # lazy: jinja2 loads only when a chat template fails

        if self._turn_end is None:
            mark = "\x00RECMAS-TURN\x00"
            try:
                full = self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": "q"}, {"role": "assistant", "content": mark}], tokenize=False)
            except (TemplateError, ValueError):  # no usable template: fall back to EOS
                full = ""
            end = full[full.index(mark) + len(mark):] if mark in full else ""
            self._turn_end = end or (self.tokenizer.eos_token or "")
        return self._turn_end

    def embed_teacher_forced(self, user: str, latents: dict[str, torch.Tensor] | None, target: str, *,
                             literal_slots: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Prompt + the gold assistant turn as the chat template renders it (text + its end, e.g. `<|im_end|>\\n`):
        (E_LD, ids_L with -100 at latents, assistant_mask_L over that turn). Training only.

        Gradients flow into the spliced latent blocks (used by outer-loop training).
        """
        target_ids = self.tokenizer(target + self.assistant_turn_end(), add_special_tokens=False).input_ids
        e_LD, ids_L = self.embed_prompt(user, latents, literal_slots=literal_slots)
        e_LD = torch.cat([e_LD, self._embed_ids(target_ids)], dim=0)
        ids_L = torch.cat([ids_L, torch.tensor(target_ids, dtype=torch.long)])
        assistant_L = torch.zeros(ids_L.shape[0], dtype=torch.bool)
        assistant_L[-len(target_ids):] = True
        return e_LD, ids_L, assistant_L

    @torch.no_grad()
    def target_nll(self, users: list[str], latents: dict[str, torch.Tensor] | None, targets: list[str], *,
                   per_token: bool = False) -> list[float] | list[list[float]]:
        """Mean token NLL of each target as the assistant turn after its chat prompt (`per_token`: each target's
        token NLLs instead, in the order of `target_token_offsets`); see `score_targets`."""
        scored = self.score_targets(users, latents, targets)
        return [s.token_nll for s in scored] if per_token else [s.mean_nll for s in scored]

    @torch.no_grad()
    def score_targets(self, users: list[str], latents: dict[str, torch.Tensor] | None, targets: list[str], *,
                      continuation: bool = False) -> list[TargetScore]:
        """THE teacher-forced scorer: each target after the prompt `decode` starts from (`embed_prompt`, latents
        spliced in; `latents` maps slot -> [B, M, D]).

        Default: the target is the assistant turn as the chat template renders it, turn end included
        (`embed_teacher_forced`, as in training). `continuation`: the target's raw tokens right after the
        prompt (lm-eval's loglikelihood of a continuation).
        """
        latents = latents or {}
        rows, targets_L = [], []
        for b, (user, target) in enumerate(zip(users, targets)):
            lat = {k: v[b] for k, v in latents.items()}
            if continuation:
                e_LD, _ = self.embed_prompt(user, lat)
                ids = self.tokenizer(target, add_special_tokens=False).input_ids
                if not ids:
                    raise ValueError(f"continuation {target!r} has no tokens")
                rows.append(torch.cat([e_LD, self._embed_ids(ids)], dim=0))
                targets_L.append(torch.tensor([-100] * e_LD.shape[0] + list(ids), dtype=torch.long))
            else:
                e_LD, ids_L, asst_L = self.embed_teacher_forced(user, lat, target)
                rows.append(e_LD)
                targets_L.append(torch.where(asst_L, ids_L, torch.full_like(ids_L, -100)))
        e_BLD, mask_BL = left_pad(rows)
        ids_BL = torch.full(mask_BL.shape, -100, dtype=torch.long, device=self.device)
        for b, t_L in enumerate(targets_L):
            ids_BL[b, ids_BL.shape[1] - t_L.shape[0]:] = t_L.to(self.device)
        # targets are right-aligned: vocabulary logits only where a target token is predicted (the prompt's
        # positions would cost most of the lm-head work for nothing, V up to 262k here)
        cols = (ids_BL != -100).any(0).nonzero()
        first = max(int(cols[0, 0]) - 1, 0) if len(cols) else ids_BL.shape[1] - 2  # predicts the first target
        h_BLD = self.forward_hidden(e_BLD, mask_BL)[:, first:-1]
        logp_BLV = torch.log_softmax(self.logits(h_BLD).float(), dim=-1)
        tgt_BL = ids_BL[:, first + 1:]
        keep_BL = tgt_BL != -100
        tok_nll_BL = -logp_BLV.gather(-1, tgt_BL.clamp(min=0)[..., None])[..., 0] * keep_BL
        hit_BL = (logp_BLV.argmax(-1) == tgt_BL) | ~keep_BL
        return [TargetScore(row[keep].tolist(), bool(hit.all())) for row, keep, hit in zip(tok_nll_BL, keep_BL, hit_BL)]

    def target_token_offsets(self, target: str) -> list[tuple[int, int]]:
        """Character span in `target` of each token `target_nll` scores (the turn's end: spans past the text)."""
        enc = self.tokenizer(target + self.assistant_turn_end(), add_special_tokens=False,
                             return_offsets_mapping=True)
        return [tuple(o) for o in enc["offset_mapping"]]

