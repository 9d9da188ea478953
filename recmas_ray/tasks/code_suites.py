"""Assert-style test suites split into candidate calls (run in the sandbox) and checks (judged here, in the parent).

`split_suite(tests)` reads a test script with `ast`, never running it: MBPP/MBPP+ asserts (``assert f(x) == y``,
``assert math.isclose(f(x), y, rel_tol=...)``, ``assert set(f(x)) == set(y)``, ``assert not f(x)``), evalplus
scripts (``inputs = [...]``, ``results = [...]``, ``for i, (inp, exp) in enumerate(zip(inputs, results)):
assertion(f(*inp), exp, atol)`` with evalplus' own ``is_floats``/``assertion`` helpers, recognised by their
syntax tree), and HumanEval ``def check(candidate): ...`` + ``check(entry_point)``. Every call of a function the
tests do not define is a `Probe`: its name and its arguments, which the parent evaluates from literals. Only the
probes go to the sandbox; the expected values and everything around the call (``==``, ``abs``, ``set``,
``math.isclose``, evalplus' float tolerance) are evaluated here on the plain data that comes back, so nothing the
program defines, patches or returns can take part in the comparison.

A script with anything else (loops over random inputs, helper functions, candidate calls nested in candidate
calls, names the parent cannot evaluate) raises `Unsplittable`; the grader then falls back to the in-sandbox
harness and says so (``grading: "in_sandbox"``).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from recmas_ray.tasks.code_checks import (_KNOWN_HELPERS, _MATH, Unsplittable, _Candidate, _CheckFailed, _Module,
                                        _call_args, _callee, _eval, _shape, _static, evalplus_assertion)

__all__ = ["Probe", "SplitSuite", "Unsplittable", "split_suite", "evalplus_assertion"]

_MAX_PROBES = 20_000

# A call's exception type name -> the error type of the test that needed its value.
_ERROR_KINDS = {"TimeoutError": "TLE", "NotRun": "TLE", "NotPlainData": "NOT_DATA", "NO_FUNC": "NO_FUNC"}


@dataclass
class Probe:
    """One call the sandbox makes: ``fn(*args, **kwargs)`` in the program's namespace."""

    fn: str
    """Name of the function in the program's namespace (or the method of ``Solution``)."""
    args: tuple
    """Positional arguments (plain data, evaluated in the parent)."""
    kwargs: dict = field(default_factory=dict)
    """Keyword arguments (plain data)."""


@dataclass
class _Check:
    node: ast.expr | ast.Call
    env: dict
    kind: str  # "assert" (truth of the expression) or "evalplus" (assertion(out, exp, atol))
    probe_of: dict  # id(call node) -> index into the suite's probes
    line: int


@dataclass
class SplitSuite:
    """A test suite as probes for the sandbox and checks for the parent."""

    probes: list[Probe]
    """Calls to make in the sandbox, in order."""
    checks: list[_Check]
    """Assertions, judged in the parent from the probes' values."""

    def verdict(self, outcomes: list[dict]) -> tuple[int, str | None, str]:
        """(checks passed before the first failure, its error type or None, why) from the probes' outcomes.

        ``outcomes[i]`` is ``{"value": v}`` (v decoded) or ``{"error": type name, "detail": ...}``; a missing
        outcome (the run stopped) fails the check that needed it. Error types: WA (a false check), RE (the
        call raised), TLE (it ran out of time), NOT_DATA (it returned something that is not plain data).
        """
        for i, check in enumerate(self.checks):
            def value_of(node):
                k = check.probe_of[id(node)]
                got = outcomes[k] if k < len(outcomes) else {"error": "NotRun", "detail": "the run stopped before"}
                if "value" in got:
                    return got["value"]
                err = str(got.get("error"))
                kind = _ERROR_KINDS.get(err, "RE")
                raise _CheckFailed(kind, f"{self.probes[k].fn}() raised {err}: {str(got.get('detail', ''))[:200]}")
            try:
                if check.kind == "evalplus":
                    out, exp, atol = (_eval(a, check.env, value_of) for a in check.node.args)
                    evalplus_assertion(out, exp, atol, check.env["__allclose__"])
                elif not _eval(check.node, check.env, value_of):
                    raise _CheckFailed("WA", "the assertion is false")
            except _CheckFailed as exc:
                return i, exc.args[0], f"line {check.line}: {exc.args[1]}"
            except Exception as exc:  # noqa: BLE001 (a comparison raising on the values is a failed test)
                return i, "WA", f"line {check.line}: {type(exc).__name__}: {str(exc)[:200]}"
        return len(self.checks), None, "OK"


# ----------------------------------------------------------------------------- splitting

