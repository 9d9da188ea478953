"""Raw benchmark records and the row helpers every task family's loader uses.

`read_records` reads a .jsonl, .json, .csv or .parquet file (or a directory of .jsonl/.json files) into
dicts; `_field` / `_text` take a row's field by any of its published names, each error naming the row;
`_item` builds the normalised dict with the base keys (`doc_id`, `question`, `gold`, `task_type`,
`benchmark`, `raw_question`).
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

from recmas_ray.config.inputs import check_file, parse_json_lines

LOCAL_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def _read_text(path: Path) -> str:
    """A data file's UTF-8 text; a FIFO, an unreadable file or a decoding error is a ValueError naming it."""
    check_file("data file", path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot be read ({e.strerror or e})") from None


def _read_file(path: Path, json_field: str | None = None) -> list[dict]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return parse_json_lines(_read_text(path), str(path))
    if suffix == ".json":
        try:
            data = json.loads(_read_text(path) or "null")
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        if isinstance(data, dict):
            key = json_field or "data"
            if key not in data:
                raise ValueError(f"{path}: JSON object has no field {key!r} holding the records "
                                 f"(fields: {sorted(data)[:10]})")
            data = data[key]
        return data if isinstance(data, list) else [data] if data else []
    if suffix == ".csv":
        return list(csv.DictReader(io.StringIO(_read_text(path), newline="")))
    if suffix == ".parquet":
        import pyarrow.parquet as pq  # lazy: ~0.3 s and pandas-sized: only .parquet files need it

        return pq.read_table(path).to_pylist()
    raise ValueError(f"{path}: unsupported file type {suffix!r}; expected one of {LOCAL_SUFFIXES}")


def read_records(path: str | os.PathLike, json_field: str | None = None) -> list[dict]:
    """Raw records of a file, or of every .jsonl/.json file in a directory (sorted by name)."""
    p = Path(path).expanduser()
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix.lower() in (".jsonl", ".json"))
        if not files:
            raise ValueError(f"{p}: directory holds no .jsonl/.json files")
        rows = [r for f in files for r in _read_file(f, json_field)]
    else:
        check_file("benchmark data path", p)  # missing, a FIFO, unreadable: named
        rows = _read_file(p, json_field)
    if not rows:
        raise ValueError(f"{p}: no records (empty file)")
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise ValueError(f"{p}: record {bad} is a {type(rows[bad]).__name__}, expected an object")
    return rows


def _field(row: dict, keys: tuple[str, ...], i: int, name: str, *, required=True) -> Any:
    for k in keys:
        v = row.get(k)
        if v is not None and str(v).strip() != "":
            return v
    if required:
        empty = [k for k in keys if k in row]
        if empty:  # the field is there, but null or blank: say so, not that it is missing
            raise ValueError(f"{name}: row {i} field {empty[0]!r} is {_preview(row[empty[0]])}; expected a non-empty "
                             f"value" + (f" (or {' / '.join(repr(k) for k in keys if k != empty[0])})"
                                         if len(keys) > 1 else ""))
        raise ValueError(f"{name}: row {i} has no {' / '.join(repr(k) for k in keys)} field "
                         f"(fields present: {sorted(row)[:12]})")
    return None


def _text(row: dict, keys: tuple[str, ...], i: int, name: str, **kw) -> str:
    """`_field` of a text field as a string; a list or object there is refused, not stringified."""
    value = _field(row, keys, i, name, **kw)
    if isinstance(value, (list, dict, tuple)):
        key = next(k for k in keys if row.get(k) is value)
        raise ValueError(f"{name}: row {i} field {key!r} holds a {type(value).__name__} ({_preview(value)}); "
                         "expected text")
    return "" if value is None else str(value)


def _preview(value, limit: int = 40) -> str:
    text = json.dumps(value, default=str)[:limit + 1]
    return text if len(text) <= limit else text[:limit] + "..."


def _item(doc_id, question, gold, task_type, benchmark, raw_question, **extra) -> dict:
    return {"doc_id": str(doc_id), "question": question, "gold": gold, "task_type": task_type,
            "benchmark": benchmark, "raw_question": raw_question, **extra}
