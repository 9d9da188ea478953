"""Hidden-fact tasks for every style, with a held-out split whose fact values never occur in training.

Each row tells some upstream roles a fact ("x = 65.", `role_context`) and asks the decoder, which is never
told it, about one fact ("What is x?"), so the decoder's answer can come only through the channel:

    task        told                                               asked                style(s)
    recall      the first stage (planner / expert / reflector)     that fact            sequential, distillation, deliberation
    two_fact    planner x, critic y (different letters)            x or y (alternating) sequential (the solver must tell them apart)
    mixture     math x, code y, science n (three letters)          one of them          mixture (the summarizer picks its slot)
    compare     the first stage (x = 65.)                          "Is x greater than   every style: the decoder combines what
                                                                    52?" yes / no         it sees (52) with what it is sent
    choose      the first stage (x = 65.)                          "x is 56 or 65.      every style: the decoder sees two
                                                                    What is x?"           candidates, the upstream agent knows

`compare` and `choose` are the collaboration tasks (`COLLABORATION_TASKS`): the single agent without the fact
is not at the floor (about half by picking), the channel can lift it. SmolLM2-135M told the fact does no better
than chance on `compare` (it does not compare two-digit numbers, docs/learning_runs.md), so `choose` asks for
what it can do, copying one of two values it sees, with the other agent's fact deciding which.

Rows come from one split of the facts (`train.splits`: the same for every seed): training rows state only
training facts, whose values are never one of `UNSEEN_VALUES`; `split_by_value` draws the training rows and the
test rows a job reports on: seen-values rows (test facts whose values training rows do state) and unseen-values
rows (facts whose values no training row states). Validation rows (`split="validation"`) are for choosing
settings. The gold texts state the fact first, so the outer loss needs the value.
"""

from __future__ import annotations

import random

from recmas_ray.styles import STYLES, get_style
from recmas_ray.train.splits import FACT_VALUES, SEEN_VALUES, UNSEEN_VALUES, check_split, fact_pairs

FACT_TASKS = ("recall", "two_fact", "mixture", "compare", "choose")
COLLABORATION_TASKS = ("compare", "choose")
"""Tasks the decoder can partly solve alone (its single-agent accuracy is neither floor nor ceiling)."""
TASK_STYLES = {task: tuple(name for name, style in STYLES.items() if task in style.fact_tasks) for task in FACT_TASKS}
"""Registered styles each task applies to, as their declarations say (`StyleSpec.fact_tasks`; mixture's recall
tells the math expert alone)."""


def _texts(told: dict[str, str], asked_var: str, value: int, gold: str, answer: str) -> dict:
    """Every style's gold fields of one row: upstream texts state the fact first, the decoder's the answer.

    Fact first because the inner link learns to map a hidden state to the embedding of the next gold token:
    an agent's m-step latent rollout then walks the first m tokens of its gold form, and a fact stated there
    lies within m (a rollout trained on "Plan for the learner: s = 31." walked "Plan for the learner: t =" and
    lost the value; docs/learning_runs.md). The critic (two hops) restates the asked fact it received."""
    plan = " ".join(told.values())
    asked = f"{asked_var} = {value}."
    critic = told["critic"] + (f" {asked}" if told["critic"] != asked else "") if "critic" in told else asked
    return {
        "plan": f"{told.get('planner', plan)} Report the value of {asked_var}.",
        "refined_plan": f"{critic} Write the value of {asked_var} in \\boxed{{}}.",
        "answer": answer, "gold": gold,
        "hie_math_expert": f"{told.get('math', plan)} Math expert.",
        "hie_code_expert": f"{told.get('code', plan)} Code expert.",
        "hie_science_expert": f"{told.get('science', plan)} Science expert.",
        "hie_summarizer": answer,
        "distill_expert": f"{told.get('expert', plan)} Plan for the learner: report {asked_var}.",
        "distill_learner": answer,
        "deliberation_reflector": f"{told.get('reflector', plan)} Reflection: report {asked_var}.",
        "deliberation_toolcaller": answer,
    }


