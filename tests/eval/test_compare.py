"""jobs.compare / eval.compare: pairing by doc id, refusals (one line, exit 2), per-split counts and Holm."""

from __future__ import annotations

import json

import pytest

from jobs.compare import main
from recmas_ray.eval.compare import CompareError, compare_folders, compare_pooled
from recmas_ray.eval.stats import mcnemar_exact

FP = {"recursion": {"decode": {"max_new_tokens": 8}}, "grader": "strict", "format_retry": True, "seed": 0,
      "num_rollouts": 1, "dtype": "float32", "batch_size": 8}


def write_run(folder, strict, lenient=None, *, golds=None, split=None, fp=None, method="recursive_mas"):
    """A jobs.run-shaped output folder: samples file (doc ids 0..n-1) and its fingerprint sidecar."""
    folder.mkdir(parents=True)
    lenient = lenient or strict
    with open(folder / "samples_f_2026.jsonl", "w") as f:
        for i, (s, l) in enumerate(zip(strict, lenient)):
            rec = {"doc_id": i, "method": method, "rollout": 0, "gold": (golds or {}).get(i, str(i)),
                   "correct": s, "grade_detail": {"strict": s, "reference": l}, "tokens": 10 + i, "latency_s": 0.5}
            if split:
                rec["split"] = split[i]
            f.write(json.dumps(rec) + "\n")
    (folder / "samples_f_2026.fingerprint.json").write_text(json.dumps(fp or FP))
    return str(folder)


def test_counts_splits_and_holm(tmp_path):
    n = 12
    own = [True] * 10 + [False] * 2
    shuf = [False] * 8 + [True] * 4
    fresh = [True] * 9 + [False] * 3
    split = ["seen"] * 6 + ["unseen"] * 6
    a = write_run(tmp_path / "own", own, split=split)
    b = write_run(tmp_path / "shuf", shuf, [True] * n, split=split)
    c = write_run(tmp_path / "fresh", fresh, split=split)
    t = compare_folders([a, b, c])
    assert t["splits"] == ["all", "seen", "unseen"]
    rows = {r["name"]: r for r in t["rows"]}
    assert rows["shuf"]["counts"]["all"] == {"n": n, "correct": 4, "correct_lenient": n}
    assert rows["own"]["counts"]["seen"]["correct"] == 6 and rows["own"]["counts"]["unseen"]["correct"] == 4
    assert rows["own"]["tokens_per_question"] == pytest.approx(10 + (n - 1) / 2)
    p = [mcnemar_exact(own, shuf)["p"], mcnemar_exact(own, fresh)["p"]]
    lo, hi = sorted(range(2), key=lambda i: p[i])
    want = [0.0, 0.0]
    want[lo] = min(1.0, 2 * p[lo])
    want[hi] = max(want[lo], min(1.0, p[hi]))  # Holm: step-down, monotone
    got = {x["row"]: x for x in t["tests"]["all"]}
    assert [got["shuf"]["p_holm"], got["fresh"]["p_holm"]] == pytest.approx(want)
    assert got["shuf"]["p"] == pytest.approx(p[0]) and (got["shuf"]["a_only"], got["shuf"]["b_only"]) == (8, 2)


def test_lenient_tests_use_the_lenient_outcomes(tmp_path):
    own, own_lenient = [True, False, False, False, True], [True, True, True, True, True]
    other = [False, False, False, False, True]
    t = compare_folders([write_run(tmp_path / "own", own, own_lenient), write_run(tmp_path / "other", other)])
    assert t["tests"]["all"][0]["p"] == pytest.approx(mcnemar_exact(own, other)["p"])
    assert t["tests_lenient"]["all"][0]["p"] == pytest.approx(mcnemar_exact(own_lenient, other)["p"])
    assert (t["tests_lenient"]["all"][0]["a_only"], t["tests_lenient"]["all"][0]["b_only"]) == (4, 0)


def test_pooled_seeds_count_every_question_of_every_seed(tmp_path):
    seed0 = [write_run(tmp_path / "s0" / "own", [True] * 5 + [False]), write_run(tmp_path / "s0" / "shuf", [False] * 6)]
    # the second seed's questions have other gold answers: its own draw, paired within the seed only
    seed1 = [write_run(tmp_path / "s1" / "own", [True] * 4 + [False] * 2, golds={0: "x"}),
             write_run(tmp_path / "s1" / "shuf", [False] * 5 + [True], golds={0: "x"}, fp={**FP, "seed": 1}),]
    with pytest.raises(CompareError, match="fingerprint seed"):  # each seed's set is checked as compare_folders does
        compare_pooled({"0": seed0, "1": seed1}, ["own", "shuf"])
    seed1[0] = write_run(tmp_path / "s1b" / "own", [True] * 4 + [False] * 2, golds={0: "x"}, fp={**FP, "seed": 1})
    t = compare_pooled({"0": seed0, "1": seed1}, ["own", "shuf"])
    rows = {r["name"]: r for r in t["rows"]}
    assert rows["own"]["counts"]["all"] == {"n": 12, "correct": 9, "correct_lenient": 9}
    assert rows["shuf"]["counts"]["all"]["correct"] == 1 and t["groups"] == ["0", "1"]
    assert t["tests"]["all"][0]["p"] == pytest.approx(mcnemar_exact(
        [True] * 5 + [False] + [True] * 4 + [False] * 2, [False] * 6 + [False] * 5 + [True])["p"])
    assert [g["rows"][0]["counts"]["all"]["correct"] for g in t["per_group"].values()] == [5, 4]
    assert set(rows["own"]["correct_per_doc"]) == {f"{g}/{i}" for g in "01" for i in range(6)}


def test_cli_writes_table_and_refuses(tmp_path, capsys):
    a = write_run(tmp_path / "a", [True, False, True])
    b = write_run(tmp_path / "b", [False, False, True])
    assert main([a, b, "--output_path", str(tmp_path / "cmp")]) == 0
    assert "| a |" in capsys.readouterr().out
    table = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [r["counts"]["all"]["correct"] for r in table["rows"]] == [2, 1]
    other_q = write_run(tmp_path / "q", [True, True], )
    other_gold = write_run(tmp_path / "g", [True, True, True], golds={1: "99"})
    other_fp = write_run(tmp_path / "fp", [True, True, True], fp={**FP, "seed": 1})
    for bad, words in ((other_q, "other questions"), (other_gold, "gold"), (other_fp, "fingerprint seed")):
        capsys.readouterr()
        assert main([a, bad, "--output_path", str(tmp_path / "no")]) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "no").exists()
    assert main([a, str(tmp_path / "missing")]) == 2
    with pytest.raises(CompareError, match="expected two or more"):
        compare_folders([a])
