"""The hidden-operand family (`difficulty="hidden"`, dataset name `synthetic_hidden:N`) is the latent-handoff
test: only the upstream roles are told the fact (`role_context`, e.g. {"planner": "x = 17."}); the decoder
sees "What is x - 8?" and its latent slot, so its answer can only come through the latents. The gold plan
states the fact in its first tokens, the critic's gold text never holds the value (the value must cross the
planner -> critic link, not come back from the critic's teacher-forced text), the answer is short
("17 - 8 = 9. \\boxed{9}"), `full_question` ("x = 17. What is x - 8?") is the single agent's ceiling, and
`facts` ({"fact": 17, "operand": 8, "operation": "-"}) is what a probe of the messages should find.

The recall variant (`question_kind="recall"`, `difficulty="hidden_recall"`, dataset `synthetic_recall:N`)
asks the decoder for the fact itself ("What is x?", answer "x = 17. \\boxed{17}", facts {"fact": 17}).

Rows come from one split (`train.splits`, fixed per question for every seed; `split="train"` by default, what the
`synthetic_hidden:N` / `synthetic_recall:N` datasets hold): a recall question is split by its fact, as the
hidden-fact tasks split it, so no training set of either generator holds a question either one tests on.
"""

from __future__ import annotations

import random

from recmas_ray.train.splits import FACT_VARIABLES, SPLITS, check_split, fact_pairs, split_of

HIDDEN_VARIABLES = ("x", "y", "n", "k")
HIDDEN_VALUES = (2, 40)
"""Range of the hidden operand (inclusive): a decoder that cannot read it is near chance (1 in 39)."""
HIDDEN_RECALL_VARIABLES = FACT_VARIABLES
"""Recall rows: two-digit values (one tokenization for all, chance 1 in 90), 12 variables (1080 questions)."""
HIDDEN_QUESTIONS = ("arithmetic", "recall")
"""What the decoder is asked about the hidden fact: arithmetic ("What is x - 8?") or recall ("What is x?").
Recall is the clean channel test for a small decoder: SmolLM2-135M told the fact ends its reply with the
right value on recall in 40/40 and on the arithmetic in 0/40 (6/40 even with the value substituted), so
only recall has a ceiling to reach (strictly graded, boxed, it reaches 17/128: fact-token NLL is sharper)."""
HIDDEN_CONTEXT_ROLES = ("planner", "math", "code", "science", "expert", "reflector")
"""Roles told the fact: the first stage of every style (the decoders solver, summarizer, learner and
toolcaller never are)."""


def _arithmetic_questions() -> list[tuple[str, int, str, int]]:
    """Every hidden-arithmetic question as (variable, x, operation, b), in the order `_hidden_row` can draw."""
    out = []
    for var in HIDDEN_VARIABLES:
        for x in range(HIDDEN_VALUES[0], HIDDEN_VALUES[1] + 1):
            out += [(var, x, "+", b) for b in range(1, 10)] + [(var, x, "-", b) for b in range(1, min(9, x - 1) + 1)]
    return out


def _arithmetic_key(var: str, x: int, op: str, b: int) -> str:
    return f"{var} = {x}. What is {var} {op} {b}?"


HIDDEN_MAX_ROWS = {
    "arithmetic": {s: sum(split_of(_arithmetic_key(*q)) == s for q in _arithmetic_questions()) for s in SPLITS},
    "recall": {s: len(fact_pairs(s)) for s in SPLITS}}
"""Distinct rows each question kind has in each split (every question counted once)."""


def _hidden_row(rng: random.Random, question_kind: str, pairs: list[tuple[str, int]]) -> dict:
    if question_kind == "recall":
        var, x = rng.choice(pairs)
        b, op, value, template = 0, "=", x, "hidden_recall"
        question, plan = f"What is {var}?", f"{var} = {x}. Report the value of {var}."
        refined, expression, code = f"Write the value of {var} in \\boxed{{}}.", f"{var} = {x}", f"{var} = {x}\nprint({var})"
    else:
        var, x = rng.choice(HIDDEN_VARIABLES), rng.randint(*HIDDEN_VALUES)
        plus = rng.random() < 0.5
        b = rng.randint(1, 9) if plus else rng.randint(1, min(9, x - 1))
        op, value = ("+", x + b) if plus else ("-", x - b)
        template = "hidden_plus" if plus else "hidden_minus"
        question, plan = f"What is {var} {op} {b}?", f"{var} = {x}. Compute {x} {op} {b}."
        verb = f"Add {b} to {var}" if plus else f"Subtract {b} from {var}"
        refined, expression = f"{verb} and write the result in \\boxed{{}}.", f"{x} {op} {b} = {value}"
        code = f"{var} = {x}\nprint({var} {op} {b})"
    fact = f"{var} = {x}."
    answer = f"{expression}. \\boxed{{{value}}}"
    facts = {"fact": x} if question_kind == "recall" else {"fact": x, "operand": b, "operation": op}
    return {
        "question": question, "role_context": {r: fact for r in HIDDEN_CONTEXT_ROLES},
        "full_question": f"{fact} {question}", "facts": facts,
        "plan": plan, "refined_plan": refined, "answer": answer, "gold": str(value),
        "hie_math_expert": f"Math expert: {plan}", "hie_code_expert": f"```python\n{code}\n```",
        "hie_science_expert": f"Science expert: {var} = {x} is a whole number, so the result is one too.",
        "hie_summarizer": answer, "distill_expert": f"Plan for the learner: {plan}", "distill_learner": answer,
        "deliberation_reflector": f"Reflection: {plan} {refined}",
        "deliberation_toolcaller": f"<python>\n{code}\n</python> <result> {value} </result>\n{answer}",
        "template": template,
    }


def make_hidden_operand_dataset(num_rows: int, *, seed: int = 0, question_kind: str = "arithmetic",
                                split: str = "train") -> list[dict]:
    """`num_rows` distinct hidden-operand rows of `split` (see the module docstring); same seed, same rows.
    `question_kind`: one of `HIDDEN_QUESTIONS`."""
    if question_kind not in HIDDEN_QUESTIONS:
        raise ValueError(f"question_kind {question_kind!r}; expected one of {', '.join(HIDDEN_QUESTIONS)}")
    if num_rows < 0:
        raise ValueError(f"num_rows must be >= 0, got {num_rows}")
    cap = HIDDEN_MAX_ROWS[question_kind][check_split(split)]
    if num_rows > cap:
        family = "hidden_recall" if question_kind == "recall" else "hidden"
        raise ValueError(f"at most {cap} distinct {family} rows in the {split} split, got {num_rows}")
    pairs = fact_pairs(split) if question_kind == "recall" else []
    rng, rows, seen = random.Random(seed), [], set()
    while len(rows) < num_rows:
        row = _hidden_row(rng, question_kind, pairs)
        if row["full_question"] not in seen and (question_kind == "recall" or split_of(row["full_question"]) == split):
            seen.add(row["full_question"])
            rows.append(row)
    return rows
