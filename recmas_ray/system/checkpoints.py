"""Link checkpoints: our safetensors + manifest format, and import of the public release's layouts.

Our format (one directory): `links.safetensors` with keys `inner.<role>.<param>` and
`outer.<src->dst>.<param>` (any subset: an inner-training checkpoint holds one role's inner link, an
outer-training one all outer links), and `manifest.json` (style, roles, base model names, hidden
sizes, link types, rounds and latent steps). Never a copy of a base model.

Release layouts: inner `adapter.pt` (or `adapter(<task>).pt`) + `adapter_config.json`;
outer `outer_<key>.pt` files, optionally described by `outerlink_config.json`; released inner folders
may name their adapter per task in `innerlink_config.json`. `.pt` files load with
`torch.load(weights_only=True)`; reference keys (`outer_12`) are mapped to role-pair edges here only.

Checkpoint folders are untrusted input: every file named by a manifest must stay inside the folder
(no absolute paths, no `..`, no symlink out), tensor shapes are checked against the models' hidden
sizes before the weights are read, and unreadable files are one-line ValueErrors naming the file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from recmas_ray.engine.links import (INNER_LINK_TYPE, OUTER_LINK_TYPE, InnerLink, OuterLink, inner_link_from_state_dict,
                              link_args, link_from_state, link_kind, link_state, outer_link_from_state_dict)
from recmas_ray.styles import StyleSpec
from recmas_ray.system.link_manifest import MANIFEST, check_dims, inner_dim, outer_dims, declared_link
from recmas_ray.system.token_links_pt import TOKEN_LINKS_PT, read_token_links_pt
from recmas_ray.system.untrusted import check_finite, opened_inside, read_bytes_inside

WEIGHTS = "links.safetensors"
OUTER_INIT_DIR = "init"
"""The subfolder of a trained outer-link folder holding the links as training started, where that start was
fitted (`--outer_init bridge` / `state_bridge`): an evaluation's untrained-links row loads it (`eval.rows`)."""

# Reference numeric keys -> recmas_ray role-pair edges; the only place they appear.
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
    """Edge -> outer link of any registered kind (`links.LINK_KINDS`: the release's OuterLink, TokenLink)."""
    manifest: dict = field(default_factory=dict)


def group_link_tensors(tensors: dict, *, what: str = "checkpoint") -> dict[tuple[str, str], dict]:
    """Our key layout `inner.<role>.<param>` / `outer.<src->dst>.<param>` -> {(kind, name): {param: value}}.

    Values may be tensors or their shapes (header-only checks before the weights load).
    """
    groups: dict[tuple[str, str], dict] = {}
    for key, value in tensors.items():
        kind, _, rest = key.partition(".")
        name, param = rest.rsplit(".", 2)[0], ".".join(rest.rsplit(".", 2)[1:])  # param: "proj1.weight"
        if kind not in ("inner", "outer") or not param:
            raise ValueError(f"{what}: unexpected tensor {key!r}; expected inner.<role>.* or outer.<edge>.*")
        groups.setdefault((kind, name), {})[param] = value
    return groups


def read_safetensors(path: Path, root: Path | None = None) -> dict[str, torch.Tensor]:
    """A safetensors file (opened inside `root` when given); a truncated or corrupt one, or one holding NaN/Inf,
    is a ValueError naming the file."""
    try:
        with opened_inside(root or Path(path).parent, path, what=str(path)) as opened:
            tensors = load_file(opened)
    except ValueError as e:
        if "not a readable" in str(e) or str(path) in str(e):
            raise
        raise ValueError(f"{path}: not a readable safetensors file ({' '.join(str(e).split())})") from None
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types for torn files
        raise ValueError(f"{path}: not a readable safetensors file ({' '.join(str(e).split())})") from None
    check_finite(tensors, str(path))
    return tensors


