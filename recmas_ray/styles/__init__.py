"""Registry of collaboration styles: `get_style(name)` returns a validated `StyleSpec`."""

from recmas_ray.styles.base import (StyleSpec, Step, build_schedule, question_with_interface, render_prompt,
                                   render_single_agent_prompt, split_edge)
from recmas_ray.styles.deliberation import DELIBERATION
from recmas_ray.styles.distillation import DISTILLATION
from recmas_ray.styles.mixture import MIXTURE
from recmas_ray.styles.sequential import SEQUENTIAL

# sequential_light / sequential_scaled share one declaration; they differ only in their base models
# (see `recmas_ray.system.presets`). `mas_design` names of the original training tool are aliases.
STYLES: dict[str, StyleSpec] = {
    "sequential": SEQUENTIAL, "sequential_light": SEQUENTIAL, "sequential_scaled": SEQUENTIAL,
    "mixture": MIXTURE, "distillation": DISTILLATION, "deliberation": DELIBERATION,
}
ALIASES = {"hie": "mixture", "distill": "distillation"}


def get_style(name: str) -> StyleSpec:
    """Look up a style by name, raising ValueError listing the known names."""
    key = ALIASES.get(name, name)
    if key not in STYLES:
        raise ValueError(f"unknown style {name!r}; expected one of {sorted(STYLES)}")
    style = STYLES[key]
    style.validate()
    return style


# Role names of the original training tool (`--mas_role`) -> the role in our style declarations.
ROLE_ALIASES = {
    "refiner": "critic",
    "hie_math_expert": "math", "hie_code_expert": "code", "hie_science_expert": "science",
    "hie_summarizer": "summarizer",
    "distill_expert": "expert", "distill_learner": "learner",
    "deliberation_reflector": "reflector", "deliberation_toolcaller": "toolcaller",
}


def canonical_role(style: StyleSpec, name: str) -> str:
    """A role of `style` from its own name or an alias of the original tool; ValueError otherwise."""
    role = ROLE_ALIASES.get(name, name)
    if role not in style.roles:
        aliases = sorted(a for a, r in ROLE_ALIASES.items() if r in style.roles)
        raise ValueError(f"unknown role {name!r} for style {style.name}; expected one of {list(style.roles)} "
                         f"or an alias {aliases}")
    return role


__all__ = ["ROLE_ALIASES", "STYLES", "StyleSpec", "Step", "build_schedule", "canonical_role", "get_style",
           "question_with_interface", "render_prompt", "render_single_agent_prompt", "split_edge"]
