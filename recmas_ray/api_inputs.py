"""Checks of the Python API's arguments (questions, stop strings, training rows), its answers' final shape
(stop strings cut, `finish_reason`), and its errors' names (Python arguments, not CLI flags).

The server (`serve/`) shares the limits and the answer shaping, so both front doors answer alike.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Sequence

from recmas_ray.config.checks import ConfigTypeError
from recmas_ray.engine.runner import SampleResult

MAX_QUESTION_CHARS = 32_000
"""Default longest question of `generate` (a 100k-character prompt runs for minutes on CPU)."""
MAX_N = 64
"""Most answers per question (`n`)."""
MAX_STOP_STRINGS = 16


PYTHON_NAMES = {"models": "role_models", "role_model": "role_models", "placement": "placement"}
"""CLI flags whose Python argument is spelled differently (the rest keep their name)."""


@contextlib.contextmanager
def python_names():
    """Inside: a ValueError / TypeError whose message names a CLI flag (`--models`) names the Python argument
    (`role_models`) instead; the shared checks speak the CLI's language."""
    def rename(match: re.Match) -> str:
        name = match.group(1).rstrip(".").rsplit(".", 1)[-1]  # nested settings: the argument is the leaf
        return PYTHON_NAMES.get(name, name)

    try:
        yield
    except (ValueError, TypeError) as e:
        text = str(e)
        renamed = re.sub(r"(?<![\w-])--([a-z][a-z0-9_.]*)", rename, text)
        if renamed == text:
            raise
        raise type(e)(renamed) from None


def str_list(values, name: str) -> list[str]:
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise ConfigTypeError(f"{name} must be a str or a list of str, got {type(values).__name__}")
    bad = [i for i, v in enumerate(values) if not isinstance(v, str)]
    if bad:
        raise ConfigTypeError(f"{name}[{bad[0]}] must be a str, got {type(values[bad[0]]).__name__}")
    return list(values)


def check_questions(questions, *, max_question_chars: int = MAX_QUESTION_CHARS,
                    allow_empty: bool = False) -> list[str]:
    """A question or a list/tuple of them, each a non-empty str of at most `max_question_chars` characters
    (`allow_empty`: an empty list passes)."""
    questions = [questions] if isinstance(questions, str) else str_list(questions, "questions")
    if not questions and not allow_empty:
        raise ValueError("questions is empty; pass a question or a non-empty list of them")
    for i, q in enumerate(questions):
        if not q.strip():
            raise ValueError(f"questions[{i}] is empty")
        if len(q) > max_question_chars:
            raise ValueError(f"questions[{i}] has {len(q)} characters; at most max_question_chars="
                             f"{max_question_chars} are accepted")
    return questions


def check_stop(stop) -> list[str]:
    """Stop strings as a list (None: none); each a non-empty str, at most MAX_STOP_STRINGS of them."""
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else str_list(stop, "stop")
    if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
        raise ValueError(f"stop must hold 1 to {MAX_STOP_STRINGS} non-empty strings, got {stops!r}")
    return stops


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """`text` up to the earliest stop string (not included), and whether one was found."""
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[:min(cuts)], True) if cuts else (text, False)


def finish(result: SampleResult, max_new_tokens: int, stops: Sequence[str]) -> SampleResult:
    """Cut `result.prediction` at the first stop string and set its `finish_reason`.

    "length" when the final decode used its whole budget (a row that reached EOS on exactly its last
    token is counted so too: the trace holds token counts, not the tokens), else "stop".
    """
    result.decoder_input = None  # a caller's answer does not keep its batch's latents alive (or copy them per n)
    result.prediction, hit = cut_at_stop(result.prediction, stops)
    decoded = [t for t in result.trace if t.get("action") == "decode"]
    full = bool(decoded) and decoded[-1]["text_tokens"] >= max_new_tokens
    result.finish_reason = "stop" if hit or not full else "length"
    return result


def check_int(name: str, value, lo: int, hi: int | None = None) -> int:
    """An integer argument in [lo, hi]: another type is a `ConfigTypeError` (a TypeError and a ValueError, the
    rule of every argument check: docs/usage.md), an integer out of range a ValueError; both name it."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigTypeError(f"{name}: expected an integer, got {type(value).__name__} {value!r:.40}")
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"{name}={value}: expected an integer " + (f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"))
    return value


def rows_file(rows: str | Path | Sequence[dict], directory: str | Path, name: str = "train.jsonl") -> str:
    """A dataset argument for training: a path or dataset name as is, rows in memory written as JSONL."""
    if isinstance(rows, (str, Path)):
        return str(rows)

    rows = list(rows)
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise ConfigTypeError("rows must be a path, a dataset name, or a non-empty list of dicts")
    path = Path(directory) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)
