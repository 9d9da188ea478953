"""Links from the Hugging Face Hub: `ORG/NAME[@REVISION][:SUBFOLDER]` wherever a link folder is expected.

    --ckpt_override planner=org/links@v1:planner      one role's folder of a Hub repo
    System.build(..., links="org/links")              a repo holding planner/, critic/, ..., outer/

Each folder is fetched with `huggingface_hub.snapshot_download(repo_id, revision=..., allow_patterns=
[f"{subfolder}/*"])`, so only that role's files are downloaded, into the Hub cache (`HF_HUB_CACHE`, read at
call time), and a second resolution in the same process is free. A local directory always wins over a Hub id
of the same spelling. Offline (`HF_HUB_OFFLINE=1`) the cache alone answers; a missing repo, revision or
folder is one `ValueError` naming the id. Nothing here imports torch; `huggingface_hub` loads on first use.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+)(?:@(?P<rev>[^:@\s]+))?"
                     r"(?::(?P<sub>[^\s:@]+))?$")


@dataclass(frozen=True)
class HubRef:
    """A parsed Hub link reference."""

    repo_id: str
    """ORG/NAME."""
    revision: str | None = None
    """Branch, tag or commit (None: main)."""
    subfolder: str | None = None
    """Folder inside the repo (None: the repo root)."""

    def child(self, name: str) -> HubRef:
        """The reference of a sub-folder, e.g. one role's folder of a multi-role repo."""
        return HubRef(self.repo_id, self.revision, f"{self.subfolder}/{name}" if self.subfolder else name)

    def __str__(self) -> str:
        rev, sub = f"@{self.revision}" if self.revision else "", f":{self.subfolder}" if self.subfolder else ""
        return self.repo_id + rev + sub


def parse_hub_id(text: str) -> HubRef | None:
    """`ORG/NAME[@REV][:SUB]` as a `HubRef`, or None when `text` does not have that shape."""
    m = _HUB_ID.match(text or "")
    if m is None or ".." in text:
        return None
    return HubRef(m["repo"], m["rev"], m["sub"].strip("/") if m["sub"] else None)


def looks_like_hub_id(text: str) -> bool:
    """True for a value that is not an existing path but has the Hub id shape (checked before models load)."""
    return not os.path.exists(text) and parse_hub_id(text) is not None


def resolve_folder(value: str, *, what: str = "links") -> str:
    """A local directory as is; a Hub id fetched (only its subfolder) and returned as a local directory."""
    if os.path.isdir(value):
        return value
    ref = parse_hub_id(value)
    if ref is None:
        raise ValueError(f"{what} {value!r}: no such directory (and not a Hub id ORG/NAME[@REVISION][:SUBFOLDER])")
    return str(_fetch(ref, what, value))


def fetch_subfolder(ref: HubRef, *, what: str = "links", missing_ok: bool = False) -> Path | None:
    """Download `ref` (its subfolder only) into the Hub cache; None when the folder is absent and `missing_ok`."""
    try:
        return _fetch(ref, what, str(ref))
    except _MissingFolder:
        if missing_ok:
            return None
        raise


def resolve_overrides(overrides: dict[str, str]) -> dict[str, str]:
    """`--ckpt_override` values with every Hub id replaced by its local (cached) folder."""
    return {role: resolve_folder(value, what=f"--ckpt_override {role}") for role, value in (overrides or {}).items()}


def links_overrides(links: str, roles) -> dict[str, str]:
    """Per-role link folders of a system folder (`<links>/<role>/`, `<links>/outer/`) or of a Hub repo id.

    Only the folders present are returned (other roles keep fresh links); none at all is an error.
    """
    names = [*roles, "outer"]
    if os.path.isdir(links):
        found = {n: str(Path(links) / n) for n in names if (Path(links) / n).is_dir()}
    else:
        ref = parse_hub_id(links)
        if ref is None:
            raise ValueError(f"links {links!r}: no such directory (and not a Hub id ORG/NAME[@REVISION][:SUBFOLDER])")
        found = {n: str(p) for n in names
                 if (p := fetch_subfolder(ref.child(n), what="links", missing_ok=True)) is not None}
    if not found:
        raise ValueError(f"links {links!r}: no folder named after a role ({', '.join(names)}) in it")
    return found


class _MissingFolder(ValueError):
    """The repo was found but holds no files under the requested folder."""


def _fetch(ref: HubRef, what: str, shown: str) -> Path:
    root = Path(_snapshot(ref.repo_id, ref.revision, ref.subfolder, what, shown))
    folder = root / ref.subfolder if ref.subfolder else root
    if not folder.is_dir() or not any(folder.iterdir()):
        raise _MissingFolder(f"{what} {shown!r}: Hub repo {ref.repo_id} (revision {ref.revision or 'main'}) has no "
                             f"files under {ref.subfolder or '/'}")
    return folder


@functools.lru_cache(maxsize=256)
def _snapshot_cached(repo_id: str, revision: str | None, subfolder: str | None, cache_dir: str | None) -> str:
    from huggingface_hub import snapshot_download  # lazy: the Hub client (~0.3 s) loads only for Hub access

    return snapshot_download(repo_id, revision=revision, cache_dir=cache_dir,
                             allow_patterns=[f"{subfolder}/*"] if subfolder else None)


def _snapshot(repo_id, revision, subfolder, what, shown) -> str:
    try:
        return _snapshot_cached(repo_id, revision, subfolder, os.environ.get("HF_HUB_CACHE") or None)
    except Exception as e:  # noqa: BLE001 - offline, missing repo or revision, auth: one line naming the id
        reason = " ".join(str(e).split())[:300] or type(e).__name__
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        note = " (HF_HUB_OFFLINE is set: only the cache is searched)" if offline else ""
        raise ValueError(f"{what} {shown!r}: not a local directory, and the Hub repo {repo_id} (revision "
                         f"{revision or 'main'}) could not be fetched{note}: {type(e).__name__}: {reason}") from None
