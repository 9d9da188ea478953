"""Parent-side evaluation of a split test suite's checks (`code_suites`): plain data only, bounded.

`_eval` evaluates an assertion's expression on the values the sandbox sent back: literals, the parent's own
pure builtins (`_FUNCS`), ``math`` / ``numpy`` closeness, bounded ``*`` / ``**`` / ``<<`` / ``range``; calls of
the program's functions come from the probes' outcomes. `_static` checks beforehand that `_eval` can do it.
`evalplus_assertion` is evalplus' ``assertion(out, exp, atol)``; `_KNOWN_HELPERS` recognises evalplus' own
helpers by their syntax tree.
"""
from __future__ import annotations

import ast
import builtins
import math
import operator
from typing import Any, Callable

__all__ = ["Unsplittable", "evalplus_assertion"]

_MAX_ITEMS = 1_000_000  # longest sequence or range a check may build from a returned value


class Unsplittable(Exception):
    """The suite cannot be split into calls and parent-side checks (the message says what stopped it)."""


class _CheckFailed(Exception):
    """A check failed: ``args == (error type, why)``."""


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
    import numpy as np  # lazy: only when a check needs it (the parent may run without numpy)

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
    import numpy as np  # lazy: only when a check needs it (the parent may run without numpy)

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
