"""Per-sample evaluation records in lm-evaluation-harness's layout (docs/usage.md): the streaming writer
and the readers `--resume` uses.

- `SampleWriter`: append-only `samples_<benchmark>_<time>.jsonl`, one line per finished sample,
  flushed and fsynced, so a crash loses at most the line being written; `load_done_ids` and
  `read_samples` make `--resume` skip finished samples and never double count.
- `with_verdicts`: both graders' verdicts of a record; `lm_eval_sample`: a record as lm-eval writes it.
- `json_default`: how results and samples serialize dataclasses, tuples and tensor scalars.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

# Both graders' verdicts per sample: results report `accuracy,strict` (math-verify)
# and `accuracy,reference` (the release's lenient rules) whatever `--grader` picked for the headline.
VERDICT_FIELDS = {"strict": "correct_strict", "reference": "correct_reference"}


def with_verdicts(record: dict) -> dict:
    """`record` with `correct_strict` / `correct_reference` from its grade_detail (set in place).

    A mode missing from grade_detail (code samples written before both were recorded) takes
    `correct`: test verdicts do not depend on the mode.
    """
    detail = record.get("grade_detail") or {}
    for mode, fld in VERDICT_FIELDS.items():
        record[fld] = bool(detail[mode]) if mode in detail else bool(record["correct"])
    return record


def own_reply(record: dict) -> str:
    """The text a sample's agent wrote itself: its prediction before any answer-format retry was appended."""
    retry = record.get("retry")
    if isinstance(retry, dict) and retry.get("raw_prediction") is not None:
        return str(retry["raw_prediction"])
    return str(record.get("prediction") or "")


def timestamp() -> str:
    """lm-eval style file timestamp: ISO time with ':' replaced, safe in file names."""
    return _dt.datetime.now().isoformat(timespec="microseconds").replace(":", "-")


def sample_key(record: Mapping[str, Any]) -> str:
    """Identity of a finished sample: method, doc id and rollout, where present."""
    if "doc_id" not in record:
        raise ValueError(f"sample record has no 'doc_id' (keys: {sorted(record)[:12]})")
    return "::".join(str(record[k]) for k in ("method", "doc_id", "rollout")
                     if record.get(k) is not None)


class SampleWriter:
    """Append one JSON line per finished sample; flush + fsync after each line.

    A crash can leave a partial last line; opening the file again cuts it off, so the next
    append starts on a clean line and resume treats that sample as not done.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        _drop_partial_line(self.path)
        self._f = open(self.path, "ab", buffering=0)

    def write(self, record: Mapping[str, Any]) -> None:
        """Append `record` as one line (JSON, non-ASCII kept, lm-eval's sample fields added) and make it durable.

        A write that fails part-way (a full disk) is cut back to the end of the previous line before the
        error propagates, so the file never holds a partial line and `--resume` continues from it.
        """
        data = (json.dumps(lm_eval_sample(record), ensure_ascii=False, default=json_default) + "\n").encode()
        with self._lock:
            fd = self._f.fileno()
            start = os.fstat(fd).st_size
            try:
                write_whole(fd, data)
            except OSError as e:
                try:
                    os.ftruncate(fd, start)
                except OSError:
                    pass  # the next open cuts a torn tail too (_drop_partial_line)
                raise OSError(e.errno, e.strerror, str(self.path)) from None

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            if not self._f.closed:
                self._f.close()

    def __enter__(self) -> "SampleWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_whole(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd` and fsync (one seam, so tests can fill the disk part-way through a line)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def lm_eval_sample(record: Mapping[str, Any]) -> dict:
    """`record` plus lm-eval's sample fields (doc, target, arguments, resps, filtered_resps, filter, metrics,
    <metric>, doc_hash, prompt_hash, target_hash), derived from our question / gold / prediction / correct;
    fields already present are kept."""
    rec = dict(record)
    if "prediction" not in rec:
        return rec
    question, target = str(rec.get("question", "")), str(rec.get("gold", ""))
    doc = {"question": question, "gold": rec.get("gold")}
    lm = {"doc": doc, "target": target, "arguments": {"gen_args_0": {"arg_0": question, "arg_1": {}}},
          "resps": [[rec["prediction"]]], "filtered_resps": [rec["prediction"]], "filter": "strict",
          "metrics": ["accuracy"], "accuracy": float(bool(rec.get("correct"))),
          "doc_hash": _sha256(json.dumps(doc, indent=2, default=json_default, ensure_ascii=False)),
          "prompt_hash": _sha256(question), "target_hash": _sha256(target)}
    return {**lm, **rec}


def _drop_partial_line(path: Path) -> None:
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        data = f.read()
        if not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def read_samples(path: str | os.PathLike, *, key: Callable[[Mapping], str] = sample_key
                 ) -> list[dict]:
    """Parsed sample records, skipping a torn last line and keeping the last copy per key."""
    p = Path(path)
    if not p.exists():
        return []
    by_key: dict[str, dict] = {}
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line torn by a crash; the sample is simply redone
        if isinstance(rec, dict) and "doc_id" in rec:
            by_key[key(rec)] = rec
    return list(by_key.values())


def check_samples_file(path: str | os.PathLike, *, flag: str = "--resume") -> None:
    """A samples file a run may resume: a regular UTF-8 file of JSON sample records, where only the last line
    may be torn (a crash mid-write). ValueError naming the file and the first damaged line otherwise."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{flag}: {p} is not a regular file; expected the samples JSONL of an earlier run")
    try:
        lines = p.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"{flag}: {p} is not UTF-8 text (byte {e.start}); the samples file is damaged: move it "
                         "away or use another --output_path") from None
    for n, line in enumerate(lines[:-1], start=1):  # the last line alone may be torn
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        if not isinstance(rec, dict) or "doc_id" not in rec:
            raise ValueError(f"{flag}: {p} line {n} is not a sample record; the samples file is damaged: move it "
                             "away or use another --output_path")


def load_done_ids(path: str | os.PathLike, *, key: Callable[[Mapping], str] = sample_key
                  ) -> set[str]:
    """Keys (see `sample_key`) of the samples already in `path`; empty if it does not exist."""
    return {key(r) for r in read_samples(path, key=key)}


def json_default(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    return str(obj)
