"""Math tasks: MATH-500, AIME 2025 / 2026, GSM8K.

Prompt fields: the problem as the question, the final answer as `gold` (`solution` keeps the worked one);
the style's math instruction asks for ``\\boxed{}``. Graded here: `grade_math_strict` (the
paper's runner) or `grade_math_reference` (``--grader reference``); `grade_lenient` judges a reply by the
final number it states, whatever its format; `with_format_help` / `apply_format_help` append the same
answer-format help to every question of a comparison. `BENCHMARKS` are the family's sources and loaders,
`TASK` is the family.
"""

from __future__ import annotations

import re
import threading

from recmas_ray.tasks.base import BenchmarkSpec, GradeResult, Task
from recmas_ray.tasks.records import _field, _item, _text


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
        from math_verify import parse, verify  # lazy: loads sympy (~1 s): only strict math grading needs it
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


# ----------------------------------------------------------------------------- lenient: the value stated
# It separates "the reply holds the value" from "the reply is in the graded format" (a model told a fact in plain
# text states it, often without \\boxed{}); the reply graded is the sample's own (eval.samples.own_reply).

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?")


def final_number(text: str | None) -> float | None:
    """The last number written in `text` ("so x = 65." -> 65.0; "17 - 8 = 9" -> 9.0; "1,250" -> 1250.0), or None."""
    found = _NUMBER.findall(text or "")
    return float(found[-1].replace(",", "")) if found else None


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


# ----------------------------------------------------------------------------- format help
# The same answer-format instruction or worked example appended to every row's question: a comparison between
# methods says something about information only when every method had the same chance at the graded format
# (trained links learn to end with \\boxed{value} from their gold answers, a text baseline may state the value
# without it). Appended to the question every role sees (per-role context markers, `styles.role_context`, stay in
# front), so the single agent, the text methods and the latent methods all read it; `grade_lenient` is the other
# half.

FORMAT_HELP_MODES = ("none", "instruction", "few_shot")
"""none: the question as it is; instruction: one sentence asking for the value alone in \\boxed{}; few_shot: the
instruction plus two worked examples of the reply's form."""

FORMAT_HELP_INSTRUCTION = "End your reply with the final value alone inside \\boxed{}, for example \\boxed{42}."
FORMAT_HELP_FEW_SHOT = ("Examples of the reply's form:\n"
                        "Question: y = 12. What is y? Reply: y = 12. \\boxed{12}\n"
                        "Question: What is 7 + 5? Reply: 7 + 5 = 12. \\boxed{12}")


FORMAT_HELP_ONE_EXAMPLE = "Example of the reply's form:\nQuestion: y = 12. What is y? Reply: y = 12. \\boxed{12}"
"""The one worked example of the decoder's format help (`decoder_help_text`)."""


def decoder_help_text() -> str:
    """What `--format_help` appends to the decoder's prompt (`eval.rows`): the instruction and one example."""
    return f"{FORMAT_HELP_INSTRUCTION}\n{FORMAT_HELP_ONE_EXAMPLE}"


def format_help_text(mode: str) -> str:
    """The text `mode` appends ("" for none)."""
    if mode not in FORMAT_HELP_MODES:
        raise ValueError(f"format help {mode!r}; expected one of {', '.join(FORMAT_HELP_MODES)}")
    return {"none": "", "instruction": FORMAT_HELP_INSTRUCTION,
            "few_shot": f"{FORMAT_HELP_INSTRUCTION}\n{FORMAT_HELP_FEW_SHOT}"}[mode]


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


BENCHMARKS = {
    "math500": BenchmarkSpec("HuggingFaceH4/MATH-500", None, "test", _math500,
                             aliases=("math-500", "huggingfaceh4/math-500")),
    "aime2025": BenchmarkSpec("math-ai/aime25", None, "test", _aime, "pass@10", aliases=("aime25",)),
    "aime2026": BenchmarkSpec("MathArena/aime_2026", None, "train", _aime, "pass@10", aliases=("aime26",)),
    "gsm8k": BenchmarkSpec("openai/gsm8k", "main", "test", _gsm8k, aliases=("openai/gsm8k",)),
}

# The release's retry suffix (its answer-format retry, docs/reproducing.md).
TASK = Task("math", instruction="Reason step by step and put the final answer within \\boxed{}, for example "
                                "\\boxed{1}.",
            answer_found=has_boxed_answer, grade=grade, retry_suffix="\nFinal Answer: \\boxed{", benchmarks=BENCHMARKS,
            local_fields=lambda row, gold: {})
