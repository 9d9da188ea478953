"""The offline arithmetic training-data generator (recmas_ray.train.synthetic)."""

from __future__ import annotations

import contextlib
import io
import json
import re
from fractions import Fraction

import pytest

from recmas_ray.train import synthetic
from recmas_ray.train.synthetic import FIELDS, make_arithmetic_dataset, write_jsonl

# The truth per template, written independently of the generator from the numbers in the question, in order.
TRUTH = {
    "shopping": lambda a, p, b, q, bill: bill - (a * p + b * q),
    "travel": lambda v, h, w, k: v * h + w * k,
    "sharing": lambda n, c, e, f: Fraction(n * c - e, f),
    "savings": lambda s, w, x: s * w - x,
    "garden": lambda r, c, d, p: r * c - d + p,
    "ages": lambda a, d, m, y: m * (a + d) + y,
    "bakery": lambda t, m, s, u, k: Fraction(t * m - s - u, k),
}
NUM_ROWS = 210


@pytest.fixture(scope="module")
def rows():
    return make_arithmetic_dataset(NUM_ROWS, seed=7)


def _run(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})
    return out.getvalue().strip()


def test_deterministic_by_seed(rows):
    assert make_arithmetic_dataset(NUM_ROWS, seed=7) == rows
    other = make_arithmetic_dataset(NUM_ROWS, seed=8)
    assert [r["question"] for r in other] != [r["question"] for r in rows]
    assert make_arithmetic_dataset(0) == []
    with pytest.raises(ValueError, match="num_rows"):
        make_arithmetic_dataset(-1)


def test_every_field_present_short_and_varied(rows):
    assert len(rows) == NUM_ROWS
    for i, row in enumerate(rows):
        for field in FIELDS:
            assert isinstance(row[field], str) and row[field].strip(), (i, field)
            assert len(row[field]) < 400, (i, field, len(row[field]))
        assert row["template"] in TRUTH
        num_steps = len(row["plan"].splitlines())
        assert 2 <= num_steps <= 4 and all(line.startswith(f"Step {k}:") for k, line in
                                           enumerate(row["plan"].splitlines(), 1))
        assert row["refined_plan"].startswith("Step 1:")
        assert row["question"].isascii() and row["answer"].isascii()
    assert len({r["question"] for r in rows}) == NUM_ROWS
    assert {r["template"] for r in rows} == set(TRUTH)


def test_boxed_answer_is_gold_and_true(rows):
    for row in rows:
        numbers = [int(x) for x in re.findall(r"\d+", row["question"])]
        truth = TRUTH[row["template"]](*numbers)
        assert truth == int(truth) and truth >= 0, row["question"]
        assert row["gold"] == str(int(truth)), row["question"]
        for field in ("answer", "hie_summarizer", "distill_learner", "deliberation_toolcaller"):
            assert re.findall(r"\\boxed\{([^{}]*)\}", row[field]) == [row["gold"]], (field, row[field])
        assert row["answer"].rstrip().endswith(f"\\boxed{{{row['gold']}}}.")


def test_worked_arithmetic_lines_are_correct(rows):
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b}
    for row in rows:
        lines = re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)", row["answer"])
        assert len(lines) == len(row["plan"].splitlines())
        for a, op, b, c in lines:
            assert ops[op](int(a), int(b)) == int(c), (a, op, b, c)
        assert lines[-1][3] == row["gold"]


def test_python_snippets_print_gold(rows):
    for row in rows:
        call = re.fullmatch(r"(?s)(.*)<python>\n(.*?)\n</python> <result> (\d+) </result>\n(.*)",
                            row["deliberation_toolcaller"])
        assert call is not None, row["deliberation_toolcaller"]
        assert call.group(3) == row["gold"] and "\\boxed" in call.group(4) and "\\boxed" not in call.group(1)
        assert _run(call.group(2)) == row["gold"]
        code = re.fullmatch(r"(?s)```python\n(.*)\n```", row["hie_code_expert"])
        assert code is not None and _run(code.group(1)) == row["gold"]


def test_write_jsonl_and_cli(rows, tmp_path, capsys):
    path = write_jsonl(rows[:5], tmp_path / "sub" / "d.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows[:5]

    synthetic.main(["--num_rows", "12", "--out", str(tmp_path / "cli.jsonl"), "--seed", "7"])
    lines = (tmp_path / "cli.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == make_arithmetic_dataset(12, seed=7)

    synthetic.main(["--num_rows", "4", "--out", str(tmp_path / "d.json"), "--json_field", "data"])
    wrapped = json.loads((tmp_path / "d.json").read_text())
    assert list(wrapped) == ["data"] and wrapped["data"] == make_arithmetic_dataset(4, seed=0)
    assert "wrote 4 rows" in capsys.readouterr().out


def test_short_answer_targets_keep_the_value_and_drop_the_wording():
    from recmas_ray.train.data import load_rows
    from recmas_ray.train.synthetic import make_arithmetic_dataset

    for difficulty in ("arith", "multi"):
        long = make_arithmetic_dataset(6, seed=2, difficulty=difficulty)
        short = make_arithmetic_dataset(6, seed=2, difficulty=difficulty, short_answers=True)
        for a, b in zip(long, short):
            assert {k: v for k, v in a.items() if k != "answer"} == {k: v for k, v in b.items() if k != "answer"}
            assert b["answer"].endswith(f"\\boxed{{{a['gold']}}}") and len(b["answer"]) < len(a["answer"])
            assert "The answer is" not in b["answer"]
    assert load_rows("synthetic_short:4") == make_arithmetic_dataset(4, seed=0, short_answers=True)
