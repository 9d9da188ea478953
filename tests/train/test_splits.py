"""Generated training data never holds a question that a validation or test draw can hold, for every generator
and every seed the jobs use (`train.splits`)."""

import pytest

from recmas_ray.train.data import SYNTHETIC_DATASETS, load_rows
from recmas_ray.train.splits import (FACT_VARIABLES, SPLITS, UNSEEN_VALUES, fact_pairs, fact_split, split_of)
from recmas_ray.train.synthetic import DIFFICULTIES, DIFFICULTY_SIZES, make_arithmetic_dataset
from recmas_ray.train.synthetic_facts import TASK_STYLES, fact_values_of, make_fact_dataset, split_by_value
from recmas_ray.train.synthetic_hidden import HIDDEN_MAX_ROWS, HIDDEN_QUESTIONS, make_hidden_operand_dataset

SEEDS = (0, 1, 2)
"""The seeds the main job and its recipes use (--seed 0 by default; --full's repeats 0-2)."""


def _facts(row: dict) -> set[str]:
    """The facts a row whose question is about its facts states, as `splits.fact_key` writes them ("x=65"); none
    for other rows (a hidden-arithmetic row "x = 17. What is x - 8?" is split by its whole question)."""
    out = set()
    if not (row.get("template", "").startswith("fact_") or row.get("template") == "hidden_recall"):
        return out
    for text in (row.get("role_context") or {}).values():
        var, _, value = text.rstrip(".").partition(" = ")
        out.add(f"{var}={value}")
    return out


def _draws(split: str, seed: int) -> list[dict]:
    """Rows of `split` from every generator (each at a size the jobs ask for, capped by what the split holds)."""
    rows = []
    for task, styles in TASK_STYLES.items():
        for style in styles:
            size = {"train": 512, "validation": 24, "test": 128}[split]
            if split == "train" or task in ("recall", "compare", "choose"):
                rows += make_fact_dataset(task, style, size if task != "mixture" else min(size, 64), seed=seed,
                                          split=split)
    for kind in HIDDEN_QUESTIONS:
        rows += make_hidden_operand_dataset(min(300, HIDDEN_MAX_ROWS[kind][split]), seed=seed, question_kind=kind,
                                            split=split)
    for difficulty in DIFFICULTIES:
        if difficulty not in ("hidden", "hidden_recall"):
            cap = DIFFICULTY_SIZES.get(difficulty, {}).get(split, 200)
            rows += make_arithmetic_dataset(min(200, cap), seed=seed, difficulty=difficulty, split=split)
    return rows


def _question(row: dict) -> str:
    return row.get("full_question") or row["question"]


def test_no_training_row_of_any_seed_holds_a_validation_or_test_question_of_any_seed():
    train = [r for seed in SEEDS for r in _draws("train", seed)]
    for name in SYNTHETIC_DATASETS:  # the dataset names users train on (`--dataset_name synthetic_recall:512`)
        train += load_rows(f"{name}:256")
    train_questions = {_question(r) for r in train}
    train_facts = set().union(*map(_facts, train))
    for split in ("validation", "test"):
        held = [r for seed in SEEDS for r in _draws(split, seed)]
        assert held and not train_questions & {_question(r) for r in held}, split
        assert not train_facts & set().union(*map(_facts, held)), split
    assert not set().union(*map(fact_values_of, [r for r in train if "facts" in r and "role_context" in r
                                                 and r.get("template", "").startswith("fact_")])) & UNSEEN_VALUES


def test_the_documented_recall_dataset_shares_no_fact_with_the_main_jobs_held_out_questions():
    """The case that leaked: `synthetic_recall:512` (seed 0) held 29 of the main job's 64 held-out questions."""
    _, seen, unseen = split_by_value("recall", "distillation", num_train=512, num_seen=32, num_unseen=32, seed=0)
    held = {_question(r) for r in seen + unseen}
    assert not held & {_question(r) for r in load_rows("synthetic_recall:512")}


def test_splits_are_fixed_per_question_and_shared_by_every_generator():
    assert split_of("What is 3 + 4?") == split_of("What is 3 + 4?")
    assert {split_of(f"q{i}") for i in range(200)} == set(SPLITS)
    for split in SPLITS:
        pairs = fact_pairs(split)
        assert pairs and all(fact_split(v, x) == split for v, x in pairs)
    assert not {x for _, x in fact_pairs("train")} & UNSEEN_VALUES
    assert sum(len(fact_pairs(s)) for s in SPLITS) == len(FACT_VARIABLES) * 90
    # the same fact is the same question in the hidden-fact tasks and in synthetic_recall
    recall = make_hidden_operand_dataset(50, seed=3, question_kind="recall", split="test")
    assert all(fact_split(*next(iter(_facts(r))).split("=")[:1], int(r["facts"]["fact"])) == "test" for r in recall)


def test_asking_a_split_for_more_rows_than_it_holds_is_one_clear_error():
    with pytest.raises(ValueError, match="in the test split"):
        make_hidden_operand_dataset(HIDDEN_MAX_ROWS["recall"]["test"] + 1, question_kind="recall", split="test")
    with pytest.raises(ValueError, match="split 'dev'; expected one of train, validation, test"):
        make_fact_dataset("recall", "distillation", 4, split="dev")
