"""Field help that does not need the source: the attribute docstrings of every config dataclass, shipped as data.

A config field's help is the string literal under it, which Python keeps only in the source. `class_docs(cls)`
reads it from the source when `inspect` can find it, and otherwise from `field_docs.json`, written next to this
file by `python -m recmas_ray.config.field_docs` from the package's own sources (a test checks that the file
matches them), so `--help` stays complete where only bytecode is installed.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import sys
import textwrap
from pathlib import Path

DOCS_FILE = Path(__file__).with_name("field_docs.json")
PACKAGES = ("recmas_ray", "jobs")
"""Top-level packages whose dataclasses are collected (from the folder that holds recmas_ray)."""


def docs_of_class_node(node: ast.ClassDef) -> dict[str, str]:
    """field -> docstring of one class body: an annotated assignment followed by a string literal."""
    docs = {}
    for prev, cur in zip(node.body, node.body[1:]):
        if isinstance(prev, ast.AnnAssign) and isinstance(prev.target, ast.Name) and isinstance(cur, ast.Expr) \
                and isinstance(cur.value, ast.Constant) and isinstance(cur.value.value, str):
            docs[prev.target.id] = " ".join(cur.value.value.split())
    return docs


def collect(root: Path | None = None) -> dict[str, dict[str, str]]:
    """"module.Class" -> field docs, for every top-level class with field docstrings in PACKAGES' sources."""
    root = root or Path(__file__).resolve().parents[2]
    out: dict[str, dict[str, str]] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef) and (docs := docs_of_class_node(node)):
                    out[f"{module}.{node.name}"] = docs
    return out


@functools.cache
def _shipped() -> dict[str, dict[str, str]]:
    try:
        return json.loads(DOCS_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def class_docs(klass) -> dict[str, str]:
    """The field docs of one class (not its bases): from its source, else from the shipped table, else {}."""
    if not dataclasses.is_dataclass(klass):
        return {}
    try:
        node = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]
        if isinstance(node, ast.ClassDef):
            return docs_of_class_node(node)
    except (OSError, TypeError, IndexError, SyntaxError):
        pass
    return dict(_shipped().get(f"{klass.__module__}.{klass.__qualname__}", {}))


def main() -> int:
    """Write field_docs.json from the sources next to this package."""
    DOCS_FILE.write_text(json.dumps(collect(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {DOCS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
