"""Refusing to resume a different configuration: one field-by-field comparison for evaluation and training.

Evaluation compares a samples file's fingerprint (`eval/run.py`); training compares the config.json a run
saved next to its outputs with the config of the `--resume` run (`check_training_resume`, called from
`TrainConfig.validate`, i.e. before any model loads or Ray starts). Both name every differing field.
"""

from __future__ import annotations

import json
from pathlib import Path

from recmas_ray.config.checks import unread_fields
from recmas_ray.config.tree import to_dict

TRAIN_RESUME_FREE = frozenset({
    "resume", "progress", "verbose", "log_every", "max_failures", "num_to_keep", "stop_at_step", "save_every",
    "fit_timeout_s", "cpus_per_worker", "gpus_per_worker", "eval_every", "verify_frozen", "profile_memory",
    "storage_path", "save_dir", "mas_role", "track"})
"""Training settings a resumed run may change: bookkeeping, resources and where things go, never what the
weights become (seed, lr, data, schedule, models, ... must match)."""


def settings_diff(old: dict, new: dict, prefix: str = "", ignore=frozenset()) -> list[str]:
    """Dotted names of the fields that differ, with both values ("recursion.num_recursive_rounds: 1 -> 3")."""
    out = []
    for key in sorted(set(old) | set(new)):
        if key in ignore and not prefix:
            continue
        a, b, name = old.get(key, "<absent>"), new.get(key, "<absent>"), f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += settings_diff(a, b, name + ".")
        elif a != b:
            out.append(f"{name}: {json.dumps(a, default=str)} -> {json.dumps(b, default=str)}")
    return out


def check_training_resume(cfg, folder: str | Path, flag: str = "--resume") -> None:
    """Refuse `--resume` into `folder` when the config.json saved there by the earlier run differs from `cfg`
    in any field that changes the trained weights; silently fine when there is no earlier run."""
    saved = Path(folder) / "config.json"
    if not saved.is_file():
        return
    try:
        old = json.loads(saved.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{flag}: {saved} is unreadable ({' '.join(str(e).split())}); it records the run being "
                         "resumed: restore it, or start afresh without --resume") from None
    if not isinstance(old, dict):
        raise ValueError(f"{flag}: {saved} holds a {type(old).__name__}, not the earlier run's settings")
    hidden = unread_fields(type(cfg))
    old, new = _system_lifted(old, hidden), _system_lifted(to_dict(cfg), hidden)
    ignore = set(TRAIN_RESUME_FREE)
    if (old.get("num_train_epochs") or 0) > 0 and old.get("num_train_epochs") == new.get("num_train_epochs"):
        ignore.add("max_steps")  # resolved from the epochs when the run started
    diff = settings_diff(old, new, ignore=frozenset(ignore))
    if diff:
        raise ValueError(f"{flag}: {folder} holds a run with other settings; differing fields: {'; '.join(diff)}. "
                         "Resume with the same settings, or use another --save_dir")


def _system_lifted(settings: dict, hidden=()) -> dict:
    """`settings` with the fields of its `system` section at the top, named as their flags are (`seed`, not
    `system.seed`), less the ones the job does not use (`hidden`)."""
    out = dict(settings)
    section = out.pop("system", None)
    out.update(section if isinstance(section, dict) else {})
    for path in hidden:
        out.pop(path.removeprefix("system."), None)
    return out
