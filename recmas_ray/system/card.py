"""Publishing trained links: a system folder staged as a Hub repo with a model card.

A *system folder* is what `System.build(links=DIR)` reads: one sub-folder per role with trained inner links
(`planner/`, `critic/`, ...) and `outer/` with the outer links, each in our checkpoint format
(`links.safetensors` + `manifest.json` + `config.json`). `stage_system_folder` copies only those files (and a
held-out curve where training wrote one) into a fresh folder and writes `README.md`, a model card built from the
manifests: style, base model and hidden size per role, link types, training settings and the held-out metrics.
The staged folder is laid out exactly as `links=ORG/NAME` expects after upload (`system/hub.py` reads it back).

Local file-system paths in training configs (save_dir, storage_path, ckpt_override, ...) are left out of the
card: they name the trainer's machine, not the model. Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

from recmas_ray.models.registry import model_kind
from recmas_ray.system.checkpoints import MANIFEST, WEIGHTS

SHIPPED_FILES = (WEIGHTS, MANIFEST, "config.json", "provenance.json", "eval_curve.jsonl", "eval_curve.png",
                 "loss_curve.png")
"""Files of a link folder that are published (anything else, e.g. `_ray_runs/`, optimizer state, stays home)."""

MAX_MANIFEST_BYTES = 4 * 2**20
"""A manifest is a few KiB; a larger file is not one of ours."""

_SHOWN_SETTINGS = ("task", "trainer", "outer_init", "tau", "lr", "lr_scheduler_type", "warmup_steps", "max_steps", "batch_size", "num_recursive_rounds",
                   "max_latent_tokens", "latent_steps", "weight_decay", "max_grad_norm", "seed", "dtype")
"""Training settings shown on the card (a whitelist: paths of the trainer's machine never appear)."""


def read_system_folder(folder: str | Path) -> dict[str, dict]:
    """{sub-folder name: its manifest} of every link folder in `folder`; ValueError naming what is wrong.

    The folder is untrusted input: sub-folders and files must be regular (no symlinks, FIFOs or devices),
    manifests must be JSON objects of our format with a known `kind`.
    """
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"folder {str(folder)!r}: not a directory (expected a system folder with one "
                         f"sub-folder per role and outer/, as written by training)")
    found: dict[str, dict] = {}
    for sub in sorted(root.iterdir()):
        if sub.name.startswith(("_", ".")) or sub.is_symlink() or not sub.is_dir():
            continue
        manifest = sub / MANIFEST
        if not manifest.exists():
            continue
        _check_regular(manifest)
        _check_regular(sub / WEIGHTS)
        try:
            data = json.loads(manifest.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{manifest}: not a JSON manifest ({str(e).splitlines()[0]})") from None
        if not isinstance(data, dict) or data.get("kind") not in ("inner", "outer"):
            raise ValueError(f"{manifest}: not a recmas_ray link manifest (needs \"kind\": \"inner\" or \"outer\")")
        if not isinstance(data.get("roles", {}), dict):
            raise ValueError(f"{manifest}: \"roles\" must be an object of role -> {{base_model, hidden_size}}")
        found[sub.name] = data
    if not found:
        raise ValueError(f"folder {str(folder)!r}: no link folder in it (expected sub-folders such as planner/ "
                         f"and outer/, each with {WEIGHTS} and {MANIFEST})")
    return found


def _check_regular(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise ValueError(f"{path}: missing (each link folder needs {WEIGHTS} and {MANIFEST})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path}: not a regular file (symlinks, FIFOs and devices are refused)")
    if path.name == MANIFEST and st.st_size > MAX_MANIFEST_BYTES:
        raise ValueError(f"{path}: {st.st_size} bytes, more than a manifest can be ({MAX_MANIFEST_BYTES})")


def _roles(manifests: dict[str, dict]) -> dict[str, dict]:
    roles: dict[str, dict] = {}
    for data in manifests.values():
        for role, info in (data.get("roles") or {}).items():
            if isinstance(info, dict):
                roles.setdefault(str(role), {}).update({k: info[k] for k in ("base_model", "hidden_size") if k in info})
    return roles


def _final_metrics(folder: Path, name: str, data: dict) -> dict:
    """Last training loss and, where training measured one, the last held-out loss."""
    out = {}
    log = data.get("log") or data.get("loss_log") or []
    last = log[-1] if log else None
    if isinstance(last, dict) and isinstance(last.get("loss"), (int, float)):
        out["train loss"] = last["loss"]
    elif isinstance(last, (list, tuple)) and len(last) == 2 and isinstance(last[1], (int, float)):
        out["train loss"] = last[1]
    elif isinstance(data.get("loss"), (int, float)):
        out["train loss"] = data["loss"]
    curve = folder / name / "eval_curve.jsonl"
    if curve.is_file() and not curve.is_symlink():
        lines = [ln for ln in curve.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        try:
            row = json.loads(lines[-1]) if lines else {}
        except json.JSONDecodeError:
            row = {}
        if isinstance(row, dict) and isinstance(row.get("eval_loss"), (int, float)):
            out["held-out loss"] = row["eval_loss"]
    if isinstance(data.get("step"), int):
        out["steps"] = data["step"]
    return out


def model_card(manifests: dict[str, dict], repo_id: str, *, folder: str | Path) -> str:
    """README.md of the published repo: front matter for the Hub, then what the links are and how to load them."""
    roles = _roles(manifests)
    styles = sorted({str(m.get("style")) for m in manifests.values() if m.get("style")})
    # the outer links were trained for the whole system's style (inner ones record their design only)
    system_style = next((str(m["style"]) for m in manifests.values() if m.get("kind") == "outer" and m.get("style")),
                        styles[0] if styles else "STYLE")
    bases = sorted({str(r["base_model"]) for r in roles.values() if r.get("base_model")})
    hub_bases = [b for b in bases if "/" in b and model_kind(b).hub_id]
    lines = ["---", "library_name: recmas_ray", "tags:", "- recursivemas", "- multi-agent", "- latent-communication"]
    if hub_bases:
        lines += ["base_model:"] + [f"- {b}" for b in hub_bases]
    lines += ["---", "", f"# {repo_id}", "",
              f"Trained RecursiveMAS links for the `{system_style}` system: the small inner and "
              "outer links only (no base-model weights). The base models stay frozen and are loaded from their own "
              "repositories.", "", "## Roles", "", "| role | base model | hidden size |", "|---|---|---|"]
    lines += [f"| {r} | `{info.get('base_model', '?')}` | {info.get('hidden_size', '?')} |"
              for r, info in sorted(roles.items())]
    lines += ["", "## Link folders", "", "| folder | kind | links | link type | metrics |", "|---|---|---|---|---|"]
    for name, data in manifests.items():
        kind = data.get("kind")
        links = sorted((data.get("inner") or {}) if kind == "inner" else (data.get("outer") or {}))
        entries = (data.get("inner") if kind == "inner" else data.get("outer")) or {}
        kinds = sorted({str(e.get("kind")) for e in entries.values() if isinstance(e, dict) and e.get("kind")})
        link_type = ", ".join(kinds) or data.get("inner_link_type" if kind == "inner" else "outer_link_type", "?")
        metrics = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in _final_metrics(Path(folder), name, data).items())
        lines.append(f"| `{name}/` | {kind} | {', '.join(links) or '-'} | {link_type} | {metrics or '-'} |")
    lines += ["", "## Training settings", ""]
    for name, data in manifests.items():
        cfg = data.get("train_config") if isinstance(data.get("train_config"), dict) else {}
        shown = {k: cfg[k] for k in _SHOWN_SETTINGS if k in cfg}
        lines.append(f"- `{name}/`: " + (", ".join(f"{k}={v}" for k, v in shown.items()) or "not recorded"))
    lines += ["", "## Use", "", "```python", "from recmas_ray import System", "",
              f"system = System.build({system_style!r}, links={repo_id!r},",
              f"                      role_models={ {r: info.get('base_model') for r, info in sorted(roles.items())} !r})",
              "print(system.generate(\"What is 17 - 8?\")[0][0].prediction)", "```", "",
              "or from the command line, each folder by its Hub id:", "", "```bash",
              f"python -m jobs.run --style {system_style} --dataset QUESTIONS.jsonl "
              "--ckpt_override " + " ".join(f"{n}={repo_id}:{n}" for n in manifests), "```", ""]
    return "\n".join(lines)


def stage_system_folder(folder: str | Path, staging: str | Path, repo_id: str) -> Path:
    """Copy the publishable files of every link folder into `staging` (created empty) and write README.md."""
    manifests = read_system_folder(folder)
    out = Path(staging)
    out.mkdir(parents=True, exist_ok=False)
    for name in manifests:
        (out / name).mkdir()
        for file in SHIPPED_FILES:
            src = Path(folder) / name / file
            if src.is_file() and not src.is_symlink():
                shutil.copyfile(src, out / name / file)
    (out / "README.md").write_text(model_card(manifests, repo_id, folder=folder), encoding="utf-8")
    return out
