"""Code graders: run an extracted program against a benchmark's tests in the sandbox.

One entry point takes every code-task interface; loaders pass the row's interface fields through:

    grade_program(program, test_type=..., tests=None, inputs=(), outputs=(), fn_name=None,
                  timeout_s=..., memory_mb=2048, prelude=CODE_PRELUDE, num_tests=1) -> CodeResult

* ``test_type="script"`` (alias ``"assert"``): assert-based tests (HumanEval ``check(entry_point)``, MBPP/MBPP+,
  evalplus scripts); with ``fn_name``, a script that defines ``check(candidate)`` without calling it gets
  ``check(fn_name)`` appended. `code_suites.split_suite` splits the script into calls and checks: the sandbox
  only makes the calls and sends back their values as plain data, the parent evaluates every assertion
  (``grading="parent"``). A script that cannot be split (random inputs, helper functions, ...) runs whole in
  the sandbox, which reports through a per-call nonce that it ran to its end (``grading="in_sandbox"``, with
  the reason in ``grading_note``): that path keeps a secret inside the program's own process, so a program
  that reads its memory can fool it.
* ``test_type="functional"``: LiveCodeBench ``testtype == "functional"`` rows: ``fn_name`` (``metadata.func_name``)
  is called as ``Solution().fn_name`` or a plain function on each input (newline-separated JSON arguments);
  the values come back to the parent, which compares them with ``outputs`` (JSON) as LiveCodeBench does.
* ``test_type="stdin"`` (alias ``"stdio"``): LiveCodeBench ``testtype == "stdin"`` rows: the program runs once
  per input with it on stdin; the parent compares stdout with the output line by line (Decimal tolerance).

In the parent-graded modes, expected values never enter the sandbox and nothing the program returns is trusted
but its value: the child encodes each value as strict JSON of plain types (`sandbox.values.encode_value`: exact builtin
types only, so an object that compares equal to anything or a list subclass with its own ``__eq__`` is a
failure, NOT_DATA) and the parent compares what it decodes. Output the program forges on any descriptor can only
claim values, which pass only if they are the right ones. Every run goes through `recmas_ray.sandbox`, so
hostile candidate code becomes a failed test, never a crash of the grader.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Sequence

from recmas_ray.sandbox import SandboxConfig, run_python
from recmas_ray.sandbox.values import PROBE_MARK, decode_value, encode_value
from recmas_ray.tasks.code_suites import Probe, SplitSuite, Unsplittable, split_suite

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
    """None, or EMPTY_CODE, NO_TESTS, TLE, MLE, RE, WA, NO_FUNC, NOT_DATA (a value that is not plain data),
    BAD_TEST, SANDBOX (refused)."""
    detail: str = ""
    """Short human-readable reason (stderr tail, mismatch, ...)."""
    seconds: float = 0.0
    """Wall seconds spent in the sandbox."""
    grading: str = "parent"
    """Where the verdict was computed: "parent" (from returned values) or "in_sandbox" (unsplittable script)."""
    grading_note: str = ""
    """Why a script was graded in the sandbox (what `code_suites.split_suite` could not split)."""


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
         tests: str | None = None, max_output_chars: int = 6000, grading: dict | None = None):
    # The CPU limit follows the wall limit so a long multi-test run is not cut short by the
    # sandbox's default CPU budget; an infinite loop still ends at whichever comes first.
    cfg = SandboxConfig(timeout_s=timeout_s, cpu_time_s=int(math.ceil(timeout_s)) + 1,
                        memory_mb=memory_mb, max_output_chars=max_output_chars)
    return run_python(code, config=cfg, stdin=stdin, prelude=prelude, tests=tests, grading=grading)


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


_MAX_RESULT_CHARS = 8_000_000  # the probe results line (values of every call) is cut here and then fails


def _reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


def run_probes(program: str, probes: Sequence[Probe], *, timeout_s: float, memory_mb: int, prelude: str,
               method_of: str | None = None,
               per_call_timeout_s: int = 0) -> tuple[list[dict] | None, CodeResult | None, float]:
    """Make `probes` in the sandbox after `program`; (outcomes with decoded values, None, seconds) or
    (None, the failure, seconds). Only the one well-formed results line counts; anything else fails."""
    calls = [{"fn": p.fn, "args": encode_value(tuple(p.args)), "kwargs": encode_value(dict(p.kwargs))}
             for p in probes]
    spec = {"calls": calls, "method_of": method_of, "per_call_timeout_s": int(per_call_timeout_s)}
    res = _run(program, timeout_s=timeout_s, memory_mb=memory_mb, prelude=prelude, grading=spec,
               max_output_chars=_MAX_RESULT_CHARS)
    n = len(probes)
    frames = [ln for ln in res.stdout.split("\n") if ln.startswith(PROBE_MARK)]
    fail = _failure_from(res, n)
    if fail or len(frames) != 1:
        why = "no single results line from the sandbox (the program exited early or wrote its own): "
        return None, fail or CodeResult(False, 0, n, "RE", why + res.stderr[-600:], res.seconds), res.seconds
    try:
        report = json.loads(frames[0][len(PROBE_MARK):], parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        report = None
    if isinstance(report, dict) and isinstance(report.get("load_error"), dict):
        err = report["load_error"]
        return None, CodeResult(False, 0, n, "RE", f"the program raised {str(err.get('error'))[:80]} while loading: "
                                f"{str(err.get('detail'))[:400]}", res.seconds), res.seconds
    outcomes = report.get("outcomes") if isinstance(report, dict) else None
    if not isinstance(outcomes, list) or len(outcomes) > n or not all(isinstance(o, dict) for o in outcomes):
        return None, CodeResult(False, 0, n, "RE", "unreadable results line", res.seconds), res.seconds
    decoded = []
    for o in outcomes:
        if "value" in o:
            try:
                decoded.append({"value": decode_value(o["value"])})
            except (ValueError, RecursionError) as exc:
                decoded.append({"error": "NotPlainData", "detail": str(exc)[:200]})
        else:
            decoded.append({"error": str(o.get("error"))[:80], "detail": str(o.get("detail", ""))[:300]})
    return decoded, None, res.seconds


def grade_code(program: str | None, tests: str, *, timeout_s: float = 10.0,
               memory_mb: int = 2048, prelude: str = "", num_tests: int = 1,
               fn_name: str | None = None) -> CodeResult:
    """Run `program` against the assert-based `tests` script (see the module docstring).

    Split suites: the sandbox makes the calls, the parent judges each assertion (``num_tests`` then counts the
    assertions, loops unrolled). Other scripts: pass iff the sandbox's harness reports, with a per-call nonce,
    that the script ran to its end (exit(), sys.exit(0), os._exit(0) or forged output cannot pass).
    ``fn_name``, the entry point, names the program's function even where it shadows a builtin (``sum``).
    """
    if not program or not program.strip():
        return CodeResult(False, 0, num_tests, "EMPTY_CODE", "no code after parsing")
    if not tests or not tests.strip():
        return CodeResult(False, 0, 0, "NO_TESTS", "no executable tests")
    try:
        suite = split_suite(tests, fn_name)
        encode_value([(p.args, p.kwargs) for p in suite.probes])  # test data the sandbox cannot receive: unsplit
    except (Unsplittable, TypeError) as why:
        return _grade_in_sandbox(program, tests, timeout_s=timeout_s, memory_mb=memory_mb, prelude=prelude,
                                 num_tests=num_tests, note=str(why), fn_name=fn_name)
    return _grade_split(program, suite, timeout_s=timeout_s, memory_mb=memory_mb, prelude=prelude)


def _grade_split(program: str, suite: SplitSuite, *, timeout_s: float, memory_mb: int, prelude: str) -> CodeResult:
    n = len(suite.checks)
    outcomes, fail, seconds = run_probes(program.strip() + "\n", suite.probes, timeout_s=timeout_s,
                                         memory_mb=memory_mb, prelude=prelude)
    if fail:
        fail.num_tests = n
        return fail
    passed, error_type, detail = suite.verdict(outcomes)
    return CodeResult(error_type is None, passed, n, error_type, detail, seconds)


def _grade_in_sandbox(program: str, tests: str, *, timeout_s: float, memory_mb: int, prelude: str,
                      num_tests: int, note: str, fn_name: str | None) -> CodeResult:
    res = _run(program.strip() + "\n", timeout_s=timeout_s, memory_mb=memory_mb, prelude=prelude,
               tests=tests.strip() + "\n", grading={"program_names": [fn_name] if fn_name else []})
    if res.tests_passed:
        out = CodeResult(True, num_tests, num_tests, None, "OK", res.seconds)
    else:
        out = _failure_from(res, num_tests) or CodeResult(False, 0, num_tests, "RE", "the tests did not run to the "
                                                         "end (the program exited early)", res.seconds)
    out.grading, out.grading_note = "in_sandbox", note[:300]
    return out


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


def _lcb_equal(got, want) -> bool:
    """LiveCodeBench's call-based comparison: a returned tuple counts as a list (top level only), then ==."""
    return (list(got) if isinstance(got, tuple) else got) == want


