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
import builtins
import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["Probe", "SplitSuite", "Unsplittable", "split_suite", "evalplus_assertion"]

_MAX_PROBES = 20_000
_MAX_ITEMS = 1_000_000  # longest sequence or range a check may build from a returned value


class Unsplittable(Exception):
    """The suite cannot be split into calls and parent-side checks (the message says what stopped it)."""


# A call's exception type name -> the error type of the test that needed its value.
_ERROR_KINDS = {"TimeoutError": "TLE", "NotRun": "TLE", "NotPlainData": "NOT_DATA", "NO_FUNC": "NO_FUNC"}


class _CheckFailed(Exception):
    """A check failed: ``args == (error type, why)``."""


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


# ----------------------------------------------------------------------------- parent-side evaluation

def _bounded_mul(a, b):
    for seq, n in ((a, b), (b, a)):
        if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and len(seq) * max(n, 0) > _MAX_ITEMS:
            raise _CheckFailed("WA", "repetition too large")
    return operator.mul(a, b)


def _bounded_pow(a, b):
    if isinstance(a, int) and isinstance(b, int) and abs(b) > 10_000 and abs(a) > 1:
        raise _CheckFailed("WA", "power too large")
    return operator.pow(a, b)


def _bounded_lshift(a, b):
    if isinstance(b, int) and b > 100_000:
        raise _CheckFailed("WA", "shift too large")
    return operator.lshift(a, b)


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: _bounded_mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: _bounded_pow,
           ast.LShift: _bounded_lshift, ast.RShift: operator.rshift, ast.BitOr: operator.or_,
           ast.BitXor: operator.xor, ast.BitAnd: operator.and_}
