"""The deliberation search tool: Tavily web search with key rotation, for ``<search>...</search>`` calls.

Faithful to the reference: ``search_depth="advanced"``, the top 4 results formatted
as "[i] title / URL / content[:320]". Keys come from ``--tavily_keys_file`` (one per line, blank and ``#`` lines
skipped) and ``TAVILY_API_KEY``; on a rate-limit or auth error the tool moves on to the next key. With no key, no
network, no ``tavily-python`` or every key rejected, the call returns a "search unavailable: <reason>" text and the
run goes on: the tool never raises.

Secrets: keys are read by the parent process only (sandboxed Python never sees the file: it is not mounted there,
and a keys file readable by group or others is refused). A key never appears in returned text, log lines,
exception messages or reprs: every text passes through ``redact``, which also catches the key reversed, base64-
or hex-encoded and split over lines; backend exceptions are re-raised ``from None`` so no chained message carries
a key; the keys live in a container whose repr only shows a count.

Example:
    >>> tool = WebSearchTool.from_config(SearchConfig(keys_file="keys.txt"))
    >>> print(tool("boiling point of water at 2000 m").text)
"""
from __future__ import annotations

import base64
import functools
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from recmas_ray.tools.output import ToolOutput

logger = logging.getLogger(__name__)

REDACTED = "[REDACTED]"


@dataclass(kw_only=True)
class SearchConfig:
    """Parameters of the web search tool."""

    keys_file: str | None = None
    """File with one Tavily API key per line (``--tavily_keys_file``); ``TAVILY_API_KEY`` is added when set."""
    max_results: int = 4
    """Results per query (reference: 4)."""
    content_chars: int = 320
    """Characters of each result's content kept (reference: 320)."""
    search_depth: str = "advanced"
    """Tavily ``search_depth`` (reference: "advanced")."""
    timeout_s: float = 15.0
    """Per-request timeout, so a dead network cannot stall a sample."""
    network_cooldown_s: float = 60.0
    """After a network failure, answer "search unavailable" without trying for this long."""

    def __post_init__(self) -> None:
        if self.max_results <= 0 or self.content_chars <= 0 or self.timeout_s <= 0:
            raise ValueError(f"SearchConfig max_results={self.max_results}, content_chars={self.content_chars}, "
                             f"timeout_s={self.timeout_s}: expected positive values")


class SearchKeyError(Exception):
    """One key was refused (rate limit, quota, invalid or unauthorised): the tool rotates to the next key."""

    def __init__(self, reason: str, *, permanent: bool = False):
        super().__init__(reason)
        self.permanent = permanent
        """True for auth failures: the key is skipped for the rest of the run."""


class SearchUnavailableError(Exception):
    """Search cannot work right now (no network, package missing); no other key would help."""

    def __init__(self, reason: str, *, permanent: bool = False):
        super().__init__(reason)
        self.permanent = permanent
        """True when retrying later cannot help (e.g. the package is not installed)."""


class SearchBackend(Protocol):
    """What ``WebSearchTool`` needs from a search service; tests pass a fake one."""

    def search(self, query: str, *, api_key: str, max_results: int) -> list[dict]:
        """Return dicts with "title", "url" and "content"; raise SearchKeyError/SearchUnavailableError on failure."""
        ...


