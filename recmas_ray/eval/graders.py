"""Answer graders for the paper's benchmarks: math, multiple choice, code and open-domain QA.

Every grader is a pure function of (model output, gold); `grade(task_type, record, response, mode)`
is the one entry point callers need. Two modes exist (recursivemas.md sections 10 and 11):

- ``strict`` (default): math answers are compared with `math_verify`, an unparsable answer is
  wrong, QA uses SQuAD-style exact match over every published gold alias.
- ``reference``: the public release's lenient rules, kept so numbers can be compared with the
  paper (math `intpart`/`latex_text`/`nospace`/`digits` chain, unparsable choice scored as "A",
  QA `date`/`em`/`lower` chain, whole-text fallback for extraction).

The graders of each family live with its loaders in `recmas_ray.eval.tasks` (math, multiple_choice, qa;
code in `code_graders.py`); this module holds `GradeResult`, `pass_at_k` and the `grade` dispatch.

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
from dataclasses import dataclass, field

from recmas_ray.config.choices import GRADERS, TASK_TYPES
from recmas_ray.eval.code_graders import (CODE_PRELUDE, CodeResult, compare_stdio_output, extract_code,  # noqa: F401
                                         grade_code, grade_functional, grade_program, grade_stdio)
from recmas_ray.eval.tasks.math import (_reference_extract, extract_boxed, extract_math_answer,  # noqa: F401
                                        grade_math_reference, grade_math_strict, reference_math_strategy)
from recmas_ray.eval.tasks.multiple_choice import LETTERS, extract_choice, shuffle_options  # noqa: F401
from recmas_ray.eval.tasks.qa import (_reference_qa_match, exact_match, f1_score, normalize_answer,  # noqa: F401
                                      normalize_date)

__all__ = [
    "GradeResult", "CodeResult", "extract_boxed", "extract_math_answer", "grade_math_strict",
    "grade_math_reference", "reference_math_strategy", "shuffle_options", "extract_choice",
    "extract_code", "grade_code", "grade_program", "grade_stdio", "grade_functional", "compare_stdio_output",
    "normalize_answer", "normalize_date", "exact_match", "f1_score", "pass_at_k", "grade",
    "GRADER_MODES", "TASK_TYPES", "CODE_PRELUDE", "final_number", "grade_lenient", "own_reply",
]

GRADER_MODES = GRADERS

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


# ----------------------------------------------------------------------------- pass@k, dispatch

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate (Chen et al. 2021) from n samples of which c are correct."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


# A row's interface (benchmarks.py) -> the harnesses that may grade it: stdin rows run on
# stdin/stdout pairs, functional rows as named-function calls or a test script that calls it.
_INTERFACE_MODES = {"stdin": ("stdio", "stdin"), "functional": ("functional", "script", "assert")}


def _grade_code_record(record: dict, response: str) -> GradeResult:
    code = extract_code(response)
    mode = record.get("test_mode", "script")
    interface = record.get("interface")
    if interface is not None:
        if mode not in _INTERFACE_MODES.get(interface.get("type"), ()):
            raise ValueError(f"code row {record.get('doc_id')!r}: interface {interface.get('type')!r} cannot be "
                             f"graded with test_mode {mode!r}")
        if interface.get("fn_name"):
            record = {**record, "fn_name": interface["fn_name"]}
    if mode not in ("script", "assert", "stdio", "stdin", "functional"):
        raise ValueError(f"test_mode={mode!r}; expected 'script', 'stdio' or 'functional'")
    timeout = float(record.get("timeout_s", 10.0 if mode in ("script", "assert") else 6.0))
    program = code
    if mode in ("script", "assert"):
        if code and record.get("program_prefix"):
            program = record["program_prefix"] + "\n" + code
        if code and record.get("completion_prefix") and not re.search(
                rf"def\s+{re.escape(record.get('entry_point') or '')}\s*\(", code):
            # HumanEval-style: a bare function body completes the given signature.
            program = record["completion_prefix"] + code
    res = grade_program(program, test_type=mode, tests=record.get("tests"), inputs=record.get("inputs", ()),
                        outputs=record.get("outputs", ()), fn_name=record.get("fn_name"), timeout_s=timeout,
                        prelude=record.get("prelude", CODE_PRELUDE), num_tests=int(record.get("num_tests", 1)))
    return GradeResult(res.passed, code, code is None, {
        "passed_tests": res.num_passed, "total_tests": res.num_tests,
        "error_type": res.error_type, "error_detail": res.detail[:800], "seconds": res.seconds,
        "grading": res.grading, "grading_note": res.grading_note})


def grade(task_type: str, record: dict, response: str, mode: str = "strict") -> GradeResult:
    """Grade `response` for one benchmark `record` (as produced by `eval.benchmarks`).

    `mode` picks which verdict lands in `correct`; both modes' verdicts are always in
    `detail["strict"]` and `detail["reference"]` (equal for code).
    """
    if mode not in GRADER_MODES:
        raise ValueError(f"mode={mode!r}; expected one of {GRADER_MODES}")
    if task_type == "math":
        extracted = extract_math_answer(response)
        gold = str(record["gold"])
        ref_pred = _reference_extract(response)
        verdicts = {"strict": grade_math_strict(response, gold),
                    "reference": reference_math_strategy(ref_pred, gold) is not None}
        detail = {**verdicts, "reference_extracted": ref_pred,
                  "reference_strategy": reference_math_strategy(ref_pred, gold)}
        return GradeResult(verdicts[mode], extracted, extracted is None, detail)
    if task_type == "choice":
        letters = LETTERS[:len(record.get("options") or "ABCD")]
        letter = extract_choice(response, letters)
        gold = str(record["gold"]).strip().upper()
        verdicts = {"strict": letter == gold, "reference": (letter or "A") == gold}
        chosen = letter if mode == "strict" else (letter or "A")
        return GradeResult(verdicts[mode], chosen, letter is None, dict(verdicts))
    if task_type == "code":
        res = _grade_code_record(record, response)
        # Tests pass or fail the same under both modes; both verdicts are recorded all the same, so
        # every sample carries detail["strict"] and detail["reference"] (results report both).
        res.detail.update(strict=res.correct, reference=res.correct)
        return res
    if task_type == "qa":
        golds = [str(record["gold"])] + [a for a in record.get("aliases") or [] if a != record["gold"]]
        extracted = extract_math_answer(response)
        ref_pred = _reference_extract(response)
        strategy = _reference_qa_match(ref_pred, str(record["gold"]))
        verdicts = {"strict": extracted is not None and exact_match(extracted, golds),
                    "reference": strategy is not None}
        detail = {**verdicts, "f1": f1_score(extracted or "", golds),
                  "reference_extracted": ref_pred, "reference_strategy": strategy}
        return GradeResult(verdicts[mode], extracted if mode == "strict" else ref_pred,
                           extracted is None, detail)
    raise ValueError(f"task_type={task_type!r}; expected one of {TASK_TYPES}")


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
