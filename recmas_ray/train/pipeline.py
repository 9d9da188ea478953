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
                                  AdamW on the fp32 masters, LR schedule, copy masters into the working links
    checkpoint  every worker adds its outer links + optimizer state to one Ray Train checkpoint directory;
                rank 0 adds train_state.json and the COMPLETE marker listing every worker's files (core.py)
    evaluation  --eval_every K: the forward sweep alone, no grad, over the held-out rows -> eval_curve.*

Both sweeps walk one global order known to every worker; receives block and sends do not, so each
receive waits only on a send that comes earlier in that order: no deadlock for any DAG of edges, and
microbatches overlap across workers as in GPipe (stage i works on m + 1 while stage i + 1 has m).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import ray
import ray.train
import torch
import torch.distributed as dist

from recmas_ray.config.checks import check_tree
from recmas_ray.config.tree import save_config
from recmas_ray.engine.agent import Agent
from recmas_ray.train.config import OuterTrainConfig
from recmas_ray.console import current
from recmas_ray.distributed import cluster
from recmas_ray.engine.links import inner_link_from_state_dict, outer_link_from_state_dict
from recmas_ray.models import loader
from recmas_ray.models.loader import resolve_dtype
from recmas_ray.styles import StyleSpec, get_style
from recmas_ray.system.checkpoints import OUTER_INIT_DIR, LinkSet, save_links
from recmas_ray.system.plan import plan_system
from recmas_ray.system.provenance import write_provenance
from recmas_ray.train import core, history
from recmas_ray.train import hop_by_hop_job
from recmas_ray.train.bridge import bridge_outer_links, state_bridge_outer_links
from recmas_ray.train.data import load_rows
from recmas_ray.train.outer import (OuterRunResult, Sample, export_checkpoint, prepare_samples,  # noqa: F401
                                    round_loss_weight)  # (OuterRunResult, Sample, export_checkpoint: re-exported)
from recmas_ray.train.progress import post_step, StepBoard
from recmas_ray.train.stage import PipelineStage

NAN_STOP = "nan_stop.json"
EVAL_CURVE = "eval_curve.jsonl"


# ----------------------------------------------------------------------------- Ray Train worker
def _build_stage(cfg: OuterTrainConfig, style: StyleSpec, role: str, system: dict, link_state, device, group=None):
    """Load this role's base model and links only, and wrap them in a PipelineStage."""
    name = system["role_models"][role]
    model, tokenizer = loader.load_frozen_model(name, dtype=resolve_dtype(cfg.system.dtype, device), device=device)
    inner_sd, outer_sds = link_state
    agent = Agent(model, tokenizer, inner_link_from_state_dict(inner_sd, what=f"inner link of {role}"), role=role,
                  model_name=name, system_prompt=style.system_prompt)
    masters = {e: outer_link_from_state_dict(sd, what=f"outer link {e}") for e, sd in outer_sds.items()}
    if cfg.latent_norm != "none":  # non-reference option: the receiving agent rescales what is spliced in
        agent.set_latent_norm(cfg.latent_norm)
    return PipelineStage(cfg, style, agent, masters, role_ranks={r: i for i, r in enumerate(style.roles)}, group=group)


def evaluate_rows(stage: PipelineStage, rows: list[Sample], cfg: OuterTrainConfig) -> dict:
    """Held-out loss over every row (batches of batch_size, no grad): final-round CE and the weighted objective,
    both sample-weighted means."""
    R, total, final, num = cfg.num_recursive_rounds, 0.0, 0.0, 0
    for start in range(0, len(rows), cfg.batch_size):
        batch = rows[start:start + cfg.batch_size]
        stats = stage.evaluate(batch)
        rounds = range(R - len(stats.round_losses) + 1, R + 1)
        total += len(batch) * sum(round_loss_weight(r, R, cfg.non_last_loss_weight) * x
                                  for r, x in zip(rounds, stats.round_losses))
        final += len(batch) * stats.round_losses[-1]
        num += len(batch)
    return {"eval_loss": final / num, "eval_objective": total / num, "num_eval_rows": num}