def grade_functional(program: str | None, fn_name: str, inputs: Sequence[str],
                     outputs: Sequence[str], *, timeout_s: float = 6.0, memory_mb: int = 2048,
                     prelude: str = CODE_PRELUDE) -> CodeResult:
    """LiveCodeBench functional tests: call `fn_name` (or `Solution().fn_name`) on JSON args.

    Each test input is newline-separated JSON arguments and each output one JSON value, as in
    the published `public_test_cases`. One sandboxed process makes every call, each under an alarm;
    it sends back the values and the parent compares them with the expected outputs, which never
    enter the sandbox.
    """
    n = len(inputs)
    if not program or not program.strip():
        return CodeResult(False, 0, n, "EMPTY_CODE", "no code after parsing")
    if n == 0 or len(outputs) != n:
        return CodeResult(False, 0, n, "NO_TESTS", f"{n} inputs, {len(outputs)} outputs")
    probes, wants = [], []
    for i, (inp, want) in enumerate(zip(inputs, outputs)):
        try:
            probes.append(Probe(fn_name, tuple(json.loads(ln) for ln in inp.split("\n") if ln.strip())))
            wants.append(json.loads(want))
        except (json.JSONDecodeError, TypeError) as exc:
            return CodeResult(False, i, n, "BAD_TEST", f"test {i}: unreadable input or output ({exc})")
    per_test = max(1, int(math.ceil(timeout_s)))
    outcomes, fail, seconds = run_probes(program, probes, timeout_s=per_test * (n + 1) + 2, memory_mb=memory_mb,
                                         prelude=prelude, per_call_timeout_s=per_test,
                                         method_of="Solution" if "class Solution" in program else None)
    if fail:
        return fail
    for i, want in enumerate(wants):
        got = outcomes[i] if i < len(outcomes) else {"error": "TimeoutError", "detail": "not run"}
        if "value" not in got:
            err = got["error"]
            kind = {"TimeoutError": "TLE", "NO_FUNC": "NO_FUNC", "NotPlainData": "NOT_DATA"}.get(err, "RE")
            return CodeResult(False, i, n, kind, f"test {i}: {err}: {got.get('detail', '')}"[:800], seconds)
        if not _lcb_equal(got["value"], want):
            return CodeResult(False, i, n, "WA", f"test {i}: expected {str(outputs[i])[:300]}, got "
                              f"{str(got['value'])[:300]}", seconds)
    return CodeResult(True, n, n, None, "OK", seconds)


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
                          num_tests=num_tests, fn_name=fn_name)
    if kind == "functional":
        if not fn_name:
            raise ValueError("test_type='functional' needs fn_name (LiveCodeBench metadata.func_name)")
        return grade_functional(program, fn_name, inputs, outputs, timeout_s=timeout_s, memory_mb=memory_mb,
                                prelude=prelude)
    return grade_stdio(program, inputs, outputs, timeout_s=timeout_s, memory_mb=memory_mb)
