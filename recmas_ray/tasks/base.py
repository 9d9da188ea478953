"""What a task family is: a `Task` (its answer instruction, answer format, format-retry rule, grader and
benchmarks), the `BenchmarkSpec` of each benchmark it reads (where the data lives, how it is loaded) and the
`GradeResult` its grader returns. Each family module declares one `TASK`; the registry in `recmas_ray.tasks`
finds them by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from recmas_ray.config.extensions import note_extension


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
class BenchmarkSpec:
    """Where a benchmark lives, how its rows become question records, and how it is graded."""

    hf_id: str | None
    """Hugging Face dataset id for the opt-in hub fallback (None: local copy required)."""
    hf_config: str | None
    """Dataset config name passed to `load_dataset`."""
    split: str
    """Split used by the paper's runner."""
    loader: Callable[..., list[dict]]
    """(published rows, name, options) -> question records (the base keys plus the family's fields)."""
    metric: str = "accuracy"
    """Headline metric as named in results (accuracy, pass@10, ...)."""
    aliases: tuple[str, ...] = ()
    """Other names the release's runner accepts for it (lower case)."""
    hub_files: tuple[str, ...] = ()
    """Files of the hub dataset read as they are instead of `load_dataset` (none: `load_dataset`)."""
    bundled: Callable[[], list[dict]] | None = None
    """Where the rows come from when no local copy is given, instead of the hub (an installed package's data)."""
    task_type: str = ""
    """The family that grades it (filled in by the registry from the family that declares it)."""


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
    benchmarks: dict[str, BenchmarkSpec] = field(default_factory=dict)
    """Benchmark name -> where it lives and its loader."""
    local_fields: Callable[[dict, str], dict] | None = None
    """(row of a local question file, its gold) -> the family's extra record fields; None: the family cannot
    be read from a plain question file (`--dataset questions.jsonl --task_type ...`)."""


# ----------------------------------------------------------------------------- the registry

TASKS: dict[str, Task] = {}
"""Family name -> its `Task`, in registration order (the package's own families first)."""
BENCHMARKS: dict[str, BenchmarkSpec] = {}
"""Benchmark name -> its spec (`task_type` filled in), over every registered family."""


def register_task(task: Task) -> Task:
    """Add a family: its name becomes a `task_type`, its benchmarks loadable by name (`tasks.benchmarks`).
    A name or benchmark already taken by another family raises ValueError (one definition of each); the same
    declaration again is a no-op. A module outside the package that calls this is imported by the Ray processes
    a run starts too (`config.extensions`), so they know the family by its name."""
    other = TASKS.get(task.name)
    if other is not None and other != task:
        raise ValueError(f"task family {task.name!r} is already registered")
    taken = sorted(b for b in task.benchmarks if b in BENCHMARKS and BENCHMARKS[b].task_type != task.name)
    if taken:
        raise ValueError(f"task family {task.name!r}: benchmark(s) {taken} already belong to another family")
    TASKS[task.name] = task
    note_extension()
    BENCHMARKS.update({name: replace(spec, task_type=task.name) for name, spec in task.benchmarks.items()})
    return task


def task_names() -> tuple[str, ...]:
    """Every registered family's name (the `--task` choices, a question's `task_type`)."""
    return tuple(TASKS)


def get_task(name: str) -> Task:
    """The family called `name`; ValueError naming the families otherwise."""
    if name not in TASKS:
        raise ValueError(f"unknown task type {name!r}; expected one of {tuple(TASKS)}")
    return TASKS[name]
