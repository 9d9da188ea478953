"""Answer graders for the paper's benchmarks: math, multiple choice, code and open-domain QA.

Every grader is a pure function of (model output, gold); `grade(task_type, record, response, mode)`
is the one entry point callers need. Two modes exist (docs/reproducing.md#sources):

- ``strict`` (default): math answers are compared with `math_verify`, an unparsable answer is
  wrong, QA uses SQuAD-style exact match over every published gold alias.
- ``reference``: the public release's lenient rules, kept so numbers can be compared with the
  paper (math `intpart`/`latex_text`/`nospace`/`digits` chain, unparsable choice scored as "A",
  QA `date`/`em`/`lower` chain, whole-text fallback for extraction).

The graders of each family live with its loaders in its `Task` (`recmas_ray.eval.tasks`: math, multiple_choice,
qa, code; code's harnesses in `code_graders.py`); this module holds `pass_at_k` and the `grade` entry point.

Beside them, `grade_lenient` judges a reply by the value it states, whatever its format: the reply's final
number (before any answer-format retry was appended, `own_reply`) against a numeric gold. It separates "the
reply holds the value" from "the reply is in the graded format" (a model told a fact in plain text states it,
often without \\boxed{}).

Code is executed only through `recmas_ray.sandbox.run_python` (time and memory limits, no network,
throw-away working dir); see `code_graders.py`.
"""

from __future__ import annotations

import math
import re

from recmas_ray.config.choices import GRADERS
from recmas_ray.eval.code_graders import (CODE_PRELUDE, CodeResult, compare_stdio_output, extract_code,  # noqa: F401
                                         grade_code, grade_functional, grade_program, grade_stdio)
from recmas_ray.eval.tasks import TASK_TYPES, GradeResult, get_task  # noqa: F401
from recmas_ray.eval.tasks.math import (extract_boxed, extract_math_answer,  # noqa: F401
                                        grade_math_reference, grade_math_strict, reference_math_strategy)
from recmas_ray.eval.tasks.multiple_choice import extract_choice, shuffle_options  # noqa: F401
from recmas_ray.eval.tasks.qa import exact_match, f1_score, normalize_answer, normalize_date  # noqa: F401

__all__ = [
    "GradeResult", "CodeResult", "extract_boxed", "extract_math_answer", "grade_math_strict",
    "grade_math_reference", "reference_math_strategy", "shuffle_options", "extract_choice",
    "extract_code", "grade_code", "grade_program", "grade_stdio", "grade_functional", "compare_stdio_output",
    "normalize_answer", "normalize_date", "exact_match", "f1_score", "pass_at_k", "grade",
    "GRADER_MODES", "TASK_TYPES", "CODE_PRELUDE", "final_number", "grade_lenient", "own_reply",
]

GRADER_MODES = GRADERS

# ----------------------------------------------------------------------------- pass@k, dispatch

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate (Chen et al. 2021) from n samples of which c are correct."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def grade(task_type: str, record: dict, response: str, mode: str = "strict") -> GradeResult:
    """Grade `response` for one benchmark `record` (as produced by `eval.benchmarks`).

    `mode` picks which verdict lands in `correct`; both modes' verdicts are always in
    `detail["strict"]` and `detail["reference"]` (equal for code).
    """
    if mode not in GRADER_MODES:
        raise ValueError(f"mode={mode!r}; expected one of {GRADER_MODES}")
    return get_task(task_type).grade(record, response, mode)


# ----------------------------------------------------------------------------- lenient: the value stated

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?")


def final_number(text: str | None) -> float | None:
    """The last number written in `text` ("so x = 65." -> 65.0; "17 - 8 = 9" -> 9.0; "1,250" -> 1250.0), or None."""
    found = _NUMBER.findall(text or "")
    return float(found[-1].replace(",", "")) if found else None


def own_reply(record: dict) -> str:
    """The text a sample's agent wrote itself: its prediction before any answer-format retry was appended."""
    retry = record.get("retry")
    if isinstance(retry, dict) and retry.get("raw_prediction") is not None:
        return str(retry["raw_prediction"])
    return str(record.get("prediction") or "")


def grade_lenient(reply: str | None, gold: str, *, strict: bool | None = None) -> GradeResult:
    """Lenient grade of a numeric answer: correct when the reply's final number equals `gold` (numerically), or
    when it passes the strict grader (`strict`, computed here when not given). A non-numeric gold is graded
    strictly only. `extracted` is the final number as written (None when the reply has none)."""
    strict_ok = grade_math_strict(reply or "", str(gold)) if strict is None else bool(strict)
    value = final_number(reply)
    gold_value = final_number(str(gold)) if _NUMBER.fullmatch(str(gold).strip()) else None
    by_value = value is not None and gold_value is not None and value == gold_value
    shown = None if value is None else (str(int(value)) if value.is_integer() else str(value))
    return GradeResult(strict_ok or by_value, shown, value is None,
                       {"strict": strict_ok, "final_number": value, "final_number_matches": by_value})