class _Splitter:
    def __init__(self):
        self.probes: list[Probe] = []
        self.checks: list[_Check] = []
        self.checks_fns: dict[str, ast.FunctionDef] = {}

    def block(self, stmts: list[ast.stmt], env: dict) -> None:
        for st in stmts:
            self.stmt(st, env)

    def stmt(self, st: ast.stmt, env: dict) -> None:
        where = f"line {st.lineno}"
        if isinstance(st, ast.Pass) or (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant)):
            return
        if isinstance(st, ast.Import):
            for a in st.names:
                if a.name not in ("math", "numpy", "numpy.testing"):
                    raise Unsplittable(f"{where}: import {a.name}")
                env[a.asname or a.name.split(".")[0]] = _Module(a.name if a.asname else a.name.split(".")[0])
            return
        if isinstance(st, ast.ImportFrom) and st.module == "math":
            for a in st.names:
                if a.name not in _MATH:
                    raise Unsplittable(f"{where}: from math import {a.name}")
                env[a.asname or a.name] = _MATH[a.name]
            return
        if isinstance(st, ast.FunctionDef):
            known = _KNOWN_HELPERS.get(_shape(st))
            if known:
                env["__" + known[0] + "__"] = True
                if known[1]:
                    env["__allclose__"] = known[1]
                return
            if st.name == "check" and len(st.args.args) == 1 and not st.decorator_list:
                self.checks_fns["check"] = st
                env.pop("check", None)
                return
            raise Unsplittable(f"{where}: the tests define a function {st.name!r}")
        if isinstance(st, ast.Assign) and len(st.targets) == 1:
            value = self.value(st.value, env)
            self.bind(st.targets[0], value, env)
            return
        if isinstance(st, ast.Assert):
            self.add(st.test, env, "assert")
            return
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and isinstance(st.value.func, ast.Name):
            call, name = st.value, st.value.func.id
            if name == "assertion" and env.get("__assertion__") and len(call.args) == 3 and not call.keywords:
                self.add(call, env, "evalplus")
                return
            if name in self.checks_fns and len(call.args) == 1 and isinstance(call.args[0], ast.Name):
                fn = self.checks_fns[name]
                target = call.args[0].id
                inner = {**env, fn.args.args[0].arg: _Candidate(target)}
                self.block(fn.body, inner)
                return
        if isinstance(st, ast.For) and not st.orelse:
            items = self.value(st.iter, env)
            if not isinstance(items, (list, tuple, range)):
                raise Unsplittable(f"{where}: loop over a {type(items).__name__}")
            for item in items:
                inner = dict(env)
                self.bind(st.target, item, inner)
                self.block(st.body, inner)
                env.update({k: v for k, v in inner.items() if k.startswith("__")})
            return
        raise Unsplittable(f"{where}: {type(st).__name__} statement")

    def bind(self, target: ast.expr, value, env: dict) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
            return
        if isinstance(target, (ast.Tuple, ast.List)) and not any(isinstance(e, ast.Starred) for e in target.elts):
            values = list(value)
            if len(values) != len(target.elts):
                raise Unsplittable(f"line {target.lineno}: cannot unpack {len(values)} values")
            for t, v in zip(target.elts, values):
                self.bind(t, v, env)
            return
        raise Unsplittable(f"line {target.lineno}: assignment to {ast.unparse(target)!r}")

    def value(self, node: ast.expr, env: dict):
        """A value the parent computes alone (no call of the program's functions)."""
        def no_call(call):
            raise Unsplittable(f"line {call.lineno}: a value the tests compute from the program "
                               f"({ast.unparse(call)[:80]})")
        try:
            return _eval(node, env, no_call)
        except Unsplittable:
            raise
        except Exception as exc:  # noqa: BLE001
            raise Unsplittable(f"line {node.lineno}: {type(exc).__name__} evaluating the test data") from None

    def add(self, node: ast.expr, env: dict, kind: str) -> None:
        probe_of = {}
        parts = node.args if kind == "evalplus" else [node]
        for part in parts:
            _static(part, env)
        for sub in (s for part in parts for s in ast.walk(part)):
            if isinstance(sub, ast.Call) and _callee(sub, env) is not None:
                args, kwargs = _call_args(sub, lambda n: self.value(n, env))
                probe_of[id(sub)] = len(self.probes)
                self.probes.append(Probe(_callee(sub, env), tuple(args), kwargs))
        if len(self.probes) > _MAX_PROBES:
            raise Unsplittable(f"more than {_MAX_PROBES} calls")
        self.checks.append(_Check(node, env, kind, probe_of, node.lineno))


def split_suite(tests: str, entry_point: str | None = None) -> SplitSuite:
    """Split an assert-style test script into probes and parent-side checks; `Unsplittable` if it cannot be.

    ``entry_point`` names the program's function even where it shadows a builtin (MBPP's ``sum``).
    """
    try:
        tree = ast.parse(tests)
    except SyntaxError as exc:
        raise Unsplittable(f"the tests do not parse: {exc}") from None
    splitter = _Splitter()
    env: dict = {"__allclose__": "np.allclose"}
    if entry_point:
        env[entry_point] = _Candidate(entry_point)
    splitter.block(tree.body, env)
    if not splitter.checks:
        raise Unsplittable("no assertion found")
    if not splitter.probes:
        raise Unsplittable("no assertion calls the program")
    # A check that never reads a call (`assert True`) stays: it passes, as in the original script.
    return SplitSuite(splitter.probes, splitter.checks)