def save_links(path: str | os.PathLike, links: LinkSet, manifest: dict) -> Path:
    """Write `links.safetensors` + `manifest.json` atomically (a crash never leaves half a checkpoint).

    The manifest names every link's kind and constructor arguments (`links.link_args`), e.g.
    `"outer": {"critic->solver": {"kind": "token_link", "in_dim": 640, "out_dim": 576, "num_tokens": 9000,
    "tau": 0.02}}`; loading checks each tensor's shape against them before the weights are read.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)

    def stored(v: torch.Tensor) -> torch.Tensor:  # token ids stay integers, the temperature float64
        v = v.detach().cpu()
        return (v if not v.is_floating_point() or v.dtype == torch.float64 else v.float()).contiguous()

    tensors = {f"{place}.{name}.{k}": stored(v) for place, table in (("inner", links.inner), ("outer", links.outer))
               for name, m in table.items() for k, v in link_state(m).items()}
    full = {"format_version": 1, "inner_link_type": INNER_LINK_TYPE, "outer_link_type": OUTER_LINK_TYPE,
            "inner": {r: {"kind": link_kind(m), **link_args(m)} for r, m in links.inner.items()},
            "outer": {e: {"kind": link_kind(m), **link_args(m)} for e, m in links.outer.items()},
            **manifest}
    for name, write in ((WEIGHTS, lambda p: save_file(tensors, p)),
                        (MANIFEST, lambda p: Path(p).write_text(json.dumps(full, indent=2, sort_keys=True)))):
        fd, tmp = tempfile.mkstemp(dir=path, prefix=f".{name}.")
        os.close(fd)
        write(tmp)
        os.replace(tmp, path / name)
    return path


def contained(folder: Path, name: str, *, what: str) -> Path:
    """`folder/name`, refused unless it stays inside `folder` (checkpoint folders are untrusted input).

    Absolute names, `..` components and symlinks that resolve outside the folder are ValueErrors.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what}: file name {name!r} is not a relative path")
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"{what}: file {name!r} leaves the checkpoint folder {folder} (absolute or '..')")
    target = folder / rel
    root = folder.resolve()
    if not target.resolve().is_relative_to(root):
        raise ValueError(f"{what}: file {name!r} is a link to {target.resolve()}, outside the checkpoint folder {root}")
    return target


def read_json(path: Path, root: Path | None = None) -> dict:
    """A checkpoint's JSON file (opened inside `root`, default its folder); malformed JSON is a one-line
    ValueError naming the file."""
    try:
        data = json.loads(read_bytes_inside(root or path.parent, path, what=str(path)).decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable JSON file ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def task_entry(cfg: dict, task: str, file: Path) -> dict:
    """`cfg["tasks"][task]` of a task-scoped release config; a missing task names the ones present."""
    tasks = cfg.get("tasks")
    if tasks is None:
        return cfg
    if not isinstance(tasks, dict):
        raise TypeError(f"'tasks' in {file.name} is a {type(tasks).__name__}; expected a mapping task -> entry")
    if task not in tasks:
        raise ValueError(f"{file}: no links for task {task!r}; the release manifest holds tasks {sorted(tasks)}")
    return tasks[task]


def read_manifest(path: str | os.PathLike) -> dict:
    """Our checkpoint's manifest.json (empty for release layouts); no weights are read."""
    path = Path(path)
    if (path / WEIGHTS).exists() and (path / MANIFEST).exists():
        return read_json(contained(path, MANIFEST, what=str(path)))
    return {}


def malformed_config_guard(fn):
    """Checkpoint configs are untrusted JSON: a value of the wrong type (a list where a mapping belongs, a
    number where a file name belongs) or a missing key is one ValueError naming the folder, not a crash."""
    @functools.wraps(fn)
    def guarded(path, *args, **kwargs):
        try:
            return fn(path, *args, **kwargs)
        except (KeyError, TypeError, AttributeError, IndexError) as e:
            detail = f"missing key {e}" if isinstance(e, KeyError) else " ".join(str(e).split())
            raise ValueError(f"checkpoint {str(path)!r}: malformed configuration JSON ({type(e).__name__}: "
                             f"{detail}); expected the layout of links.safetensors + manifest.json or the "
                             "release's adapter/outer configs") from None
    return guarded


@malformed_config_guard
def declared_base_model(path: str | os.PathLike, role: str) -> str | None:
    """The base model an inner checkpoint names for `role` (no weights read), else None.

    Ours: the manifest's roles[role].base_model (or base_model); a release inner folder that ships
    the model's config.json next to its adapter: the folder itself.
    """
    path = Path(path)
    manifest = read_manifest(path)
    if manifest:
        name = (manifest.get("roles", {}).get(role, {}) or {}).get("base_model") or manifest.get("base_model")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"base_model of {role} is a {type(name).__name__}, expected a model name")
        return name
    if not (path / WEIGHTS).exists() and (path / "config.json").exists():
        return str(path)
    return None


