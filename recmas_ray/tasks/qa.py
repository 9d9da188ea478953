"""Short-answer QA tasks: HotpotQA, Bamboogle.

Prompt fields: the question (HotpotQA's wrapped in `QA_INSTRUCTION` and question markers, as the paper's
runner does); `gold` and its `aliases`. Graded here: exact match / F1 (`exact_match`, `f1_score`); `TASK` is the
family.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Sequence

from recmas_ray.tasks.base import BenchmarkSpec, GradeResult, Task
from recmas_ray.tasks.math import _reference_extract, extract_math_answer, has_boxed_answer
from recmas_ray.tasks.records import _field, _item, _text


QA_INSTRUCTION = "Answer the question. You may use available tools if needed."


def _qa(rows, name, *, qa_wrap=None, **_):
    wrap = (name == "hotpotqa") if qa_wrap is None else qa_wrap
    out = []
    for i, r in enumerate(rows):
        q = _text(r, ("question", "Question"), i, name).strip()
        gold = _text(r, ("answer", "Answer"), i, name).strip()
        aliases = [gold] + [str(r[k]).strip() for k in ("Answer 2", "answer_2")
                            if str(r.get(k) or "").strip()]
        question = f"{QA_INSTRUCTION}\n\n[Question Start]\n{q}\n[Question End]" if wrap else q
        doc = _field(r, ("id", "_id", "ID"), i, name, required=False)
        out.append(_item(doc if doc is not None else i, question, gold, "qa", name, q,
                         aliases=aliases))
    return out


# ----------------------------------------------------------------------------- grading

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
        from dateutil import parser as date_parser  # lazy: ~50 ms on first use: only date-like golds need it

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



def grade(record: dict, response: str, mode: str) -> GradeResult:
    """Strict: SQuAD exact match of the boxed answer against every gold alias; reference: the release's chain."""
    golds = [str(record["gold"])] + [a for a in record.get("aliases") or [] if a != record["gold"]]
    extracted = extract_math_answer(response)
    ref_pred = _reference_extract(response)
    strategy = _reference_qa_match(ref_pred, str(record["gold"]))
    verdicts = {"strict": extracted is not None and exact_match(extracted, golds),
                "reference": strategy is not None}
    detail = {**verdicts, "f1": f1_score(extracted or "", golds),
              "reference_extracted": ref_pred, "reference_strategy": strategy}
    return GradeResult(verdicts[mode], extracted if mode == "strict" else ref_pred, extracted is None, detail)


BENCHMARKS = {
    "hotpotqa": BenchmarkSpec("hotpotqa/hotpot_qa", "distractor", "validation", _qa, "exact_match"),
    "bamboogle": BenchmarkSpec("chiayewken/bamboogle", None, "test", _qa, "exact_match"),
}

# QA prompts ask for \boxed{} too, so the retry is math's.
TASK = Task("qa", instruction="Answer the question. You may use available tools if needed. Put the final short "
                              "answer within \\boxed{}.",
            answer_found=has_boxed_answer, grade=grade, retry_suffix="\nFinal Answer: \\boxed{", benchmarks=BENCHMARKS,
            local_fields=lambda row, gold: {"aliases": [gold]})
