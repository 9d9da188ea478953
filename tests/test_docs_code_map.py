"""docs/architecture.md's code map names only files and folders that exist.

A path written in backticks (`recmas_ray/engine/links.py`, `config/`, `probe.py`) resolves from the repository root or
the package's folder (the prose says `distributed/launch.py`), or, inside a row of a table, from the folder of any
path the row's first cell names (the code map lists a folder, then its files by bare name). A name that resolves nowhere is a stale map: a file moved or removed without the docs.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
# Backticked names that look like paths: a file with a source or config suffix, or a folder ending in "/".
PATH_RE = re.compile(r"`([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*(?:\.(?:py|sh|md|json|yaml|toml|txt)|/))`")


def _bases(row: str) -> list[Path]:
    """The folders a table row's bare names may live in: the root, and the folders of its first cell's paths."""
    bases = [ROOT, ROOT / "recmas_ray"]
    cells = [c for c in row.split("|") if c.strip()]
    if cells:
        for name in PATH_RE.findall(cells[0]):
            path = ROOT / name
            for folder in (path if name.endswith("/") else path.parent, path.parent):
                if folder not in bases:
                    bases.append(folder)
    return bases


def missing_paths(text: str) -> list[str]:
    """Every backticked path of `text` that exists under none of its line's bases."""
    missing = []
    for line in text.splitlines():
        bases = _bases(line) if line.lstrip().startswith("|") else [ROOT, ROOT / "recmas_ray"]
        for name in PATH_RE.findall(line):
            if not any((base / name).exists() for base in bases):
                missing.append(name)
    return missing


def test_every_path_the_code_map_names_exists():
    assert missing_paths(DOC.read_text(encoding="utf-8")) == []


def test_a_stale_name_is_found():
    row = "| `recmas_ray/eval/` | `run.py` (an evaluation run), `gone_module.py` |"
    assert missing_paths(row) == ["gone_module.py"]
    assert missing_paths("see `recmas_ray/nowhere/`") == ["recmas_ray/nowhere/"]
