"""The deliberation Python tool: model-written code from ``<python>...</python>`` run in the sandbox.

Faithful to the reference tool: a prelude importing math, itertools, functools,
fractions, statistics and sympy as ``sp``; stdout, stderr and the exit code captured and cut to 6000 characters;
a 10 s timeout; ``echo_last_expr`` prints the value of a final bare expression. Unlike the reference, the code runs
in ``recmas_ray.sandbox`` (bubblewrap: no network, no host files or secrets, resource limits, throw-away /work).

Example:
    >>> run_python_tool("sp.factorint(360)", echo_last_expr=True).text
    '{2: 3, 3: 2, 5: 1}'
"""
from __future__ import annotations

import ast
import re
import textwrap

from recmas_ray.sandbox import SandboxConfig, SandboxResult, run_python
from recmas_ray.tools.output import ToolOutput

# sympy is imported on first use of ``sp`` (it costs ~0.5 s per call and most snippets never touch it); where it is
# not installed ``sp`` is None, as in the reference's guarded import.
PYTHON_TOOL_PRELUDE = '''
import math, itertools, functools, fractions, statistics
import importlib.util as _recmas_ilu
if _recmas_ilu.find_spec("sympy") is not None:
    class _RecmasLazySympy:
        def __getattr__(self, name):
            import sympy
            globals()["sp"] = sympy
            return getattr(sympy, name)
        def __repr__(self):
            return "<module 'sympy' (imported on first use)>"
    sp = _RecmasLazySympy()
else:
    sp = None
del _recmas_ilu
def __recmas_echo__(value):
    if value is not None:
        print(repr(value))
    return value
'''

_FENCE_RE = re.compile(r"^\s*```[a-zA-Z0-9_+-]*[ \t]*\n(.*?)\n?\s*```\s*$", re.DOTALL)


def run_python_tool(code: str, *, config: SandboxConfig | None = None, echo_last_expr: bool = False) -> ToolOutput:
    """Run one ``<python>`` call and return the text for ``<result>...</result>``; never raises.

    Args:
        code: the model-written code (a surrounding markdown fence and common indentation are removed).
        config: sandbox limits; ``None`` means ``SandboxConfig()`` (10 s, 1 GiB, 6000 characters, no network).
        echo_last_expr: print ``repr`` of a final bare expression, like the interactive interpreter.
    """
    cfg = config or SandboxConfig()
    code = clean_code(code)
    if echo_last_expr:
        code = wrap_last_expression(code)
    result = run_python(code, config=cfg, prelude=PYTHON_TOOL_PRELUDE)
    return ToolOutput(text=format_result(result, max_chars=cfg.max_output_chars), ok=result.ok,
                      seconds=result.seconds)


def clean_code(code: str) -> str:
    """Strip a markdown fence models often put inside the tags, and common leading indentation."""
    match = _FENCE_RE.match(code)
    if match:
        code = match.group(1)
    return textwrap.dedent(code).strip("\n") + "\n"


def wrap_last_expression(code: str) -> str:
    """Wrap a final bare expression in ``__recmas_echo__(...)`` in place, so line numbers stay unchanged."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code  # the sandbox reports the syntax error with the user's line numbers
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    value = tree.body[-1].value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "print":
        return code
    raw = code.encode("utf-8")  # ast column offsets count UTF-8 bytes
    line_starts = [0]
    for line in raw.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    begin = line_starts[value.lineno - 1] + value.col_offset
    end = line_starts[value.end_lineno - 1] + value.end_col_offset
    return (raw[:begin] + b"__recmas_echo__(" + raw[begin:end] + b")" + raw[end:]).decode("utf-8")


def format_result(result: SandboxResult, *, max_chars: int) -> str:
    """Text of one call: stdout, then stderr, then the error or a non-zero exit code; cut to ``max_chars``."""
    parts = []
    if result.stdout.strip():
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr.strip():
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    text = "\n".join(parts)
    if len(text) > max_chars:
        text = text[:max_chars] + "\n...[truncated]"
    # The status line is kept after truncation: the model must see that the call failed.
    if result.error is not None:
        text += f"\n[error: {result.error}]"
    elif result.exit_code not in (0, None):
        text += f"\n[exit code {result.exit_code}]"
    return text.strip("\n") or "[no output]"
