"""Where a link folder came from: `provenance.json` written beside the links by the job that made them, and the
check that a folder's link files are still the ones it describes.

A result is reproducible from a clone only when every link it used can be traced to the command and config that
trained it. Training jobs call `write_provenance(folder, config=..., inputs=...)` once their final links are in
place: it records the sha256 of each link file (`link_files`: what `checkpoints.load_links` reads), the command
line, working directory, code version (the package's git commit where it runs from a checkout) and time, the
job's config (values under names that look secret left out) and the origin of every link folder the job
started from. `link_origin(folder)` reads it back and re-hashes the files; `require_known_links` is the gate
of the jobs that take link folders (`jobs.run --ckpt_override`, the recipe sweep's `--inner_from`): a folder
without a provenance record, or whose files no longer match it, is refused in one line naming the folder and
the flag that accepts it anyway (`--allow_unknown_links`). Folders are untrusted input: every file is opened
inside the folder (`system.untrusted`).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from recmas_ray.system.checkpoints import MANIFEST, WEIGHTS, read_json
from recmas_ray.system.untrusted import read_bytes_inside

PROVENANCE = "provenance.json"
FORMAT = "recmas_ray.link_provenance/1"
ALLOW_FLAG = "--allow_unknown_links"
_RELEASE_FILES = ("adapter_config.json", "innerlink_config.json", "outerlink_config.json")
_SECRET_WORDS = ("key", "token", "secret", "password", "credential")


def link_files(folder: str | os.PathLike) -> list[str]:
    """Names of the files that make up the links of `folder`: ours (links.safetensors, manifest.json) or a
    release layout's (*.pt adapters and outer links, their JSON configs); sorted."""
    folder = Path(folder)
    if (folder / WEIGHTS).exists():
        return sorted(n for n in (WEIGHTS, MANIFEST) if (folder / n).exists())
    return sorted(p.name for p in folder.iterdir()
                  if p.is_file() and (p.suffix == ".pt" or p.name in _RELEASE_FILES))


def file_hashes(folder: str | os.PathLike) -> dict[str, str]:
    """sha256 of every link file of `folder` (each opened inside it)."""
    folder = Path(folder)
    return {n: hashlib.sha256(read_bytes_inside(folder, folder / n, what=str(folder))).hexdigest()
            for n in link_files(folder)}


def _code_version() -> dict:
    root = Path(__file__).resolve().parents[2]  # the folder holding the recmas_ray package
    out = {"package_dir": str(root)}
    if (root / ".git").exists():
        try:
            got = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                 timeout=10, check=False)
            if got.returncode == 0:
                out["git_commit"] = got.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return out


def _without_secrets(value):
    if isinstance(value, dict):
        return {k: ("<left out>" if any(w in str(k).lower() for w in _SECRET_WORDS) and v else _without_secrets(v))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_secrets(v) for v in value]
    return value


def write_provenance(folder: str | os.PathLike, *, config: dict, inputs: Mapping[str, str] | None = None,
                     kind: str = "") -> Path:
    """Write `folder/provenance.json` for the links now in `folder` (call once they are final): file hashes,
    the command that made them (this process's command line), code version, `config` (secrets left out) and
    the origin of each input link folder (`inputs`: name -> folder, e.g. the inner links outer training began
    from)."""
    folder = Path(folder)
    record = {"format": FORMAT, "kind": kind, "files": file_hashes(folder),
              "made_by": {"command": shlex.join([sys.executable, *sys.argv]), "cwd": os.getcwd(),
                          "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                          **_code_version()},
              "config": _without_secrets(config),
              "inputs": {name: link_origin(path) for name, path in (inputs or {}).items()}}
    tmp = folder / f".{PROVENANCE}.tmp"
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True, default=str), encoding="utf-8")
    os.replace(tmp, folder / PROVENANCE)
    return folder / PROVENANCE


def link_origin(folder: str | os.PathLike) -> dict:
    """What is known of `folder`'s links: its path, the sha256 of its link files now, the provenance record
    (None without one), whether the files match it (`known`) and, where not, why (`why`)."""
    folder = Path(folder)
    out = {"path": str(folder.resolve()), "files": {}, "provenance": None, "known": False, "why": ""}
    if not folder.is_dir():
        out["why"] = "not a directory"
        return out
    try:
        out["files"] = file_hashes(folder)
    except ValueError as e:
        out["why"] = str(e)
        return out
    if not (folder / PROVENANCE).exists():
        out["why"] = f"no {PROVENANCE} (not made by a training job of this project, or by an older one)"
        return out
    try:
        record = read_json(folder / PROVENANCE, folder)
    except ValueError as e:
        out["why"] = str(e)
        return out
    out["provenance"] = record
    recorded = record.get("files") if isinstance(record.get("files"), dict) else {}
    changed = sorted(n for n in set(recorded) | set(out["files"]) if recorded.get(n) != out["files"].get(n))
    if record.get("format") != FORMAT:
        out["why"] = f"{PROVENANCE} has format {record.get('format')!r}, expected {FORMAT!r}"
    elif not out["files"]:
        out["why"] = "no link files in it"
    elif changed:
        out["why"] = f"{', '.join(changed)} differ from the sha256 in its {PROVENANCE} (changed after training)"
    else:
        out["known"] = True
    return out


def require_known_links(folders: Mapping[str, str], *, allow_unknown: bool, flag: str = ALLOW_FLAG,
                        what: str = "--ckpt_override") -> dict[str, dict]:
    """name -> `link_origin` of each folder; unless `allow_unknown`, a folder of unknown origin is a ValueError
    (one line: the folder, why, and `flag`). Reads only small files: call it before any model loads."""
    origins = {name: link_origin(path) for name, path in folders.items()}
    if not allow_unknown:
        for name, o in origins.items():
            if not o["known"]:
                raise ValueError(f"{what} {name}={folders[name]}: links of unknown origin ({o['why']}); give {flag} "
                                 f"to use them anyway (recorded as unknown in the results)")
    return origins


__all__ = ["PROVENANCE", "ALLOW_FLAG", "link_files", "file_hashes", "write_provenance", "link_origin",
           "require_known_links"]
