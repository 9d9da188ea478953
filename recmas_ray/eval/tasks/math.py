"""Math tasks: MATH-500, AIME 2025 / 2026, GSM8K.

Prompt fields: the problem as the question, the final answer as `gold` (`solution` keeps the worked one);
the style's math instruction asks for ``\\boxed{}``. Graded here: `grade_math_strict` (the
paper's runner) or `grade_math_reference` (``--grader reference``); `TASK` is the family.
"""

from __future__ import annotations

import re
import threading

from recmas_ray.eval.tasks.base import GradeResult, Task
from recmas_ray.eval.tasks.records import _field, _item, _text


def _math500(rows, name, **_):
    return [_item(_field(r, ("unique_id", "id"), i, name, required=False) or i,
                  _text(r, ("problem",), i, name), _text(r, ("answer",), i, name).strip(),
                  "math", name, str(r["problem"]), solution=str(r.get("solution") or ""),
                  subject=str(r.get("subject") or ""), level=str(r.get("level") or ""))
            for i, r in enumerate(rows)]


def _aime(rows, name, **_):
    out = []
    for i, r in enumerate(rows):
        q = _text(r, ("problem", "question", "Problem"), i, name)
        gold = _text(r, ("answer", "Answer"), i, name).strip()
        if gold.isdigit():
            gold = gold.lstrip("0") or "0"  # some copies keep leading zeros: "025"
        doc = _field(r, ("id", "problem_idx", "ID"), i, name, required=False)
        out.append(_item(doc if doc is not None else i, q, gold, "math", name, q))
    return out


def _gsm8k(rows, name, **_):
    out = []
    for i, r in enumerate(rows):
        q, sol = _text(r, ("question",), i, name), _text(r, ("answer",), i, name)
        m = re.search(r"####\s*(.+?)\s*$", sol, re.DOTALL)
        if not m:
            raise ValueError(f"{name}: row {i} answer has no '#### <number>' final line")
        out.append(_item(i, q, m[1].replace(",", "").strip(), "math", name, q, solution=sol))
    return out


# ----------------------------------------------------------------------------- grading

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
    # as "\\$18.90" and math_verify cannot parse those, so it is dropped first.
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



def grade(record: dict, response: str, mode: str) -> GradeResult:
    """Strict: `math_verify` on the extracted answer; reference: the release's normalisation chain."""
    extracted = extract_math_answer(response)
    gold = str(record["gold"])
    ref_pred = _reference_extract(response)
    verdicts = {"strict": grade_math_strict(response, gold),
                "reference": reference_math_strategy(ref_pred, gold) is not None}
    detail = {**verdicts, "reference_extracted": ref_pred,
              "reference_strategy": reference_math_strategy(ref_pred, gold)}
    return GradeResult(verdicts[mode], extracted, extracted is None, detail)


def has_boxed_answer(item: dict, text: str) -> bool:
    """The answer format of math (and QA): a ``\\boxed{}``."""
    return extract_boxed(text) is not None


LOADERS = {"math500": _math500, "aime2025": _aime, "aime2026": _aime, "gsm8k": _gsm8k}

# The release's retry suffix (its answer-format retry, docs/reproducing.md).
TASK = Task("math", instruction="Reason step by step and put the final answer within \\boxed{}, for example "
                                "\\boxed{1}.",
            answer_found=has_boxed_answer, grade=grade, retry_suffix="\nFinal Answer: \\boxed{", loaders=LOADERS,
            local_fields=lambda row, gold: {})