def train_loop_per_worker(config: dict) -> None:
    """Ray Train entry. config = {"cfg", "system", "links": {role: ObjectRef}, "samples", "eval_samples",
    "storage": (storage_path, run name), "resume_from", "progress" (the driver's StepBoard queue or None),
    "rollout_cache" (first-stage rollouts the driver computed, `outer.rollout_stage`'s layout), "_faults"}."""
    cfg, style, role, device = core.role_worker_setup(config, OuterTrainConfig)
    rank = style.roles.index(role)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL object collectives use the current device
    stage = _build_stage(cfg, style, role, config["system"], ray.get(config["links"][role]), device)
    stage.rollout_cache.update({k: z for k, z in (config.get("rollout_cache") or {}).items() if k[0] == role})
    samples = [Sample(**s) for s in config["samples"]]
    eval_samples = [Sample(**s) for s in config.get("eval_samples") or []]
    storage, faults = core.RunStorage(*config["storage"]), core.Faults.of(config)
    digest0 = stage.frozen_digest() if cfg.verify_frozen else None

    start, log, eval_log = 0, [], []
    best: dict = {"eval_loss": math.inf, "step": None, "links": None}  # --keep_best: the lowest held-out loss
    with core.restored_dir(config.get("resume_from")) as d:
        if d is not None:
            stage.load_shard(d)
            state = core.read_state(d)
            start, log, eval_log = state["step"], state["log"], state.get("eval_log", [])
    end = min(cfg.max_steps, cfg.stop_at_step) if cfg.stop_at_step else cfg.max_steps

    def report(step: int, metrics: dict, chosen: dict | None = None) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            stage.save_shard(Path(tmp))
            sizes = [None] * dist.get_world_size(stage.group)
            dist.all_gather_object(sizes, core.file_sizes(Path(tmp)), group=stage.group)
            if rank == 0:  # the marker lists every worker's shard: Ray merges them into one folder
                core.write_state(Path(tmp), {"step": step, "log": log, "eval_log": eval_log, "style": style.name,
                                             "roles": config["system"]["manifest"]["roles"],
                                             **({"chosen": chosen} if chosen else {})})
                core.seal(Path(tmp), {k: v for s in sizes for k, v in s.items()})
            core.report_checkpoint(Path(tmp), metrics, step=step, storage=storage, local_mode=False,
                                   num_to_keep=cfg.num_to_keep)

    def maybe_evaluate(step: int) -> None:
        if not eval_samples or not (step == end or cfg.eval_every and step % cfg.eval_every == 0):
            return
        if eval_log and eval_log[-1]["step"] == step:
            return
        eval_log.append({"step": step, **evaluate_rows(stage, eval_samples, cfg)})
        if cfg.keep_best and eval_log[-1]["eval_loss"] < best["eval_loss"]:
            best.update(eval_loss=eval_log[-1]["eval_loss"], step=step, links=stage.links_state())
        if rank == 0:
            print(f"[outer {style.name}] step {step}/{cfg.max_steps} eval_loss {eval_log[-1]['eval_loss']:.4f} "
                  f"on {eval_log[-1]['num_eval_rows']} held-out rows", flush=True)

    metrics, t0 = {"step": start}, time.perf_counter()
    for step in range(start, end):
        done = step + 1
        batch = [samples[j] for j in core.step_indices(len(samples), step, cfg.batch_size, cfg.system.seed)]
        t_step = time.perf_counter()
        stats = stage.accumulate(batch, inject_nan=done == faults.nan_step,
                                 mid_step_hook=lambda: faults.maybe_kill(rank, done, storage))
        if not stats.nan_samples:
            stats = stage.update(stats)  # steps only when the global grad norm is finite
        if stats.nan_samples or not math.isfinite(stats.grad_norm):
            # stop without stepping (every rank decides alike from all-reduced values); the last reported
            # checkpoint stays the latest and the driver raises NaNLossError
            if rank == 0:
                bad = stats.nan_samples or list(range(len(batch)))
                storage.write_text(NAN_STOP, json.dumps({
                    "step": done, "sample_ids": [batch[j].sample_id for j in bad], "round_losses": stats.round_losses,
                    "what": "loss" if stats.nan_samples else "gradient norm"}))
            return
        dt = time.perf_counter() - t_step
        log.append({"step": done, "loss": stats.round_losses[-1], "round_losses": stats.round_losses,
                    "grad_norm": stats.grad_norm, "lr": stats.lr, "step_s": dt, "num_truncated": stats.num_truncated})
        if rank == 0:
            post_step(config.get("progress"), f"outer {style.name}", done, cfg.max_steps)
        if rank == 0 and (done % cfg.log_every == 0 or done == end):
            rounds = " ".join(f"{x:.4f}" for x in stats.round_losses)
            cut = f" truncated {stats.num_truncated}/{len(batch)}" if stats.num_truncated else ""
            print(f"[outer {style.name}] step {done}/{cfg.max_steps} loss {stats.round_losses[-1]:.4f} "
                  f"(rounds {rounds}) grad_norm {stats.grad_norm:.3f} lr {stats.lr:.2e} step {dt:.2f}s{cut}",
                  flush=True)
        maybe_evaluate(done)
        if (cfg.save_every and done % cfg.save_every == 0) or done == end:
            metrics = {"step": done, "loss": stats.round_losses[-1], "grad_norm": stats.grad_norm,
                       "elapsed_s": time.perf_counter() - t0,
                       "num_truncated": sum(e.get("num_truncated", 0) for e in log),
                       **({"eval_loss": eval_log[-1]["eval_loss"]} if eval_log else {})}
            chosen = None
            if done == end:
                metrics["workers"] = _gather_worker_stats(stage, digest0)
                chosen = keep_best_links(stage, best, eval_log, start) if cfg.keep_best else None
            report(done, metrics, chosen)
    if start >= end:  # resumed at or past the end: report once so the run has a result
        report(start, {"step": start, "workers": _gather_worker_stats(stage, digest0)})


