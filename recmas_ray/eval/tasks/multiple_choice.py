"""Multiple-choice tasks: GPQA-Diamond, MedQA.

Prompt fields: the stem with lettered options and `CHOICE_SUFFIX`; `gold` is the option letter, `options`
the option texts (GPQA's are shuffled with the run's seed). Graded by `graders.extract_choice`
(``grade("choice", ...)``).
"""

from __future__ import annotations

import re

from recmas_ray.eval.graders import shuffle_options
from recmas_ray.eval.tasks.records import _field, _item, _text


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


LOADERS = {"gpqa_diamond": _gpqa, "medqa": _medqa}
