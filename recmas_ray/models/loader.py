"""Model loading: turn a model name into a frozen (model, tokenizer) pair.

Every kind of name (tiny test models, packaged real models, a Hugging Face id or local path) resolves through
its kind in `registry.py`.
"""

from __future__ import annotations

import logging

import torch

from recmas_ray.models.registry import model_kind
from recmas_ray.models.tiny import CHAT_TEMPLATES, PLAIN_TEMPLATE

log = logging.getLogger(__name__)


def resolve_model_path(name: str) -> str:
    """Turn a model name into something `from_pretrained` accepts (offline for tiny: and pkg:), by its kind
    (`models.registry`)."""
    return model_kind(name).path(name)


def model_revision(name: str) -> str | None:
    """Which weights `name` means right now, without loading them (`ModelKind.revision`): the commit of a cached
    Hub snapshot, a hash of a local model folder's config.json, or the name itself for the kinds built from their
    name; None where nothing can be read (a Hub id not cached yet)."""
    return model_kind(name).revision(name)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` is bf16 on CUDA and fp32 on CPU (bf16 CPU numerics are too coarse for equivalence tests)."""
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; expected auto or one of {sorted(table)}")
    return table[dtype]


def plan_device_map(num_layers: int, devices: list[str], *, layer_prefix: str = "model.layers",
                    embed: str = "model.embed_tokens", tail: tuple[str, ...] = ("model.norm", "model.rotary_emb",
                                                                                  "lm_head")) -> dict[str, str]:
    """A device map that splits a decoder over `devices`, balanced by layer count (pure, no torch).

    Layers go in contiguous runs, the first `num_layers % K` devices taking one more; the
    embeddings sit with the first layer, the final norm and the LM head with the last, which is
    also where the agent puts its inner and outer links (`output_device`).
    """
    if not devices:
        raise ValueError("plan_device_map: no devices")
    if num_layers < len(devices):
        raise ValueError(f"plan_device_map: {num_layers} layers cannot be split over {len(devices)} devices")
    k = len(devices)
    per, extra = divmod(num_layers, k)
    out, layer = {embed: devices[0]}, 0
    for i, dev in enumerate(devices):
        for _ in range(per + (1 if i < extra else 0)):
            out[f"{layer_prefix}.{layer}"] = dev
            layer += 1
    out.update({name: devices[-1] for name in tail})
    return out


def output_device(model) -> torch.device:
    """The device of a model's last layer (its only device unless split with a device map)."""
    dmap = getattr(model, "hf_device_map", None)
    if dmap and len(set(map(str, dmap.values()))) > 1:
        last = dmap.get("lm_head", list(dmap.values())[-1])
        return torch.device(f"cuda:{last}" if isinstance(last, int) else last)
    return next(model.parameters()).device


def device_map_for(config, devices: list[str]) -> dict[str, str]:
    """`plan_device_map` with the module names of `config`'s model family (built on the meta device,
    no weights): its decoder-layer list, its input embeddings, and every other module off the path
    from the root to the layer list. Those that feed the embeddings (a multimodal model's vision
    tower and projector, which come before the language model) sit with the first device, the rest
    (final norm, rotary tables, LM head) with the last."""
    from accelerate import init_empty_weights  # lazy: accelerate loads only for multi-GPU device maps
    # lazy: transformers reads env settings on import; this module loads before the console sets them
    from transformers import AutoModelForCausalLM

    text = config.get_text_config()
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    names = dict((mod, name) for name, mod in model.named_modules())
    layers = [name for name, mod in model.named_modules()
              if isinstance(mod, torch.nn.ModuleList) and len(mod) == text.num_hidden_layers]
    if not layers:
        raise ValueError(f"{type(model).__name__}: no list of {text.num_hidden_layers} decoder layers to split")
    prefix, embed = layers[0], names[model.get_input_embeddings()]
    parts = prefix.split(".")
    path = {".".join(parts[:i]) for i in range(len(parts) + 1)}  # "" (the root) ... the layer list
    head, tail = [], []
    for ancestor in sorted(path - {prefix}, key=len, reverse=True):  # innermost first
        module = model.get_submodule(ancestor) if ancestor else model
        child_on_path = ".".join(parts[:ancestor.count(".") + 2 if ancestor else 1])
        seen_path = False
        for child, _ in module.named_children():
            full = f"{ancestor}.{child}" if ancestor else child
            if full == child_on_path:
                seen_path = True
            elif full != embed and full not in path:
                (tail if seen_path else head).append(full)
    dmap = plan_device_map(int(text.num_hidden_layers), devices, layer_prefix=prefix, embed=embed, tail=tuple(tail))
    dmap.update({name: devices[0] for name in head})
    return dmap


def _split_model_map(path: str, num_devices: int) -> dict[str, str]:
    """`device_map_for` over cuda:0..K-1: Ray narrows CUDA_VISIBLE_DEVICES to the role's K GPUs,
    so these are exactly the GPUs of its bundle."""
    # lazy: transformers reads env settings on import; this module loads before the console sets them
    from transformers import AutoConfig

    available = torch.cuda.device_count()
    if available < num_devices:
        raise ValueError(f"model split over {num_devices} GPUs, but torch sees {available}")
    return device_map_for(AutoConfig.from_pretrained(path), [f"cuda:{i}" for i in range(num_devices)])


def load_frozen_model(name: str, *, dtype: torch.dtype, device: torch.device | str = "cpu", num_devices: int = 1):
    """Load (model, tokenizer) frozen: eval mode, requires_grad False, left padding.

    `num_devices` > 1 (CUDA only) splits the model over cuda:0..K-1 with `plan_device_map`.
    """
    # lazy: transformers reads env settings on import; this module loads before the console sets them
    from transformers import AutoModelForCausalLM, AutoTokenizer
    # lazy: transformers reads env settings on import; this module loads before the console sets them
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
    if num_devices > 1 and torch.device(device).type == "cuda":
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=_split_model_map(path, num_devices))
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer
