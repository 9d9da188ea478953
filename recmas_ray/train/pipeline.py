"""Pipeline-parallel outer-loop training on Ray Train: one worker per role, latents and their gradients by p2p.

    driver      validate the config, plan the system (inner checkpoints checked against base models before
                any compute), load + validate rows, one TorchTrainer with a worker per role
    worker r    role = style.roles[r]; loads only its base model, its frozen inner link and the outer links
                of its outgoing edges (fp32 masters + AdamW; the agent runs a copy in the model dtype)
    one step    forward sweep   for round r, microbatch m, schedule step s of round r owned by this role:
                                  recv each input (lengths header first, then the data) -> stage -> isend outputs
                                  tape[m, s] = inputs (+ graph, unless --recompute)
                backward sweep  the same order reversed: recv output grads -> ONE backward over all outputs
                                  (+ loss): fan-out grads meet at inner(H) -> isend input grads to producers
                all-reduce      loss per round + NaN flags per sample, then squared grad norm -> global clip,
                                  AdamW on the fp32 masters, cosine LR, copy masters into the working links
    checkpoint  every worker adds its outer links + optimizer state to one Ray Train checkpoint directory

Both sweeps walk one global order known to every worker; receives block and sends do not, so each
receive waits only on a send that comes earlier in that order: no deadlock for any DAG of edges, and
microbatches overlap across workers as in GPipe (stage i works on m + 1 while stage i + 1 has m).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from recmas_ray.agent import Agent
from recmas_ray.links import inner_link_from_state_dict, outer_link_from_state_dict
from recmas_ray.styles import StyleSpec
from recmas_ray.train.outer import (TRAIN_STATE, OuterTrainConfig, Sample, export_checkpoint, latest_checkpoint,
                                    step_indices, validate_config)
from recmas_ray.train.stage import PipelineStage

NAN_STOP = "nan_stop.json"


# ----------------------------------------------------------------------------- Ray Train worker
def _build_stage(cfg: OuterTrainConfig, style: StyleSpec, role: str, system: dict, link_state, device, group=None):
    """Load this role's base model and links only, and wrap them in a PipelineStage."""
    from recmas_ray.models.loader import load_frozen_model, resolve_dtype

    name = system["role_models"][role]
    model, tokenizer = load_frozen_model(name, dtype=resolve_dtype(cfg.dtype, device), device=device)
    inner_sd, outer_sds = link_state
    agent = Agent(model, tokenizer, inner_link_from_state_dict(inner_sd, what=f"inner link of {role}"), role=role,
                  model_name=name, system_prompt=style.system_prompt)
    masters = {e: outer_link_from_state_dict(sd, what=f"outer link {e}") for e, sd in outer_sds.items()}
    return PipelineStage(cfg, style, agent, masters, role_ranks={r: i for i, r in enumerate(style.roles)}, group=group)


def _maybe_die(cfg: OuterTrainConfig, rank: int, step: int, run_dir: Path) -> None:
    # Fault-injection hook for the recovery test: die once, mid-step, leaving a marker so a restart survives.
    marker = run_dir / f".killed-rank{rank}-step{step}"
    if rank == cfg.fault_kill_rank and step == cfg.fault_kill_step and not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        os._exit(1)


def train_loop_per_worker(config: dict) -> None:
    """Ray Train entry. config = {"cfg", "system", "links": {role: ObjectRef}, "samples", "run_dir", "resume_from"}."""
    import ray
    import ray.train
    from ray.train import Checkpoint

    cfg = OuterTrainConfig(**config["cfg"])
    style = validate_config(cfg)
    rank = ray.train.get_context().get_world_rank()
    role = style.roles[rank]
    device = ray.train.torch.get_device() if cfg.use_gpu else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL object collectives use the current device
    stage = _build_stage(cfg, style, role, config["system"], ray.get(config["links"][role]), device)
    samples = [Sample(**s) for s in config["samples"]]
    run_dir = Path(config["run_dir"])
    digest0 = stage.frozen_digest() if cfg.verify_frozen else None

    start, log = 0, []
    ckpt = ray.train.get_checkpoint()  # set after a worker-group restart, or by --resume through Ray's snapshot
    if ckpt is not None:
        with ckpt.as_directory() as d:
            start, log = stage.load_shard(Path(d)), json.loads((Path(d) / TRAIN_STATE).read_text())["log"]
    elif config.get("resume_from"):
        d = Path(config["resume_from"])
        start, log = stage.load_shard(d), json.loads((d / TRAIN_STATE).read_text())["log"]
    end = min(cfg.max_steps, cfg.stop_at_step) if cfg.stop_at_step else cfg.max_steps

    def report(step: int, metrics: dict) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            stage.save_shard(Path(tmp), step)
            if rank == 0:
                state = {"step": step, "log": log, "style": style.name, "roles": config["system"]["manifest"]["roles"]}
                (Path(tmp) / TRAIN_STATE).write_text(json.dumps(state))
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(tmp),
                             checkpoint_dir_name=f"checkpoint_{step:06d}")

    metrics, t0 = {"step": start}, time.perf_counter()
    for step in range(start, end):
        done = step + 1
        batch = [samples[j] for j in step_indices(len(samples), step, cfg.batch_size, cfg.seed)]
        t_step = time.perf_counter()
        stats = stage.accumulate(batch, inject_nan=done == cfg.fault_nan_step,
                                 mid_step_hook=lambda: _maybe_die(cfg, rank, done, run_dir))
        if not stats.nan_samples:
            stats = stage.update(stats)  # steps only when the global grad norm is finite
        if stats.nan_samples or not math.isfinite(stats.grad_norm):
            # stop without stepping (every rank decides alike from all-reduced values); the last reported
            # checkpoint stays the latest and the driver raises NaNLossError
            if rank == 0:
                bad = stats.nan_samples or list(range(len(batch)))
                (run_dir / NAN_STOP).write_text(json.dumps({
                    "step": done, "sample_ids": [batch[j].sample_id for j in bad], "round_losses": stats.round_losses,
                    "what": "loss" if stats.nan_samples else "gradient norm"}))
            return
        dt = time.perf_counter() - t_step
        log.append({"step": done, "loss": stats.round_losses[-1], "round_losses": stats.round_losses,
                    "grad_norm": stats.grad_norm, "lr": stats.lr, "step_s": dt})
        if rank == 0 and (done % cfg.log_every == 0 or done == end):
            rounds = " ".join(f"{x:.4f}" for x in stats.round_losses)
            print(f"[outer {style.name}] step {done}/{cfg.max_steps} loss {stats.round_losses[-1]:.4f} "
                  f"(rounds {rounds}) grad_norm {stats.grad_norm:.3f} lr {stats.lr:.2e} step {dt:.2f}s", flush=True)
        if (cfg.save_every and done % cfg.save_every == 0) or done == end:
            metrics = {"step": done, "loss": stats.round_losses[-1], "grad_norm": stats.grad_norm,
                       "elapsed_s": time.perf_counter() - t0}
            if done == end:
                metrics["workers"] = _gather_worker_stats(stage, digest0)
            report(done, metrics)
    if start >= end:  # resumed at or past the end: report once so the run has a result
        report(start, {"step": start, "workers": _gather_worker_stats(stage, digest0)})


def _gather_worker_stats(stage: PipelineStage, digest0: str | None) -> dict:
    mine = {"frozen_unchanged": stage.frozen_digest() == digest0 if digest0 else None, **stage.memory_stats()}
    everyone = [None] * dist.get_world_size(stage.group)
    dist.all_gather_object(everyone, (stage.role, mine), group=stage.group)
    return dict(everyone)


# ----------------------------------------------------------------------------- driver
class NaNLossError(RuntimeError):
    """The loss became NaN/Inf; the run stopped before stepping and the last good checkpoint is kept."""


@dataclass
class OuterRunResult:
    """What `train_outer` returns."""

    save_dir: Path
    """Final outer links in our format (links.safetensors + manifest.json)."""
    checkpoint_dir: Path
    """The Ray Train checkpoint they were exported from."""
    metrics: dict
    """Rank 0's last reported metrics (per-worker memory and frozen-weight checks under "workers")."""
    log: list
    """Per-step log: loss, round losses, grad norm, lr, step seconds."""


def run_dir_of(cfg: OuterTrainConfig, style: StyleSpec) -> tuple[Path, str]:
    """(storage path, run name) of the Ray Train run; the name is tied to save_dir so runs sharing a
    storage path never collide and `--resume` with the same save_dir finds its run."""
    storage = Path(cfg.storage_path or Path(cfg.save_dir) / "_ray_runs").resolve()
    tag = hashlib.sha1(str(Path(cfg.save_dir).resolve()).encode()).hexdigest()[:8]
    return storage, f"outer-{style.name}-{tag}"


