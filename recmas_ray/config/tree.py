"""Config trees <-> plain data: `to_dict` / `from_dict` (unknown keys are errors), the `--config` file
reader, and `save_config` (the resolved config written next to a job's outputs).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from pathlib import Path

from recmas_ray.config.checks import ConfigError, field_hints, split_annotated
from recmas_ray.config.inputs import read_data_file


def to_dict(cfg) -> dict:
    """A config tree as plain JSON-able data."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def from_dict(cls, data: dict, *, base=None, where: str = "config", _root=None, _section: str = ""):
    """Build `cls` from nested data over `base` (or the class defaults); unknown keys are errors, and a key that
    is a setting elsewhere in the tree (a flat key for a nested setting, a setting in the wrong section) is
    pointed to its place."""
    root = cls if _root is None else _root
    here = f"{where}, section {_section!r}" if _section else where
    if not isinstance(data, dict):
        raise ConfigError(f"{here}: expected a mapping of settings, got {type(data).__name__}")
    hints, fields = field_hints(cls), [f for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(data) - {f.name for f in fields})
    if unknown:
        raise ConfigError(_unknown_message(root, _section, unknown, sorted(f.name for f in fields), where))
    values, missing = {}, []
    for f in fields:
        nested = split_annotated(hints[f.name])[0]
        if dataclasses.is_dataclass(nested):
            values[f.name] = from_dict(nested, data.get(f.name, {}), base=getattr(base, f.name, None), where=where,
                                       _root=root, _section=f"{_section}.{f.name}" if _section else f.name)
        elif f.name in data or base is not None:
            values[f.name] = data[f.name] if f.name in data else getattr(base, f.name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            missing.append(f.name)
    if missing:
        raise ConfigError(f"{here}: missing required setting(s) {sorted(missing)}; give them as flags "
                          f"({', '.join('--' + m for m in sorted(missing))}) or in --config")
    try:
        return cls(**values)
    except TypeError as e:
        raise ConfigError(f"{here}: {e}") from None


def setting_paths(cls, prefix: str = "") -> list[str]:
    """Dotted path of every setting (leaf field) under `cls`."""
    out = []
    hints = field_hints(cls)
    for f in (f for f in dataclasses.fields(cls) if f.init):
        nested = split_annotated(hints[f.name])[0]
        out += setting_paths(nested, f"{prefix}{f.name}.") if dataclasses.is_dataclass(nested) else [prefix + f.name]
    return out


def _unknown_message(root, section: str, unknown: list[str], names: list[str], where: str) -> str:
    """`unknown setting(s) [...]` in `section` of the file, each key that is a setting elsewhere in the tree (or a
    flag alias of one) pointed to its place; otherwise the section's settings, and a close spelling if any."""
    paths = setting_paths(root)
    aliases = dict(getattr(root, "FLAG_ALIASES", {}))
    level = f"in section {section!r}" if section else "at the top level"
    hints = []
    for key in unknown:
        homes = [p for p in paths if p.rpartition(".")[2] == key and p.rpartition(".")[0] != section]
        target = aliases.get(key)
        if target and target not in homes:
            homes.append(target)
        if homes:
            hints.append(f"{key!r} belongs " + " or ".join(_nested(p) for p in homes))
        else:
            close = difflib.get_close_matches(key, names, n=1)
            if close:
                hints.append(f"{key!r}: did you mean {close[0]!r}?")
    text = f"{where}: unknown setting(s) {unknown} {level}"
    if hints:
        return f"{text}: {'; '.join(hints)}"
    return f"{text}; expected some of {names}"


def _nested(path: str) -> str:
    """Where a dotted setting path goes in a config file: `in section 'recursion' (write recursion: {m: ...})`."""
    parts = path.split(".")
    if len(parts) == 1:
        return f"at the top level (write {path}: ...)"
    return (f"in section {'.'.join(parts[:-1])!r} (write " + "".join(f"{p}: {{" for p in parts[:-1])
            + f"{parts[-1]}: ..." + "}" * (len(parts) - 1) + ")")


def load_config_file(path: str) -> dict:
    """A JSON or YAML file of settings (or a results_*.json, whose resolved config is used)."""
    data = read_data_file(path, "--config")
    if isinstance(data, dict) and isinstance(data.get("config"), dict) and "results" in data:
        data = data["config"]  # a results_*.json: reuse its resolved config
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path!r} holds a {type(data).__name__}; expected a mapping of settings "
                          "(setting: value, nested by section)")
    return data


def set_path(values: dict, path: str, value) -> None:
    """Set `value` at the dotted `path` of nested settings (a --config file's, which may hold a scalar there)."""
    parts = path.split(".")
    for i, part in enumerate(parts[:-1]):
        inner = values.setdefault(part, {})
        if not isinstance(inner, dict):  # a --config file with `recursion: 3` or `recursion: [..]`
            raise ConfigError(f"--config: section {'.'.join(parts[:i + 1])!r} is a {type(inner).__name__}; "
                              "expected a mapping of its settings")
        values = inner
    values[parts[-1]] = value


def save_config(cfg, directory: str | Path, name: str = "config.json") -> Path:
    """Write the resolved config next to a job's outputs (atomically)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{name}.tmp"
    tmp.write_text(json.dumps(to_dict(cfg), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(d / name)
    return d / name
