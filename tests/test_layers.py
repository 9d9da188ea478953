"""The tree's floors, read from its folders, and its imports: at module level and inside functions.

Every module of ``recmas_ray`` and ``jobs`` sits on the floor of its folder; a module may import only from its own
floor or the floors below, whether at module level or inside a function (an import deferred into a function still
makes the module depend on its target at run time). Floors, bottom to top, and the folders on each:

  ground       config/: the config mechanism and leaf types (flags, checks, file readers, shared choices);
               console/: what a job prints and its log file (from a job's first second, no heavy imports)
  engine       plain torch, no Ray: engine/ (links, agent, KV cache, scheduler, decoding, scoring, runner, relay,
               pool, service), models/, styles/, tools/, sandbox/, tasks/ (the task families: instructions,
               answer formats, graders, benchmark sources and loaders, plain Python the styles' prompts read)
  system       system/: what a system is: plan, presets, checkpoints, cards, hub (uses the engine, never Ray)
  distributed  distributed/: the thin Ray layer: actors, placement, role copies, running systems and replicas
  top          train/, eval/, serve/: what people run: training, evaluation, serving; and the package root's own
               modules (the public API, lm-eval, tracking)
  jobs         jobs/ (outside the package, run from the checkout): may import anything of the package

Every folder of the package with a module is listed in ``FOLDERS``: a new folder states its floor. Two graphs
are built with ``ast``: the top-level ``import`` / ``from`` statements (those a ``try`` at top level runs
included; ``if TYPE_CHECKING:`` blocks left out), which is what importing a module pulls in, and the imports inside functions and methods. The
floor rule holds for both graphs with no exception; cycles are checked over the module-level graph and over both
graphs together (a function-level import that closes a circle is a circle all the same). A job config whose
checks need styles, the system or the benchmarks lives with its job (``eval/config.py``, ``train/config.py``).

Imports sit at the top of each module: at most 10% of a tree's imports may sit inside functions, each with a
``# lazy: <reason>`` comment (an optional or slow dependency, a module that --help loads and that must not import
torch, Ray only where it runs, the sandboxed child's boot text). ``python tests/test_layers.py --imports`` prints
the share of imports that sit inside functions.
"""
from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ("recmas_ray", "jobs")

FLOORS = ("ground", "engine", "system", "distributed", "top", "jobs")
LEVEL = {name: i for i, name in enumerate(FLOORS)}

# Folder (relative to the repository root) -> floor; a module's floor is its own folder's.
FOLDERS = {
    "recmas_ray/config": "ground", "recmas_ray/console": "ground",
    "recmas_ray/engine": "engine", "recmas_ray/models": "engine", "recmas_ray/styles": "engine",
    "recmas_ray/tools": "engine", "recmas_ray/sandbox": "engine", "recmas_ray/tasks": "engine",
    "recmas_ray/system": "system",
    "recmas_ray/distributed": "distributed",
    "recmas_ray": "top", "recmas_ray/train": "top", "recmas_ray/eval": "top", "recmas_ray/serve": "top",
    "jobs": "jobs",
}

@functools.lru_cache(maxsize=1)
def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package and of jobs/."""
    out = {}
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def floor_of(module: str) -> str:
    """The floor of ``module``: its folder's (a folder not in FOLDERS sits on the floor of the nearest listed
    folder above it, but ``test_every_folder_is_listed`` asks for every folder by name)."""
    path = modules().get(module)
    assert path is not None, f"{module} is no module of the tree"
    folder = path.relative_to(ROOT).parent.as_posix()
    while folder not in FOLDERS and "/" in folder:
        folder = folder.rpartition("/")[0]
    assert folder in FOLDERS, f"{module} is on no floor: add its folder to FOLDERS"
    return FOLDERS[folder]


def _top_level_imports(tree: ast.Module):
    """Import nodes executed when the module is imported (top level and top-level try blocks)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.Try):
            stack.extend(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])


def _function_imports(tree: ast.Module):
    """Import nodes the module does not run on import (inside functions and classes' methods)."""
    top = {id(n) for n in _top_level_imports(tree)}
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in top]


def _package_targets(mod: str, path: Path, node, mods: dict[str, Path]) -> set[str]:
    """The package modules one import statement of ``mod`` pulls in."""

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    else:
        if node.level:
            base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        # ``from pkg import submodule`` depends on the submodule; any other name on ``pkg`` itself.
        targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in mods else source for a in node.names]
    out = set()
    for target in targets:
        if target.split(".")[0] in TREES:
            dep = resolve(target)
            if dep and dep != mod:
                out.add(dep)
    return out


