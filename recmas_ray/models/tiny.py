"""Tiny random-weight test models of four families, built offline: `tiny:qwen3|llama|gemma3|mistral`.

Each has its own hidden size and a family-style chat template over a lossless byte-level tokenizer.
They are built once into the model cache and saved as normal HF folders, then loaded through
`from_pretrained` exactly like real models, so tests and real runs share one code path. The chat
templates double as fallbacks for real base checkpoints that ship none (see `loader.py`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from recmas_ray.models.cache import cache_root

TINY_VERSION = "v1"

_BYTE_SPECIALS = [
    "<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|begin_of_text|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<bos>", "<start_of_turn>", "<end_of_turn>",
    "[INST]", "[/INST]",
]

# Family-style chat templates. Gemma's and Mistral's refuse a system turn, like the real templates
# of those families did, so the agent's "merge system into user" fallback is exercised by tests.
CHAT_TEMPLATES = {
    "qwen3": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
    ),
    "llama": (
        "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    "gemma3": (
        "<bos>{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
        "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
    "mistral": (
        "<s>{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
        "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]{% else %}{{ m['content'] }}</s>{% endif %}"
        "{% endfor %}"
    ),
}
PLAIN_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
_EOS = {"qwen3": "<|im_end|>", "llama": "<|eot_id|>", "gemma3": "<end_of_turn>", "mistral": "</s>"}


@dataclass(frozen=True)
class TinySpec:
    """Architecture of one tiny random-weight family."""

    family: str
    hidden_size: int
    intermediate_size: int
    head_dim: int


TINY_FAMILIES = {
    "qwen3": TinySpec("qwen3", 64, 128, 16),
    "llama": TinySpec("llama", 96, 192, 24),
    "gemma3": TinySpec("gemma3", 128, 256, 32),
    "mistral": TinySpec("mistral", 256, 512, 64),
}


def build_byte_tokenizer(family: str):
    """A lossless byte-level BPE tokenizer (no merges) with the family's specials and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # lazy: optional dependency
    # lazy: transformers reads env settings on import; this module loads before the console sets them
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(_BYTE_SPECIALS)}
    for sym in sorted(alphabet):
        vocab[sym] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token=_EOS[family], pad_token="<pad>", padding_side="left",
        additional_special_tokens=[t for t in _BYTE_SPECIALS if t not in ("<pad>", "<s>", _EOS[family])],
    )
    fast.chat_template = CHAT_TEMPLATES[family]
    return fast


def _tiny_config(spec: TinySpec, vocab_size: int):
    # lazy: transformers reads env settings on import; this module loads before the console sets them
    import transformers as tf

    common = dict(
        vocab_size=vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    if spec.family == "qwen3":
        return tf.Qwen3Config(head_dim=spec.head_dim, **common)
    if spec.family == "llama":
        return tf.LlamaConfig(head_dim=spec.head_dim, **common)
    if spec.family == "gemma3":
        return tf.Gemma3TextConfig(
            head_dim=spec.head_dim, sliding_window=64, layer_types=["sliding_attention", "full_attention"], **common
        )
    return tf.MistralConfig(head_dim=spec.head_dim, sliding_window=None, **common)


def ensure_tiny_model(family: str) -> Path:
    """Build `tiny:<family>` once into the cache (atomic rename, safe under races) and return its folder."""
    if family not in TINY_FAMILIES:
        raise ValueError(f"unknown tiny model family {family!r}; expected one of {sorted(TINY_FAMILIES)}")
    out = cache_root() / "tiny" / f"{family}-{TINY_VERSION}"
    if (out / "config.json").exists():
        return out
    # lazy: transformers reads env settings on import; this module loads before the console sets them
    from transformers import AutoModelForCausalLM

    tokenizer = build_byte_tokenizer(family)
    eos_id = tokenizer.convert_tokens_to_ids(_EOS[family])
    cfg = _tiny_config(TINY_FAMILIES[family], len(tokenizer))
    cfg.eos_token_id = eos_id
    torch.manual_seed(1000 + sorted(TINY_FAMILIES).index(family))
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{family}-", dir=out.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        os.replace(tmp, out)
    except OSError:  # another process won the race; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return out


