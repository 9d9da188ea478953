"""Offline training data: deterministic multi-step arithmetic word problems with every role's target field.

The RecursiveMAS training sets live on the Hugging Face hub; this module generates a small stand-in so inner-
and outer-loop training, tests and demos run with no network. Each row has the fields every style reads,
all short so CPU training is fast:

    question, plan, refined_plan, answer, gold                       sequential (answer ends in \\boxed{N})
    hie_math_expert, hie_code_expert, hie_science_expert, hie_summarizer           mixture
    distill_expert, distill_learner                                                 distillation
    deliberation_reflector, deliberation_toolcaller                                 deliberation
    template                                                         metadata: which word-problem template

The hidden-operand family (`difficulty="hidden"`, dataset name `synthetic_hidden:N`) is in `synthetic_hidden.py`.
Every row comes from one split (`train.splits`: train by default, or validation / test), fixed per question for
every seed, so a training set made with any seed never holds a question a test set made with any seed holds.

CLI: `python -m recmas_ray.train.synthetic --num_rows 200 --out data.jsonl [--json_field data] [--seed 0]
[--split test]`.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from recmas_ray.train.splits import SPLITS, check_split, split_of
from recmas_ray.train.synthetic_hidden import HIDDEN_MAX_ROWS, make_hidden_operand_dataset

FIELDS = ("question", "plan", "refined_plan", "answer", "gold", "hie_math_expert", "hie_code_expert",
          "hie_science_expert", "hie_summarizer", "distill_expert", "distill_learner", "deliberation_reflector",
          "deliberation_toolcaller")
"""Text fields present (non-empty) in every generated row."""

NAMES = ("Mia", "Leo", "Ava", "Noah", "Emma", "Liam", "Zoe", "Omar", "Sara", "Ivan", "Nina", "Ben")


@dataclass(frozen=True)
class Step:
    """One arithmetic step: `var = code` in Python, described in words by `desc`."""

    desc: str
    var: str
    code: str


@dataclass(frozen=True)
class Problem:
    template: str
    question: str
    steps: tuple[Step, ...]
    unit: str
    """What the final number counts, e.g. 'dollars'."""
    check: str
    """A sanity condition on the result, in words, for the science expert."""


def _shopping(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    one, two = rng.choice((("notebooks", "pens"), ("apples", "pears"), ("stickers", "markers"), ("cups", "plates")))
    a, p, b, q = rng.randint(2, 6), rng.randint(2, 9), rng.randint(2, 6), rng.randint(2, 9)
    bill = (a * p + b * q) // 10 * 10 + rng.choice((10, 20, 30, 50))
    article = "an" if str(bill).startswith("8") else "a"
    question = (f"{name} buys {a} {one} for {p} dollars each and {b} {two} for {q} dollars each. {name} pays with "
                f"{article} {bill} dollar bill. How much change, in dollars, does {name} get?")
    steps = (Step(f"Find the cost of the {one}", one, f"{a} * {p}"),
             Step(f"Find the cost of the {two}", two, f"{b} * {q}"),
             Step("Add the two costs", "total", f"{one} + {two}"),
             Step("Subtract the total from the bill", "change", f"{bill} - total"))
    return Problem("shopping", question, steps, "dollars", f"between 0 and {bill}")


def _travel(rng: random.Random) -> Problem:
    vehicle = rng.choice(("bus", "train", "truck", "boat"))
    v, h, w, k = rng.randint(3, 9) * 10, rng.randint(2, 5), rng.randint(3, 9) * 10, rng.randint(2, 5)
    question = (f"A {vehicle} travels at {v} km per hour for {h} hours, then at {w} km per hour for {k} hours. "
                "How many kilometers does it travel in total?")
    steps = (Step("Find the distance of the first part", "first", f"{v} * {h}"),
             Step("Find the distance of the second part", "second", f"{w} * {k}"),
             Step("Add the two distances", "distance", "first + second"))
    return Problem("travel", question, steps, "kilometers", f"more than {v * h}")


def _sharing(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    n, c, f = rng.randint(2, 6), rng.randint(4, 12), rng.randint(2, 6)
    # eaten = remainder + a multiple of f, so the rest divides evenly; at least 1 eaten, fewer than all
    base = (n * c) % f
    e = base + f * rng.randint(0 if base else 1, min(2, (n * c - 1 - base) // f))
    question = (f"{name} has {n} boxes with {c} cookies in each box. {name} eats {e} cookies and shares the rest "
                f"equally among {f} friends. How many cookies does each friend get?")
    steps = (Step("Find the total number of cookies", "cookies", f"{n} * {c}"),
             Step("Subtract the cookies eaten", "rest", f"cookies - {e}"),
             Step("Divide the rest among the friends", "each", f"rest // {f}"))
    return Problem("sharing", question, steps, "cookies", f"at most {n * c // f}")


def _savings(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    s, w = rng.randint(3, 15), rng.randint(3, 10)
    x = rng.randint(1, s * w - 1)
    thing = rng.choice(("a bike", "a book", "a game", "a jacket"))
    question = (f"{name} saves {s} dollars every week for {w} weeks and then spends {x} dollars on {thing}. "
                "How many dollars are left?")
    steps = (Step("Find the total savings", "saved", f"{s} * {w}"),
             Step("Subtract the money spent", "left", f"saved - {x}"))
    return Problem("savings", question, steps, "dollars", f"less than {s * w}")


def _garden(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    r, c = rng.randint(3, 9), rng.randint(3, 9)
    d, p = rng.randint(1, r * c - 1), rng.randint(2, 20)
    question = (f"A garden has {r} rows with {c} plants in each row. {d} plants die, and {name} plants {p} new "
                "ones. How many plants are in the garden now?")
    steps = (Step("Find the number of plants at the start", "plants", f"{r} * {c}"),
             Step("Subtract the plants that died", "alive", f"plants - {d}"),
             Step("Add the new plants", "now", f"alive + {p}"))
    return Problem("garden", question, steps, "plants", f"at most {r * c + p}")


def _ages(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    a, d, m, y = rng.randint(3, 12), rng.randint(1, 6), rng.randint(2, 3), rng.randint(2, 10)
    question = (f"{name} is {a} years old. {name}'s sister is {d} years older. Their father is {m} times as old "
                f"as the sister. How old will the father be in {y} years?")
    steps = (Step("Find the sister's age", "sister", f"{a} + {d}"),
             Step("Find the father's age now", "father", f"{m} * sister"),
             Step("Add the years that pass", "later", f"father + {y}"))
    return Problem("ages", question, steps, "years", f"more than {y}")


def _bakery(rng: random.Random) -> Problem:
    t, m, k = rng.randint(3, 8), rng.randint(6, 12), rng.randint(2, 6)
    total = t * m
    sold = (total % k) + k * rng.randint(1, max(1, (total - k) // k - 1))
    s = rng.randint(1, sold - 1)  # sold >= k >= 2, so both halves are positive
    u = sold - s
    question = (f"A bakery makes {t} trays of muffins with {m} muffins on each tray. It sells {s} muffins in the "
                f"morning and {u} in the afternoon. The rest are packed in boxes of {k}. How many boxes are filled?")
    steps = (Step("Find the total number of muffins", "muffins", f"{t} * {m}"),
             Step("Add the muffins sold", "sold", f"{s} + {u}"),
             Step("Subtract the sold muffins", "rest", "muffins - sold"),
             Step("Divide the rest into boxes", "boxes", f"rest // {k}"))
    return Problem("bakery", question, steps, "boxes", f"at most {total // k}")


TEMPLATES: dict[str, Callable[[random.Random], Problem]] = {
    "shopping": _shopping, "travel": _travel, "sharing": _sharing, "savings": _savings,
    "garden": _garden, "ages": _ages, "bakery": _bakery,
}
"""The multi-step family (2-4 steps): difficulty "multi"."""

_THINGS = ("apples", "pens", "stickers", "marbles", "cards", "shells", "coins", "books")


def _more(rng: random.Random) -> Problem:
    name, thing = rng.choice(NAMES), rng.choice(_THINGS)
    a, b = rng.randint(2, 19), rng.randint(2, 9)
    question = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?"
    return Problem("more", question, (Step(f"Add the {thing}", "total", f"{a} + {b}"),), thing, f"more than {a}")


def _fewer(rng: random.Random) -> Problem:
    name, thing = rng.choice(NAMES), rng.choice(_THINGS)
    a = rng.randint(6, 19)
    b = rng.randint(1, min(9, a - 1))
    question = f"{name} has {a} {thing} and gives away {b}. How many {thing} does {name} have left?"
    return Problem("fewer", question, (Step(f"Subtract the {thing} given away", "left", f"{a} - {b}"),), thing,
                   f"less than {a}")


def _groups(rng: random.Random) -> Problem:
    name, thing = rng.choice(NAMES), rng.choice(_THINGS)
    a, b = rng.randint(2, 5), rng.randint(2, 9)
    question = f"{name} has {a} bags with {b} {thing} in each bag. How many {thing} does {name} have?"
    return Problem("groups", question, (Step(f"Multiply the bags by the {thing} per bag", "total", f"{a} * {b}"),),
                   thing, f"a multiple of {b}")


def _arith(rng: random.Random) -> Problem:
    if rng.random() < 0.5:
        a, b = rng.randint(1, 20), rng.randint(1, 9)
        return Problem("sum", f"What is {a} + {b}?", (Step("Add the two numbers", "total", f"{a} + {b}"),), "units",
                       f"more than {a}")
    a = rng.randint(2, 20)
    b = rng.randint(1, min(9, a - 1))
    return Problem("difference", f"What is {a} - {b}?", (Step("Subtract the second number", "left", f"{a} - {b}"),),
                   "units", f"less than {a}")


ARITH_TEMPLATES: dict[str, Callable[[random.Random], Problem]] = {"arith": _arith}
"""Bare one-step arithmetic, a + b (a <= 20, b <= 9) or a - b (a <= 20, b <= 9, b < a), 315 distinct
questions: difficulty "arith"."""

ONE_STEP_TEMPLATES: dict[str, Callable[[random.Random], Problem]] = {"more": _more, "fewer": _fewer,
                                                                      "groups": _groups}
"""The one-step family (one small addition, subtraction or multiplication): difficulty "one_step"."""

DIFFICULTIES: dict[str, dict[str, Callable[[random.Random], Problem]]] = {
    "arith": ARITH_TEMPLATES, "one_step": ONE_STEP_TEMPLATES, "multi": TEMPLATES, "mixed": {**ONE_STEP_TEMPLATES, **TEMPLATES},
    "hidden": {}, "hidden_recall": {}}
"""Task families by difficulty: arith (bare a + b / a - b, the demo's: its 135M decoder solves part of
it), one_step (one-operation word problems), multi (2-4 steps, the original family), mixed (one_step
and multi, rotating), hidden and hidden_recall (the hidden-operand rows of `make_hidden_operand_dataset`,
arithmetic and recall questions, no templates)."""

def _arith_questions() -> list[str]:
    """Every question `_arith` can draw (315)."""
    return ([f"What is {a} + {b}?" for a in range(1, 21) for b in range(1, 10)] +
            [f"What is {a} - {b}?" for a in range(2, 21) for b in range(1, min(9, a - 1) + 1)])


DIFFICULTY_SIZES = {"arith": {s: sum(split_of(q) == s for q in _arith_questions()) for s in SPLITS},
                    "hidden": HIDDEN_MAX_ROWS["arithmetic"], "hidden_recall": HIDDEN_MAX_ROWS["recall"]}
"""Family -> split -> how many distinct rows it has (families missing here have far more than anyone asks)."""


def _evaluate(steps: tuple[Step, ...]) -> list[tuple[str, int]]:
    """(numeric expression text, value) per step, e.g. ('12 + 10', 22)."""
    env: dict[str, int] = {}
    out = []
    for step in steps:
        text = re.sub(r"[a-z_]+", lambda m: str(env[m.group(0)]), step.code).replace("//", "/")
        value = eval(step.code, {"__builtins__": {}}, dict(env))  # our own template strings, never user input
        assert isinstance(value, int) and value >= 0, (step, value)
        env[step.var] = value
        out.append((text, value))
    return out


def _row(problem: Problem, short_answer: bool = False) -> dict:
    worked = _evaluate(problem.steps)
    gold = worked[-1][1]
    boxed = f"\\boxed{{{gold}}}"
    chain = "; ".join(f"{text} = {value}" for text, value in worked)
    plan = "\n".join(f"Step {i}: {s.desc}." for i, s in enumerate(problem.steps, 1))
    concrete = [f"Step {i}: {s.desc}: {text}." for i, (s, (text, _)) in enumerate(zip(problem.steps, worked), 1)]
    solution = "\n".join(f"{s.desc}: {text} = {value}." for s, (text, value) in zip(problem.steps, worked))
    code = "\n".join(f"{s.var} = {s.code}" for s in problem.steps) + f"\nprint({problem.steps[-1].var})"
    asks = problem.question.rsplit(". ", 1)[-1]
    row = {
        "question": problem.question,
        "plan": plan,
        "refined_plan": "\n".join(concrete + [f"Step {len(concrete) + 1}: Write the final number in \\boxed{{}}."]),
        "answer": f"{chain}. {boxed}" if short_answer else f"{solution}\nThe answer is {boxed}.",
        "gold": str(gold),
        "hie_math_expert": f"Math expert: {chain}. Result: {gold}.",
        "hie_code_expert": f"```python\n{code}\n```",
        "hie_science_expert": (f"Science expert: the result counts {problem.unit}, is a whole number, and must be "
                               f"{problem.check}; the value {gold} passes these checks."),
        "hie_summarizer": f"The three experts agree: {chain}. The answer is {boxed}.",
        "distill_expert": "Plan for the learner:\n" + "\n".join(concrete),
        "distill_learner": f"Following the expert plan:\n{solution}\nThe answer is {boxed}.",
        "deliberation_reflector": (f"Reflection: the question asks: {asks} The steps are: "
                                   + "; ".join(s.desc.lower() for s in problem.steps)
                                   + ". The toolcaller should check the arithmetic with Python."),
        "deliberation_toolcaller": (f"Let me compute it with Python.\n<python>\n{code}\n</python> <result> {gold} "
                                    f"</result>\nThe answer is {boxed}."),
        "template": problem.template,
    }
    return row


def make_arithmetic_dataset(num_rows: int, *, seed: int = 0, difficulty: str = "multi",
                            short_answers: bool = False, split: str = "train") -> list[dict]:
    """`num_rows` distinct word problems of `split` (`train.splits`) with every style's fields; same seed, same
    rows.

    `short_answers` (non-reference: the release's targets are worked solutions): the decoder's `answer` is
    the bare computation and the boxed value ("3 + 4 = 7. \\boxed{7}"), so fixed wording no longer
    dominates its loss.

    `difficulty` picks the family (see `DIFFICULTIES`): multi (2-4 steps each, the default), one_step or
    mixed. Templates rotate so every kind appears in small sets; questions are unique so a train/eval split
    never leaks a question.
    """
    if num_rows < 0:
        raise ValueError(f"num_rows must be >= 0, got {num_rows}")
    check_split(split)
    if difficulty in ("hidden", "hidden_recall"):
        return make_hidden_operand_dataset(num_rows, seed=seed, split=split,
                                           question_kind="recall" if difficulty == "hidden_recall" else "arithmetic")
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty {difficulty!r}; expected one of {', '.join(DIFFICULTIES)}")
    templates = DIFFICULTIES[difficulty]
    rng = random.Random(seed)
    names = list(templates)
    offset = rng.randrange(len(names))
    rows: list[dict] = []
    seen: set[str] = set()
    attempts = 0
    while len(rows) < num_rows:
        attempts += 1
        if attempts > 50 * num_rows + 1000:
            raise ValueError(f"could not generate {num_rows} distinct questions of the {split} split; ask for "
                             "fewer rows")
        problem = templates[names[(offset + len(rows)) % len(names)]](rng)
        if problem.question in seen or split_of(problem.question) != split:
            continue
        seen.add(problem.question)
        rows.append(_row(problem, short_answers))
    return rows


def check_disjoint(train: list[dict], heldout: list[dict]) -> None:
    """Raise ValueError if any held-out question (whitespace and case ignored) also appears in `train`."""
    def norm(r: dict) -> str:  # the question with its per-role facts: hidden rows share the masked text
        return " ".join((r["question"] + json.dumps(r.get("role_context") or {}, sort_keys=True)).lower().split())

    seen = {norm(r) for r in train}
    leaked = [r["question"] for r in heldout if norm(r) in seen]
    if leaked:
        raise ValueError(f"{len(leaked)} held-out question(s) also appear in the training rows, e.g. {leaked[0]!r}")


def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    """Write one JSON object per line (creating parent directories); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def write_json(rows: list[dict], path: str | Path, *, json_field: str = "data") -> Path:
    """Write `{json_field: rows}` (the RecursiveMAS local format read with `--dataset_json_field`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({json_field: rows}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recmas_ray.train.synthetic",
                                     description="Generate offline multi-step arithmetic training data.")
    parser.add_argument("--num_rows", type=int, required=True, help="number of rows to generate")
    parser.add_argument("--out", required=True, help="output file (.jsonl, or .json with --json_field)")
    parser.add_argument("--json_field", default=None,
                        help="write one JSON object {FIELD: [rows]} instead of JSON lines (e.g. 'data')")
    parser.add_argument("--short_answers", action="store_true",
                        help="short answer targets, e.g. '3 + 4 = 7. \\boxed{7}' (non-reference)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed, same rows)")
    parser.add_argument("--split", default="train", choices=list(SPLITS),
                        help="which questions: train (default), validation or test; fixed per question for every "
                             "seed, so no training file holds a test file's question")
    parser.add_argument("--difficulty", default="multi", choices=list(DIFFICULTIES),
                        help="task family: multi (2-4 steps), one_step, mixed, arith or hidden (the hidden "
                             "operand, only the planner told the fact; default: multi)")
    args = parser.parse_args(argv)
    rows = make_arithmetic_dataset(args.num_rows, seed=args.seed, difficulty=args.difficulty,
                                   short_answers=args.short_answers, split=args.split)
    if args.json_field:
        path = write_json(rows, args.out, json_field=args.json_field)
    else:
        path = write_jsonl(rows, args.out)
    print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
