"""Modules outside the package that extended its registries (a task family, a style, a transport), so that the
Ray processes a run starts import them too.

A registration function (`tasks.register_task`, `styles.register_style`, `config.transport.register_transport`)
notes the module that called it; the Ray layer hands `extension_modules()` to the processes that look things up
by name (the orchestrator renders prompts for a task family by its name), which `import_extensions` there, so the
same registrations run. Such a module must be importable by name where Ray runs (a file on PYTHONPATH or in an
installed package, not a script run as `__main__`). Pure Python: the ground floor.
"""

from __future__ import annotations

import importlib
import sys

EXTENSION_MODULES: list[str] = []
"""Modules that registered something, in the order they did (the package's own modules are not listed)."""


def note_extension(depth: int = 1) -> None:
    """Record the module of the function `depth` frames above the caller (the one calling a registration
    function) when it lies outside the package."""
    module = sys._getframe(depth + 1).f_globals.get("__name__", "")
    if module and module != "__main__" and module.split(".")[0] != "recmas_ray" and module not in EXTENSION_MODULES:
        EXTENSION_MODULES.append(module)


def extension_modules() -> tuple[str, ...]:
    """The modules a Ray process must import to know what this one registered."""
    return tuple(EXTENSION_MODULES)


def import_extensions(modules) -> None:
    """Import `modules` (a process the Ray layer started), which register their extensions here too."""
    for module in modules:
        importlib.import_module(module)
