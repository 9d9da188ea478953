"""What a system's links were trained with (task type and prompt set), read from their manifests, and the check
that a run prompts them the same way.

A link learns the prompts it was trained under: an inner link trained on the qa instruction, run under the math
instruction, answers another question (issue 48: 0/64 where the trained prompts give 43/64). Every checkpoint of
ours records its task (`task` or `train_config.task`) and, for outer links, the sha256 of the prompts
(`prompt_set_hash`); a run that asks for no task gets the recorded one, and a run that asks for another one, or
runs other prompts, is refused before any model loads unless it passes `--allow_task_mismatch`.
"""

from __future__ import annotations

from dataclasses import dataclass

from recmas_ray.system.checkpoints import read_manifest


@dataclass(frozen=True)
class Trained:
    """The task and prompts one link folder records."""

    folder: str
    """The link folder (`--ckpt_override` value, Hub ids resolved)."""
    key: str
    """Its role, or "outer"."""
    task: str | None
    """Task type it was trained on (None: not recorded, e.g. a release layout)."""
    prompt_set_hash: str | None
    """sha256 of the prompts it was trained with (None: not recorded)."""


def trained_with(overrides: dict[str, str]) -> list[Trained]:
    """What each link folder of `overrides` records (release layouts and unreadable manifests record nothing)."""
    out = []
    for key, folder in sorted(overrides.items()):
        try:
            manifest = read_manifest(folder)
        except (OSError, ValueError):  # the loader reports an unreadable manifest, naming the folder
            continue
        cfg = manifest.get("train_config") if isinstance(manifest.get("train_config"), dict) else {}
        task = manifest.get("task", cfg.get("task"))
        digest = manifest.get("prompt_set_hash")
        out.append(Trained(folder, key, task if isinstance(task, str) else None,
                           digest if isinstance(digest, str) else None))
    return out


def trained_task(overrides: dict[str, str]) -> str | None:
    """The task the links were trained on (the outer links' first, then the roles'); None when none records one."""
    records = sorted(trained_with(overrides), key=lambda t: t.key != "outer")
    return next((t.task for t in records if t.task), None)


def check_trained_task(overrides: dict[str, str], tasks, prompt_set_hash: str, *, allow: bool,
                       task_flag: str = "--task") -> None:
    """Refuse a run whose task types (`tasks`, every row's) or prompts differ from those its links record.

    One ValueError naming the folder, what it was trained with and how to run it as trained (or `allow`)."""
    if allow:
        return
    tasks = sorted(set(tasks))
    for rec in trained_with(overrides):
        other = [t for t in tasks if rec.task and t != rec.task]
        if other:
            raise ValueError(f"links {rec.key}={rec.folder} were trained on task {rec.task!r}, but this run prompts "
                             f"{other[0]!r}; run it as trained ({task_flag} {rec.task}, or a `task` field per row) "
                             "or pass --allow_task_mismatch")
        if rec.prompt_set_hash and rec.prompt_set_hash != prompt_set_hash:
            raise ValueError(f"links {rec.key}={rec.folder} were trained with prompts sha256 "
                             f"{rec.prompt_set_hash[:12]}, but this run's prompts hash to {prompt_set_hash[:12]} "
                             "(another --prompt_set, or none); pass the prompt set they were trained with, or "
                             "--allow_task_mismatch")
