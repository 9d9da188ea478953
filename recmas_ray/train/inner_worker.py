"""The Ray Train worker of inner-loop training and its checkpoints (the numerics are in `inner.py`).

    worker      step s -> rows of this step = f(seed, s) (train/core.py) -> this rank's rows -> train_step
    checkpoint  inner link (links.safetensors + manifest.json, our format) + optim-<role>.pt + train_state.json,
                sealed by COMPLETE; never the base model. Local mode (num_workers 0) persists it where Ray
                Train would, so --resume finds it either way.

Data order and every random choice are functions of (seed, step), so a run resumed from a checkpoint
ends with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import ray
import ray.train
import torch
from ray.experimental.tqdm_ray import tqdm as ray_tqdm

from recmas_ray.console import current
from recmas_ray.engine.agent import Agent
from recmas_ray.train.config import InnerTrainConfig
from recmas_ray.engine.links import InnerLink, inner_link_from_state_dict
from recmas_ray.models import loader
from recmas_ray.models.loader import resolve_dtype
from recmas_ray.styles import get_style
from recmas_ray.system.checkpoints import LinkSet, load_links, save_links
from recmas_ray.train import core
from recmas_ray.train.inner import make_optimizer, train_step
from recmas_ray.train.progress import post_step


def write_checkpoint(path: Path, *, link: InnerLink, opt, sched, step: int, cfg: InnerTrainConfig, role: str,
                     base_model: str, loss_log: list, world_size: int = 1) -> Path:
    """Inner link + manifest (our format) + optimizer/scheduler + train state, sealed last."""
    manifest = {"kind": "inner", "style": cfg.system.style, "role": role, "base_model": base_model,
                "roles": {role: {"base_model": base_model, "hidden_size": link.hidden_size}},
                "step": step, "max_steps": cfg.max_steps, "task": cfg.task, "seed": cfg.system.seed,
                "world_size": world_size, "loss": loss_log[-1][1] if loss_log else None, "loss_log": loss_log,
                "train_config": asdict(cfg)}
    save_links(path, LinkSet(inner={role: link}), manifest)
    core.save_optim(path, role, opt, sched)
    core.write_state(path, {"step": step, "loss_log": loss_log, "role": role, "base_model": base_model})
    return core.seal(path)


def load_checkpoint(path: Path, *, link: InnerLink, opt, sched, role: str, base_model: str) -> tuple[int, list]:
    """Restore link, optimizer and scheduler in place; returns (step, loss_log)."""
    links = load_links(path)
    base = links.manifest.get("base_model")
    if role not in links.inner or base != base_model:
        raise ValueError(f"checkpoint {path} holds roles {sorted(links.inner)} on {base!r}; cannot resume "
                         f"role {role} on {base_model!r}")
    dtype = next(link.parameters()).dtype
    link.load_state_dict({k: v.to(dtype) for k, v in links.inner[role].state_dict().items()})
    core.load_optim(path, role, opt, sched)
    state = core.read_state(path)
    return int(state["step"]), [list(x) for x in state["loss_log"]]


def _progress_bar(cfg: InnerTrainConfig, role: str, start: int, board):
    """The rank-0 bar: none when the driver's StepBoard draws the steps (`board`, its queue) or progress is
    off; Ray's driver-rendered tqdm in a Ray worker; else the console's own bar (local mode, in the driver)."""
    if not cfg.progress or board is not None:
        return None
    if ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE:
        bar = ray_tqdm(total=cfg.max_steps, desc=f"inner {role}")
        bar.update(start)
        return bar

    return current().bar(cfg.max_steps, f"inner {role}", unit="step", initial=start)


def train_loop_per_worker(config: dict) -> dict:
    """Ray Train entry point; runs on every worker (or in-process in local mode).

    config: {"cfg": asdict(InnerTrainConfig) of one role, "role", "base_model", "link": the initial inner link's
    state dict, "examples": [(user prompt, target)], "storage": (storage_path, run name),
    "resume_from": a Ray Train Checkpoint or None, "progress": the driver's StepBoard queue or None,
    "_faults": test hooks}. Returns {"loss_log": ...}.
    """
    cfg = core.config_from_dict(InnerTrainConfig, config["cfg"])
    role, base_model, examples = config["role"], config["base_model"], config["examples"]
    storage, local_mode, faults = core.RunStorage(*config["storage"]), cfg.num_workers == 0, core.Faults.of(config)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    if cfg.use_gpu:
        device = torch.device("cuda", ctx.get_local_rank()) if local_mode else ray.train.torch.get_device()
    else:
        device = torch.device("cpu")
    model, tokenizer = loader.load_frozen_model(base_model, dtype=resolve_dtype(cfg.system.dtype, device),
                                                device=device)
    link = inner_link_from_state_dict(config["link"], what=f"inner link of {role}")
    style = get_style(cfg.system.style)
    agent = Agent(model, tokenizer, link, role=role, model_name=base_model, system_prompt=style.system_prompt)
    if cfg.adapter_dtype == "float32":
        agent.inner_link.float()
    opt, sched = make_optimizer(agent.inner_link, cfg)

    start, loss_log = 0, []
    with core.restored_dir(config.get("resume_from")) as d:
        if d is not None:
            start, loss_log = load_checkpoint(d, link=agent.inner_link, opt=opt, sched=sched, role=role,
                                              base_model=base_model)
        restored = d is not None
    end = min(cfg.max_steps, cfg.stop_at_step) if cfg.stop_at_step else cfg.max_steps
    board = config.get("progress")  # the driver's StepBoard queue, or None
    bar = _progress_bar(cfg, role, start, board) if rank == 0 else None
    window, t0, saved = [], time.perf_counter(), None
    rows_per_rank = cfg.batch_size * cfg.grad_accum_steps

    def report(step: int, metrics: dict, with_ckpt: bool) -> None:
        if not with_ckpt:
            ray.train.report(metrics)
            return
        with tempfile.TemporaryDirectory() as tmp:
            if rank == 0:
                write_checkpoint(Path(tmp), link=agent.inner_link, opt=opt, sched=sched, step=step, cfg=cfg,
                                 role=role, base_model=base_model, loss_log=loss_log, world_size=world)
            core.report_checkpoint(Path(tmp), metrics, step=step, storage=storage, local_mode=local_mode,
                                   num_to_keep=cfg.num_to_keep, with_files=rank == 0)

    metrics = {"step": start, "role": role, "world_size": world}
    for step in range(start, end):
        idx = core.step_indices(len(examples), step, rows_per_rank * world, cfg.system.seed)
        # accumulation chunk a of rank r: rows (a * world + r) * batch_size ... (one layout for any world size)
        mine = [i for a in range(cfg.grad_accum_steps)
                for i in idx[(a * world + rank) * cfg.batch_size:(a * world + rank + 1) * cfg.batch_size]]
        lr = opt.param_groups[0]["lr"]
        window.append(train_step(agent, opt, sched, [examples[i] for i in mine], cfg,
                                 literal_slots=not style.teacher_text_in_slots))
        done = step + 1
        faults.maybe_fail(done, restored)
        if bar is not None:
            bar.update(1)
        if rank == 0:
            post_step(board, f"inner {role}", done, cfg.max_steps)
        log_now = done % cfg.log_every == 0 or done == end
        save_now = (cfg.save_every and done % cfg.save_every == 0) or done == end
        if log_now:
            mean = sum(window) / len(window)
            loss_log.append([done, mean])
            metrics = {"step": done, "loss": mean, "lr": lr, "role": role, "world_size": world,
                       "samples_per_s": len(window) * rows_per_rank * world / (time.perf_counter() - t0)}
            if rank == 0:
                msg = (f"[inner {role}] step {done}/{cfg.max_steps} loss {mean:.4f} lr {lr:.2e} "
                       f"samples/s {metrics['samples_per_s']:.1f}")
                if hasattr(bar, "write"):
                    bar.write(msg)  # above a plain tqdm bar
                else:
                    print(msg, flush=True)
            window, t0 = [], time.perf_counter()
        if log_now or save_now:
            report(done, metrics, bool(save_now))
            saved = done if save_now else saved
    if saved is None:  # nothing ran (resumed at or past the end): report the restored state as the result
        report(start, metrics, True)
    if bar is not None:
        bar.close()
    return {"loss_log": loss_log}
