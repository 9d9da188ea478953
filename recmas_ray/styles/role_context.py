"""Per-role context of a question: facts told only to some roles (the hidden-operand rows).

`with_role_context` puts a marker line with the role -> text table (JSON) ahead of the shared question;
`question_for_role` is the question as one role sees it (its own context first, the others' removed).
"""

from __future__ import annotations

import json

ROLE_CONTEXT_MARK = "[[role_context "
"""Start of the marker line that carries a question's per-role context (JSON) ahead of the shared text."""
_ROLE_CONTEXT_END = "]]\n"


def with_role_context(question: str, role_context: dict[str, str] | None) -> str:
    """`question` with a per-role context attached (role -> text told only to that role); unchanged if none."""
    if not role_context:
        return question
    if question.startswith(ROLE_CONTEXT_MARK):
        raise ValueError("the question already carries a role context")
    bad = {k: v for k, v in role_context.items() if not isinstance(k, str) or not isinstance(v, str) or not v.strip()}
    if bad:
        raise ValueError(f"role_context must map role names to non-empty text, got {bad!r}")
    blob = json.dumps(role_context, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return f"{ROLE_CONTEXT_MARK}{blob}{_ROLE_CONTEXT_END}{question}"


def split_role_context(question: str) -> tuple[dict[str, str], str]:
    """(role context, shared question text) of a question built by `with_role_context` ({} if it has none)."""
    if not question.startswith(ROLE_CONTEXT_MARK):
        return {}, question
    blob, sep, rest = question[len(ROLE_CONTEXT_MARK):].partition(_ROLE_CONTEXT_END)
    try:
        context = json.loads(blob) if sep else None
    except ValueError:
        context = None
    if not isinstance(context, dict):
        raise ValueError(f"malformed role context marker at the start of the question: {question[:80]!r}")
    return context, rest


def question_for_role(question: str, role: str) -> str:
    """The question as `role` sees it: its own context first ("x = 17. What is x - 8?"), others' removed."""
    context, shared = split_role_context(question)
    own = context.get(role)
    return f"{own} {shared}" if own else shared
