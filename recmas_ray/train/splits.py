"""Which split a generated question belongs to: training, validation or test, the same for every seed.

Every generator of this package (`synthetic[:N]`, `synthetic_hidden[:N]`, `synthetic_recall[:N]`, the hidden-fact
tasks) draws a row only from the split it is asked for, and a question's split depends on the question alone,
never on the seed. So no seed's training draw holds a question that any seed's validation or test draw can
hold: a recipe chosen on validation questions and reported on test questions has seen neither in training,
whatever seeds the training data and the report used.

- A question's split is a fixed hash bucket of its key (`split_of`): 11 of 16 buckets train, 1 validation,
  4 test. The key of a hidden-fact question is its fact (`fact_key`: "x=65"), so "What is x?" told "x = 65."
  is one question in every generator and every style; other questions are keyed by their full text.
- Fact values are split too: a fixed 20% of the two-digit values (`UNSEEN_VALUES`) never occur in any training
  row; a fact with such a value is a validation question by its bucket and a test question otherwise.
"""

from __future__ import annotations

import random
import zlib

SPLITS = ("train", "validation", "test")
NUM_BUCKETS = 16
SPLIT_OF_BUCKET = ("validation",) + ("test",) * 4 + ("train",) * 11
"""Bucket -> split: 1/16 validation, 4/16 test (the seen-values test draw of `--full`, 128 facts, fits in
12 variables x 72 seen values x 4/16 = 216), 11/16 train (594 recall facts, above the main job's 512 rows)."""
FACT_VALUES = (10, 99)
"""Fact values (inclusive): two digits, one token pattern for all, chance 1 in 90."""
FACT_VARIABLES = ("x", "y", "n", "k", "a", "b", "m", "p", "q", "r", "s", "t")
"""Letters a fact names (12 x 90 values = 1080 facts)."""
UNSEEN_SHARE = 0.2
"""Share of the fact values held out of every training row."""
VALUE_SPLIT_SEED = 0
"""Seed of the fixed order that picks the unseen values (0: the values the main job held out before splits
were fixed per question, so its unseen-values rows did not change)."""


def split_of(key: str) -> str:
    """The split of the question keyed `key` (a fixed CRC-32 bucket: stable across runs, machines and Python
    versions, unlike `hash`)."""
    return SPLIT_OF_BUCKET[zlib.crc32(key.encode("utf-8")) % NUM_BUCKETS]


def _unseen_values() -> frozenset[int]:
    order = list(range(FACT_VALUES[0], FACT_VALUES[1] + 1))
    random.Random(VALUE_SPLIT_SEED).shuffle(order)
    return frozenset(order[:max(1, round(UNSEEN_SHARE * len(order)))])


UNSEEN_VALUES = _unseen_values()
"""The fact values no training row ever states."""
SEEN_VALUES = tuple(v for v in range(FACT_VALUES[0], FACT_VALUES[1] + 1) if v not in UNSEEN_VALUES)


def fact_key(variable: str, value: int) -> str:
    """The key of the question about one fact ("x=65"), shared by every generator and style."""
    return f"{variable}={value}"


def fact_split(variable: str, value: int) -> str:
    """The split of a fact: never train for an unseen value, else its key's bucket."""
    split = split_of(fact_key(variable, value))
    if value in UNSEEN_VALUES and split == "train":
        return "test"
    return split


def fact_pairs(split: str, values: str = "all") -> list[tuple[str, int]]:
    """Every (variable, value) fact of `split`, in a fixed order; `values`: all, seen (values training rows may
    state) or unseen (`UNSEEN_VALUES`)."""
    check_split(split)
    if values not in ("all", "seen", "unseen"):
        raise ValueError(f"values {values!r}; expected all, seen or unseen")
    pool = {"all": range(FACT_VALUES[0], FACT_VALUES[1] + 1), "seen": SEEN_VALUES, "unseen": sorted(UNSEEN_VALUES)}
    return [(var, x) for x in pool[values] for var in FACT_VARIABLES if fact_split(var, x) == split]


def check_split(split: str) -> str:
    """`split`, or ValueError naming the expected ones."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}; expected one of {', '.join(SPLITS)}")
    return split
