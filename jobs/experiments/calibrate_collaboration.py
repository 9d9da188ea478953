"""Calibrate a collaboration task before training for it: can any channel help the decoder at all?

A collaboration task is worth a trained run only where the decoder told the upstream fact in text beats the
decoder alone (McNemar p < 0.01 on the same questions) and the decoder alone is neither at the floor nor at the
ceiling. This job measures exactly that, for each (task, decoder model, format help) cell, on validation
questions only (`train.splits`: never a test question), each row one `python -m jobs.run --method single_agent`
of the product:

    data/<task>/validation.jsonl        the decoder's question (the fact is told to the first stage only)
    data/<task>/validation_told.jsonl   the same rows, the question stating the fact
    <task>-<decoder>[-format_help]/{alone,told}/   jobs.run output folders
    calibration.json, calibration.md    per cell: alone and told strict (lenient) / n, McNemar p, the verdict

    python -m jobs.experiments.calibrate_collaboration --tasks choose compare --num_questions 64
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from jobs import run as eval_job
from recmas_ray.config.checks import OneOf, Range, WritableDir
from recmas_ray.config.cli import run_job
from recmas_ray.config.tree import save_config
from recmas_ray.eval.compare import compare_folders
from recmas_ray.eval.results import library_versions
from recmas_ray.models.registry import GEMMA3_270M, SMOLLM2_135M
from recmas_ray.train.synthetic import write_jsonl
from recmas_ray.train.synthetic_facts import COLLABORATION_TASKS, make_fact_dataset, told_rows

STYLE = "distillation"
"""The one-hop style: its learner is the decoder whose prompt the rows use."""
DECODERS = {"smollm2": SMOLLM2_135M, "gemma3": GEMMA3_270M}
"""Decoder models tried (the main job's two families)."""
ALPHA = 0.01
"""Told must beat alone at this McNemar p."""
MARGIN = 0.1
"""The decoder alone must be above this share and below 1 - this share (neither floor nor ceiling)."""


@dataclass
class CalibrateConfig:
    """Which collaboration tasks and decoders to calibrate, on how many validation questions."""

    tasks: Annotated[list[str], OneOf(COLLABORATION_TASKS)] = field(default_factory=lambda: ["choose", "compare"])
    """Collaboration tasks (`train.synthetic_facts.COLLABORATION_TASKS`)."""
    decoders: Annotated[list[str], OneOf(tuple(DECODERS))] = field(default_factory=lambda: list(DECODERS))
    """Decoder models tried (`DECODERS`)."""
    num_questions: Annotated[int, Range(8, 64)] = 64
    """Validation questions per task (the validation split holds about 67 facts)."""
    seed: int = 0
    """Question draw and decoding seed."""
    max_new_tokens: Annotated[int, Range(1, 4096)] = 16
    """Decoded tokens per answer, as the main job's rows."""
    backend: Annotated[str, OneOf(("local", "ray"))] = "local"
    """jobs.run --backend of every row."""
    output_path: Annotated[str, WritableDir()] = "out/calibrate_collaboration"
    """Folder for the question files, the rows' output folders and calibration.json / .md."""


def write_questions(task: str, num: int, seed: int, folder: Path) -> tuple[Path, Path]:
    """(validation, validation_told) files of `task`: validation facts only, ids 0..num-1."""
    rows = [{**r, "id": i} for i, r in enumerate(make_fact_dataset(task, STYLE, num, seed=seed, split="validation"))]
    told = told_rows(rows)
    folder.mkdir(parents=True, exist_ok=True)
    return write_jsonl(rows, folder / "validation.jsonl"), write_jsonl(told, folder / "validation_told.jsonl")


def run_row(data: Path, decoder: str, format_help: bool, out: Path, cfg) -> Path:
    """One single-agent row through jobs.run (skipped when its results are there: the job resumes)."""
    if not any(out.glob("results_*.json")):
        argv = ["--style", STYLE, "--preset", "demo", "--models", f"learner={DECODERS[decoder]}", "--task", "qa",
                "--dataset", str(data), "--method", "single_agent", "--backend", cfg.backend,
                "--max_new_tokens", str(cfg.max_new_tokens), "--batch_size", "32", "--seed", str(cfg.seed),
                "--output_path", str(out), "--no_progress", *(["--format_help"] if format_help else [])]
        if eval_job.main(argv) != 0:
            raise RuntimeError(f"jobs.run {' '.join(argv)} failed")
    return out


def cell(task: str, decoder: str, format_help: bool, files: tuple[Path, Path], root: Path, cfg) -> dict:
    """Alone vs told for one (task, decoder, format help): counts, McNemar (strict and lenient), the verdict."""
    name = f"{task}-{decoder}" + ("-format_help" if format_help else "")
    folders = [run_row(f, decoder, format_help, root / name / row, cfg) for f, row in zip(files, ("told", "alone"))]
    table = compare_folders([str(f) for f in folders], ["told", "alone"])
    told, alone = (r["counts"]["all"] for r in table["rows"])
    p, p_lenient = table["tests"]["all"][0]["p"], table["tests_lenient"]["all"][0]["p"]
    n = alone["n"]
    useful = (told["correct"] > alone["correct"] and p < ALPHA and told["correct_lenient"] > alone["correct_lenient"]
              and p_lenient < ALPHA and MARGIN * n < alone["correct"] < (1 - MARGIN) * n)
    return {"cell": name, "task": task, "decoder": DECODERS[decoder], "format_help": format_help, "n": n,
            "told": told, "alone": alone, "p": p, "p_lenient": p_lenient, "calibrated": useful}


def markdown(cells: list[dict]) -> str:
    """The cells as one markdown table (calibration.md)."""
    lines = ["| task | decoder | format help | alone strict (lenient) | told strict (lenient) | McNemar p strict / "
             "lenient | a channel can help |", "|---|---|---|---|---|---|---|"]
    for c in cells:
        a, t = c["alone"], c["told"]
        lines.append(f"| {c['task']} | {c['decoder']} | {'yes' if c['format_help'] else 'no'} | "
                     f"{a['correct']} ({a['correct_lenient']}) / {c['n']} | {t['correct']} ({t['correct_lenient']}) / "
                     f"{c['n']} | {c['p']:.2g} / {c['p_lenient']:.2g} | {'yes' if c['calibrated'] else 'no'} |")
    return "\n".join(lines)


def main_cfg(cfg: CalibrateConfig) -> int:
    root = Path(cfg.output_path)
    save_config(cfg, root)  # the resolved config next to the results
    cells = []
    for task in cfg.tasks:
        files = write_questions(task, cfg.num_questions, cfg.seed, root / "data" / task)
        for decoder in cfg.decoders:
            for format_help in (False, True):
                cells.append(cell(task, decoder, format_help, (files[1], files[0]), root, cfg))
                print(markdown(cells[-1:]).splitlines()[-1], flush=True)
    (root / "calibration.json").write_text(json.dumps({"cells": cells, "seed": cfg.seed, "alpha": ALPHA,
                                                       "margin": MARGIN, "versions": library_versions()}, indent=2))
    (root / "calibration.md").write_text(markdown(cells) + "\n")
    print(markdown(cells))
    return 0


def main(argv=None) -> int:
    """Command line: parse, check, run; bad input is one line and exit 2."""
    return run_job(main_cfg, CalibrateConfig, argv, prog="calibrate_collaboration", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
