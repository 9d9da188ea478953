"""Answer graders for the paper's benchmarks: math, multiple choice, code and open-domain QA.

Every grader is a pure function of (model output, gold); `grade(task_type, record, response, mode)`
is the one entry point callers need. Two modes exist (recursivemas.md sections 10 and 11):

- ``strict`` (default): math answers are compared with `math_verify`, an unparsable answer is
  wrong, QA uses SQuAD-style exact match over every published gold alias.
- ``reference``: the public release's lenient rules, kept so numbers can be compared with the
  paper (math `intpart`/`latex_text`/`nospace`/`digits` chain, unparsable choice scored as "A",
  QA `date`/`em`/`lower` chain, whole-text fallback for extraction).

Code is executed only through `recmas_ray.sandbox.run_python` (time and memory limits, no network,
throw-away working dir); see `code_graders.py`.
"""

from __future__ import annotations

import math
import re
import string
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from recmas_ray.config.choices import GRADERS, TASK_TYPES
from recmas_ray.eval.code_graders import (CODE_PRELUDE, CodeResult, compare_stdio_output, extract_code,  # noqa: F401
                                         grade_code, grade_functional, grade_program, grade_stdio)

__all__ = [
    "GradeResult", "CodeResult", "extract_boxed", "extract_math_answer", "grade_math_strict",
    "grade_math_reference", "reference_math_strategy", "shuffle_options", "extract_choice",
    "extract_code", "grade_code", "grade_program", "grade_stdio", "grade_functional", "compare_stdio_output",
    "normalize_answer", "normalize_date", "exact_match", "f1_score", "pass_at_k", "grade",
    "GRADER_MODES", "TASK_TYPES", "CODE_PRELUDE",
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


# ----------------------------------------------------------------------------- math

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_FINAL_ANSWER_RE = re.compile(r"Final\s+Answer\s*:\s*(.+)$", re.IGNORECASE | re.MULTILINE)


def extract_boxed(text: str | None) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (or ``\\fbox``) in `text`, nested braces handled."""
    text = text or ""
    found = None
    for m in _BOXED_RE.finditer(text):
        depth, start = 0, m.end() - 1
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    found = text[start + 1:i].strip()
                    break
    return found


def extract_math_answer(text: str | None) -> str | None:
    """Last boxed answer, else the last non-empty "Final Answer:" line, else None."""
    boxed = extract_boxed(text)
    if boxed:
        return boxed
    lines = [s.strip() for s in _FINAL_ANSWER_RE.findall(text or "") if s.strip()]
    return lines[-1] if lines else None


def _mv_timeout() -> int | None:
    # math_verify times out with SIGALRM, which only works on the main thread (Ray actors run
    # methods on worker threads); elsewhere the sandbox-free parse simply runs without a limit.
    return 5 if threading.current_thread() is threading.main_thread() else None


def _as_math(text: str) -> str:
    # An escaped dollar is a currency sign, not a math delimiter: MATH500 writes 3 gold answers
    # as "\\$18.90" and math_verify cannot parse those (issue 16 item 6), so it is dropped first.
    text = text.strip().replace("\\$", "")
    return text if ("$" in text or "\\boxed" in text) else f"${text}$"


def grade_math_strict(pred_text: str | None, gold: str) -> bool:
    """Strict math grading: the extracted answer must equal `gold` under math_verify."""
    pred = extract_math_answer(pred_text)
    if pred is None or not str(gold).strip():
        return False
    try:
        from math_verify import parse, verify
    except ImportError as exc:  # pragma: no cover - math-verify is a hard dependency
        raise ImportError("strict math grading needs `pip install math-verify`") from exc
    t = _mv_timeout()
    gold_p = parse(_as_math(str(gold)), parsing_timeout=t)
    pred_p = parse(_as_math(pred), parsing_timeout=t)
    if not gold_p or not pred_p:
        return False
    return bool(verify(gold_p, pred_p, timeout_seconds=t))


def _reference_extract(text: str | None) -> str | None:
    # The release's extraction: non-nested boxed regex, then a greedy one, then the
    # "Final Answer:" line, then the whole text.
    text = text or ""
    for pat in (r"\\boxed\{([^{}]+)\}", r"\\boxed\{(.*)\}"):
        hits = re.findall(pat, text)
        if hits:
            return hits[-1].strip()
    lines = [s.strip() for s in _FINAL_ANSWER_RE.findall(text) if s.strip()]
    if lines:
        return lines[-1]
    return text.strip() or None


def _strip_text_macro(s: str) -> str:
    return re.sub(r"\\text\{([^{}]*)\}", r"\1", s)


def _norm_intpart(s: str) -> str:
    s = _strip_text_macro(s.strip())
    s = re.sub(r"\\frac\{\s*(-?\d+)\s*\}\{\s*(-?\d+)\s*\}",
               lambda m: str(int(m[1]) / int(m[2])) if int(m[2]) else m[0], s)
    s = s.replace("\\left", "").replace("\\right", "").replace(",", "").replace("\\circ", "")
    m = re.search(r"-?\d+(?:\.\d+)?", s)
    if not m:
        return ""
    head = m[0].split(".", 1)[0]
    return str(int(head)) if head not in ("", "-") else ""


def _norm_latex_text(s: str) -> str:
    s = _strip_text_macro(s.strip())
    for tok in ("\\left", "\\right", "$", "\\,", "\\;", "\\!", "\\:", "{", "}", '"', "'"):
        s = s.replace(tok, "")
    return re.sub(r"\s+", "", s)


def _norm_nospace(s: str) -> str:
    return re.sub(r"\s+", "", s.strip())


def _norm_digits(s: str) -> str:
    digits = "".join(re.findall(r"\d", s.split(".", 1)[0]))
    return (digits.lstrip("0") or "0") if digits else ""


_REFERENCE_MATH_CHAIN = (("intpart", _norm_intpart), ("latex_text", _norm_latex_text),
                         ("nospace", _norm_nospace), ("digits", _norm_digits))


def reference_math_strategy(pred_answer: str | None, gold: str) -> str | None:
    """Name of the first release strategy under which `pred_answer` equals `gold`, else None.

    Mirrors the release: each strategy in order (intpart, latex_text, nospace, digits) normalises
    both sides and the pair counts as equal as soon as one strategy gives equal non-empty strings.
    That is why 4.5 vs 14/3 ("4" == "4") and (3,5) vs 35 ("35" == "35") pass.
    """
    if pred_answer is None:
        return None
    for name, fn in _REFERENCE_MATH_CHAIN:
        a, b = fn(str(gold)), fn(pred_answer)
        if a and b and a == b:
            return name
    return None


def grade_math_reference(pred_text: str | None, gold: str) -> bool:
    """The release's lenient MATH grader (kept only for comparison with published numbers)."""
    return reference_math_strategy(_reference_extract(pred_text), gold) is not None


# ----------------------------------------------------------------------------- multiple choice

LETTERS = "ABCDEFGHIJ"


def shuffle_options(stem: str, options: Sequence[str], gold_index: int, seed: int
                    ) -> tuple[list[str], str]:
    """Deterministically permute `options`; returns (new options, letter of the gold option).

    Same permutation as the release: md5 of f"{seed}::{stem}" (first 16 hex digits) seeds
    `random.Random`, which shuffles the index list; position i shows option perm[i].
    """
    import hashlib
    import random

    if not 0 <= gold_index < len(options):
        raise ValueError(f"gold_index={gold_index} out of range for {len(options)} options")
    key = stem.strip() or "||".join(options)
    perm = list(range(len(options)))
    random.Random(int(hashlib.md5(f"{seed}::{key}".encode()).hexdigest()[:16], 16)).shuffle(perm)
    return [options[i] for i in perm], LETTERS[perm.index(gold_index)]


def _choice_core(text: str, letters: str) -> str | None:
    text = re.sub(r"\\(?:text|textbf|mathrm|mathbf)\{([^{}]*)\}", r"\1", text).strip()
    if not text:
        return None
    cls = f"[{letters}{letters.lower()}]"
    m = re.search(r"(?:final\s*(?:choice|answer)|correct\s*(?:choice|option|answer)|choice|option"
                  r"|answer)\s*[:\-]?\s*[\(\[]?\s*(" + cls + r")\b", text, re.IGNORECASE)
    if m:
        return m[1].upper()
    m = re.match(r"^\s*[\(\[]?\s*(" + cls + r")(?:\s*[\)\]]|\s*[:\.\-]|$)", text)
    return m[1].upper() if m else None


def extract_choice(text: str | None, letters: str = "ABCD") -> str | None:
    """Option letter from a response: boxed, then a "Final Choice/Answer:" line, then the text.

    The whole-text step accepts "answer: B"-style phrases or a response that starts with a lone
    letter ("B", "(B)", "B. ..."). Returns None when nothing parses.
    """
    text = text or ""
    candidates = [extract_boxed(text)]
    lines = re.findall(r"Final\s*(?:Choice|Answer)\s*:\s*(.+)$", text, re.IGNORECASE | re.MULTILINE)
    candidates += [lines[-1] if lines else None, text]
    for cand in candidates:
        letter = _choice_core(cand, letters) if cand else None
        if letter is not None:
            return letter
    return None


# ----------------------------------------------------------------------------- open-domain QA

_MONTHS = (r"\b(january|jan|february|feb|march|mar|april|apr|may|june|jun|july|jul|august|aug|"
           r"september|sep|sept|october|oct|november|nov|december|dec)\b")


def _lower_norm(text: str) -> str:
    text = (text or "").strip().lower().replace("\u2019", "'").replace("`", "'")
    text = re.sub(r"[\u2010-\u2015]", "-", text)
    return re.sub(r"\s+", " ", text).strip()


def normalize_date(text: str) -> str:
    """"YYYY-MM-DD", "YYYY-MM" or "YYYY" for date-like text (dateutil), "" otherwise."""
    text = re.sub(r"\b(\d{1,2})(st|nd|rd|th)\b", r"\1", _lower_norm(text))
    has_year = bool(re.search(r"\b\d{4}\b", text))
    has_month = bool(re.search(_MONTHS, text) or re.search(r"\b\d{1,2}[/-]\d{1,2}(?:[/-]\d{2,4})?\b", text))
    if not (has_year or has_month):
        return ""
    try:
        from dateutil import parser as date_parser

        parsed = date_parser.parse(text, fuzzy=False)
    except (ValueError, OverflowError, TypeError):
        return ""
    has_day = has_month and bool(re.search(r"\b\d{1,2}\b", text))
    if has_year and has_day:
        return parsed.strftime("%Y-%m-%d")
    if has_year and has_month:
        return parsed.strftime("%Y-%m")
    return parsed.strftime("%Y") if has_year else ""


_PUNCT = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in (text or "").lower() if ch not in _PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _golds(golds: str | Sequence[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else [str(g) for g in golds if str(g).strip()]


def exact_match(prediction: str, golds: str | Sequence[str]) -> bool:
    """True if `prediction` equals any gold after date normalisation or SQuAD normalisation."""
    pred_date, pred_norm = normalize_date(prediction), normalize_answer(prediction)
    for g in _golds(golds):
        gold_date = normalize_date(g)
        if pred_date and gold_date and pred_date == gold_date:
            return True
        if pred_norm and pred_norm == normalize_answer(g):
            return True
    return False


def f1_score(prediction: str, golds: str | Sequence[str]) -> float:
    """Best token-level F1 (SQuAD) of `prediction` against the golds."""
    best = 0.0
    pred_toks = normalize_answer(prediction).split()
    for g in _golds(golds):
        gold_toks = normalize_answer(g).split()
        common = sum((Counter(pred_toks) & Counter(gold_toks)).values())
        if common:
            p, r = common / len(pred_toks), common / len(gold_toks)
            best = max(best, 2 * p * r / (p + r))
    return best


def _reference_qa_match(pred: str | None, gold: str) -> str | None:
    def em(s: str) -> str:
        s = re.sub(r"[^\w\s]", " ", _lower_norm(s))
        return re.sub(r"\s+", " ", re.sub(r"\b(a|an|the)\b", " ", s)).strip()

    if pred is None:
        return None
    for name, fn in (("date", normalize_date), ("em", em), ("lower", _lower_norm)):
        a, b = fn(gold), fn(pred)
        if a and b and a == b:
            return name
    return None


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
