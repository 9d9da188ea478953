"""Link checkpoints: our safetensors + manifest format, and import of the public release's layouts.

Our format (one directory): `links.safetensors` with keys `inner.<role>.<param>` and
`outer.<src->dst>.<param>` (any subset: an inner-training checkpoint holds one role's inner link, an
outer-training one all outer links), and `manifest.json` (style, roles, base model names, hidden
sizes, link types, rounds and latent steps). Never a copy of a base model.

Release layouts (spec section 9): inner `adapter.pt` (or `adapter(<task>).pt`) + `adapter_config.json`;
outer `outer_<key>.pt` files, optionally described by `outerlink_config.json`. `.pt` files load with
`torch.load(weights_only=True)`; reference keys (`outer_12`) are mapped to role-pair edges here only.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from recmas_ray.links import (INNER_LINK_TYPE, OUTER_LINK_TYPE, InnerLink, OuterLink,
                              inner_link_from_state_dict, outer_link_from_state_dict)
from recmas_ray.styles import StyleSpec

MANIFEST = "manifest.json"
WEIGHTS = "links.safetensors"

# Reference numeric keys -> recmas_ray role-pair edges (spec section 1.4); the only place they appear.
LEGACY_EDGE_KEYS = {
    "outer_12": "planner->critic", "outer_23": "critic->solver", "outer_31": "solver->planner",
    "outer_1s": "math->summarizer", "outer_2s": "code->summarizer", "outer_3s": "science->summarizer",
    "outer_s1": "summarizer->math", "outer_s2": "summarizer->code", "outer_s3": "summarizer->science",
    "outer_el": "expert->learner", "outer_le": "learner->expert",
    "outer_rt": "reflector->toolcaller", "outer_tr": "toolcaller->reflector",
}


@dataclass
class LinkSet:
    """A (possibly partial) set of links of one system, plus where they came from."""

    inner: dict[str, InnerLink] = field(default_factory=dict)
    outer: dict[str, OuterLink] = field(default_factory=dict)
    manifest: dict = field(default_factory=dict)


def stable_seed(seed: int, name: str) -> int:
    """Per-link seed independent of process and hash randomisation (local and Ray runs agree)."""
    return zlib.crc32(f"{seed}:{name}".encode()) & 0x7FFFFFFF


def seeded_inner_link(hidden_size: int, *, seed: int, role: str) -> InnerLink:
    """A role's fresh inner link (PyTorch default init under its own seed): the one seeding of inner links."""
    with torch.random.fork_rng():
        torch.manual_seed(stable_seed(seed, f"inner:{role}"))
        return InnerLink(hidden_size)


def seeded_outer_link(in_dim: int, out_dim: int, *, seed: int, edge: str) -> OuterLink:
    """An edge's fresh outer link under its own seed."""
    with torch.random.fork_rng():
        torch.manual_seed(stable_seed(seed, f"outer:{edge}"))
        return OuterLink(in_dim, out_dim)


def init_links(style: StyleSpec, hidden_sizes: dict[str, int], *, seed: int) -> LinkSet:
    """Fresh links for every role and edge with PyTorch default init, seeded per link."""
    links = LinkSet()
    for role in style.roles:
        links.inner[role] = seeded_inner_link(hidden_sizes[role], seed=seed, role=role)
    for edge in style.edges:
        src, dst = edge.split("->")
        links.outer[edge] = seeded_outer_link(hidden_sizes[src], hidden_sizes[dst], seed=seed, edge=edge)
    return links


def group_link_tensors(tensors: dict[str, torch.Tensor]) -> dict[tuple[str, str], dict[str, torch.Tensor]]:
    """Our key layout `inner.<role>.<param>` / `outer.<src->dst>.<param>` -> {(kind, name): state dict}."""
    groups: dict[tuple[str, str], dict] = {}
    for key, value in tensors.items():
        kind, rest = key.split(".", 1)
        name, param = rest.rsplit(".", 2)[0], ".".join(rest.rsplit(".", 2)[1:])
        groups.setdefault((kind, name), {})[param] = value
    return groups


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file; a truncated or corrupt one is a ValueError naming the file."""
    try:
        return load_file(str(path))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types for torn files
        raise ValueError(f"{path}: not a readable safetensors file ({' '.join(str(e).split())})") from None


def save_links(path: str | os.PathLike, links: LinkSet, manifest: dict) -> Path:
    """Write `links.safetensors` + `manifest.json` atomically (a crash never leaves half a checkpoint)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {f"inner.{r}.{k}": v.detach().float().cpu().contiguous() for r, m in links.inner.items()
               for k, v in m.state_dict().items()}
    tensors |= {f"outer.{e}.{k}": v.detach().float().cpu().contiguous() for e, m in links.outer.items()
                for k, v in m.state_dict().items()}
    full = {"format_version": 1, "inner_link_type": INNER_LINK_TYPE, "outer_link_type": OUTER_LINK_TYPE,
            "inner": {r: {"hidden_size": m.hidden_size} for r, m in links.inner.items()},
            "outer": {e: {"in_dim": m.in_dim, "out_dim": m.out_dim} for e, m in links.outer.items()},
            **manifest}
    for name, write in ((WEIGHTS, lambda p: save_file(tensors, p)),
                        (MANIFEST, lambda p: Path(p).write_text(json.dumps(full, indent=2, sort_keys=True)))):
        fd, tmp = tempfile.mkstemp(dir=path, prefix=f".{name}.")
        os.close(fd)
        write(tmp)
        os.replace(tmp, path / name)
    return path


