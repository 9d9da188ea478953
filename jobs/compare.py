"""Paired comparison of `jobs.run` output folders: which rows answer more of the same questions correctly?

  python -m jobs.compare out/own out/shuffled out/fresh [--names own,shuffled,fresh] [--output_path out/cmp]

Reads each folder's newest samples file and its fingerprint, pairs the samples by doc id (folders whose
question sets or grading/decoding settings differ are refused, one line, exit status 2), and prints per row
the correct answers strict (lenient) per split, tokens and seconds per question, and McNemar's exact test of
the first row against each other row with Holm-adjusted p; the table goes to OUTPUT_PATH/compare.json and
compare.md (`recmas_ray.eval.compare`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from recmas_ray.config.checks import NonEmpty, WritableDir
from recmas_ray.config.cli import run_job
from recmas_ray.eval.compare import compare_folders, markdown, write_table


@dataclass(kw_only=True)
class CompareConfig:
    """Which output folders to compare and where the table goes."""

    folders: Annotated[list[str], NonEmpty()] = field(default_factory=list)
    """Output folders of python -m jobs.run (also the leading positional arguments); the first is the reference
    every other row is tested against."""
    names: list[str] = field(default_factory=list)
    """A row name per folder (default: the folder's name)."""
    output_path: Annotated[str | None, WritableDir()] = None
    """Folder for compare.json and compare.md (default: the first folder's parent, under compare/)."""

    def validate(self) -> None:
        """Every folder is read and checked here, before anything is written."""
        self._table = compare_folders(list(self.folders), list(self.names) or None)


def main_cfg(cfg: CompareConfig) -> int:
    """Print the table and write it (compare.json, compare.md)."""
    table = getattr(cfg, "_table", None) or compare_folders(list(cfg.folders), list(cfg.names) or None)
    out = cfg.output_path or str(Path(cfg.folders[0]).resolve().parent / "compare")
    print(markdown(table))
    js, md = write_table(table, out)
    print(f"table: {md} ({js.name} beside it)")
    return 0


def positional(argv: list[str]) -> list[str]:
    """Leading arguments that are no flag are the folders: `DIR_A DIR_B ...` means `--folders DIR_A DIR_B ...`."""
    lead = []
    while len(lead) < len(argv) and not argv[len(lead)].startswith("-"):
        lead.append(argv[len(lead)])
    return (["--folders", *lead] if lead else []) + argv[len(lead):]


def main(argv=None) -> int:
    argv = positional(list(sys.argv[1:] if argv is None else argv))
    return run_job(main_cfg, CompareConfig, argv, prog="python -m jobs.compare", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
