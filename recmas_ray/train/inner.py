"""Inner-loop training on Ray Train: warm-start one role's inner link on its frozen base model.

Goal (spec section 7): inner(h_t) should look like the input embedding of token t+1, so latent
thoughts land in the distribution of the model's own inputs. One Ray Train `TorchTrainer` per role;
`train_all_roles` runs the roles of a style concurrently, each from its own `num_cpus=0` task.

    driver      rows -> validate -> (user prompt with upstream gold text, gold target) per row
    worker      step s -> global batch = f(seed, s) -> this rank's slice
                embed prompt + target + EOS -> left pad -> frozen forward (no_grad) -> H, E
                pred_t = inner(H[:, t]), target_t = E[:, t+1] at assistant positions -> 1 - cos
                backward -> all-reduce link grads over workers -> clip -> AdamW -> cosine LR
    checkpoint  inner link (links.safetensors + manifest.json) + optimizer/scheduler/step; never the base model

Data order and every random choice are functions of (seed, step), so a run resumed from a
checkpoint ends with the same weights as an uninterrupted one.
Legend: B batch, L sequence, D hidden size, N kept (assistant) positions.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from recmas_ray.agent import Agent, left_pad
from recmas_ray.system.checkpoints import MANIFEST, WEIGHTS, stable_seed
from recmas_ray.links import InnerLink
from recmas_ray.styles import get_style
from recmas_ray.styles.base import TASK_TYPES
from recmas_ray.train.data import canonical_role, load_rows, role_examples, validate_rows
from recmas_ray.train.inner_checkpoints import (_persist_local, latest_checkpoint,  # noqa: F401
                                               load_checkpoint, write_checkpoint)



@dataclass(kw_only=True)
class InnerTrainConfig:
    """One role's inner-loop run (flags of the original `train_inner.py` plus the Ray Train ones)."""

    model_name_or_path: str = "tiny:qwen3"
    """Frozen base model of the role: tiny:<family>, pkg:<name>, a HF id or a local path."""
    mas_design: str = "sequential"
    """Style (sequential, mixture, distillation, deliberation; aliases hie, distill)."""
    mas_role: str = "planner"
    """Role of the style, or an alias of the original tool (refiner, hie_math_expert, ...); the CLI also
    takes `all` (every role at once)."""
    mas_task: str = "math"
    """Task type of the prompts: math, code or choice."""
    dataset_name: str = "synthetic:256"
    """Local .json/.jsonl, a HF dataset id (train split) or synthetic[:N] (offline arithmetic set)."""
    dataset_json_field: str | None = None
    """Field holding the rows in a `{"data": [...]}` JSON file."""
    dataset_split: str = "train"
    """Split of a Hugging Face dataset."""
    save_dir: str = "checkpoints/inner"
    """Where the final inner link goes (links.safetensors + manifest.json, loadable by --ckpt_override)."""
    max_steps: int = 20000
    """Optimizer steps (the cosine schedule spans exactly these)."""
    batch_size: int = 2
    """Rows per worker per step (global batch = batch_size * max(num_workers, 1))."""
    lr: float = 5e-4
    """Peak learning rate, the reference value. Note (spec section 8, [KO]): on the outer loop 5e-4 was
    unstable in a third-party re-run and 1e-4 was best; lower it if the loss spikes."""
    warmup_steps: int = 10
    """Linear warmup steps before the cosine decay (num_cycles 0.5: reaches 0 at max_steps)."""
    max_length: int = 2048
    """Right-truncation of prompt + target tokens (latent-free teacher forcing)."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0 disables)."""
    w_cos: float = 1.0
    """Weight of mean(1 - cos(pred, target))."""
    w_mse: float = 0.0
    """Weight of mean MSE(pred, target); the CLI default of the reference is 0."""
    seed: int = 42
    """Seed of the link init and of the data order."""
    dtype: str = "auto"
    """Base model dtype: auto (bf16 on CUDA, fp32 on CPU), bfloat16, float32, float16."""
    adapter_dtype: str = "base"
    """Inner link dtype: base (the reference: same as the base model) or float32 (fp32 master weights,
    a non-reference option)."""
    num_workers: int = 1
    """Ray Train workers (data parallel); 0 runs Ray Train's local mode in the calling process."""
    use_gpu: bool = False
    """One GPU (or gpus_per_worker) per worker."""
    cpus_per_worker: float = 1.0
    """CPUs reserved per worker."""
    gpus_per_worker: float = 1.0
    """GPUs reserved per worker when use_gpu."""
    save_every: int = 500
    """Report a checkpoint every this many steps (and always at the end); 0 = only at the end."""
    log_every: int = 10
    """Log (and report metrics) every this many steps; the logged loss is the window mean."""
    stop_at_step: int = 0
    """Stop early at this step after saving a checkpoint, keeping the max_steps schedule (time-sliced
    runs; continue with resume). 0 runs to max_steps."""
    resume: bool = False
    """Continue from the latest checkpoint of this role's run in the storage path."""
    storage_path: str | None = None
    """Ray Train storage (shared disk for multi-node runs); default <save_dir>/_ray_runs."""
    max_failures: int = 0
    """Worker-group restarts Ray Train may do (each resumes from the latest checkpoint)."""
    num_to_keep: int = 2
    """Checkpoints kept in storage."""
    progress: bool = True
    """Progress bar on rank 0."""
    fit_timeout_s: float | None = None
    """Timeout of each concurrent role run in train_all_roles (None waits forever)."""


