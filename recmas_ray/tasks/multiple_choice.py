"""Multiple-choice tasks: GPQA-Diamond, MedQA.

Prompt fields: the stem with lettered options and `CHOICE_SUFFIX`; `gold` is the option letter, `options`
the option texts (GPQA's are shuffled with the run's seed). Graded here: `extract_choice`; `TASK` is the
family.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Sequence

from recmas_ray.tasks.base import BenchmarkSpec, GradeResult, Task
from recmas_ray.tasks.math import extract_boxed
from recmas_ray.tasks.records import _field, _item, _text


CHOICE_SUFFIX = "Choose the correct option (A/B/C/D)."


def _choice_question(stem: str, options: list[str]) -> str:
    lines = "\n".join(f"{chr(65 + i)}. {o}" for i, o in enumerate(options))
    return f"{stem}\n{lines}\n\n{CHOICE_SUFFIX}"


def _gpqa(rows, name, *, seed=0, gpqa_shuffle_options=True, **_):
    out = []
    keys = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
    for i, r in enumerate(rows):
        stem = _text(r, ("Question", "question"), i, name).strip()
        opts = [_text(r, (k,), i, name).strip() for k in keys]
        if gpqa_shuffle_options:
            opts, gold = shuffle_options(stem, opts, 0, seed)
        else:
            gold = "A"
        out.append(_item(_field(r, ("Record ID",), i, name, required=False) or i,
                         _choice_question(stem, opts), gold, "choice", name, stem, options=opts))
    return out


def _medqa(rows, name, **_):
    out = []
    for i, r in enumerate(rows):
        stem = _text(r, ("query", "question"), i, name).strip()
        raw = _field(r, ("options",), i, name)
        if isinstance(raw, dict):
            opts = [str(raw[k]).strip() for k in sorted(raw)]
        elif isinstance(raw, list):  # LatentMAS layout: ["A. text", ...]
            opts = [re.sub(r"^\s*[A-Ja-j]\s*[\.\):\-]\s*", "", str(o)).strip() for o in raw]
        else:
            raise ValueError(f"{name}: row {i} options must be a dict or a list, got {type(raw).__name__}")
        gold = str(r.get("answer_idx") or "").strip().upper()
        if not gold:
            ans = re.sub(r"\s+", " ", _text(r, ("answer",), i, name)).strip().lower()
            norm = [re.sub(r"\s+", " ", o).lower() for o in opts]
            hits = [j for j, o in enumerate(norm) if o == ans] or \
                [j for j, o in enumerate(norm) if ans in o or o in ans]
            if not hits:
                raise ValueError(f"{name}: row {i} answer {ans[:60]!r} matches no option")
            gold = chr(65 + hits[0])
        if not re.fullmatch(r"[A-J]", gold) or ord(gold) - 65 >= len(opts):
            raise ValueError(f"{name}: row {i} answer_idx {gold!r} is not one of the option letters")
        lettered = re.search(r"(?mi)^\s*[A-D]\s*[\.\):\-]\s+", stem)
        question = stem if lettered else "\n".join(
            [stem] + [f"{chr(65 + j)}. {o}" for j, o in enumerate(opts)])
        if "choose the correct option" not in question.lower():
            question = f"{question.rstrip()}\n\n{CHOICE_SUFFIX}"
        # The LatentMAS copy repeats its idx/pid values, so only `realidx` is trusted as an id.
        doc = r.get("realidx")
        out.append(_item(doc if doc is not None else i, question, gold, "choice", name, stem,
                         options=opts))
    return out


# ----------------------------------------------------------------------------- grading

LETTERS = "ABCDEFGHIJ"


def shuffle_options(stem: str, options: Sequence[str], gold_index: int, seed: int
                    ) -> tuple[list[str], str]:
    """Deterministically permute `options`; returns (new options, letter of the gold option).

    Same permutation as the release: md5 of f"{seed}::{stem}" (first 16 hex digits) seeds
    `random.Random`, which shuffles the index list; position i shows option perm[i].
    """
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



def _letters(record: dict) -> str:
    return LETTERS[:len(record.get("options") or "ABCD")]


def grade(record: dict, response: str, mode: str) -> GradeResult:
    """Strict: the extracted letter equals gold; reference: an unparsable answer counts as "A" (the release)."""
    letter = extract_choice(response, _letters(record))
    gold = str(record["gold"]).strip().upper()
    verdicts = {"strict": letter == gold, "reference": (letter or "A") == gold}
    chosen = letter if mode == "strict" else (letter or "A")
    return GradeResult(verdicts[mode], chosen, letter is None, dict(verdicts))


BENCHMARKS = {
    "gpqa_diamond": BenchmarkSpec("Idavidrein/gpqa", "gpqa_diamond", "train", _gpqa, aliases=("gpqa",)),
    "medqa": BenchmarkSpec(None, None, "test", _medqa),
}

TASK = Task("choice", instruction="Reason step by step and put only the letter of the final choice within "
                                  "\\boxed{}, for example \\boxed{A}.",
            answer_found=lambda item, text: extract_choice(text, _letters(item)) is not None, grade=grade,
            retry_suffix="\nFinal Choice: \\boxed{", benchmarks=BENCHMARKS,
            local_fields=lambda row, gold: {"options": row["options"]} if "options" in row else {})