def load_links(path: str | os.PathLike, *, role: str | None = None, style: StyleSpec | None = None,
               task: str = "math") -> LinkSet:
    """Load our format or a release layout. `role` names the role for a release inner adapter."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"checkpoint {str(path)!r} is not a directory")
    if (path / WEIGHTS).exists():
        return _load_ours(path)
    inner_file = next((path / n for n in (f"adapter({task}).pt", "adapter.pt") if (path / n).exists()), None)
    if inner_file is not None:
        if role is None:
            raise ValueError(f"{path}: a release inner adapter needs the role it belongs to")
        return _load_release_inner(path, inner_file, role)
    if (path / "outerlink_config.json").exists() or list(path.glob("outer_*.pt")):
        return _load_release_outer(path, style, task)
    raise ValueError(f"{path}: no {WEIGHTS}, adapter.pt or outer_*.pt found; not a link checkpoint")


def _load_ours(path: Path) -> LinkSet:
    try:
        manifest = json.loads((path / MANIFEST).read_text()) if (path / MANIFEST).exists() else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"{path / MANIFEST}: not valid JSON ({e})") from None
    groups = group_link_tensors(read_safetensors(path / WEIGHTS))
    links = LinkSet(manifest=manifest)
    for (kind, name), sd in groups.items():
        if kind == "inner":
            links.inner[name] = inner_link_from_state_dict(sd, what=f"{path}: inner link of {name}")
        else:
            links.outer[name] = outer_link_from_state_dict(sd, what=f"{path}: outer link {name}")
    return links


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _torch_load(p: Path) -> dict:
    try:
        sd = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickles with code, torn files: refused, one line
        raise ValueError(f"{p}: not a plain tensor checkpoint (loaded with weights_only=True): "
                         f"{str(e).strip().splitlines()[0]}") from None
    if not isinstance(sd, dict):
        raise ValueError(f"{p}: expected a state dict, got {type(sd).__name__}")
    return sd


def _load_release_inner(path: Path, file: Path, role: str) -> LinkSet:
    cfg_file = path / "adapter_config.json"
    cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {"adapter_type": INNER_LINK_TYPE}
    if cfg.get("adapter_type", INNER_LINK_TYPE) != INNER_LINK_TYPE:
        raise ValueError(f"{file}: adapter_type {cfg['adapter_type']!r} is not supported; expected {INNER_LINK_TYPE}")
    link = inner_link_from_state_dict(_torch_load(file), what=str(file))
    manifest = {"source": "release", "files": {str(file): _sha256(file)}}
    if (path / "config.json").exists():  # release inner dirs ship the full base model next to the adapter
        manifest["roles"] = {role: {"base_model": str(path)}}
    return LinkSet(inner={role: link}, manifest=manifest)


def _load_release_outer(path: Path, style: StyleSpec | None, task: str) -> LinkSet:
    entries = []
    cfg_file = path / "outerlink_config.json"
    if cfg_file.exists():
        cfg = json.loads(cfg_file.read_text())
        adapters = cfg["tasks"][task]["adapters"] if "tasks" in cfg else cfg.get("adapters", [])
        for a in adapters:
            if a.get("adapter_type", OUTER_LINK_TYPE) != OUTER_LINK_TYPE:
                raise ValueError(f"{cfg_file}: adapter_type {a['adapter_type']!r} is not supported")
            entries.append((a["legacy_key"], path / a["filename"]))
    else:
        entries = [(f.stem, f) for f in sorted(path.glob("outer_*.pt"))]
    links = LinkSet(manifest={"source": "release", "files": {}})
    for key, file in entries:
        if key not in LEGACY_EDGE_KEYS:
            raise ValueError(f"{file}: unknown reference key {key!r}; expected one of {sorted(LEGACY_EDGE_KEYS)}")
        edge = LEGACY_EDGE_KEYS[key]
        if style is not None and edge not in style.edges:
            continue
        links.outer[edge] = outer_link_from_state_dict(_torch_load(file), what=str(file))
        links.manifest["files"][str(file)] = _sha256(file)
    if not links.outer:
        raise ValueError(f"{path}: no outer links for style {style.name if style else '?'} found")
    return links
