"""Paired comparison of evaluation outputs: the folders `jobs.run` wrote, one row per folder and method.

Each folder holds a samples file (`samples_<bench>_<time>.jsonl`, the newest is read) and its fingerprint
(`eval.fingerprint`). Samples pair by doc id, so the rows must answer the same questions: the same doc ids with
the same gold answers (the question text may differ: a ceiling row's question states the fact) and the same
grading and decoding (`PAIRED_FIELDS` of the fingerprints); anything else is refused with one line
(`CompareError`). Per row: correct answers strict (math-verify) and lenient (the release's rules), per split
where the samples carry a `split` field, text tokens and seconds per question, and McNemar's exact test
(strict, and lenient) of the first row against each other row, each family Holm-adjusted (`eval.stats`);
`compare_pooled` pools several paired sets (one per seed) into one table.

    table = compare_folders(["out/own", "out/shuffled", "out/fresh"])
    print(markdown(table)); write_table(table, "out/compare")
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from recmas_ray.eval.samples import read_samples, with_verdicts
from recmas_ray.eval.stats import holm, mcnemar_exact

PAIRED_FIELDS = ("recursion.decode", "grader", "format_retry", "seed", "num_rollouts", "dtype", "batch_size")
"""Fingerprint fields every compared folder must share (dotted paths): the same decoding, grading, seed and
rollouts, so that the rows differ only in method, links, ablation or question wording."""
ALL_SPLITS = "all"
"""The name of the whole question set among the per-split counts."""


class CompareError(ValueError):
    """Folders that cannot be compared (no samples, errored samples, other questions or settings)."""


def samples_file(folder: str | Path) -> Path:
    """The newest samples file of an output folder (`jobs.run --output_path`)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CompareError(f"{folder}: no such folder; expected an output folder of python -m jobs.run")
    files = sorted(p for p in folder.glob("samples_*.jsonl"))
    if not files:
        raise CompareError(f"{folder}: no samples_*.jsonl; expected an output folder of python -m jobs.run")
    return max(files, key=lambda p: p.stat().st_mtime_ns)


def _dotted(d: dict, path: str):
    for part in path.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def load_rows(folder: str | Path, name: str | None = None) -> list[dict]:
    """One row per method in the folder's newest samples file: {"name", "folder", "method", "samples" (doc id ->
    record, rollout 0), "fingerprint"}."""
    path = samples_file(folder)
    side = path.with_name(path.stem + ".fingerprint.json")
    try:
        fingerprint = json.loads(side.read_text(encoding="utf-8")) if side.exists() else {}
    except (OSError, ValueError) as e:
        raise CompareError(f"{side}: unreadable fingerprint ({' '.join(str(e).split())})") from None
    records = [with_verdicts(r) for r in read_samples(path) if r.get("rollout", 0) == 0]
    errored = [r["doc_id"] for r in records if r.get("error")]
    if errored:
        raise CompareError(f"{path}: {len(errored)} errored samples (doc {errored[0]}, ...); rerun that jobs.run "
                           "with --resume first")
    methods = list(dict.fromkeys(r["method"] for r in records))
    base = name or Path(folder).name
    return [{"name": base if len(methods) == 1 else f"{base}/{m}", "folder": str(folder), "method": m,
             "samples": {str(r["doc_id"]): r for r in records if r["method"] == m}, "fingerprint": fingerprint}
            for m in methods]


def check_paired(rows: list[dict]) -> None:
    """Every row answers the same questions (doc ids, gold answers) under the same `PAIRED_FIELDS`."""
    if len(rows) < 2:
        raise CompareError(f"{len(rows)} row(s) to compare; expected two or more output folders or methods")
    first = rows[0]
    gold = {d: s["gold"] for d, s in first["samples"].items()}
    for row in rows[1:]:
        other = {d: s["gold"] for d, s in row["samples"].items()}
        if set(other) != set(gold):
            only_a, only_b = sorted(set(gold) - set(other)), sorted(set(other) - set(gold))
            raise CompareError(f"{row['name']} ({row['folder']}) answers other questions than {first['name']}: "
                               f"{len(only_a)} doc ids only in the first (e.g. {only_a[:1]}), {len(only_b)} only in "
                               f"it (e.g. {only_b[:1]}); expected the same question set")
        wrong = [d for d in gold if str(gold[d]) != str(other[d])]
        if wrong:
            raise CompareError(f"{row['name']} ({row['folder']}): doc {wrong[0]} has gold {other[wrong[0]]!r}, "
                               f"{first['name']} has {gold[wrong[0]]!r} ({len(wrong)} such); expected the same "
                               "questions")
        for fld in PAIRED_FIELDS:
            a, b = _dotted(first["fingerprint"], fld), _dotted(row["fingerprint"], fld)
            if a != b:
                raise CompareError(f"{row['name']} ({row['folder']}): fingerprint {fld} is {json.dumps(b)}, "
                                   f"{first['name']} has {json.dumps(a)}; expected the same for a paired comparison")


def _mean(xs: list) -> float:
    got = [float(x) for x in xs if x is not None]
    return sum(got) / len(got) if got else float("nan")


def _counts(samples: dict, docs: list[str]) -> dict:
    strict = sum(bool(samples[d]["correct_strict"]) for d in docs)
    lenient = sum(bool(samples[d]["correct_reference"] or samples[d]["correct_strict"]) for d in docs)
    return {"n": len(docs), "correct": strict, "correct_lenient": lenient}