def keep_best_links(stage: PipelineStage, best: dict, eval_log: list, start: int) -> dict:
    """--keep_best at the last step: set the stage's links to those of the lowest held-out loss (every worker
    decides alike: the loss is all-reduced) and return what the manifest records of the choice."""
    if best["step"] is not None and best["step"] != eval_log[-1]["step"]:
        stage.load_links_state(best["links"])
    return {"step": best["step"], "eval_loss": best["eval_loss"], "by": "lowest held-out loss (--keep_best)",
            "among_steps": [e["step"] for e in eval_log if e["step"] > start]}


def _gather_worker_stats(stage: PipelineStage, digest0: str | None) -> dict:
    mine = {"frozen_unchanged": stage.frozen_digest() == digest0 if digest0 else None, **stage.memory_stats()}
    everyone = [None] * dist.get_world_size(stage.group)
    dist.all_gather_object(everyone, (stage.role, mine), group=stage.group)
    return dict(everyone)


# ----------------------------------------------------------------------------- driver
class NaNLossError(RuntimeError):
    """The loss became NaN/Inf; the run stopped before stepping and the last good checkpoint is kept."""


def train_outer(cfg: OuterTrainConfig, *, faults: dict | None = None) -> OuterRunResult:
    """Run outer-loop training as one pipeline-parallel Ray Train job; returns the exported result
    (`--schedule hop_by_hop`: `hop_by_hop_job.train_hop_by_hop`, links.pt in save_dir).

    `faults` is the test-only fault-injection dict (see `core.Faults`)."""
    if cfg.schedule == "hop_by_hop":
        if faults:
            raise ValueError("fault injection is for the end_to_end schedule only")
        return hop_by_hop_job.train_hop_by_hop(cfg)

    check_tree(cfg)
    style = get_style(cfg.system.style)
    plan = plan_system(cfg.system, task=cfg.task)  # raises on link/base-model mismatches, before compute
    samples = prepare_samples(load_rows(cfg.dataset_name, cfg.dataset_json_field, split=cfg.dataset_split), style,
                              cfg.task)
    eval_samples = prepare_samples(load_rows(cfg.eval_dataset, cfg.dataset_json_field), style, cfg.task) \
        if cfg.eval_dataset else []
    cfg = core.resolve_steps(cfg, len(samples), cfg.batch_size)
    manifest = {**plan.manifest(), "train_config": asdict(cfg)}
    storage = core.run_storage(cfg, f"outer-{style.name}")
    resume_from = core.start_or_resume(cfg, storage, "outer")
    if resume_from is not None:
        _check_resume(resume_from, manifest)
    rollouts: dict = {}  # the state bridge's first-stage rollouts (same CPU dtype as the workers'): computed once
    if cfg.outer_init != "default" and "outer" not in cfg.system.ckpt_override and resume_from is None:
        if cfg.outer_init == "state_bridge":  # first-stage links fitted on the training questions' rollouts
            state_bridge_outer_links(plan, [s.question for s in samples], task=cfg.task,
                                     num_steps=cfg.rollout_latent_steps, num_rounds=cfg.num_recursive_rounds,
                                     ridge=cfg.bridge_ridge, dtype=cfg.system.dtype,
                                     rollouts=None if cfg.use_gpu else rollouts)
        else:
            bridge_outer_links(plan, ridge=cfg.bridge_ridge, dtype=cfg.system.dtype)
        # the links as training starts, kept beside the trained ones: an evaluation's untrained-links row loads
        # them (`eval.rows`) instead of re-fitting the bridge on every training question's rollouts
        save_links(Path(cfg.save_dir) / OUTER_INIT_DIR, LinkSet(outer=dict(plan.links.outer)),
                   {"kind": "outer_init", "outer_init": cfg.outer_init, "step": 0})
    if storage.exists(NAN_STOP):
        storage.fs.delete_file(storage.path(NAN_STOP))
    save_config(cfg, cfg.save_dir)  # next to the outputs, once every input has been checked
    local = not ray.is_initialized()
    if local:  # joins a running cluster (RAY_ADDRESS / ray start) or starts a local one on loopback

        cluster.init_ray()
    links = {r: ray.put(plan.service_args(r)[1:]) for r in style.roles}
    system = {"role_models": plan.role_models, "hidden_sizes": plan.hidden_sizes, "manifest": manifest}
    repo = str(Path(__file__).resolve().parents[2])
    loop_config = {"cfg": asdict(cfg), "system": system, "links": links, "storage": (storage.uri, storage.name),
                   "samples": [asdict(s) for s in samples], "eval_samples": [asdict(s) for s in eval_samples],
                   "resume_from": resume_from, "_faults": faults, "rollout_cache": rollouts}
    with history.tracked_run(cfg, f"outer-{cfg.system.style}") as tracker, \
            StepBoard(current(), enabled=cfg.progress) as board:
        loop_config["progress"] = board.queue
        result = core.fit(train_loop_per_worker, loop_config, cfg, storage, num_workers=len(style.roles),
                          resources=core.role_worker_resources(cfg, len(style.roles), local),
                          backend="nccl" if cfg.use_gpu else "gloo", tracker=tracker,
                          env_vars={"PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))})
        if storage.exists(NAN_STOP):
            info = json.loads(storage.read_text(NAN_STOP))
            last = storage.latest_complete()
            raise NaNLossError(f"non-finite {info['what']} at step {info['step']} for sample ids "
                               f"{info['sample_ids']} (round losses {info['round_losses']}); stopped without "
                               f"stepping, last good checkpoint: {last.path if last else 'none'}")
        if result.checkpoint is None:
            raise RuntimeError(f"outer training finished without a checkpoint (run {storage.root})")
        with result.checkpoint.as_directory() as d:
            save_dir = export_checkpoint(Path(d), Path(cfg.save_dir), manifest)
            state = core.read_state(Path(d))
        if state.get("eval_log"):
            write_eval_curve(save_dir, state["log"], state["eval_log"])
        history.log_history(tracker, [*state["log"], *state.get("eval_log", [])], save_dir=save_dir,
                         files=("manifest.json", "config.json", EVAL_CURVE, "eval_curve.png"))

    write_provenance(save_dir, config=asdict(cfg), inputs=cfg.system.ckpt_override, kind="outer")
    return OuterRunResult(save_dir, result.checkpoint.path, result.metrics or {}, state["log"], state.get("eval_log", []))


def write_eval_curve(save_dir: Path, log: list, eval_log: list) -> Path:
    """eval_curve.jsonl (one held-out evaluation per line) and eval_curve.png (train and held-out loss vs step)."""
    import matplotlib  # lazy: matplotlib (~1 s) loads only for plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib (~1 s) loads only for plots

    (Path(save_dir) / EVAL_CURVE).write_text("".join(json.dumps(e) + "\n" for e in eval_log))
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([e["step"] for e in log], [e["loss"] for e in log], label="train loss (final round)", alpha=0.6)
    ax.plot([e["step"] for e in eval_log], [e["eval_loss"] for e in eval_log], "o-", label="held-out loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.legend()
    fig.tight_layout()
    png = Path(save_dir) / "eval_curve.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def _check_resume(ckpt, manifest: dict) -> None:
    # A checkpoint of another system (other base models) must not be resumed silently.
    with ckpt.as_directory() as d:
        saved = core.read_state(Path(d)).get("roles", {})
    for role, info in manifest["roles"].items():
        old = saved.get(role, {})
        if old and (old.get("base_model"), old.get("hidden_size")) != (info["base_model"], info["hidden_size"]):
            raise ValueError(f"--resume: role {role} ran on {old.get('base_model')} (hidden {old.get('hidden_size')}) "
                             f"in {ckpt.path}, but now on {info['base_model']} (hidden {info['hidden_size']})")