def validate_config(cfg: InnerTrainConfig):
    """Check the config up front; returns (style, canonical role)."""
    style = get_style(cfg.mas_design)
    role = canonical_role(style, cfg.mas_role)
    if cfg.mas_task not in TASK_TYPES:
        raise ValueError(f"unknown --mas_task {cfg.mas_task!r}; expected one of {TASK_TYPES}")
    for name in ("max_steps", "batch_size", "max_length", "log_every"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.num_workers < 0 or cfg.save_every < 0 or cfg.warmup_steps < 0 or cfg.stop_at_step < 0:
        raise ValueError("num_workers, save_every, warmup_steps and stop_at_step must be >= 0")
    if cfg.adapter_dtype not in ("base", "float32"):
        raise ValueError(f"adapter_dtype {cfg.adapter_dtype!r}; expected base or float32")
    if cfg.storage_path and "://" in cfg.storage_path:
        raise ValueError(f"storage_path {cfg.storage_path!r}: only local or shared-disk paths are supported")
    return style, role


# ----------------------------------------------------------------------------- numerics
def inner_loss(agent: Agent, batch: list[tuple[str, str]], *, w_cos: float = 1.0, w_mse: float = 0.0,
               max_length: int = 2048, literal_slots: bool = False) -> torch.Tensor:
    """Teacher-forced inner-link loss over a batch of (user prompt, gold target) pairs (spec section 7).

    One frozen no_grad forward; pred_t = inner(H[:, t]), target_t = E[:, t+1], kept where position
    t+1 is an assistant token (target + EOS) and position t is not padding.
    """
    with torch.no_grad():
        rows, assistant = [], []
        for user, target in batch:
            e_LD, _, asst_L = agent.embed_teacher_forced(user, None, target, literal_slots=literal_slots)
            rows.append(e_LD[:max_length])
            assistant.append(asst_L[:max_length])
        e_BLD, mask_BL = left_pad(rows)
        asst_BL = torch.zeros(mask_BL.shape, dtype=torch.bool, device=mask_BL.device)
        for b, a in enumerate(assistant):
            asst_BL[b, asst_BL.shape[1] - a.shape[0]:] = a.to(asst_BL.device)
        h_BLD = agent.forward_hidden(e_BLD, mask_BL)
        keep_BL = asst_BL[:, 1:] & mask_BL[:, :-1].bool()
        h_ND, target_ND = h_BLD[:, :-1][keep_BL], e_BLD[:, 1:][keep_BL]
    link_dtype = next(agent.inner_link.parameters()).dtype
    pred_ND = agent.inner_link(h_ND.to(link_dtype)).float()
    target_ND = target_ND.float()
    if pred_ND.shape[0] == 0:  # every target truncated away: a zero loss that still has a graph
        return pred_ND.sum() * 0.0
    loss = w_cos * (1.0 - F.cosine_similarity(pred_ND, target_ND, dim=-1)).mean()
    if w_mse:
        loss = loss + w_mse * F.mse_loss(pred_ND, target_ND)
    return loss


def lr_factor(step: int, *, warmup_steps: int, max_steps: int) -> float:
    """Linear warmup then cosine decay with num_cycles 0.5 (HF `get_cosine_schedule_with_warmup`)."""
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def fresh_inner_link(hidden_size: int, *, seed: int, role: str) -> InnerLink:
    """The same seeded init as `checkpoint.init_links` gives this role."""
    with torch.random.fork_rng():
        torch.manual_seed(stable_seed(seed, f"inner:{role}"))
        return InnerLink(hidden_size)


def make_optimizer(link: InnerLink, cfg: InnerTrainConfig):
    """AdamW over the link only, betas (0.9, 0.95), wd 0 (biases and LayerNorms in a no-decay group)."""
    decay = [p for n, p in link.named_parameters() if n.endswith("weight") and "ln" not in n]
    no_decay = [p for n, p in link.named_parameters() if not (n.endswith("weight") and "ln" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.0}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, partial(lr_factor, warmup_steps=cfg.warmup_steps, max_steps=cfg.max_steps))
    return opt, sched


def step_indices(num_rows: int, step: int, global_batch: int, seed: int) -> list[int]:
    """Row indices of global step `step`: a fresh permutation per epoch seeded by (seed, epoch), drop_last."""
    steps_per_epoch = num_rows // global_batch
    if steps_per_epoch < 1:
        raise ValueError(f"{num_rows} rows cannot fill one global batch of {global_batch}")
    epoch, pos = divmod(step, steps_per_epoch)
    gen = torch.Generator().manual_seed(stable_seed(seed, f"epoch:{epoch}"))
    return torch.randperm(num_rows, generator=gen)[pos * global_batch:(pos + 1) * global_batch].tolist()


def train_step(agent: Agent, opt, sched, batch, cfg: InnerTrainConfig, *, literal_slots: bool = False) -> float:
    """One optimizer step; link grads are averaged over workers when torch.distributed is up."""
    loss = inner_loss(agent, batch, w_cos=cfg.w_cos, w_mse=cfg.w_mse, max_length=cfg.max_length,
                      literal_slots=literal_slots)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    params = list(agent.inner_link.parameters())
    loss_t = loss.detach().clone()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
        for t in [p.grad for p in params] + [loss_t]:
            torch.distributed.all_reduce(t)
            t.div_(world)
    if cfg.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
    opt.step()
    sched.step()
    return float(loss_t)


# ----------------------------------------------------------------------------- Ray Train worker
def _progress_bar(cfg: InnerTrainConfig, role: str, start: int, local_mode: bool):
    import ray

    desc = f"inner {role}"
    if not cfg.progress:
        return None
    if ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE:
        from ray.experimental.tqdm_ray import tqdm as ray_tqdm  # renders on the driver

        bar = ray_tqdm(total=cfg.max_steps, desc=desc)
        bar.update(start)
        return bar
    from tqdm.auto import tqdm

    return tqdm(total=cfg.max_steps, initial=start, desc=desc, dynamic_ncols=True)


def train_loop_per_worker(config: dict) -> dict:
    """Ray Train entry point; runs on every worker (or in-process in local mode).

    config: {"cfg": asdict(InnerTrainConfig), "examples": [(user prompt, target)], "run_dir": where local
    mode persists checkpoints, "resume_from": a checkpoint dir or None}. Returns {"loss_log": ...}.
    """
    import ray.train
    from ray.train import Checkpoint

    from recmas_ray.models.loader import load_frozen_model, resolve_dtype

    cfg = InnerTrainConfig(**config["cfg"])
    style, role = validate_config(cfg)
    examples, local_mode = config["examples"], cfg.num_workers == 0
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    if cfg.use_gpu:
        device = torch.device("cuda", ctx.get_local_rank()) if local_mode else ray.train.torch.get_device()
    else:
        device = torch.device("cpu")
    model, tokenizer = load_frozen_model(cfg.model_name_or_path, dtype=resolve_dtype(cfg.dtype, device), device=device)
    hidden = model.config.get_text_config().hidden_size
    agent = Agent(model, tokenizer, fresh_inner_link(hidden, seed=cfg.seed, role=role), role=role,
                  model_name=cfg.model_name_or_path, system_prompt=style.system_prompt)
    if cfg.adapter_dtype == "float32":
        agent.inner_link.float()
    opt, sched = make_optimizer(agent.inner_link, cfg)

    start, loss_log = 0, []
    ckpt = ray.train.get_checkpoint()  # set when Ray Train restarts a failed worker group
    if ckpt is not None:
        with ckpt.as_directory() as d:
            start, loss_log = load_checkpoint(Path(d), link=agent.inner_link, opt=opt, sched=sched, cfg=cfg, role=role)
    elif config.get("resume_from"):
        start, loss_log = load_checkpoint(Path(config["resume_from"]), link=agent.inner_link, opt=opt, sched=sched,
                                          cfg=cfg, role=role)
    end = min(cfg.max_steps, cfg.stop_at_step) if cfg.stop_at_step else cfg.max_steps
    bar = _progress_bar(cfg, role, start, local_mode) if rank == 0 else None
    literal = not style.teacher_text_in_slots
    window, t0, saved = [], time.perf_counter(), None
    fail_at = config.get("fail_at_step")  # fault injection (tests): fail once, on a run not yet restored

    def report(step: int, metrics: dict, with_ckpt: bool) -> None:
        write = partial(write_checkpoint, link=agent.inner_link, opt=opt, sched=sched, step=step, cfg=cfg, role=role,
                        style_name=style.name, loss_log=loss_log, world_size=world)
        name = f"checkpoint_{step:06d}"
        if not with_ckpt:
            ray.train.report(metrics)
        elif local_mode:
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(
                str(_persist_local(Path(config["run_dir"]), step, write, cfg.num_to_keep))))
        elif rank == 0:
            with tempfile.TemporaryDirectory() as tmp:
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(str(write(Path(tmp)))),
                                 checkpoint_dir_name=name)
        else:
            ray.train.report(metrics, checkpoint_dir_name=name)

    metrics = {"step": start, "role": role, "world_size": world}
    for step in range(start, end):
        idx = step_indices(len(examples), step, cfg.batch_size * world, cfg.seed)
        batch = [examples[i] for i in idx[rank * cfg.batch_size:(rank + 1) * cfg.batch_size]]
        lr = opt.param_groups[0]["lr"]
        window.append(train_step(agent, opt, sched, batch, cfg, literal_slots=literal))
        done = step + 1
        if fail_at == done and ckpt is None and not config.get("resume_from"):
            raise RuntimeError(f"injected failure at step {done}")
        if bar is not None:
            bar.update(1)
        log_now = done % cfg.log_every == 0 or done == end
        save_now = (cfg.save_every and done % cfg.save_every == 0) or done == end
        if log_now:
            dt = time.perf_counter() - t0
            mean = sum(window) / len(window)
            loss_log.append([done, mean])
            metrics = {"step": done, "loss": mean, "lr": lr, "samples_per_s": len(window) * cfg.batch_size * world / dt,
                       "role": role, "world_size": world}
            if rank == 0:
                msg = (f"[inner {role}] step {done}/{cfg.max_steps} loss {mean:.4f} lr {lr:.2e} "
                       f"samples/s {metrics['samples_per_s']:.1f}")
                if hasattr(bar, "write"):  # plain tqdm: print above the bar
                    bar.write(msg)
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