def import_graph(select=_top_level_imports) -> dict[str, set[str]]:
    """Module -> the package modules it imports at module level (or, with ``select=_function_imports``,
    inside its functions)."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in select(ast.parse(path.read_text(), str(path))):
            graph[mod] |= _package_targets(mod, path, node, mods)
    return graph


def upward_imports(graph) -> list[tuple[str, str]]:
    """(importer, imported) pairs where the imported module sits on a higher floor."""
    return sorted((a, b) for a, deps in graph.items() for b in deps if LEVEL[floor_of(b)] > LEVEL[floor_of(a)])


def cycles(graph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_floor():
    for mod in modules():
        floor_of(mod)


def test_every_folder_is_listed():
    """Each folder of the package holding a module names its floor in FOLDERS (no floor by inheritance, no
    per-module exception); jobs/ is one floor, its subfolders included."""
    folders = {p.relative_to(ROOT).parent.as_posix() for p in modules().values()}
    unlisted = sorted(f for f in folders if f.startswith("recmas_ray") and f not in FOLDERS)
    assert not unlisted, f"folders on no floor (add them to FOLDERS): {unlisted}"


def test_no_upward_imports():
    up = upward_imports(import_graph())
    assert not up, "imports running up a floor:\n" + "\n".join(
        f"  {a} ({floor_of(a)}) -> {b} ({floor_of(b)})" for a, b in up)


def test_no_upward_imports_inside_functions():
    """A deferred import is still a dependency: no function imports a module of a higher floor (e.g. the ground
    floor's console never reaches into the Ray layer; the Ray layer's start-up lives there)."""
    up = upward_imports(import_graph(_function_imports))
    assert not up, "imports inside functions running up a floor:\n" + "\n".join(
        f"  {a} ({floor_of(a)}) -> {b} ({floor_of(b)})" for a, b in up)


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join("  " + " <-> ".join(c) for c in found)


def test_no_import_cycles_counting_function_imports():
    top, inner = import_graph(), import_graph(_function_imports)
    found = cycles({m: top[m] | inner[m] for m in top})
    assert not found, "import cycles (function-level imports included):\n" + "\n".join(
        "  " + " <-> ".join(c) for c in found)


def _third_party(path: Path) -> set[str]:
    """Top-level package names a module imports at module level."""
    out = set()
    for node in _top_level_imports(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        out |= {n.split(".")[0] for n in names if n and not (isinstance(node, ast.ImportFrom) and node.level)}
    return out


def test_engine_imports_no_ray_and_config_no_torch():
    """Model and engine code knows nothing about Ray (style guide, principle 1); the config floor imports
    neither torch nor Ray, so every job's --help is instant."""
    for mod, path in modules().items():
        level, imported = LEVEL[floor_of(mod)], _third_party(path)
        if level <= LEVEL["system"]:
            assert "ray" not in imported, f"{mod} imports Ray"
        if level == LEVEL["ground"]:
            assert not imported & {"torch", "transformers"}, f"{mod} imports {sorted(imported & {'torch', 'transformers'})}"


def _imports_in_functions(tree: ast.Module) -> list[ast.stmt]:
    """Import statements inside functions or methods (nested ones counted once)."""
    found = {id(n): n for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return sorted(found.values(), key=lambda n: n.lineno)


def function_import_share(trees=TREES) -> tuple[int, int]:
    """(import statements inside functions or methods, all import statements) over the modules of ``trees``."""
    inner = total = 0
    for mod, path in modules().items():
        if mod.split(".")[0] not in trees:
            continue
        tree = ast.parse(path.read_text(), str(path))
        total += sum(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(tree))
        inner += len(_imports_in_functions(tree))
    return inner, total


MAX_FUNCTION_IMPORT_SHARE = 0.10
"""A module's top says what it needs: at most this share of a tree's imports may sit inside functions."""
LAZY = "# lazy:"


def unexplained_function_imports(tree_name: str) -> list[str]:
    """``path:line`` of each import inside a function of ``tree_name`` with no ``# lazy: <reason>`` comment ending
    one of its lines or on the line above it."""
    out = []
    for mod, path in modules().items():
        if mod.split(".")[0] != tree_name:
            continue
        text = path.read_text()
        lines = text.splitlines()
        for node in _imports_in_functions(ast.parse(text, str(path))):
            own = lines[node.lineno - 1:node.end_lineno]
            above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
            if not any(LAZY in line for line in own) and not above.startswith(LAZY):
                out.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return out


@pytest.mark.parametrize("tree_name", TREES)
def test_imports_sit_at_the_top(tree_name):
    """Imports sit at the top of each module: at most 10% of a tree's imports inside functions, each of those with
    its reason (``# lazy: optional dependency``, ``# lazy: --help must not import torch``, ...)."""
    inner, total = function_import_share((tree_name,))
    assert inner <= MAX_FUNCTION_IMPORT_SHARE * total, (
        f"{tree_name}: {inner} of {total} imports ({100 * inner / total:.1f}%) sit inside functions (at most "
        f"{100 * MAX_FUNCTION_IMPORT_SHARE:.0f}%): move them to the module's top")
    missing = unexplained_function_imports(tree_name)
    assert not missing, (f"{tree_name}: imports inside functions without a `{LAZY} <reason>` comment (on the line "
                         "or the line above):\n  " + "\n  ".join(missing))


if __name__ == "__main__":
    if "--imports" in sys.argv:
        for trees in (TREES, ("recmas_ray",), ("jobs",)):
            inner, total = function_import_share(trees)
            print(f"{' + '.join(trees)}: {inner} of {total} imports ({100 * inner / total:.1f}%) sit inside functions")
        sys.exit(0)
    pytest.main([__file__, "-v", "-x"])