def fact_row(task: str, style: str, rng: random.Random, pairs: list[tuple[str, int]]) -> dict:
    """One row of `task` for `style` whose facts are drawn from `pairs` ((variable, value), `splits.fact_pairs`)."""
    spec = get_style(style)
    first = spec.first_role
    if task in ("recall", "compare", "choose"):
        var, x = rng.choice(pairs)
        told = {first: f"{var} = {x}."}
        if task == "recall":
            question, gold, answer = f"What is {var}?", str(x), f"{var} = {x}. \\boxed{{{x}}}"
        elif task == "choose":  # the decoy from the fact's own side (an unseen-values row holds no seen value)
            c = rng.choice([v for v in (sorted(UNSEEN_VALUES) if x in UNSEEN_VALUES else SEEN_VALUES) if v != x])
            a, b = (x, c) if rng.random() < 0.5 else (c, x)
            question, gold, answer = f"{var} is {a} or {b}. What is {var}?", str(x), f"{var} = {x}. \\boxed{{{x}}}"
        else:
            c = rng.choice([v for v in range(FACT_VALUES[0], FACT_VALUES[1] + 1) if v != x])
            gold = "yes" if x > c else "no"
            question = f"Is {var} greater than {c}? Answer yes or no."
            answer = f"{var} = {x}, {'greater' if x > c else 'not greater'} than {c}. \\boxed{{{gold}}}"
        facts = {"fact": x}
        asked = var
    else:
        roles = ("planner", "critic") if task == "two_fact" else spec.experts
        chosen = rng.sample(pairs, len(roles))
        while len({var for var, _ in chosen}) < len(roles):  # different letters (12 of them: a few draws)
            chosen = rng.sample(pairs, len(roles))
        names, vals = [var for var, _ in chosen], [x for _, x in chosen]
        told = {r: f"{v} = {x}." for r, v, x in zip(roles, names, vals)}
        pick = rng.randrange(len(roles))
        asked, x = names[pick], vals[pick]
        question, gold, answer = f"What is {asked}?", str(x), f"{asked} = {x}. \\boxed{{{x}}}"
        facts = {"fact": x, **{f"fact_{r}": v for r, v in zip(roles, vals)}, "asked_role": roles[pick]}
    full = " ".join(told.values()) + " " + question
    return {"question": question, "role_context": told, "full_question": full, "facts": facts,
            **_texts(told, asked, facts["fact"], gold, answer), "template": f"fact_{task}"}


def told_rows(rows: list[dict]) -> list[dict]:
    """`rows` with the fact stated in the decoder's question (`full_question`) and no role context: the questions
    of the rows that tell the decoder in text what the channel would carry."""
    return [{k: v for k, v in r.items() if k != "role_context"} | {"question": r["full_question"]} for r in rows]


def fact_values_of(row: dict) -> set[int]:
    """Every fact value a row states (to any role)."""
    return {v for k, v in row["facts"].items() if k.startswith("fact") and isinstance(v, int)}


def make_fact_dataset(task: str, style: str, num_rows: int, *, seed: int = 0, split: str = "train",
                      values: str = "all") -> list[dict]:
    """`num_rows` distinct rows of `task` for `style` (same seed, same rows), every fact of each row from
    `split` (`train.splits`); `values`: all, seen or unseen fact values (training facts are all seen)."""
    if task not in FACT_TASKS:
        raise ValueError(f"task {task!r}; expected one of {', '.join(FACT_TASKS)}")
    if task not in get_style(style).fact_tasks:
        raise ValueError(f"task {task} does not apply to style {style}; expected one of {', '.join(TASK_STYLES[task])}")
    pairs = fact_pairs(check_split(split), values)
    rng, rows, seen = random.Random(seed), [], set()
    for _ in range(200 * num_rows + 1000):
        if len(rows) == num_rows:
            return rows
        row = fact_row(task, style, rng, pairs)
        if row["full_question"] not in seen:
            seen.add(row["full_question"])
            rows.append(row)
    raise ValueError(f"could not generate {num_rows} distinct {task} rows from the {len(pairs)} {values}-values "
                     f"facts of the {split} split; ask for fewer")


def split_by_value(task: str, style: str, *, num_train: int, num_seen: int, num_unseen: int,
                   seed: int = 0) -> tuple[list[dict], list[dict], list[dict]]:
    """(train, seen-values test, unseen-values test) rows: training rows from training facts only, test rows
    from test facts, whose values training rows do state (seen) or never state (unseen). The splits are fixed
    per fact, so no seed's training rows hold any seed's test question (both checked)."""
    train = make_fact_dataset(task, style, num_train, seed=seed, split="train")
    seen = make_fact_dataset(task, style, num_seen, seed=seed + 1, split="test", values="seen") if num_seen else []
    unseen = (make_fact_dataset(task, style, num_unseen, seed=seed + 2, split="test", values="unseen")
              if num_unseen else [])
    train_values = set().union(*(fact_values_of(r) for r in train)) if train else set()
    assert not train_values & UNSEEN_VALUES and all(fact_values_of(r) <= UNSEEN_VALUES for r in unseen)
    keys = {r["full_question"] for r in train}
    assert not any(r["full_question"] in keys for r in seen + unseen)
    return train, seen, unseen