_UNARY = {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
# Pure functions of plain data a check may apply (the parent's own builtins, never the program's).
_FUNCS: dict[str, Any] = {f.__name__: f for f in (abs, all, any, bool, dict, float, frozenset, int, isinstance,
                                                  len, list, max, min, round, set, sorted, str, sum, tuple)}
def _bounded_range(*args):
    r = range(*args)
    if len(r) > _MAX_ITEMS:
        raise _CheckFailed("WA", "range too large")
    return r


_FUNCS.update(zip=lambda *a: list(zip(*a)), enumerate=lambda *a: list(enumerate(*a)), type=type,
              range=_bounded_range)
_CONSTANTS = {"True": True, "False": False, "None": None, "inf": math.inf, "nan": math.nan}
_MATH = {"isclose": math.isclose, "fabs": math.fabs, "sqrt": math.sqrt, "inf": math.inf, "pi": math.pi,
         "e": math.e, "nan": math.nan, "floor": math.floor, "ceil": math.ceil}


def _np_attr(name: str):
    import numpy as np  # only when a check needs it (the parent may run without numpy)

    return {"isclose": np.isclose, "allclose": np.allclose}[name]


class _Module:
    def __init__(self, kind: str):
        self.kind = kind


def _attr(node: ast.Attribute, env: dict):
    base = node.value
    if isinstance(base, ast.Name) and isinstance(env.get(base.id), _Module):
        kind = env[base.id].kind
        if kind == "math" and node.attr in _MATH:
            return _MATH[node.attr]
        if kind == "numpy" and node.attr in ("isclose", "allclose"):
            return _np_attr(node.attr)
        if kind == "numpy.testing" and node.attr == "assert_allclose":
            return _assert_allclose
    if (isinstance(base, ast.Attribute) and base.attr == "testing" and isinstance(base.value, ast.Name)
            and isinstance(env.get(base.value.id), _Module) and env[base.value.id].kind == "numpy"
            and node.attr == "assert_allclose"):
        return _assert_allclose
    raise Unsplittable(f"line {node.lineno}: attribute {ast.unparse(node)!r}")


def _assert_allclose(out, exp, atol=0, rtol=1e-07):
    import numpy as np

    np.testing.assert_allclose(out, exp, rtol=rtol, atol=atol)


class _Candidate:
    """The `candidate` parameter of a HumanEval ``check``: the entry point it was called with."""

    def __init__(self, fn: str):
        self.fn = fn


def _callee(node: ast.Call, env: dict) -> str | None:
    """The program's function a call names (None for the parent's own functions)."""
    f = node.func
    if isinstance(f, ast.Name):
        bound = env.get(f.id)
        if isinstance(bound, _Candidate):
            return bound.fn
        if f.id in env or f.id in _FUNCS:
            return None
        return f.id
    return None


def _eval(node, env: dict, value_of: Callable[[ast.Call], Any]):
    """Evaluate a check expression on plain data; calls of the program's functions come from `value_of`."""
    ev = lambda n: _eval(n, env, value_of)  # noqa: E731
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env and not isinstance(env[node.id], (_Module, _Candidate)):
            return env[node.id]
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        if node.id in _FUNCS:
            return _FUNCS[node.id]
        raise Unsplittable(f"line {node.lineno}: name {node.id!r} used as a value")
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = []
        for e in node.elts:
            if isinstance(e, ast.Starred):
                items.extend(ev(e.value))
            else:
                items.append(ev(e))
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise Unsplittable(f"line {node.lineno}: ** in a dict display")
        return {ev(k): ev(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](ev(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
    if isinstance(node, ast.BoolOp):
        result = None
        for v in node.values:
            result = ev(v)
            if isinstance(node.op, ast.And) != bool(result):
                return result
        return result
    if isinstance(node, ast.Compare):
        left = ev(node.left)
        for op, right_node in zip(node.ops, node.comparators):
            right = ev(right_node)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return ev(node.body) if ev(node.test) else ev(node.orelse)
    if isinstance(node, ast.Subscript):
        return ev(node.value)[ev(node.slice)]
    if isinstance(node, ast.Slice):
        return slice(*(ev(p) if p is not None else None for p in (node.lower, node.upper, node.step)))
    if isinstance(node, ast.Attribute):
        return _attr(node, env)
    if isinstance(node, ast.Call):
        if _callee(node, env) is not None:
            return value_of(node)
        fn = _attr(node.func, env) if isinstance(node.func, ast.Attribute) else ev(node.func)
        args, kwargs = _call_args(node, ev)
        return fn(*args, **kwargs)
    raise Unsplittable(f"line {getattr(node, 'lineno', '?')}: {type(node).__name__} in a check")


def _static(node, env: dict) -> None:
    """Raise `Unsplittable` unless `_eval` can evaluate `node` once the calls' values are known."""
    sub = lambda n: _static(n, env)  # noqa: E731
    if isinstance(node, ast.Constant):
        return
    if isinstance(node, ast.Name):
        _eval(node, env, None)
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for e in node.elts:
            sub(e.value if isinstance(e, ast.Starred) else e)
    elif isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise Unsplittable(f"line {node.lineno}: ** in a dict display")
        for n in [*node.keys, *node.values]:
            sub(n)
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        sub(node.operand)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        sub(node.left), sub(node.right)
    elif isinstance(node, ast.BoolOp):
        for v in node.values:
            sub(v)
    elif isinstance(node, ast.Compare):
        for n in [node.left, *node.comparators]:
            sub(n)
    elif isinstance(node, ast.IfExp):
        sub(node.test), sub(node.body), sub(node.orelse)
    elif isinstance(node, ast.Subscript):
        sub(node.value), sub(node.slice)
    elif isinstance(node, ast.Slice):
        for p in (node.lower, node.upper, node.step):
            if p is not None:
                sub(p)
    elif isinstance(node, ast.Attribute):
        _attr(node, env)
    elif isinstance(node, ast.Call):
        name = _callee(node, env)
        if name is not None and name in builtins.__dict__ and name not in env:
            raise Unsplittable(f"line {node.lineno}: call of the builtin {name!r}")
        if name is None:
            _attr(node.func, env) if isinstance(node.func, ast.Attribute) else sub(node.func)
        for a in node.args:
            sub(a.value if isinstance(a, ast.Starred) else a)
        for k in node.keywords:
            sub(k.value)
    else:
        raise Unsplittable(f"line {getattr(node, 'lineno', '?')}: {type(node).__name__} in a check")


def _call_args(node: ast.Call, ev) -> tuple[list, dict]:
    args = []
    for a in node.args:
        args.extend(ev(a.value)) if isinstance(a, ast.Starred) else args.append(ev(a))
    kwargs = {}
    for k in node.keywords:
        if k.arg is None:
            kwargs.update(ev(k.value))
        else:
            kwargs[k.arg] = ev(k.value)
    return args, kwargs


def evalplus_assertion(out, exp, atol, allclose: str = "np.allclose") -> None:
    """evalplus' ``assertion(out, exp, atol)`` on plain data (raises AssertionError when it fails).

    Exact equality, else, with a tolerance (``atol``, or 1e-6 when ``exp`` is a float or a sequence of
    floats), ``np.allclose(out, exp, rtol=1e-07, atol=atol)`` (MBPP+) or ``np.testing.assert_allclose``
    (HumanEval+), whichever the script's own helper uses.
    """
    exact_match = out == exp
    if atol == 0 and _is_floats(exp):
        atol = 1e-6
    if not exact_match and atol != 0:
        if allclose == "np.testing.assert_allclose":
            _assert_allclose(out, exp, atol=atol)
        else:
            assert _np_attr("allclose")(out, exp, rtol=1e-07, atol=atol)
    else:
        assert exact_match


def _is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)):
        return all(isinstance(i, float) for i in x)
    return False


# evalplus' helpers as published in the MBPP+ / HumanEval+ `test` scripts, matched by syntax tree (docstrings
# and comments aside) so that a script whose helpers differ is not judged by these semantics.
_IS_FLOATS = '''
def is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)):
        return all(isinstance(i, float) for i in x)
    if isinstance(x, np.ndarray):
        return x.dtype == np.float64 or x.dtype == np.float32
    return False
'''
_ASSERTION = '''
def assertion(out, exp, atol):
    exact_match = out == exp

    if atol == 0 and is_floats(exp):
        atol = 1e-6
    if not exact_match and atol != 0:
        {close}
    else:
        assert exact_match
'''
_CLOSE = {"np.allclose": "assert np.allclose(out, exp, rtol=1e-07, atol=atol)",
          "np.testing.assert_allclose": "np.testing.assert_allclose(out, exp, atol=atol)"}


def _shape(fn: ast.FunctionDef) -> str:
    body = fn.body[1:] if (fn.body and isinstance(fn.body[0], ast.Expr)
                           and isinstance(fn.body[0].value, ast.Constant)) else fn.body
    return ast.dump(ast.FunctionDef(fn.name, fn.args, body, [], fn.returns, None))


_KNOWN_HELPERS = {_shape(ast.parse(_IS_FLOATS).body[0]): ("is_floats", None)}
_KNOWN_HELPERS.update({_shape(ast.parse(_ASSERTION.format(close=c)).body[0]): ("assertion", name)
                       for name, c in _CLOSE.items()})


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
