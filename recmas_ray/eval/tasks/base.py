"""What a task family is: a `Task` (its answer instruction, answer format, format-retry rule, grader and
loaders) and the `GradeResult` its grader returns. Each family module declares one `TASK`; the registry in
`recmas_ray.eval.tasks` finds them by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass
class GradeResult:
    """Outcome of grading one response."""

    correct: bool
    """Whether the response counts as correct under the requested mode."""
    extracted: str | None
    """The answer pulled out of the response (letter, math expression, code, text), None if none."""
    parse_failed: bool
    """True when no answer in the expected format was found (logged as the parse-failure rate)."""
    detail: dict = field(default_factory=dict)
    """Grader specifics: the other mode's verdict, the matching strategy, F1, test results, ..."""


@dataclass(frozen=True)
class Task:
    """One task family (the `task_type` of a question)."""

    name: str
    """The family's name: a question's `task_type`, the `--task` choice."""
    instruction: str
    """The final-answer instruction a prompt's `{final}` becomes (a style's prompt set may replace it)."""
    answer_found: Callable[[dict, str], bool]
    """(question record, output) -> whether the output holds an answer in the family's format."""
    grade: Callable[[dict, str, str], GradeResult]
    """(question record, output, grader mode) -> its grade; both modes' verdicts land in `detail`."""
    retry_suffix: str
    """The format retry: text appended to an output without an answer, continued by the decoder's base model."""
    retry_tokens: int = 16
    """Tokens the format retry may add."""
    retry_closer: str = ""
    """Appended to a retry continuation that lacks it (code: the fence the suffix opened)."""
    adapter: str = "math"
    """Which of the release's per-task link adapters (`adapter(<task>).pt`) a system for this family loads."""
    loaders: dict[str, Callable] = field(default_factory=dict)
    """Benchmark name -> loader (published rows, name, options -> question records)."""
    local_fields: Callable[[dict, str], dict] | None = None
    """(row of a local question file, its gold) -> the family's extra record fields; None: the family cannot
    be read from a plain question file (`--dataset questions.jsonl --task_type ...`)."""
