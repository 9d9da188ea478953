"""Inner-loop checkpoints: the inner link in our format plus optimizer, scheduler and step state.

A checkpoint never holds a copy of the base model. Local mode (no Ray workers) writes its
checkpoints where Ray Train would, so `--resume` finds them either way.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from recmas_ray.system.checkpoints import MANIFEST, WEIGHTS, LinkSet, load_links, save_links
from recmas_ray.links import InnerLink

if TYPE_CHECKING:
    from recmas_ray.train.inner import InnerTrainConfig

TRAIN_STATE = "train_state.pt"


def write_checkpoint(path: Path, *, link: InnerLink, opt, sched, step: int, cfg: InnerTrainConfig, role: str,
                     style_name: str, loss_log: list, world_size: int = 1) -> Path:
    """Inner link + manifest (our format) + optimizer/scheduler/step state; never the base model."""
    manifest = {"kind": "inner", "style": style_name, "role": role, "base_model": cfg.model_name_or_path,
                "roles": {role: {"base_model": cfg.model_name_or_path, "hidden_size": link.hidden_size}},
                "step": step, "max_steps": cfg.max_steps, "task": cfg.mas_task, "seed": cfg.seed,
                "world_size": world_size, "loss": loss_log[-1][1] if loss_log else None, "loss_log": loss_log,
                "train_config": asdict(cfg)}
    save_links(path, LinkSet(inner={role: link}), manifest)
    torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "step": step,
                "loss_log": loss_log}, path / TRAIN_STATE)
    return path


def load_checkpoint(path: Path, *, link: InnerLink, opt, sched, cfg: InnerTrainConfig, role: str) -> tuple[int, list]:
    """Restore link, optimizer and scheduler in place; returns (step, loss_log)."""
    links = load_links(path)
    base = links.manifest.get("base_model")
    if role not in links.inner or base != cfg.model_name_or_path:
        raise ValueError(f"checkpoint {path} holds roles {sorted(links.inner)} on {base!r}; cannot resume "
                         f"role {role} on {cfg.model_name_or_path!r}")
    dtype = next(link.parameters()).dtype
    link.load_state_dict({k: v.to(dtype) for k, v in links.inner[role].state_dict().items()})
    state = torch.load(path / TRAIN_STATE, map_location="cpu", weights_only=True)
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    return int(state["step"]), [list(x) for x in state["loss_log"]]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The complete checkpoint with the highest step in a run directory, or None."""
    done = [p for p in Path(run_dir).glob("checkpoint_[0-9]*")
            if (p / TRAIN_STATE).exists() and (p / WEIGHTS).exists() and (p / MANIFEST).exists()]
    return max(done, key=lambda p: (p.name, p.stat().st_mtime)) if done else None


def _persist_local(run_dir: Path, step: int, write, num_to_keep: int) -> Path:
    # Local mode has no Ray storage: write the checkpoint where Ray would, atomically, and prune.
    run_dir.mkdir(parents=True, exist_ok=True)
    final = run_dir / f"checkpoint_{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=run_dir))
    write(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in sorted(run_dir.glob("checkpoint_[0-9]*"))[:-max(num_to_keep, 1)]:
        shutil.rmtree(old, ignore_errors=True)
    return final
