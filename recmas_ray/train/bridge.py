"""The ridge "bridge" initialisation of the outer links (non-reference, `--outer_init bridge`; docs/training.md).

An outer link receives the source's inner-link output, which the inner loop trains to sit in the source's
input-embedding space, and must emit vectors in the target's input-embedding space. Tokens whose text is
the same in both vocabularies give paired rows (source embedding, target embedding); the ridge regression
between them is a linear map that already sends a source token's embedding near the target's embedding of
the same text. `links.init_bridge` puts it into `residual_proj` (MLP ~0, output scale matched).
"""

from __future__ import annotations

import torch

from recmas_ray.links import init_bridge


def vocabulary_strings(tokenizer) -> dict[str, int]:
    """Decoded text -> token id for every ordinary token (special tokens, blanks and duplicates left out)."""
    special = set(tokenizer.all_special_ids)
    out: dict[str, int] = {}
    for i in range(len(tokenizer)):
        if i in special:
            continue
        text = tokenizer.decode([i])
        if text.strip() and "\ufffd" not in text and text not in out:
            out[text] = i
    return out


def shared_token_pairs(src_tokenizer, dst_tokenizer, *, max_pairs: int = 20000) -> tuple[list[int], list[int]]:
    """(source ids, target ids) of tokens with the same text in both vocabularies (at most `max_pairs`, the
    lowest source ids first: byte-pair vocabularies put their frequent tokens there)."""
    src, dst = vocabulary_strings(src_tokenizer), vocabulary_strings(dst_tokenizer)
    pairs = sorted((i, dst[t]) for t, i in src.items() if t in dst)[:max_pairs]
    if len(pairs) < 16:
        raise ValueError(f"only {len(pairs)} tokens have the same text in both vocabularies: too few for a bridge")
    return [a for a, _ in pairs], [b for _, b in pairs]


@torch.no_grad()
def bridge_outer_links(plan, *, ridge: float, dtype: str = "float32", max_pairs: int = 20000) -> dict[str, int]:
    """Initialise every outer link of `plan` (in place) as the ridge bridge between its roles' token embeddings.

    Loads each role's base model once on CPU (before training starts). Returns edge -> number of paired tokens.
    """
    from recmas_ray.models.loader import load_frozen_model, resolve_dtype

    loaded: dict[str, tuple] = {}  # by model name: roles on one base model share it

    def model_of(role):
        name = plan.role_models[role]
        if name not in loaded:
            loaded[name] = load_frozen_model(name, dtype=resolve_dtype(dtype, torch.device("cpu")),
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
    import gc

    gc.collect()
    return counts
