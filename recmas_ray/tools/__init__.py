"""Tools the deliberation style's toolcaller calls while decoding.

The tool loop turns ``<python>...</python>`` into ``run_python_tool`` and ``<search>...</search>`` into a
``WebSearchTool`` call; each returns a ``ToolOutput`` whose ``text`` goes inside ``<result>...</result>``.
Neither tool ever raises on bad input, hostile code, missing keys or a missing network.
"""
from __future__ import annotations

from recmas_ray.tools.output import ToolOutput
from recmas_ray.tools.python_tool import PYTHON_TOOL_PRELUDE, run_python_tool
from recmas_ray.tools.search import (
    SearchBackend,
    SearchConfig,
    SearchKeyError,
    SearchUnavailableError,
    TavilyBackend,
    WebSearchTool,
    format_results,
    load_keys,
    redact,
)

__all__ = [
    "PYTHON_TOOL_PRELUDE",
    "SearchBackend",
    "SearchConfig",
    "SearchKeyError",
    "SearchUnavailableError",
    "TavilyBackend",
    "ToolOutput",
    "WebSearchTool",
    "format_results",
    "load_keys",
    "redact",
    "run_python_tool",
]