def compare_rows(rows: list[dict]) -> dict:
    """The table of checked rows (`load_rows`): per row counts (overall and per split), tokens and seconds per
    question, per-doc outcomes, and McNemar (strict) of the first row against each other, Holm-adjusted."""
    check_paired(rows)
    docs = sorted(rows[0]["samples"], key=lambda d: (len(d), d))
    split_of = {d: rows[0]["samples"][d].get("split") for d in docs}
    splits = [ALL_SPLITS] + sorted({s for s in split_of.values() if s})
    in_split = {s: [d for d in docs if s == ALL_SPLITS or split_of[d] == s] for s in splits}
    out_rows = []
    for row in rows:
        s = row["samples"]
        out_rows.append({
            "name": row["name"], "folder": row["folder"], "method": row["method"],
            "counts": {sp: _counts(s, ds) for sp, ds in in_split.items()},
            "tokens_per_question": _mean([s[d].get("tokens") for d in docs]),
            "seconds_per_question": _mean([s[d].get("latency_s") for d in docs]),
            "correct_per_doc": {d: bool(s[d]["correct_strict"]) for d in docs},
            "correct_lenient_per_doc": {d: bool(s[d]["correct_reference"] or s[d]["correct_strict"]) for d in docs}})
    tests, tests_lenient = {}, {}
    for sp, ds in in_split.items():
        for out, field in ((tests, "correct_per_doc"), (tests_lenient, "correct_lenient_per_doc")):
            ref = out_rows[0][field]
            family = [{"row": r["name"], **mcnemar_exact([ref[d] for d in ds], [r[field][d] for d in ds])}
                      for r in out_rows[1:]]
            for t, adj in zip(family, holm([t["p"] for t in family])):
                t["p_holm"] = adj
            out[sp] = family
    return {"reference": out_rows[0]["name"], "splits": splits, "rows": out_rows, "tests": tests,
            "tests_lenient": tests_lenient}


def compare_folders(folders: list[str], names: list[str] | None = None) -> dict:
    """`compare_rows` of output folders (`names`: a row name per folder, default the folder's name)."""
    if names and len(names) != len(folders):
        raise CompareError(f"--names: {len(names)} names for {len(folders)} folders; expected one per folder")
    rows = [r for i, f in enumerate(folders) for r in load_rows(f, names[i] if names else None)]
    return compare_rows(rows)


def compare_pooled(groups: dict[str, list[str]], names: list[str] | None = None) -> dict:
    """One table over several paired sets of output folders (e.g. one per seed: its own training and question
    draw), `groups`: label -> folders in the same row order. Each set is checked as `compare_folders` checks it;
    the rows are then pooled by position, doc ids prefixed "LABEL/", so the counts and McNemar tests are over
    every question of every set (`per_group` keeps each set's own table)."""
    if not groups:
        raise CompareError("no output folders to pool; expected one set of folders per seed")
    per_group, pooled = {}, None
    for label, folders in groups.items():
        rows = [r for i, f in enumerate(folders) for r in load_rows(f, names[i] if names else None)]
        per_group[label] = compare_rows(rows)
        if pooled is None:
            pooled = [{**r, "samples": {}} for r in rows]
        elif [r["name"] for r in rows] != [r["name"] for r in pooled]:
            raise CompareError(f"set {label}: rows {[r['name'] for r in rows]}; expected the first set's "
                               f"{[r['name'] for r in pooled]}")
        for into, row in zip(pooled, rows):
            into["samples"].update({f"{label}/{d}": rec for d, rec in row["samples"].items()})
    table = compare_rows(pooled) if len(groups) > 1 else next(iter(per_group.values()))
    return {**table, "groups": list(groups), "per_group": per_group}


def _fmt(x: float, digits: int = 1) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def markdown(table: dict) -> str:
    """The table as markdown: a row per compared row, a column per split (strict (lenient) / n), tokens, seconds
    and the McNemar p (raw, Holm) of the first row against it per split."""
    splits = table["splits"]
    head = ["row", *(f"{s}: strict (lenient) / n" for s in splits), "tokens / q", "s / q",
            *(f"McNemar vs {table['reference']} ({s}): p, Holm" for s in splits)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_row = {s: {t["row"]: t for t in table["tests"][s]} for s in splits}
    for r in table["rows"]:
        cells = [r["name"]]
        cells += [f"{c['correct']} ({c['correct_lenient']}) / {c['n']}" for c in (r["counts"][s] for s in splits)]
        cells += [_fmt(r["tokens_per_question"]), _fmt(r["seconds_per_question"], 3)]
        for s in splits:
            t = by_row[s].get(r["name"])
            cells.append("reference" if t is None else f"{t['p']:.2g}, {t['p_holm']:.2g} ({t['a_only']} vs "
                                                       f"{t['b_only']} discordant)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_table(table: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """compare.json and compare.md in `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(table, indent=2) + "\n")
    (out / "compare.md").write_text(markdown(table) + "\n")
    return out / "compare.json", out / "compare.md"


__all__ = ["CompareError", "PAIRED_FIELDS", "compare_folders", "compare_pooled", "compare_rows", "load_rows", "markdown", "write_table"]
