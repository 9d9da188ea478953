"""Task families, found by name: `get_task("math")` is the family's `Task` (its answer instruction, answer
format, format-retry rule, grader and benchmark loaders). One module per family declares its `TASK`:

  math             MATH-500, AIME 2025 / 2026, GSM8K        math_verify (strict) / the release's chain (reference)
  multiple_choice  GPQA-Diamond, MedQA                      the extracted letter
  qa               HotpotQA, Bamboogle                      exact match (F1 recorded)
  code             MBPP+, LiveCodeBench v6, HumanEval       the row's tests in the sandbox (eval/code_graders.py)

A new family is one more module and one more entry in `TASKS`; prompts, graders, the format retry,
`recmas_ray.eval.benchmarks` and every `--task` choice read this registry. Pure Python (no torch, no Ray):
the styles read each family's instruction from here.
"""

from __future__ import annotations

from recmas_ray.eval.tasks import code, math, multiple_choice, qa
from recmas_ray.eval.tasks.base import GradeResult, Task

TASKS: dict[str, Task] = {t.name: t for t in (math.TASK, multiple_choice.TASK, code.TASK, qa.TASK)}
TASK_TYPES: tuple[str, ...] = tuple(TASKS)
"""Every family's name (the `--task` choices; a question's `task_type`)."""


def get_task(name: str) -> Task:
    """The family called `name`; ValueError naming the families otherwise."""
    if name not in TASKS:
        raise ValueError(f"unknown task type {name!r}; expected one of {TASK_TYPES}")
    return TASKS[name]


__all__ = ["GradeResult", "TASKS", "TASK_TYPES", "Task", "get_task"]