def train_outer(cfg: OuterTrainConfig) -> OuterRunResult:
    """Run outer-loop training as one pipeline-parallel Ray Train job; returns the exported result."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from recmas_ray.system.plan import plan_system
    from recmas_ray.train.data import load_rows
    from recmas_ray.train.outer import prepare_samples

    style = validate_config(cfg)
    plan = plan_system(cfg.style, preset=cfg.preset, ckpt_overrides=cfg.ckpt_overrides, seed=cfg.seed,
                       task=cfg.task)  # raises on link/base-model mismatches, naming the role, before compute
    samples = prepare_samples(load_rows(cfg.dataset_name, cfg.dataset_json_field), style, cfg.task)
    if len(samples) < cfg.batch_size:
        raise ValueError(f"{len(samples)} rows cannot fill one batch of --batch_size {cfg.batch_size}")
    manifest = {**plan.manifest(), "train_config": asdict(cfg)}
    storage, name = run_dir_of(cfg, style)
    run_dir = storage / name
    resume_from = latest_checkpoint(run_dir) if cfg.resume else None
    if resume_from is not None:
        _check_resume(resume_from, manifest)
    if not cfg.resume and run_dir.exists():
        shutil.rmtree(run_dir)  # else Ray Train would silently restore the old run of the same name
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / NAN_STOP).unlink(missing_ok=True)
    local = not ray.is_initialized()
    if local:
        ray.init()  # joins a running cluster (RAY_ADDRESS / ray start) or starts a local one
    resources = _worker_resources(cfg, len(style.roles), local)
    links = {r: ray.put(plan.service_args(r)[1:]) for r in style.roles}
    system = {"role_models": plan.role_models, "hidden_sizes": plan.hidden_sizes, "manifest": manifest}
    repo = str(Path(__file__).resolve().parents[2])
    pythonpath = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"cfg": asdict(cfg), "system": system, "links": links, "run_dir": str(run_dir),
                           "samples": [asdict(s) for s in samples],
                           "resume_from": str(resume_from) if resume_from else None},
        scaling_config=ScalingConfig(num_workers=len(style.roles), use_gpu=cfg.use_gpu,
                                     resources_per_worker=resources),
        torch_config=TorchConfig(backend="nccl" if cfg.use_gpu else "gloo"),
        run_config=RunConfig(name=name, storage_path=str(storage),
                             failure_config=FailureConfig(max_failures=cfg.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=cfg.num_to_keep),
                             worker_runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}),
    )
    result = trainer.fit()
    if (run_dir / NAN_STOP).exists():
        info = json.loads((run_dir / NAN_STOP).read_text())
        last = latest_checkpoint(run_dir)
        raise NaNLossError(f"non-finite {info['what']} at step {info['step']} for sample ids {info['sample_ids']} "
                           f"(round losses {info['round_losses']}); stopped without stepping, last good "
                           f"checkpoint: {last if last else 'none'}")
    if result.checkpoint is None:
        raise RuntimeError(f"outer training finished without a checkpoint (run {run_dir})")
    with result.checkpoint.as_directory() as d:
        save_dir = export_checkpoint(Path(d), Path(cfg.save_dir), manifest)
        log = json.loads((Path(d) / TRAIN_STATE).read_text())["log"]
        ckpt_dir = Path(result.checkpoint.path)
    return OuterRunResult(save_dir, ckpt_dir, result.metrics or {}, log)


def _check_resume(ckpt: Path, manifest: dict) -> None:
    # A checkpoint of another system (other base models) must not be resumed silently.
    saved = json.loads((ckpt / TRAIN_STATE).read_text()).get("roles", {})
    for role, info in manifest["roles"].items():
        old = saved.get(role, {})
        if old and (old.get("base_model"), old.get("hidden_size")) != (info["base_model"], info["hidden_size"]):
            raise ValueError(f"--resume: role {role} ran on {old.get('base_model')} (hidden {old.get('hidden_size')}) "
                             f"in {ckpt}, but now on {info['base_model']} (hidden {info['hidden_size']})")


def _worker_resources(cfg: OuterTrainConfig, num_roles: int, local: bool) -> dict:
    # One worker per role must fit at once. CPU asks only steer placement: shrink them to fit the cluster
    # (2-core laptops, CI). Missing GPUs fail early on a local cluster; a real one may still autoscale.
    import ray

    have = ray.cluster_resources()
    cpus = cfg.cpus_per_worker
    if num_roles * cpus > have.get("CPU", 0) > 0:
        cpus = have["CPU"] / num_roles
        print(f"[outer] {num_roles} role workers x {cfg.cpus_per_worker} CPU exceed the cluster's {have['CPU']:g} "
              f"CPUs; asking {cpus:g} per worker", flush=True)
    if cfg.use_gpu and num_roles * cfg.gpus_per_worker > have.get("GPU", 0):
        msg = (f"--use_gpu needs {num_roles} role workers x {cfg.gpus_per_worker} GPU, the cluster has "
               f"{have.get('GPU', 0):g}")
        if local:
            raise ValueError(msg + " (NCCL point-to-point needs one GPU per worker)")
        print(f"[outer] {msg}; waiting for the autoscaler", flush=True)
    return {"CPU": cpus, **({"GPU": cfg.gpus_per_worker} if cfg.use_gpu else {})}
