"""The rows the main job's product pipeline evaluates per fact task, and its report read from the results files.

A row is one `python -m jobs.run` on the saved system folder: a name, the extra jobs.run arguments that make it
that row, which question file it reads and which links it loads. Adding a row is one line in `ROWS`. The report
(`report_tasks`, `lead_lines`) reads only the samples files those runs wrote (`eval.compare`), in the shape the
experiment path's report uses (`demo.sweep_rows.row_from_measure`), so the lead lines keep their format:

    STYLE / TASK (SPLIT), R=1: trained links carry the fact: X/N own vs Y/N shuffled vs Z/N fresh (McNemar p ...)
"""

from __future__ import annotations

from dataclasses import dataclass

from recmas_ray.train.synthetic_facts import COLLABORATION_TASKS


@dataclass(frozen=True)
class Row:
    """One evaluation row of a fact task."""

    name: str
    """Row name: the output folder under eval/ and the row's name in the comparison table."""
    args: tuple[str, ...]
    """The jobs.run arguments that make this row (method, latent ablation, ...), beside the shared ones."""
    data: str = "test"
    """Which question file: test (the held-out rows) or told (the same rows, the question stating the fact)."""
    links: str = "trained"
    """trained (--links SYSTEM_FOLDER: inner and outer links) or inner (--ckpt_override of the inner links only:
    fresh outer links of the seed)."""
    measured_as: str | None = None
    """The experiment path's name of the same row (`demo.sweep_rows.MEASURED`), so the verdicts read it."""


ROWS: tuple[Row, ...] = (
    # the trained system's agents: these rows share one start-up (jobs.run's agents kept, eval.batch_runner)
    Row("own", ("--method", "recursive_mas"), measured_as="trained"),
    Row("shuffled", ("--method", "recursive_mas", "--latent_ablation", "shuffle"), measured_as="shuffled"),
    Row("zeroed", ("--method", "recursive_mas", "--latent_ablation", "zero"), measured_as="zeroed"),
    Row("floor", ("--method", "single_agent"), measured_as="single_floor"),
    Row("ceiling", ("--method", "single_agent"), data="told", measured_as="single_ceiling"),
    Row("textmas", ("--method", "textmas"), measured_as="textmas"),
    # ---- fair text rows (issue 48, item 3; jobs.run's methods and switches)
    Row("text_relay", ("--method", "text_relay")),
    Row("rollout_as_text", ("--method", "rollout_as_text")),
    # ---- rows whose agents differ (the decoder's prompts, the outer links): a start-up each
    Row("ceiling_format_help", ("--method", "single_agent", "--format_help"), data="told"),
    Row("fresh", ("--method", "recursive_mas"), links="inner", measured_as="fresh"),
    Row("untrained_links", ("--method", "recursive_mas", "--outer_init", "untrained")),
    # ---- more rows: one line each here
)
"""Every row the product pipeline runs, in order; the first is the reference of the paired tests."""

SPLIT_NAMES = {"seen": "seen values", "unseen": "unseen values"}
"""The `split` field of a test row -> the split's name in the lead lines (as the experiment path names them)."""


def measured(table: dict, row_name: str, docs: list[str]) -> dict:
    """One row of the comparison table as the experiment path's measurement (correct strict and lenient per
    question, in `docs` order), read from the samples files."""
    row = next(r for r in table["rows"] if r["name"] == row_name)
    return {"correct": [row["correct_per_doc"][d] for d in docs],
            "correct_lenient": [row["correct_lenient_per_doc"][d] for d in docs]}


def split_positions(table: dict, split_of: dict[str, str | None]) -> dict[str, list[int]]:
    """Positions (in the table's doc order) of each split, named as the lead lines name them, plus
    "all held-out" when there are several."""
    docs = table["rows"][0]["correct_per_doc"]
    order = list(docs)
    parts: dict[str, list[int]] = {}
    for i, d in enumerate(order):
        parts.setdefault(SPLIT_NAMES.get(split_of.get(d) or "", split_of.get(d) or "held-out"), []).append(i)
    if len(parts) > 1:
        parts["all held-out"] = list(range(len(order)))
    return parts