# ----------------------------------------------------------------------------- driver side
def _storage(cfg: InnerTrainConfig) -> Path:
    return Path(cfg.storage_path or Path(cfg.save_dir) / "_ray_runs").resolve()


def _fit(cfg: InnerTrainConfig, examples: list[tuple[str, str]], *, loop_extra: dict | None = None) -> Path:
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    style, role = validate_config(cfg)
    world = max(cfg.num_workers, 1)
    if len(examples) < cfg.batch_size * world:
        raise ValueError(f"{len(examples)} rows cannot fill one global batch of {cfg.batch_size} x {world} workers")
    storage, name = _storage(cfg), f"inner-{style.name}-{role}"
    run_dir = storage / name
    resume_from = latest_checkpoint(run_dir) if cfg.resume else None
    if cfg.resume and resume_from is None:
        print(f"[inner {role}] --resume: no checkpoint in {run_dir}; starting from step 0", flush=True)
    if not cfg.resume and run_dir.exists():
        shutil.rmtree(run_dir)  # else Ray Train would silently restore the old run of the same name
    if cfg.num_workers == 0:  # local mode logs every report at INFO; our own log line says the same
        logging.getLogger("ray.train.v2._internal.execution.train_fn_utils").setLevel(logging.WARNING)
    resources = {"CPU": cfg.cpus_per_worker, **({"GPU": cfg.gpus_per_worker} if cfg.use_gpu else {})}
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"cfg": asdict(cfg), "examples": examples, "run_dir": str(run_dir),
                           "resume_from": str(resume_from) if resume_from else None, **(loop_extra or {})},
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu, resources_per_worker=resources),
        run_config=RunConfig(name=name, storage_path=str(storage),
                             failure_config=FailureConfig(max_failures=cfg.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=cfg.num_to_keep)),
    )
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"inner training of {role} finished without a checkpoint (run {run_dir})")
    save_dir = Path(cfg.save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    with result.checkpoint.as_directory() as d:
        for fname in (WEIGHTS, MANIFEST):
            tmp = save_dir / f".{fname}.tmp"
            shutil.copyfile(Path(d) / fname, tmp)
            os.replace(tmp, save_dir / fname)
    return save_dir


def train_inner(cfg: InnerTrainConfig) -> Path:
    """Train one role's inner link with one TorchTrainer; returns cfg.save_dir holding the final link."""
    style, role = validate_config(cfg)
    rows = load_rows(cfg.dataset_name, cfg.dataset_json_field, split=cfg.dataset_split)
    return _fit(cfg, role_examples(rows, style, role, cfg.mas_task))


def train_all_roles(cfg: InnerTrainConfig, roles=None, *, role_models: dict[str, str] | None = None) -> dict[str, Path]:
    """One TorchTrainer per role, all running at once; returns {role: save_dir/role}.

    Each `fit()` blocks, so each runs inside its own `num_cpus=0` task (the trainer reserves its
    own workers); in local mode (num_workers=0) the task itself reserves one worker's resources.
    The tasks may run on any node: on a multi-node cluster save_dir and storage_path must be shared.
    """
    import ray

    style = get_style(cfg.mas_design)
    roles = [canonical_role(style, r) for r in (roles or style.roles)]
    rows = load_rows(cfg.dataset_name, cfg.dataset_json_field, split=cfg.dataset_split)
    validate_rows(rows, style, roles, task=cfg.mas_task)
    cfgs = {r: replace(cfg, mas_role=r, model_name_or_path=(role_models or {}).get(r, cfg.model_name_or_path),
                       save_dir=str(Path(cfg.save_dir).resolve() / r), storage_path=str(_storage(cfg))) for r in roles}
    for c in cfgs.values():
        validate_config(c)
    from recmas_ray.distributed.driver import init_ray

    init_ray()
    opts = {"num_cpus": 0} if cfg.num_workers else {
        "num_cpus": cfg.cpus_per_worker, "num_gpus": cfg.gpus_per_worker if cfg.use_gpu else 0}
    fit = ray.remote(_fit).options(max_retries=0, **opts)
    refs = {r: fit.remote(c, role_examples(rows, style, r, cfg.mas_task)) for r, c in cfgs.items()}
    try:
        return dict(zip(refs, ray.get(list(refs.values()), timeout=cfg.fit_timeout_s)))
    except BaseException as e:  # one role failed or timed out: stop the others too
        for ref in refs.values():
            ray.cancel(ref, force=True)
        if isinstance(e, ray.exceptions.GetTimeoutError):
            raise TimeoutError(f"inner training of {roles} did not finish within {cfg.fit_timeout_s} s") from None
        raise
