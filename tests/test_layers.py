"""The package's floors, read from its own imports: at module level and inside functions.

Every module of ``recmas_ray`` sits on one floor; a module may import only from its own floor or the floors below,
whether at module level or inside a function (an import deferred into a function still makes the module depend on
its target at run time). Two graphs are built with ``ast``: the top-level ``import`` / ``from`` statements (those a
``try`` at top level runs included; ``if TYPE_CHECKING:`` blocks left out), which is what importing a module pulls
in, and the imports inside functions and methods. Floors, bottom to top:

  ground       the config mechanism and leaf types (``config/``): flags, checks, file readers, shared choices
  engine       plain torch, no Ray: links, KV cache, decoding, agent, models, styles, runner, agent pool, service,
               tools, sandbox;
               and the task families (``eval/tasks``: instructions, answer formats, graders, loaders; the code
               graders they run), plain Python the styles' prompts read
  system       what a system is: plan, presets, checkpoints, cards, hub (uses the engine, never Ray)
  distributed  the thin Ray layer: actors, placement, role copies, running systems and replicas (orchestrator, router)
  top          what people run: training, evaluation, serving, lm-eval, tracking, the public API

``jobs/`` lies outside the package and may import anything. The floor rule holds for both graphs with no
exception; cycles are checked over the module-level graph and over both graphs together (a function-level import
that closes a circle is a circle all the same). A job config whose checks need styles, the system or the
benchmarks lives with its job (``eval/config.py``, ``train/config.py``).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "recmas_ray"

# (floor, module prefixes); a module belongs to the floor of its longest matching prefix.
FLOORS = [
    ("ground", ["recmas_ray.config", "recmas_ray.console"]),
    ("engine", ["recmas_ray.links", "recmas_ray.kv_cache", "recmas_ray.scheduler", "recmas_ray.decoding", "recmas_ray.scoring",
                "recmas_ray.agent", "recmas_ray.models", "recmas_ray.styles", "recmas_ray.runner",
                "recmas_ray.relay", "recmas_ray.pool",
                "recmas_ray.service", "recmas_ray.tools", "recmas_ray.sandbox", "recmas_ray.eval.tasks",
                "recmas_ray.eval.code_graders", "recmas_ray.eval.code_suites", "recmas_ray.eval.code_checks"]),
    ("system", ["recmas_ray.system"]),
    ("distributed", ["recmas_ray.distributed"]),
    ("top", ["recmas_ray", "recmas_ray.train", "recmas_ray.eval", "recmas_ray.serve",
             "recmas_ray.api", "recmas_ray.train_api", "recmas_ray.lmeval", "recmas_ray._lmeval_hook",
             "recmas_ray.tracking"]),
]
LEVEL = {name: i for i, (name, _) in enumerate(FLOORS)}


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def floor_of(module: str) -> str:
    """The floor of ``module`` (longest matching prefix in FLOORS)."""
    best, best_len = None, -1
    for name, prefixes in FLOORS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = name, len(prefix)
    assert best is not None, f"{module} is on no floor: add it to FLOORS"
    return best


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
        if target == "recmas_ray" or target.startswith("recmas_ray."):
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


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
