"""Task families, found by name: `get_task("math")` is the family's `Task` (its answer instruction, answer
format, format-retry rule, grader and the benchmarks it reads, each with its source and loader). One module per
family declares its `TASK`:

  math             MATH-500, AIME 2025 / 2026, GSM8K        math_verify (strict) / the release's chain (reference)
  multiple_choice  GPQA-Diamond, MedQA                      the extracted letter (family name "choice")
  qa               HotpotQA, Bamboogle                      exact match (F1 recorded)
  code             MBPP+, LiveCodeBench v6, HumanEval       the row's tests in the sandbox (tasks/code_graders.py)

A new family is one module declaring its `TASK` (docs/architecture.md, "Adding a task family"): a module of this
package is listed in `FAMILY_MODULES`, one anywhere else (a user's file, a test) joins with `register_task`.
Prompts, graders, the format retry, `recmas_ray.tasks.benchmarks` and every `--task` choice read this registry.
Pure Python (no torch, no Ray), on the engine floor: the styles read each family's instruction from here.

`grade(task_type, record, response, mode)` is the one grading entry point callers need. Two modes exist
(docs/reproducing.md#sources): ``strict`` (default: math answers compared with `math_verify`, an unparsable answer
is wrong, QA by SQuAD-style exact match over every published gold alias) and ``reference`` (the public release's
lenient rules, kept so numbers can be compared with the paper). Code runs only through
`recmas_ray.sandbox.run_python` (tasks/code_graders.py).
"""

from __future__ import annotations

from recmas_ray.config.choices import GRADERS
from recmas_ray.tasks import code, math, multiple_choice, qa
from recmas_ray.tasks.base import (BENCHMARKS, TASKS, BenchmarkSpec, GradeResult, Task, get_task, register_task,
                                   task_names)

FAMILY_MODULES = (math, multiple_choice, code, qa)
"""The package's own families, in the order the `--task` choices list them."""
for _module in FAMILY_MODULES:
    register_task(_module.TASK)

TASK_TYPES: tuple[str, ...] = tuple(TASKS)
"""The package's own families' names (`task_names()` adds those registered from outside)."""


def grade(task_type: str, record: dict, response: str, mode: str = "strict") -> GradeResult:
    """Grade `response` for one benchmark `record` (as produced by `tasks.benchmarks`).

    `mode` picks which verdict lands in `correct`; both modes' verdicts are always in
    `detail["strict"]` and `detail["reference"]` (equal for code).
    """
    if mode not in GRADERS:
        raise ValueError(f"mode={mode!r}; expected one of {GRADERS}")
    return get_task(task_type).grade(record, response, mode)


__all__ = ["BENCHMARKS", "BenchmarkSpec", "FAMILY_MODULES", "GradeResult", "TASKS", "TASK_TYPES", "Task", "get_task",
           "grade", "register_task", "task_names"]
