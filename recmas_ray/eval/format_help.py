"""Format help: the same answer-format instruction or worked example appended to every row's question.

A comparison between methods says something about information only when every method had the same chance at
the graded format: trained links learn to end with `\\boxed{value}` from their gold answers, a text baseline
(the decoder told the fact in text, TextMAS) may state the value without it. `with_format_help(question, mode)`
appends one fixed text to the question every role sees (per-role context markers, `styles.role_context`, stay
in front), so the single agent, the text methods and the latent methods all read it; `apply_format_help` does
it for a list of benchmark items and their per-role views. Grading both ways (`graders.grade_lenient`) is the
other half.
"""

from __future__ import annotations

FORMAT_HELP_MODES = ("none", "instruction", "few_shot")
"""none: the question as it is; instruction: one sentence asking for the value alone in \\boxed{}; few_shot: the
instruction plus two worked examples of the reply's form."""

INSTRUCTION = "End your reply with the final value alone inside \\boxed{}, for example \\boxed{42}."
FEW_SHOT = ("Examples of the reply's form:\n"
            "Question: y = 12. What is y? Reply: y = 12. \\boxed{12}\n"
            "Question: What is 7 + 5? Reply: 7 + 5 = 12. \\boxed{12}")


ONE_EXAMPLE = "Example of the reply's form:\nQuestion: y = 12. What is y? Reply: y = 12. \\boxed{12}"
"""The one worked example of the decoder's format help (`decoder_help_text`)."""


def decoder_help_text() -> str:
    """What `--format_help` appends to the decoder's prompt (`eval.rows`): the instruction and one example."""
    return f"{INSTRUCTION}\n{ONE_EXAMPLE}"


def format_help_text(mode: str) -> str:
    """The text `mode` appends ("" for none)."""
    if mode not in FORMAT_HELP_MODES:
        raise ValueError(f"format help {mode!r}; expected one of {', '.join(FORMAT_HELP_MODES)}")
    return {"none": "", "instruction": INSTRUCTION, "few_shot": f"{INSTRUCTION}\n{FEW_SHOT}"}[mode]


def with_format_help(question: str, mode: str) -> str:
    """`question` with the format help of `mode` after it (unchanged for none)."""
    help_text = format_help_text(mode)
    return f"{question}\n\n{help_text}" if help_text else question


def apply_format_help(items: list[dict], mode: str,
                      role_questions: dict[str, dict[str, str]] | None = None) -> tuple[list[dict], dict | None]:
    """(items, role_questions) with the same help on every question and on every role's view of it (doc id ->
    role -> text), so no method reads a different instruction; the inputs are not modified."""
    format_help_text(mode)  # checks the mode before anything is built
    items = [{**i, "question": with_format_help(i["question"], mode)} for i in items]
    if role_questions is not None:
        role_questions = {d: {r: with_format_help(q, mode) for r, q in views.items()}
                          for d, views in role_questions.items()}
    return items, role_questions


__all__ = ["FORMAT_HELP_MODES", "decoder_help_text", "format_help_text", "with_format_help", "apply_format_help"]
