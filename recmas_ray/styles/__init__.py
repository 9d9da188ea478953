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


__all__ = ["STYLES", "StyleSpec", "Step", "build_schedule", "get_style", "question_with_interface", "render_prompt",
           "render_single_agent_prompt", "split_edge"]
