"""Startup hook that makes `lm_eval --model recmas_ray ...` work without importing anything first.

lm-eval 0.4.13 finds models only in its own registry and reads no plug-in entry points, so the installed
`recmas_ray_lmeval.pth` (see setup.py) calls `install()` when Python starts. That puts one finder at the
front of `sys.meta_path` which does nothing until `lm_eval.models` is imported; then, right after that
module has filled lm-eval's registry, it adds `recmas_ray` as a lazy placeholder ("module:Class", the
form lm-eval uses for its own models). recmas_ray.lmeval, torch and the models load only when lm-eval
asks for the `recmas_ray` model. On lm-eval's command line (`lm_eval --model recmas_ray ...`) the finder also
checks the model_args as soon as lm-eval's CLI module has loaded, so a typo is one line and exit status 2
within a second or two, not a traceback after lm-eval has indexed its tasks. This module imports nothing beyond `sys` and `os` at startup, and the
.pth line loads it from its file without importing the `recmas_ray` package, so whichever checkout is
first on `sys.path` once the program runs (a test run's working tree, say) is the recmas_ray it imports.

Set RECMAS_RAY_LMEVAL_HOOK=0 to leave lm-eval untouched.
"""

import os
import sys

MODEL_NAME = "recmas_ray"
MODEL_TARGET = "recmas_ray.lmeval:RecMASLM"
WATCHED_MODULE = "lm_eval.models"
CLI_MODULE = "lm_eval._cli"


def register(model_registry) -> None:
    """Add the lazy placeholder unless the model (or its placeholder) is registered already."""
    if MODEL_NAME not in model_registry:
        model_registry.register(MODEL_NAME, target=MODEL_TARGET)


def _after_models() -> None:
    try:
        from lm_eval.api.registry import model_registry  # lazy: optional dependency

        register(model_registry)
    except Exception as exc:  # a registry of another lm-eval version: say so, never break lm-eval
        print(f"recmas_ray: could not register the lm-eval model {MODEL_NAME!r}: {exc}; use "
              f"`python -m recmas_ray.lmeval` instead", file=sys.stderr)


def _after_cli() -> None:
    argv = sys.argv[1:]
    if MODEL_NAME not in argv and f"--model={MODEL_NAME}" not in argv:
        return  # another model: nothing of ours loads
    try:
        # lazy: the startup hook loads recmas_ray only for lm-eval's CLI
        from recmas_ray.lmeval import check_cli_model_args
    except Exception:  # noqa: BLE001 - recmas_ray not importable in this program: lm-eval reports it later
        return
    check_cli_model_args(argv)  # a bad model_args exits 2 with one line


class _AfterLmEvalModels:
    """Meta-path finder: lets the normal finders locate a watched lm-eval module, then acts after it runs."""

    def __init__(self):
        self.pending = {WATCHED_MODULE: _after_models, CLI_MODULE: _after_cli}

    def find_spec(self, name, path=None, target=None):
        action = self.pending.pop(name, None)
        if action is None:
            return None
        if not self.pending:
            sys.meta_path[:] = [f for f in sys.meta_path if f is not self]  # done watching
        for finder in sys.meta_path:
            spec = finder.find_spec(name, path, target) if finder is not self and hasattr(finder, "find_spec") \
                else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module = loader.exec_module

        def exec_module(module):
            run_module(module)
            action()

        loader.exec_module = exec_module
        return spec


def install() -> None:
    """Called from the .pth file at interpreter start; idempotent."""
    if os.environ.get("RECMAS_RAY_LMEVAL_HOOK", "1") == "0" or WATCHED_MODULE in sys.modules:
        return
    if not any(isinstance(f, _AfterLmEvalModels) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterLmEvalModels())
