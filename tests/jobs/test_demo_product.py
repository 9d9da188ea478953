"""The main job's product pipeline (`--facts.pipeline product`) on tiny models, two seeds: every row of its report
is computed from the samples files jobs.run wrote (each seed's and the pooled counts), the validation questions
choose the outer links' step, and the printed jobs.run command gives the same own-latent row."""

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
                          "product", "--facts.num_seeds", "2", "--seed", "5", "--no_progress",
                          "--output_path", str(out)]) == 0
    printed = capsys.readouterr().out
    task = out / "product" / "distillation-recall"
    table = json.loads((task / "compare" / "compare.json").read_text())
    assert [r["name"] for r in table["rows"]] == [r.name for r in rows] and table["groups"] == ["5", "6"]
    pooled = {r["name"]: {sp: {"n": 0, "correct": 0, "correct_lenient": 0} for sp in ("all", "seen", "unseen")}
              for r in table["rows"]}
    questions = {}
    for seed in ("5", "6"):
        test_rows = [json.loads(x) for x in (task / f"seed{seed}" / "data" / "test.jsonl").read_text().splitlines()]
        assert {r["split"] for r in test_rows} == {"seen", "unseen"}
        questions[seed] = [r["question"] for r in test_rows]
        for row in table["per_group"][seed]["rows"]:  # each count recomputed from the samples file alone
            samples = samples_of(task / f"seed{seed}" / "eval" / row["name"])
            assert set(samples) == {str(r["id"]) for r in test_rows}
            for split in ("all", "seen", "unseen"):
                docs = [d for d, s in samples.items() if split == "all" or s["split"] == split]
                strict = sum(bool(samples[d]["grade_detail"]["strict"]) for d in docs)
                lenient = sum(bool(samples[d]["grade_detail"]["strict"] or samples[d]["grade_detail"]["reference"])
                              for d in docs)
                assert row["counts"][split] == {"n": len(docs), "correct": strict, "correct_lenient": lenient}
                for k, v in row["counts"][split].items():
                    pooled[row["name"]][split][k] += v
    assert questions["5"] != questions["6"]  # each seed its own question draw
    for seed in ("5", "6"):  # the validation questions chose which step's outer links the rows load
        outer = task / f"seed{seed}" / "system" / "outer"
        chosen = json.loads((outer / "manifest.json").read_text())["chosen"]
        curve = [json.loads(x) for x in (outer / "eval_curve.jsonl").read_text().splitlines()]
        assert chosen["step"] == min(curve, key=lambda e: e["eval_loss"])["step"] and len(curve) >= 2
        assert f"seed {seed}: outer links of step {chosen['step']} kept" in printed
    assert {r["name"]: r["counts"] for r in table["rows"]} == pooled  # the pooled rows are the seeds' sum
    # the lead lines' own vs shuffled vs fresh counts, strict (lenient), per split, are the pooled counts
    for split, name in (("seen", "seen values"), ("unseen", "unseen values"), ("all", "all held-out")):
        line = next(x for x in printed.splitlines() if f"distillation / recall ({name}, n=" in x)
        got = re.search(r"own (\d+) \((\d+)\) vs shuffled (\d+) \((\d+)\), fresh links (\d+) \((\d+)\)", line)
        want = [pooled[r][split][k] for r in ("own", "shuffled", "fresh") for k in ("correct", "correct_lenient")]
        assert [int(g) for g in got.groups()] == want, line
    # the printed jobs.run command, rerun into another folder, gives the same own-latent answers
    cmd = next(x.strip() for x in printed.splitlines() if x.strip().startswith("python -m jobs.run"))
    argv = shlex.split(cmd)[3:]
    argv[argv.index("--output_path") + 1] = str(tmp_path / "again")
    from jobs import run as run_job

    assert run_job.main(argv + ["--no_progress"]) == 0
    own, again = samples_of(task / "seed5" / "eval" / "own"), samples_of(tmp_path / "again")
    assert {d: s["prediction"] for d, s in again.items()} == {d: s["prediction"] for d, s in own.items()}
    assert sum(s["correct"] for s in again.values()) == table["per_group"]["5"]["rows"][0]["counts"]["all"]["correct"]
    # the printed jobs.serve command serves that system as it was evaluated, and the printed request asks the first
    # test question, its fact told to the expert only through `role_context`
    serve_line = next(x.strip() for x in printed.splitlines() if x.strip().startswith("python -m jobs.serve"))
    serve_argv = shlex.split(serve_line)[3:]
    for flag in ("--num_recursive_rounds", "--latent_steps", "--links", "--task"):
        assert serve_argv[serve_argv.index(flag) + 1] == argv[argv.index(flag) + 1], flag
    body = json.loads(shlex.split(next(x.strip() for x in printed.splitlines() if x.strip().startswith("curl -s")))[-1])
    first = json.loads((task / "seed5" / "data" / "test.jsonl").read_text().splitlines()[0])
    assert body["role_context"] == first["role_context"] and body["messages"][0]["content"] == first["question"]
    # (serving such a folder through jobs.serve on both backends: tests/jobs/test_system_folder.py)
