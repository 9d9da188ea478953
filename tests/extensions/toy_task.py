"""A toy task family, added in this one file (docs/architecture.md, "Adding a task family"): "parity", whether a
number is even or odd. Its prompt format asks for a last line `Parity: even` or `Parity: odd`; extraction reads
the last such word; the grader compares it with the gold word and records that it graded (`detail["grader"]`).

Registering it makes `parity` a `task_type`: a `--task` choice, a `System.generate(task=...)` value, and the
family a plain question file's rows are graded as (`local_fields`).
"""

from __future__ import annotations

import re

from recmas_ray.tasks import GradeResult, Task, register_task

_ANSWER = re.compile(r"parity\s*:\s*(even|odd)\b", re.IGNORECASE)


def extract(text: str) -> str | None:
    """The last `Parity: even|odd` of an output, lower case (None: no answer in the format)."""
    found = _ANSWER.findall(text or "")
    return found[-1].lower() if found else None


def grade(record: dict, response: str, mode: str) -> GradeResult:
    answer = extract(response)
    ok = answer is not None and answer == str(record["gold"]).strip().lower()
    return GradeResult(ok, answer, answer is None, {"strict": ok, "reference": ok, "grader": "parity"})


PARITY = register_task(Task(
    "parity", instruction="End with one line: `Parity: even` or `Parity: odd`.",
    answer_found=lambda item, text: extract(text) is not None, grade=grade, retry_suffix="\nParity:",
    retry_tokens=3, local_fields=lambda row, gold: {}))