@malformed_config_guard
def load_links(path: str | os.PathLike, *, role: str | None = None, style: StyleSpec | None = None,
               task: str = "math", hidden_sizes: dict[str, int] | None = None) -> LinkSet:
    """Load our format or a release layout. `role` names the role for a release inner adapter.

    With `hidden_sizes` (role -> d from the models' config.json), every tensor shape is checked
    against them from the file headers before the link weights are read.
    """
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"checkpoint {str(path)!r} is not a directory")
    if (path / WEIGHTS).exists():
        return _load_ours(path, hidden_sizes)
    inner_file = _release_inner_file(path, task)
    if inner_file is not None:
        if role is None:
            raise ValueError(f"{path}: a release inner adapter needs the role it belongs to")
        return _load_release_inner(path, inner_file, role, task, hidden_sizes)
    if (path / "outerlink_config.json").exists() or list(path.glob("outer_*.pt")):
        return _load_release_outer(path, style, task, hidden_sizes)
    if (path / TOKEN_LINKS_PT).exists():  # the hop-by-hop experiment's earlier file
        file = contained(path, TOKEN_LINKS_PT, what=str(path))
        links = LinkSet(outer=read_token_links_pt(path, file, style.edges if style else None),
                        manifest={"source": TOKEN_LINKS_PT, "files": {str(file): _sha256(file, path)}})
        for edge, link in links.outer.items():
            src, dst = edge.split("->")
            if hidden_sizes and src in hidden_sizes and dst in hidden_sizes:
                check_dims(f"{file}: {edge}", (link.in_dim, link.out_dim), (hidden_sizes[src], hidden_sizes[dst]))
        return links
    raise ValueError(f"{path}: no {WEIGHTS}, adapter.pt, outer_*.pt or {TOKEN_LINKS_PT} found; not a link "
                     "checkpoint")


def _load_ours(path: Path, hidden: dict[str, int] | None) -> LinkSet:
    manifest = read_manifest(path)
    file = contained(path, WEIGHTS, what=str(path))
    try:
        with opened_inside(path, file, what=str(path)) as opened, safe_open(opened, framework="pt") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # the header: shapes before weights
    except ValueError as e:
        if str(path) in str(e):
            raise
        raise ValueError(f"{file}: not a readable safetensors file ({str(e).splitlines()[0]})") from None
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type for corrupt files
        raise ValueError(f"{file}: not a readable safetensors file ({str(e).splitlines()[0]})") from None
    groups = group_link_tensors(shapes, what=str(file))
    for (place, name), sh in groups.items():
        what = f"{file}: {place} link {name}"
        kind, args = declared_link(manifest, place, name, sh, what)
        if not hidden:
            continue
        if place == "inner" and name in hidden:
            check_dims(what, (args["hidden_size"],), (hidden[name],))
        elif place == "outer" and all(r in hidden for r in name.split("->")):
            src, dst = name.split("->")
            check_dims(what, (args["in_dim"], args["out_dim"]), (hidden[src], hidden[dst]))
    tensors = read_safetensors(file, path)  # a file cut after its header fails here, naming it
    links = LinkSet(manifest=manifest)
    for (place, name), sh in groups.items():
        sd = {param: tensors[f"{place}.{name}.{param}"] for param in sh}
        link = link_from_state(sd, place=place, what=f"{path}: {place} link {'of ' if place == 'inner' else ''}{name}")
        (links.inner if place == "inner" else links.outer)[name] = link
    return links


def _sha256(p: Path, root: Path) -> str:
    return hashlib.sha256(read_bytes_inside(root, p, what=str(p))).hexdigest()


def _torch_load(p: Path, root: Path) -> dict:
    try:  # weights_only: a .pt file can hold no code; mmap: shapes are checked before data is read
        with opened_inside(root, p, what=str(p)) as opened:
            sd = torch.load(opened, map_location="cpu", weights_only=True, mmap=True)
            sd = {k: v.clone() for k, v in sd.items()} if isinstance(sd, dict) and all(
                isinstance(v, torch.Tensor) for v in sd.values()) else sd  # off the mapping before the fd closes
    except ValueError as e:
        if str(p) in str(e):
            raise
        first = re.sub(r"\x1b\[[0-9;]*m", "", str(e).strip().splitlines()[0])[:160]
        raise ValueError(f"{p}: not a plain tensor checkpoint (loaded with weights_only=True, which refuses "
                         f"pickled objects): {first}") from None
    except Exception as e:  # noqa: BLE001 - corrupt zip, pickle refused by weights_only, ...
        first = re.sub(r"\x1b\[[0-9;]*m", "", str(e).strip().splitlines()[0])[:160]
        raise ValueError(f"{p}: not a plain tensor checkpoint (loaded with weights_only=True, which refuses "
                         f"pickled objects): {first}") from None
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ValueError(f"{p}: expected a state dict of tensors, got {type(sd).__name__}")
    check_finite(sd, str(p))
    return sd


