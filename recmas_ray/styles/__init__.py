"""Registry of collaboration styles: `get_style(name)` returns a validated `StyleSpec`.

A new style is one `StyleSpec` declaration: a module of this package is listed in `STYLES` below, one anywhere
else (a user's file, a test) joins with `register_style` (docs/architecture.md, "Adding a style";
tests/extensions/toy_style.py).
"""

from recmas_ray.config.checks import ConfigTypeError
from recmas_ray.config.extensions import note_extension
from recmas_ray.styles.base import (StyleSpec, Step, build_schedule, question_with_interface, render_prompt,
                                   render_single_agent_prompt, split_edge)
from recmas_ray.styles.deliberation import DELIBERATION
from recmas_ray.styles.distillation import DISTILLATION
from recmas_ray.styles.mixture import MIXTURE
from recmas_ray.styles.sequential import SEQUENTIAL, SEQUENTIAL_SCALED

# sequential_light / sequential_scaled share one declaration; they differ only in their paper base models
# (`StyleSpec.presets`). `mas_design` names of the original training tool are aliases.
STYLES: dict[str, StyleSpec] = {
    "sequential": SEQUENTIAL, "sequential_light": SEQUENTIAL, "sequential_scaled": SEQUENTIAL_SCALED,
    "mixture": MIXTURE, "distillation": DISTILLATION, "deliberation": DELIBERATION,
}
ALIASES = {"hie": "mixture", "distill": "distillation"}


def register_style(style: StyleSpec) -> StyleSpec:
    """Add a style: its name becomes a `style` choice of every job and `System.build`. The declaration is
    validated first; the same declaration again is a no-op, another one under a taken name raises ValueError. A
    module outside the package that calls this is imported by the Ray processes a run starts too
    (`config.extensions`)."""
    style.validate()
    other = STYLES.get(style.name)
    if (other is not None and other != style) or style.name in ALIASES:
        raise ValueError(f"style {style.name!r} is already registered")
    STYLES[style.name] = style
    note_extension()
    return style


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


def style_names() -> tuple[str, ...]:
    """Every style name and alias (the choices of a config's `style` field)."""
    return tuple(sorted(STYLES)) + tuple(sorted(ALIASES))


def tool_styles() -> tuple[str, ...]:
    """Names of the styles whose decoder may run the tool loop (`StyleSpec.uses_tools`)."""
    return tuple(sorted({s.name for s in STYLES.values() if s.uses_tools}))


def check_role_models(flag: str, table: dict[str, str], style_name: str, *, extra: tuple[str, ...] = ()) -> None:
    """ROLE=VALUE tables (--role_model, --ckpt_override): every key a role of the style (or in `extra`),
    no empty value; raises ValueError naming the flag, the bad key and what was expected."""
    roles = list(get_style(style_name).roles)
    bad = sorted(set(table) - set(roles) - set(extra))
    if bad:
        expected = f"roles of {style_name} {roles}" + (f" or {' / '.join(extra)}" if extra else "")
        raise ValueError(f"{flag} names {bad}; expected {expected}")
    wrong = next(((k, v) for k, v in table.items() if not isinstance(k, str) or not isinstance(v, str)), None)
    if wrong is not None:  # a config file or Python caller; never str() a value that may be huge

        raise ConfigTypeError(f"{flag} {wrong[0]!s:.40}=...: expected ROLE=TEXT with text values, got "
                        f"{type(wrong[1]).__name__}")
    empty = sorted(k for k, v in table.items() if not v.strip())
    if empty:
        raise ValueError(f"{flag} {empty[0]}=: empty value")


__all__ = ["ROLE_ALIASES", "STYLES", "StyleSpec", "Step", "build_schedule", "canonical_role", "check_role_models",
           "get_style", "question_with_interface", "register_style", "render_prompt", "render_single_agent_prompt",
           "split_edge", "style_names", "tool_styles"]
