"""What one tool call returns (shared by the Python tool, the search tool and the tool loop)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ToolOutput:
    """Result of one tool call, as spliced back into the decoded text."""

    text: str
    """What goes inside ``<result>...</result>`` (already truncated and free of secrets)."""
    ok: bool
    """False when the tool failed, was refused, timed out or is unavailable (the text says why)."""
    seconds: float
    """Wall-clock seconds the call took."""
