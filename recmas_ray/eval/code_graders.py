"""Code graders: run an extracted program against a benchmark's tests in the sandbox.

Three test modes: a test script appended to the program (MBPP+, HumanEval), stdin/stdout pairs
compared line by line with a numeric tolerance (LiveCodeBench stdin tasks), and functional calls of
a named function (LiveCodeBench functional tasks). Every run goes through `recmas_ray.sandbox`, so
hostile candidate code becomes a failed test, never a crash of the grader.
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


def _run(code: str, *, timeout_s: float, memory_mb: int, stdin: str = "", prelude: str = ""):
    from recmas_ray.sandbox import SandboxConfig, run_python

    # The CPU limit follows the wall limit so a long multi-test run is not cut short by the
    # sandbox's default CPU budget; an infinite loop still ends at whichever comes first.
    cfg = SandboxConfig(timeout_s=timeout_s, cpu_time_s=int(math.ceil(timeout_s)) + 1,
                        memory_mb=memory_mb)
    return run_python(code, config=cfg, stdin=stdin, prelude=prelude)


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
    """Run `program` followed by the `tests` script in the sandbox; pass iff it exits with 0."""
    if not program or not program.strip():
        return CodeResult(False, 0, num_tests, "EMPTY_CODE", "no code after parsing")
    if not tests or not tests.strip():
        return CodeResult(False, 0, 0, "NO_TESTS", "no executable tests")
    res = _run(program.strip() + "\n\n" + tests.strip() + "\n", timeout_s=timeout_s,
               memory_mb=memory_mb, prelude=prelude)
    fail = _failure_from(res, num_tests)
    return fail or CodeResult(True, num_tests, num_tests, None, "OK", res.seconds)


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
_FUNCTIONAL_HARNESS = r'''
import io as _io, json as _json, signal as _signal, sys as _sys
_real_out = _sys.stdout
def _emit(**kw):
    _real_out.write("\n%s%s\n" % (_MARK, _json.dumps(kw)))
    _real_out.flush()
class _TLE(Exception):
    pass
def _alarm(signum, frame):
    raise _TLE()
_signal.signal(_signal.SIGALRM, _alarm)
_sys.stdout = _io.StringIO()
_ns = {"__name__": "candidate"}
try:
    _signal.alarm(_TIMEOUT)
    exec(compile(_PRELUDE + "\n\n" + _SRC, "<candidate>", "exec"), _ns)
    _signal.alarm(0)
except _TLE:
    _emit(ok=False, passed=0, err="TLE", detail="timeout while loading the program"); raise SystemExit(0)
except BaseException as e:
    _signal.alarm(0); _emit(ok=False, passed=0, err="RE", detail=repr(e)[:800]); raise SystemExit(0)
_obj = _ns["Solution"]() if ("class Solution" in _SRC and "Solution" in _ns) else None
_fn = getattr(_obj, _FN, None) if _obj is not None else _ns.get(_FN)
if not callable(_fn):
    _emit(ok=False, passed=0, err="NO_FUNC", detail="callable %r not found" % _FN); raise SystemExit(0)
_passed = 0
for _i, (_inp, _exp) in enumerate(_CASES):
    try:
        _args = [_json.loads(l) for l in _inp.split("\n") if l.strip()]
        _want = _json.loads(_exp)
    except Exception as e:
        _emit(ok=False, passed=_passed, err="BAD_TEST", detail=repr(e)[:400]); raise SystemExit(0)
    try:
        _signal.alarm(_TIMEOUT)
        _got = _fn(*_args)
        _signal.alarm(0)
    except _TLE:
        _emit(ok=False, passed=_passed, err="TLE", detail="test %d" % _i); raise SystemExit(0)
    except BaseException as e:
        _signal.alarm(0); _emit(ok=False, passed=_passed, err="RE", detail=repr(e)[:800]); raise SystemExit(0)
    if isinstance(_got, tuple):
        _got = list(_got)
    if _got != _want:
        _emit(ok=False, passed=_passed, err="WA", detail="test %d: expected %s, got %s" % (
            _i, str(_want)[:300], str(_got)[:300])); raise SystemExit(0)
    _passed += 1
_emit(ok=True, passed=_passed, err=None, detail="OK")
'''


def grade_functional(program: str | None, fn_name: str, inputs: Sequence[str],
                     outputs: Sequence[str], *, timeout_s: float = 6.0, memory_mb: int = 2048,
                     prelude: str = CODE_PRELUDE) -> CodeResult:
    """LiveCodeBench functional tests: call `fn_name` (or `Solution().fn_name`) on JSON args.

    Each test input is newline-separated JSON arguments and each output one JSON value, as in
    the published `public_test_cases`. One sandboxed process runs all tests, each under an alarm.
    """
    n = len(inputs)
    if not program or not program.strip():
        return CodeResult(False, 0, n, "EMPTY_CODE", "no code after parsing")
    if n == 0 or len(outputs) != n:
        return CodeResult(False, 0, n, "NO_TESTS", f"{n} inputs, {len(outputs)} outputs")
    per_test = max(1, int(math.ceil(timeout_s)))
    header = (f"_MARK = {_RESULT_MARK!r}\n_TIMEOUT = {per_test}\n_FN = {fn_name!r}\n"
              f"_SRC = {program!r}\n_PRELUDE = {prelude!r}\n"
              f"_CASES = {json.dumps(list(zip(inputs, outputs)))!r}\n_CASES = __import__('json').loads(_CASES)\n")
    res = _run(header + _FUNCTIONAL_HARNESS, timeout_s=per_test * (n + 1) + 2, memory_mb=memory_mb)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(_RESULT_MARK)]
    if not lines:
        fail = _failure_from(res, n)
        return fail or CodeResult(False, 0, n, "RE", "program exited without a result", res.seconds)
    out = json.loads(lines[-1][len(_RESULT_MARK):])
    return CodeResult(bool(out["ok"]), int(out["passed"]), n, out["err"], out["detail"],
                      res.seconds)


