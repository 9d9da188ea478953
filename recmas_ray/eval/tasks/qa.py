"""Short-answer QA tasks: HotpotQA, Bamboogle.

Prompt fields: the question (HotpotQA's wrapped in `QA_INSTRUCTION` and question markers, as the paper's
runner does); `gold` and its `aliases`. Graded by exact match / F1 (`graders.exact_match`, `graders.f1_score`).
"""

from __future__ import annotations

from recmas_ray.eval.tasks.records import _field, _item, _text


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


LOADERS = {"hotpotqa": _qa, "bamboogle": _qa}
