"""Math tasks: MATH-500, AIME 2025 / 2026, GSM8K.

Prompt fields: the problem as the question, the final answer as `gold` (`solution` keeps the worked one);
the style's math instruction asks for ``\\boxed{}``. Graded by `graders.grade_math_strict` (the paper's
runner) or `graders.grade_math_reference` (``--grader reference``).
"""

from __future__ import annotations

import re

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


LOADERS = {"math500": _math500, "aime2025": _aime, "aime2026": _aime, "gsm8k": _gsm8k}