class TavilyBackend:
    """``tavily-python`` client, imported lazily; its errors are mapped to the two error classes above."""

    def __init__(self, *, search_depth: str = "advanced", timeout_s: float = 15.0):
        self.search_depth = search_depth
        self.timeout_s = timeout_s

    def search(self, query: str, *, api_key: str, max_results: int) -> list[dict]:
        """One Tavily search with ``api_key``; messages of the raised errors never include the key."""
        try:
            import tavily  # lazy: optional dependency
            from tavily import errors  # lazy: optional dependency
        except ImportError:
            raise SearchUnavailableError("tavily-python is not installed (pip install tavily-python)",
                                         permanent=True) from None
        # Not every tavily-python release defines every error class.
        rate_errors = tuple(getattr(errors, n) for n in ("UsageLimitExceededError",) if hasattr(errors, n))
        auth_errors = tuple(getattr(errors, n) for n in ("InvalidAPIKeyError", "MissingAPIKeyError", "ForbiddenError")
                            if hasattr(errors, n))
        try:
            response = tavily.TavilyClient(api_key=api_key).search(
                query, search_depth=self.search_depth, max_results=max_results, timeout=self.timeout_s)
        except rate_errors:
            raise SearchKeyError("rate limit or quota exceeded") from None
        except auth_errors as exc:
            raise SearchKeyError(f"key rejected ({type(exc).__name__})", permanent=True) from None
        except (OSError, getattr(errors, "TimeoutError", OSError)) as exc:  # requests errors subclass OSError
            raise SearchUnavailableError(f"network error ({type(exc).__name__})") from None
        return [{"title": r.get("title", ""), "url": r.get("url", ""), "content": r.get("content", "")}
                for r in response.get("results", [])]


class _Secrets(Sequence):
    """Read-only sequence of keys whose repr and str show only how many there are."""

    __slots__ = ("_values",)

    def __init__(self, values: Iterable[str]):
        self._values = tuple(v for v in values if v)

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, index):
        return self._values[index]

    def __repr__(self) -> str:
        return f"<{len(self._values)} secret(s)>"

    __str__ = __repr__


_MIN_FORM_CHARS = 8  # shorter encoded fragments would redact innocent text


