"""The main job's product pipeline (`--facts.pipeline product`) on tiny models: every row of its report is
computed from the samples files jobs.run wrote, and the printed jobs.run command gives the same own-latent row."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from jobs import demo as demo_job
from jobs.experiments.demo import product, product_rows

ROWS_UNDER_TEST = ("own", "shuffled", "fresh", "ceiling")
"""The rows the lead line and the told-question file need (every row is one more jobs.run of the same code)."""


def samples_of(folder: Path) -> dict[str, dict]:
    """doc id -> sample record of the (single) samples file of a jobs.run output folder, read directly."""
    [path] = [p for p in folder.glob("samples_*.jsonl")]
    return {str(r["doc_id"]): r for r in map(json.loads, path.read_text().splitlines())}


@pytest.mark.integration
@pytest.mark.timeout(2400)  # a hang guard only: Ray Train start-ups and one jobs.run per row, minutes when loaded
def test_product_pipeline_rows_come_from_the_samples_files(tmp_path, ray_cluster, capsys, monkeypatch):
    rows = tuple(r for r in product_rows.ROWS if r.name in ROWS_UNDER_TEST)
    monkeypatch.setattr(product_rows, "ROWS", rows)
    monkeypatch.setattr(product, "ROWS", rows)
    out = tmp_path / "demo"
    assert demo_job.main(["--preset", "tiny", "--quick", "--tasks", "distillation:recall", "--facts.pipeline",
                          "product", "--no_progress", "--output_path", str(out)]) == 0
    printed = capsys.readouterr().out
    task = out / "product" / "distillation-recall"
    table = json.loads((task / "compare" / "compare.json").read_text())
    assert [r["name"] for r in table["rows"]] == list(ROWS_UNDER_TEST)
    test_rows = [json.loads(x) for x in (task / "data" / "test.jsonl").read_text().splitlines()]
    assert {r["split"] for r in test_rows} == {"seen", "unseen"}
    for row in table["rows"]:  # each count recomputed from the samples file alone
        samples = samples_of(task / "eval" / row["name"])
        assert set(samples) == {str(r["id"]) for r in test_rows}
        for split in ("all", "seen", "unseen"):
            docs = [d for d, s in samples.items() if split == "all" or s["split"] == split]
            strict = sum(bool(samples[d]["grade_detail"]["strict"]) for d in docs)
            lenient = sum(bool(samples[d]["grade_detail"]["strict"] or samples[d]["grade_detail"]["reference"])
                          for d in docs)
            assert row["counts"][split] == {"n": len(docs), "correct": strict, "correct_lenient": lenient}
    # the lead lines' X/N own vs Y/N shuffled vs Z/N fresh, per split, are the samples files' counts
    want = {split: [sum(bool(s["grade_detail"]["strict"]) for s in samples_of(task / "eval" / name).values()
                        if split == "all held-out" or product_rows.SPLIT_NAMES[s["split"]] == split)
                    for name in ("own", "shuffled", "fresh")]
            for split in ("seen values", "unseen values", "all held-out")}
    for split, counts in want.items():
        line = next(x for x in printed.splitlines() if f"distillation / recall ({split}), R=1" in x)
        got = re.search(r"(\d+)/\d+ own vs (\d+)/\d+ shuffled vs (\d+)/\d+ fresh", line)
        assert [int(g) for g in got.groups()] == counts, line
    # the printed jobs.run command, rerun into another folder, gives the same own-latent answers
    cmd = next(x.strip() for x in printed.splitlines() if x.strip().startswith("python -m jobs.run"))
    argv = shlex.split(cmd)[3:]
    argv[argv.index("--output_path") + 1] = str(tmp_path / "again")
    from jobs import run as run_job

    assert run_job.main(argv + ["--no_progress"]) == 0
    own, again = samples_of(task / "eval" / "own"), samples_of(tmp_path / "again")
    assert {d: s["prediction"] for d, s in again.items()} == {d: s["prediction"] for d, s in own.items()}
    assert sum(s["correct"] for s in again.values()) == table["rows"][0]["counts"]["all"]["correct"]
    assert any(x.strip().startswith("python -m jobs.serve") for x in printed.splitlines())
