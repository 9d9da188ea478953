"""Declarative field checks for config dataclasses, run once over a whole config tree.

A field states its range or choices in its annotation, next to its default and docstring:
`latent_steps: Annotated[int, Range(0, MAX_LATENT_STEPS)] = 32`. `check_tree(cfg, flag_of)` checks the type and
the annotated checks of every field of every nested config, then each config's own `validate()` (cross-field
rules); a config's `check_section(name)` runs before its section `name` is checked (whether it applies), so one call checks a job's input before any model loads or file is written. Errors are `ConfigError`s
(a `ValueError`) of one line naming the flag, the value and what was expected.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

KIND_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


class ConfigError(ValueError):
    """A user error in a job's configuration: one line, shown without a traceback."""


class ConfigTypeError(ConfigError, TypeError):
    """A value of the wrong type (also a TypeError, as Python callers expect for wrong types)."""


def _items(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else list(value.values()) if isinstance(value, dict) \
        else [value]


@dataclass(frozen=True)
class Range:
    """Numeric bounds of the value (or of each item), inclusive unless `lo_open` / `hi_open`; `None` leaves that
    side open."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def describe(self, kind: str) -> str:
        if self.hi is None or self.lo is None:
            bound, op = (self.lo, ">" if self.lo_open else ">=") if self.hi is None else \
                (self.hi, "<" if self.hi_open else "<=")
            return f"{kind} {op} {bound}"
        return f"{kind} in {'(' if self.lo_open else '['}{self.lo}, {self.hi}{')' if self.hi_open else ']'}"

    def ok(self, v) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
            return False
        return (self.lo is None or (v > self.lo if self.lo_open else v >= self.lo)) and \
            (self.hi is None or (v < self.hi if self.hi_open else v <= self.hi))

    def problem(self, value, base) -> str | None:
        kind = KIND_NAMES[int if base is int or int in typing.get_args(base) else float]
        bad = [v for v in _items(value) if v is not None and not self.ok(v)]
        return f"{bad[0]!r}: expected {self.describe(kind)}" if bad else None


@dataclass(frozen=True)
class OneOf:
    """The value (or each item of a list value) must be one of `choices` (a tuple or a callable giving one)."""

    choices: tuple | Callable[[], tuple]

    def values(self) -> tuple:
        return tuple(self.choices() if callable(self.choices) else self.choices)

    def problem(self, value, base) -> str | None:
        bad = [v for v in (value if isinstance(value, (list, tuple)) else [value]) if v not in (None, *self.values())]
        return f"{bad[0]!r}: expected one of {', '.join(map(str, self.values()))}" if bad else None


@dataclass(frozen=True)
class NonEmpty:
    """A string or list that may not be empty."""

    def problem(self, value, base) -> str | None:
        return None if value else "is empty; expected at least one value"


@dataclass(frozen=True)
class ExistingPath:
    """A path (when set) that must exist; `allow` is a predicate for values that are names, not paths."""

    allow: Callable[[str], bool] | None = None

    def problem(self, value, base) -> str | None:
        missing = value and not (self.allow and self.allow(str(value))) and not Path(str(value)).expanduser().exists()
        return f"{value!r}: no such file or directory" if missing else None


@dataclass(frozen=True)
class WritableDir:
    """A directory that exists and is writable, or can be created (its nearest existing parent is writable)."""

    def problem(self, value, base) -> str | None:
        if isinstance(value, str) and not value.strip():
            return "is empty; expected a directory path"
        problem = writable_dir_problem(str(value)) if value else None
        return f"{value!r} {problem}" if problem else None


def writable_dir_problem(path: str) -> str | None:
    """Why `path` cannot be used as an output directory, or None (nothing is created here)."""
    p = Path(path).expanduser()
    if p.exists():
        if not p.is_dir():
            return "is not a directory"
        return None if os.access(p, os.W_OK | os.X_OK) else "is not writable"
    parent = p.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"cannot be created ({parent} is not a directory)"
    return None if os.access(parent, os.W_OK | os.X_OK) else f"cannot be created ({parent} is not writable)"


@functools.cache
def field_hints(cls) -> dict[str, Any]:
    """Resolved annotations of a dataclass, with `Annotated` extras kept (resolved once per class: every batch an
    orchestrator runs checks its config, and resolving string annotations costs more than the checks)."""
    return typing.get_type_hints(cls, include_extras=True)


def split_annotated(tp) -> tuple[Any, tuple]:
    """(base type, checks) of an annotation."""
    if typing.get_origin(tp) is typing.Annotated:
        base, *extras = typing.get_args(tp)
        return base, tuple(extras)
    return tp, ()


def unread_fields(cls) -> dict[str, Any]:
    """Dotted path -> default of each `system` field a job config class does not read (all but its
    `SYSTEM_FIELDS`): they get no flag, and `check_tree` refuses another value (it would be ignored)."""
    used = getattr(cls, "SYSTEM_FIELDS", None)
    if used is None:
        return {}
    fields = dataclasses.fields(split_annotated(field_hints(cls)["system"])[0])
    unknown = sorted(set(used) - {f.name for f in fields})
    assert not unknown, f"{cls.__name__}.SYSTEM_FIELDS names no field: {unknown}"
    return {f"system.{f.name}": f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
            for f in fields if f.name not in used}


def check_tree(cfg, flag_of: Callable[[str], str] = lambda path: "--" + path, prefix: str = "") -> None:
    """Check every field of `cfg` and its nested configs (nested ones first, so a parent's `validate()` sees
    valid children), then each config's `validate()`. `flag_of(dotted_path)` names a field the way the user
    wrote it (the command line gives its flag)."""
    hints = field_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value, path, (base, checks) = getattr(cfg, f.name), prefix + f.name, split_annotated(hints[f.name])
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            # whether the section applies at all comes first: settings for a style without tools are reported
            # as such, not as a problem of one of them (a keys file's mode)
            getattr(cfg, "check_section", lambda name: None)(f.name)
            check_tree(value, flag_of, path + ".")
            continue
        _check_type(flag_of(path), value, base)
        for problem in (check.problem(value, base) for check in checks):
            if problem:
                raise ConfigError(f"{flag_of(path)} {problem}")
    for path, default in unread_fields(type(cfg)).items():
        if getattr(cfg.system, path.split(".")[1]) != default:
            raise ConfigError(f"--{path}: not a setting of this job (it would be ignored); drop it")
    try:
        getattr(cfg, "validate", lambda: None)()
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_type(flag: str, value, base) -> None:
    """Refuse a value of the wrong kind (a config file or a Python caller bypasses the flags' parsing), down to
    the items of lists and the keys and values of dicts."""
    args = typing.get_args(base)
    if value is None:
        if type(None) in args or base is Any:
            return
        raise ConfigTypeError(f"{flag} is required (got null)")
    kinds = [a for a in args if a is not type(None)] if typing.get_origin(base) in (typing.Union, types.UnionType) \
        else [base]
    kind = next((k for k in kinds if _is_kind(value, k)), None)
    if kind is None:
        raise ConfigTypeError(f"{flag} {_short(value)}: expected {' or '.join(map(_kind_name, kinds))}")
    origin, item = typing.get_origin(kind), typing.get_args(kind)
    items = [(f"item {i} ", v, item[0]) for i, v in enumerate(value)] if origin in (list, tuple) and item else []
    if origin is dict and len(item) == 2:
        items = [(f"{key}=", v, item[1]) for key, v in value.items()] if all(_is_kind(key, item[0]) for key in value) \
            else [("key ", key, item[0]) for key in value]
    for label, v, k in items:
        if not _is_kind(v, k):
            raise ConfigTypeError(f"{flag} {label}{_short(v)}: expected {_kind_name(k)}")


def _is_kind(value, k) -> bool:
    origin = typing.get_origin(k) or k
    if origin is typing.Literal or k is Any:
        return True
    if origin in (int, float):
        return isinstance(value, (int, float) if origin is float else int) and not isinstance(value, bool)
    return isinstance(origin, type) and isinstance(value, origin)


def _kind_name(k) -> str:
    origin, args = typing.get_origin(k), typing.get_args(k)
    if origin in (list, tuple, dict):
        return f"a {origin.__name__}" + (" of " + ", ".join(map(_kind_name, args)) if args else "")
    return KIND_NAMES.get(k, getattr(k, "__name__", str(k)))


def _short(value, limit: int = 60) -> str:
    """repr of a value cut to `limit` characters (a bad value may be huge)."""
    text = f"<{type(value).__name__} of {len(value)} items>" if isinstance(value, (list, dict)) and len(value) >= 20 \
        else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