def _release_inner_file(path: Path, task: str) -> Path | None:
    """The inner adapter file: innerlink_config.json's entry for the task, else adapter(<task>).pt, else adapter.pt."""
    cfg_file = path / "innerlink_config.json"
    if cfg_file.exists():
        entry = task_entry(read_json(contained(path, cfg_file.name, what=str(path))), task, cfg_file)
        name = entry if isinstance(entry, str) else entry.get("adapter.pt") or entry.get("filename")
        if name:
            return contained(path, name, what=str(cfg_file))
    for name in (f"adapter({task}).pt", "adapter.pt"):
        if (path / name).exists():
            return contained(path, name, what=str(path))
    return None


def _inner_config(path: Path, task: str) -> dict:
    """adapter_type / hidden_size from innerlink_config.json (task entry first) and adapter_config.json."""
    out = {"adapter_type": INNER_LINK_TYPE}
    for name in ("adapter_config.json", "innerlink_config.json"):
        if (path / name).exists():
            cfg = read_json(contained(path, name, what=str(path)))
            entry = task_entry(cfg, task, path / name)
            for source in (cfg, entry if isinstance(entry, dict) else {}):
                out |= {k: source[k] for k in ("adapter_type", "hidden_size") if k in source}
    return out


def _load_release_inner(path: Path, file: Path, role: str, task: str, hidden: dict[str, int] | None) -> LinkSet:
    cfg = _inner_config(path, task)
    if cfg["adapter_type"] != INNER_LINK_TYPE:
        raise ValueError(f"{file}: adapter_type {cfg['adapter_type']!r} is not supported; expected {INNER_LINK_TYPE}")
    sd = _torch_load(file, path)
    d = inner_dim({k: tuple(v.shape) for k, v in sd.items()}, str(file))
    if "hidden_size" in cfg:
        check_dims(f"{file} (hidden_size in its config)", (d,), (int(cfg["hidden_size"]),))
    model_cfg = path / "config.json"  # release inner dirs ship the full base model next to the adapter
    if model_cfg.exists():
        text = read_json(contained(path, "config.json", what=str(path)))
        model_d = (text.get("text_config") or {}).get("hidden_size", text.get("hidden_size"))
        if model_d is not None:
            check_dims(f"{file} vs {model_cfg}", (d,), (int(model_d),))
    if hidden and role in hidden:
        check_dims(f"{file} (role {role})", (d,), (hidden[role],))
    link = inner_link_from_state_dict(sd, what=str(file))
    manifest = {"source": "release", "files": {str(file): _sha256(file, path)}}
    if model_cfg.exists():
        manifest["roles"] = {role: {"base_model": str(path)}}
    return LinkSet(inner={role: link}, manifest=manifest)


def _load_release_outer(path: Path, style: StyleSpec | None, task: str, hidden: dict[str, int] | None) -> LinkSet:
    entries = []
    cfg_file = path / "outerlink_config.json"
    if cfg_file.exists():
        cfg = read_json(contained(path, cfg_file.name, what=str(path)))
        for a in task_entry(cfg, task, cfg_file).get("adapters", []):
            if a.get("adapter_type", OUTER_LINK_TYPE) != OUTER_LINK_TYPE:
                raise ValueError(f"{cfg_file}: adapter_type {a['adapter_type']!r} is not supported")
            entries.append((a["legacy_key"], contained(path, a["filename"], what=str(cfg_file)),
                            (a.get("in_dim"), a.get("out_dim"))))
    else:
        entries = [(f.stem, contained(path, f.name, what=str(path)), (None, None))
                   for f in sorted(path.glob("outer_*.pt"))]
    links = LinkSet(manifest={"source": "release", "files": {}})
    for key, file, declared in entries:
        if key not in LEGACY_EDGE_KEYS:
            raise ValueError(f"{file}: unknown reference key {key!r}; expected one of {sorted(LEGACY_EDGE_KEYS)}")
        edge = LEGACY_EDGE_KEYS[key]
        if style is not None and edge not in style.edges:
            continue
        sd = _torch_load(file, path)
        dims = outer_dims({k: tuple(v.shape) for k, v in sd.items()}, str(file))
        if None not in declared:
            check_dims(f"{file} (in_dim/out_dim in {cfg_file.name})", dims, tuple(int(x) for x in declared))
        src, dst = edge.split("->")
        if hidden and src in hidden and dst in hidden:
            check_dims(f"{file} ({edge})", dims, (hidden[src], hidden[dst]))
        links.outer[edge] = outer_link_from_state_dict(sd, what=str(file))
        links.manifest["files"][str(file)] = _sha256(file, path)
    if not links.outer:
        raise ValueError(f"{path}: no outer links for style {style.name if style else '?'} found")
    return links
