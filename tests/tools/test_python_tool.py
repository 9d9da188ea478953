"""Tests of the deliberation Python tool: prelude, echo of the last expression, result text, failures as text."""
from __future__ import annotations

import pytest

from recmas_ray.sandbox import SandboxConfig
from recmas_ray.tools import ToolOutput, run_python_tool
from recmas_ray.tools.python_tool import clean_code, wrap_last_expression

pytestmark = pytest.mark.sandbox  # every test here runs code in the bubblewrap sandbox

FAST = SandboxConfig(timeout_s=30, cpu_time_s=30, memory_mb=768)  # limits, not expectations: CI is busy


def test_prelude_modules_are_available() -> None:
    code = ("print(math.factorial(5), list(itertools.islice(itertools.count(), 3)),\n"
            "      functools.reduce(lambda a, b: a * b, [2, 3]), fractions.Fraction(1, 3) + fractions.Fraction(1, 6),\n"
            "      statistics.median([3, 1, 2]))\n"
            "print(sp.factorint(360), sp.simplify('x + x'))")
    out = run_python_tool(code, config=FAST)
    assert isinstance(out, ToolOutput) and out.ok, out
    assert out.text == "120 [0, 1, 2] 6 1/2 2\n{2: 3, 3: 2, 5: 1} 2*x"


def test_echo_last_expression() -> None:
    assert run_python_tool("x = 6\nx * 7", config=FAST, echo_last_expr=True).text == "42"
    assert run_python_tool("x = 6\nx * 7", config=FAST).text == "[no output]"
    assert run_python_tool("'a' + 'b'", config=FAST, echo_last_expr=True).text == "'ab'"
    assert run_python_tool("print('once')", config=FAST, echo_last_expr=True).text == "once"
    assert run_python_tool("None", config=FAST, echo_last_expr=True).text == "[no output]"


def test_echo_keeps_line_numbers_and_unicode() -> None:
    code = "a = '\u00e9'\nb = 1\n(a +\n 1)"
    wrapped = wrap_last_expression(code)
    assert wrapped == "a = '\u00e9'\nb = 1\n(__recmas_echo__(a +\n 1))"
    out = run_python_tool(code, config=FAST, echo_last_expr=True)
    assert not out.ok and 'line 3' in out.text and "TypeError" in out.text
    assert run_python_tool("s = '\u00e9'; s * 2", config=FAST, echo_last_expr=True).text == "'\u00e9\u00e9'"
    assert wrap_last_expression("def f(:") == "def f(:"


def test_markdown_fence_and_indentation_are_removed() -> None:
    assert clean_code("```python\n    x = 1\n    print(x)\n```") == "x = 1\nprint(x)\n"
    assert run_python_tool("\n   print(2 + 2)\n", config=FAST).text == "4"


def test_failures_become_result_text() -> None:
    out = run_python_tool("print('before')\n1 / 0", config=FAST)
    assert not out.ok
    assert out.text.startswith("before\n[stderr]\nTraceback")
    assert "ZeroDivisionError" in out.text and out.text.endswith("[exit code 1]")


def test_timeout_is_reported() -> None:
    out = run_python_tool("while True:\n    pass", config=SandboxConfig(timeout_s=1, cpu_time_s=10))
    assert not out.ok and out.text.endswith("[error: timeout after 1s]")


@pytest.mark.parametrize("code, reason", [
    ("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=3)", "network"),
    ("import os\nwhile True:\n    os.fork()", "subprocesses"),
    ("bytearray(10 * 1024 ** 3)", "memory limit"),
])
def test_hostile_code_is_a_tool_error(code: str, reason: str) -> None:
    out = run_python_tool(code, config=FAST)
    assert not out.ok and "[error:" in out.text and reason in out.text.splitlines()[-1]


def test_truncation_keeps_the_status_line() -> None:
    out = run_python_tool("print('x' * 10000)\nraise SystemExit(3)", config=SandboxConfig(max_output_chars=200))
    assert "...[truncated" in out.text and out.text.endswith("[exit code 3]") and len(out.text) < 400


def test_secrets_do_not_reach_tool_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAVILY_API_KEY", "tv" "ly-python-tool-canary")
    out = run_python_tool("import os\nprint(sorted(os.environ.items()))", config=FAST)
    assert out.ok and "tv" "ly-python-tool-canary" not in out.text


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v", "-x"]))
