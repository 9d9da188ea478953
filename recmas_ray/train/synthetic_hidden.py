"""The hidden-operand family (`difficulty="hidden"`, dataset name `synthetic_hidden:N`) is the latent-handoff
test: only the upstream roles are told the fact (`role_context`, e.g. {"planner": "x = 17."}); the decoder
sees "What is x - 8?" and its latent slot, so its answer can only come through the latents. The gold plan
states the fact in its first tokens, the critic's gold text never holds the value (the value must cross the
planner -> critic link, not come back from the critic's teacher-forced text), the answer is short
("17 - 8 = 9. \\boxed{9}"), `full_question` ("x = 17. What is x - 8?") is the single agent's ceiling, and
`facts` ({"fact": 17, "operand": 8, "operation": "-"}) is what a probe of the messages should find.
"""

from __future__ import annotations

import random

HIDDEN_MAX_ROWS = 2000
"""Distinct hidden-operand rows this family can safely produce."""
HIDDEN_VARIABLES = ("x", "y", "n", "k")
HIDDEN_VALUES = (2, 40)
"""Range of the hidden operand (inclusive): a decoder that cannot read it is near chance (1 in 39)."""
HIDDEN_CONTEXT_ROLES = ("planner", "math", "code", "science", "expert", "reflector")
"""Roles told the fact: the first stage of every style (the decoders solver, summarizer, learner and
toolcaller never are)."""


def _hidden_row(rng: random.Random) -> dict:
    var = rng.choice(HIDDEN_VARIABLES)
    x = rng.randint(*HIDDEN_VALUES)
    plus = rng.random() < 0.5
    b = rng.randint(1, 9) if plus else rng.randint(1, min(9, x - 1))
    op, value = ("+", x + b) if plus else ("-", x - b)
    fact, question = f"{var} = {x}.", f"What is {var} {op} {b}?"
    verb = f"Add {b} to {var}" if plus else f"Subtract {b} from {var}"
    boxed = f"\\boxed{{{value}}}"
    answer = f"{x} {op} {b} = {value}. {boxed}"
    plan = f"{var} = {x}. Compute {x} {op} {b}."
    refined = f"{verb} and write the result in \\boxed{{}}."
    code = f"{var} = {x}\nprint({var} {op} {b})"
    return {
        "question": question, "role_context": {r: fact for r in HIDDEN_CONTEXT_ROLES},
        "full_question": f"{fact} {question}",
        "facts": {"fact": x, "operand": b, "operation": op},
        "plan": plan, "refined_plan": refined, "answer": answer, "gold": str(value),
        "hie_math_expert": f"Math expert: {plan}", "hie_code_expert": f"```python\n{code}\n```",
        "hie_science_expert": f"Science expert: {var} = {x} is a whole number, so the result is one too.",
        "hie_summarizer": answer, "distill_expert": f"Plan for the learner: {plan}", "distill_learner": answer,
        "deliberation_reflector": f"Reflection: {plan} {refined}",
        "deliberation_toolcaller": f"<python>\n{code}\n</python> <result> {value} </result>\n{answer}",
        "template": "hidden_plus" if plus else "hidden_minus",
    }


def make_hidden_operand_dataset(num_rows: int, *, seed: int = 0) -> list[dict]:
    """`num_rows` distinct hidden-operand rows (see the module docstring); same seed, same rows."""
    if num_rows < 0:
        raise ValueError(f"num_rows must be >= 0, got {num_rows}")
    if num_rows > HIDDEN_MAX_ROWS:
        raise ValueError(f"at most {HIDDEN_MAX_ROWS} distinct hidden-operand rows, got {num_rows}")
    rng, rows, seen = random.Random(seed), [], set()
    while len(rows) < num_rows:
        row = _hidden_row(rng)
        if row["full_question"] not in seen:
            seen.add(row["full_question"])
            rows.append(row)
    return rows