def report_tasks(style: str, task: str, table: dict, split_of: dict[str, str | None]) -> list[dict]:
    """One report task per split (`demo.verdicts` / `demo.report` input), every row from the samples files."""
    from jobs.experiments.demo.sweep_rows import row_from_measure

    docs = list(table["rows"][0]["correct_per_doc"])
    names = {r["name"] for r in table["rows"]}
    runs = {row.measured_as: measured(table, row.name, docs) for row in ROWS
            if row.measured_as and row.name in names}
    order = [m for m in ("single_floor", "single_ceiling", "textmas", "trained", "shuffled", "zeroed", "fresh")
             if m in runs]
    return [{"style": style, "task": f"{task} ({split})", "collaboration": task in COLLABORATION_TASKS,
             "rows": [row_from_measure(m, runs[m], positions=pos, rounds=1) for m in order]}
            for split, pos in split_positions(table, split_of).items()]


CONTROLS = {"shuffled": "shuffled", "zeroed": "zeroed", "fresh": "fresh links", "untrained_links": "untrained links"}
"""Rows that must score below own latents for the links to carry the fact (row name -> its name in the lines)."""
TEXT_ROWS = {"text_relay": "text relay", "rollout_as_text": "rollout as text", "ceiling": "told in text",
             "ceiling_format_help": "told + format help", "floor": "decoder alone", "textmas": "TextMAS"}
"""The text rows and the single agent, beside own latents on the same questions."""
CHANNEL_ALPHA = 0.01
"""Holm-adjusted level the control tests must pass, strict and lenient."""
SPLIT_ORDER = ("seen", "unseen", "all")


def _cell(row: dict, split: str) -> str:
    c = row["counts"][split]
    return f"{c['correct']} ({c['correct_lenient']})"


def _p(tests: dict, split: str, name: str) -> float:
    return next(t["p_holm"] for t in tests[split] if t["row"] == name)


def product_lines(style: str, task: str, table: dict) -> list[str]:
    """The main job's first lines for one task, from its comparison table (`eval.compare`, pooled over seeds):
    per split, own latents against every control (verdict: carry the fact where each is below own at Holm p <
    CHANNEL_ALPHA, strict and lenient), then the text rows with own's Holm p against each, strict / lenient."""
    rows = {r["name"]: r for r in table["rows"]}
    seeds = ", ".join(table.get("groups") or ["?"])
    lines = []
    for split in [s for s in SPLIT_ORDER if s in table["splits"]]:
        own, n = rows["own"], rows["own"]["counts"][split]["n"]
        name = {"all": "all held-out", "seen": "seen values", "unseen": "unseen values"}[split]
        if split == "all" and len(table["splits"]) == 1:
            name = "held-out"
        controls = [k for k in CONTROLS if k in rows]
        holds = all(_p(table[key], split, k) < CHANNEL_ALPHA and rows[k]["counts"][split][field]
                    < own["counts"][split][field] for k in controls
                    for key, field in (("tests", "correct"), ("tests_lenient", "correct_lenient")))
        lines.append(f"{style} / {task} ({name}, n={n}, seeds {seeds}): trained links "
                     f"{'carry the fact' if holds else 'do not show the fact'}: own {_cell(own, split)} vs "
                     + ", ".join(f"{CONTROLS[k]} {_cell(rows[k], split)}" for k in controls)
                     + " correct, strict (lenient); Holm p vs each "
                     + ", ".join(f"{_p(table['tests'], split, k):.2g}/{_p(table['tests_lenient'], split, k):.2g}"
                                 for k in controls) + " (strict/lenient)")
        text = [k for k in TEXT_ROWS if k in rows]
        if text:
            lines.append("    same questions as text: " + ", ".join(f"{TEXT_ROWS[k]} {_cell(rows[k], split)}"
                                                               for k in text)
                         + "; own vs each, Holm p " + ", ".join(
                             f"{_p(table['tests'], split, k):.2g}/{_p(table['tests_lenient'], split, k):.2g}"
                             for k in text) + " (strict/lenient)")
        per = table.get("per_group") or {}
        if len(per) > 1:
            lines.append("    per seed, own / shuffled / text relay: " + "; ".join(
                f"seed {g} " + " / ".join(_seed_cell(t, k, split) for k in ("own", "shuffled", "text_relay")
                                         if any(r["name"] == k for r in t["rows"]))
                for g, t in per.items()))
    return lines


def _seed_cell(table: dict, name: str, split: str) -> str:
    c = next(r for r in table["rows"] if r["name"] == name)["counts"][split]
    return f"{c['correct']}/{c['n']}"


def lead_lines(tasks: list[dict]) -> list[str]:
    """The experiment path's lead lines (`demo.facts.lead_lines`) of these report tasks."""
    from jobs.experiments.demo.facts import lead_lines as lines

    return lines(tasks)


__all__ = ["Row", "ROWS", "report_tasks", "lead_lines", "product_lines"]