def _b64_cores(data: bytes) -> list[str]:
    """Base64 characters of ``data`` that do not depend on its neighbours, for each of the 3 byte alignments."""
    out = []
    for k in range(3):
        for enc in (base64.b64encode(b"\0" * k + data), base64.urlsafe_b64encode(b"\0" * k + data)):
            text = enc.decode()
            out.append(text[-(-8 * k // 6):(8 * (k + len(data))) // 6])
    return out


def secret_forms(secret: str) -> list[str]:
    """Ways a program may print ``secret`` to slip past a plain match: as is, reversed, base64, hex."""
    forms = []
    for s in (secret, secret[::-1]):
        data = s.encode("utf-8")
        forms += [s, data.hex(), *_b64_cores(data)]
    return [f for f in dict.fromkeys(forms) if len(f) >= _MIN_FORM_CHARS or f in (secret, secret[::-1])]


@functools.lru_cache(maxsize=256)
def _pattern(secret: str) -> re.Pattern:
    # Whitespace (spaces, newlines) may sit between any two characters: a key split over lines still matches.
    alts = ["\\s*".join(map(re.escape, form)) for form in sorted(secret_forms(secret), key=len, reverse=True)]
    return re.compile("|".join(alts), re.IGNORECASE)


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace each non-empty secret in ``text`` with "[REDACTED]", also reversed, base64- or hex-encoded, or split
    by whitespace and newlines (longest secrets first)."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = _pattern(secret).sub(REDACTED, text)
    return text


def load_keys(keys_file: str | None) -> list[str]:
    """Keys from ``keys_file`` (one per line; blank and ``#`` lines skipped) plus ``TAVILY_API_KEY``, deduplicated.

    Raises:
        ValueError: ``keys_file`` is given but is not a file, or group or others may read it (the message names
            the path and the ``chmod 600`` fix, never a key).
    """
    keys: list[str] = []
    if keys_file:
        path = Path(keys_file).expanduser()
        if not path.is_file():
            raise ValueError(f"--tavily_keys_file {str(path)!r} is not a file: expected one API key per line")
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise ValueError(f"--tavily_keys_file {str(path)!r} is readable by group or others (mode {mode:04o}): "
                             f"run `chmod 600 {path}`")
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                keys.append(line)
    env_key = os.environ.get("TAVILY_API_KEY", "").strip()
    if env_key:
        keys.append(env_key)
    return list(dict.fromkeys(keys))


def format_results(results: Sequence[dict], content_chars: int = 320) -> str:
    """Reference layout: "[i] title", the URL, and the first ``content_chars`` characters of content per result."""
    if not results:
        return "no results"
    blocks = [f"[{i}] {str(r.get('title', '')).strip()}\n{str(r.get('url', '')).strip()}\n"
              f"{str(r.get('content', ''))[:content_chars]}" for i, r in enumerate(results, start=1)]
    return "\n\n".join(blocks)


class WebSearchTool:
    """Callable search tool: ``tool(query) -> ToolOutput``, rotating keys and never raising.

    Args:
        keys: API keys to rotate through (see ``load_keys``); empty means search is unavailable.
        backend: the search service; ``None`` means ``TavilyBackend`` built from ``config``.
        config: result count, content length, timeouts.
    """

    def __init__(self, keys: Sequence[str], backend: SearchBackend | None = None, *,
                 config: SearchConfig | None = None):
        self.config = config or SearchConfig()
        self._keys = _Secrets(keys)
        self._backend = backend or TavilyBackend(search_depth=self.config.search_depth,
                                                 timeout_s=self.config.timeout_s)
        self._lock = threading.Lock()
        self._next = 0
        self._dead: set[int] = set()
        self._down_until = 0.0
        self._down_reason = ""

    @classmethod
    def from_config(cls, config: SearchConfig, backend: SearchBackend | None = None) -> WebSearchTool:
        """Load the keys named by ``config`` (file and environment) and build the tool."""
        return cls(load_keys(config.keys_file), backend, config=config)

    def __repr__(self) -> str:
        return f"WebSearchTool(num_keys={len(self._keys)}, backend={type(self._backend).__name__})"

    def __call__(self, query: str) -> ToolOutput:
        """Search for ``query`` and return the formatted results or a "search unavailable: ..." text."""
        start = time.monotonic()
        try:
            text, ok = self._search(str(query).strip())
        except Exception as exc:  # a broken backend must not end the sample
            text, ok = f"search error: {type(exc).__name__}: {exc}", False
        return ToolOutput(text=redact(text, self._keys), ok=ok, seconds=time.monotonic() - start)

    def _search(self, query: str) -> tuple[str, bool]:
        if not query:
            return "search error: empty query", False
        if not self._keys:
            return "search unavailable: no Tavily API key (set TAVILY_API_KEY or pass --tavily_keys_file)", False
        with self._lock:
            if time.monotonic() < self._down_until:
                return f"search unavailable: {self._down_reason}", False
            n = len(self._keys)
            order = [(self._next + k) % n for k in range(n) if (self._next + k) % n not in self._dead]
        if not order:
            return f"search unavailable: all {n} API keys were rejected", False
        reasons = []
        for index in order:
            try:
                results = self._backend.search(query, api_key=self._keys[index],
                                               max_results=self.config.max_results)
            except SearchKeyError as exc:
                reason = redact(str(exc), self._keys)
                logger.warning("search key #%d of %d failed (%s); rotating to the next key", index + 1, n, reason)
                reasons.append(reason)
                with self._lock:
                    self._next = (index + 1) % n
                    if exc.permanent:
                        self._dead.add(index)
                continue
            except (SearchUnavailableError, OSError) as exc:
                permanent = isinstance(exc, SearchUnavailableError) and exc.permanent
                reason = redact(str(exc) or type(exc).__name__, self._keys)
                if isinstance(exc, OSError):
                    reason = f"network error ({type(exc).__name__}: {reason})"
                logger.warning("search unavailable: %s", reason)
                with self._lock:
                    self._down_reason = reason
                    self._down_until = float("inf") if permanent else (
                        time.monotonic() + self.config.network_cooldown_s)
                return f"search unavailable: {reason}", False
            with self._lock:
                self._next = index  # stay on the key that works
            return format_results(results, self.config.content_chars), True
        return f"search unavailable: all {len(order)} API keys failed ({'; '.join(dict.fromkeys(reasons))})", False
