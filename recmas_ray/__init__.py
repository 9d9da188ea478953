"""recmas_ray: RecursiveMAS on Ray, frozen LLM agents of different families collaborating through latent states.

Public API (documented, keyword-only after the first argument):

    import recmas_ray as rm
    with rm.System.build("sequential_light", role_models={"planner": "tiny:qwen3"}, backend="local") as system:
        out = system.generate(["What is 7 * 8?"], num_recursive_rounds=2, latent_steps=8)
    rm.train_inner(...), rm.train_outer(...)

Importing the package is light: the names below load their modules (torch, transformers, Ray) on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__all__ = ["System", "SampleResult", "train_inner", "train_outer"]

_LAZY = {"System": "recmas_ray.api", "SampleResult": "recmas_ray.engine.runner", "train_inner": "recmas_ray.train_api",
         "train_outer": "recmas_ray.train_api"}

if TYPE_CHECKING:
    from recmas_ray.api import System
    from recmas_ray.engine.runner import SampleResult
    from recmas_ray.train_api import train_inner, train_outer


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'recmas_ray' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
