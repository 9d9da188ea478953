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

import copy
import hashlib
import json
import math
import os
import resource
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from recmas_ray.agent import Agent
from recmas_ray.links import OuterLink, inner_link_from_state_dict, outer_link_from_state_dict
from recmas_ray.styles import StyleSpec, build_schedule, split_edge
from recmas_ray.train.outer import (TRAIN_STATE, Latent, OuterTrainConfig, Sample, SavedTensorMeter, emit_messages,
                                    encode_stage, export_checkpoint, latest_checkpoint, lr_lambda, read_outer_links,
                                    split_microbatches, step_indices, validate_config)

NAN_STOP = "nan_stop.json"


@dataclass
class StepStats:
    """What every worker knows after the backward sweep of one step."""

    round_losses: list[float]
    """Mean decoder CE per round (rounds whose loss was computed; NaN if any sample was NaN)."""
    nan_samples: list[int]
    """Positions in the batch whose loss was NaN or Inf."""
    grad_norm: float = float("nan")
    """Global norm over all outer links before clipping (set by `update`)."""
    lr: float = 0.0


@dataclass
class _Tape:
    inputs: dict[str, Latent]
    samples: list[Sample]
    z: torch.Tensor | None = None
    messages: dict[str, torch.Tensor] | None = None
    objective: torch.Tensor | None = None


class PipelineStage:
    """One role's share of the unrolled system: its agent, fp32 master outer links + AdamW, the tape, p2p."""

    def __init__(self, cfg: OuterTrainConfig, style: StyleSpec, agent: Agent, masters: dict[str, OuterLink], *,
                 role_ranks: dict[str, int], group=None):
        self.cfg, self.style, self.agent, self.role = cfg, style, agent, agent.role
        self.role_ranks, self.group = role_ranks, group
        self.device, self.dtype = agent.device, agent.dtype
        agent.inner_link.requires_grad_(False)
        self.masters = {e: m.to(self.device, torch.float32) for e, m in masters.items()}
        for edge, master in self.masters.items():
            agent.attach_outer_link(edge, copy.deepcopy(master))  # working copy in the model dtype
        self.opt = torch.optim.AdamW([p for m in self.masters.values() for p in m.parameters()], lr=cfg.lr,
                                     betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: lr_lambda(s, warmup_steps=cfg.warmup_steps, max_steps=cfg.max_steps))
        self.schedule = build_schedule(style, cfg.num_recursive_rounds)
        self.order = [(mb, i) for rnd in range(1, cfg.num_recursive_rounds + 1) for mb in range(cfg.num_microbatches)
                      for i, s in enumerate(self.schedule) if s.round == rnd]
        self.tape: dict[tuple[int, int], _Tape] = {}
        self.pending: list = []
        # weights that backward saves are resident anyway: count activations only
        weights = [agent.model, agent.inner_link, *agent.outer_links.values()]
        self.meter = SavedTensorMeter(exclude={p.untyped_storage().data_ptr() for m in weights for p in m.parameters()}) \
            if cfg.profile_memory else None

    # ----------------------------------------------------------------------------- p2p
    def _isend(self, t: torch.Tensor, dst: int) -> None:
        t = t.detach().contiguous()
        self.pending.append((dist.isend(t, dst=dst, group=self.group), t))  # keep t alive until sent

    def _recv(self, shape, dtype, src: int) -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype, device=self.device)
        dist.recv(t, src=src, group=self.group)
        return t

    def _flush_sends(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending = []

    # ----------------------------------------------------------------------------- stage compute
    def _encode(self, step, samples, inputs, batch_size):
        c = self.cfg
        return encode_stage(self.agent, self.style, step, samples, inputs, task=c.task,
                            num_rounds=c.num_recursive_rounds, max_latent_tokens=c.max_latent_tokens,
                            non_last_loss_weight=c.non_last_loss_weight, batch_size=batch_size)

    def _forward(self, mb: int, i: int, samples: list[Sample], batch_size: int, inject_nan: bool) -> list[float]:
        step = self.schedule[i]
        inputs = {}
        for marker, edge in step.inputs:
            src = self.role_ranks[split_edge(edge)[0]]
            lengths = self._recv((len(samples),), torch.int64, src).tolist()
            inputs[marker] = Latent(self._recv((sum(lengths), self.agent.hidden_size), self.dtype, src)
                                    .requires_grad_(), lengths)
        with torch.set_grad_enabled(not self.cfg.recompute):
            enc = self._encode(step, samples, inputs, batch_size)
            msgs = emit_messages(self.agent, enc.z, step.outputs)
        for edge, msg in msgs.items():
            dst = self.role_ranks[split_edge(edge)[1]]
            self._isend(torch.tensor(enc.lengths, dtype=torch.int64, device=self.device), dst)
            self._isend(msg, dst)
        entry = _Tape(inputs, samples)
        if not self.cfg.recompute:
            entry.messages, entry.objective = msgs, enc.objective
        elif not inputs:
            entry.z = enc.z  # no upstream graph: z is this stage's constant input, no need to re-run the model
        self.tape[(mb, i)] = entry
        if inject_nan and enc.sample_losses:
            return [float("nan")] * len(enc.sample_losses)
        return enc.sample_losses

    def _backward(self, mb: int, i: int, batch_size: int, inject_nan: bool) -> None:
        step = self.schedule[i]
        entry = self.tape.pop((mb, i))
        if entry.messages is None:  # --recompute: re-run the stage with a graph, then backprop at once
            if entry.z is not None:
                entry.messages = emit_messages(self.agent, entry.z, step.outputs)
            else:
                enc = self._encode(step, entry.samples, entry.inputs, batch_size)
                entry.messages, entry.objective = emit_messages(self.agent, enc.z, step.outputs), enc.objective
        outs, out_grads = [], []
        for edge in step.outputs:
            outs.append(entry.messages[edge])
            out_grads.append(self._recv(outs[-1].shape, self.dtype, self.role_ranks[split_edge(edge)[1]]))
        if entry.objective is not None:
            outs.append(entry.objective * float("nan") if inject_nan else entry.objective)
            out_grads.append(torch.ones_like(entry.objective))
        if outs:
            torch.autograd.backward(outs, out_grads)  # fan-out grads summed inside one backward
        self._flush_grads()
        for marker, edge in step.inputs:
            lat = entry.inputs[marker]
            grad = lat.flat.grad if lat.flat.grad is not None else torch.zeros_like(lat.flat)
            self._isend(grad, self.role_ranks[split_edge(edge)[0]])

    def _flush_grads(self) -> None:
        # Working links may be bf16: add their grads into the fp32 masters after every backward call.
        for edge, master in self.masters.items():
            for wp, mp in zip(self.agent.outer_links[edge].parameters(), master.parameters()):
                if wp.grad is not None:
                    g = wp.grad.detach().float()
                    mp.grad = g.clone() if mp.grad is None else mp.grad.add_(g)
                    wp.grad = None

    # ----------------------------------------------------------------------------- one step
    def accumulate(self, batch: list[Sample], *, inject_nan: bool = False, mid_step_hook=None) -> StepStats:
        """Forward and backward sweeps over the batch; link grads land in the fp32 masters."""
        R, B = self.cfg.num_recursive_rounds, len(batch)
        micro = split_microbatches(list(range(B)), self.cfg.num_microbatches)
        stats = torch.zeros(R + B, dtype=torch.float64, device=self.device)
        ctx = self.meter.track() if self.meter else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
        try:
            with ctx:
                for mb, i in self.order:
                    if self.schedule[i].role != self.role:
                        continue
                    rnd = self.schedule[i].round
                    losses = self._forward(mb, i, [batch[j] for j in micro[mb]], B, inject_nan and rnd == R)
                    for j, loss in zip(micro[mb], losses):
                        stats[rnd - 1] += loss / B
                        stats[R + j] += float(not math.isfinite(loss))
                self._flush_sends()
                if mid_step_hook is not None:
                    mid_step_hook()
                for mb, i in reversed(self.order):
                    if self.schedule[i].role == self.role:
                        self._backward(mb, i, B, inject_nan and self.schedule[i].round == R)
                self._flush_sends()
        finally:
            self.tape.clear()  # a failed step must not pin activations
        dist.all_reduce(stats, group=self.group)
        decoder_rounds = [s.round for s in self.schedule if s.role == self.style.decoder]
        return StepStats([float(stats[r - 1]) for r in decoder_rounds],
                         [j for j in range(B) if stats[R + j] > 0])

    def update(self, stats: StepStats) -> StepStats:
        """Global clip (all-reduce of squared norms), AdamW on the masters, LR step, refresh working links."""
        params = [p for m in self.masters.values() for p in m.parameters() if p.grad is not None]
        sq = torch.zeros(1, dtype=torch.float64, device=self.device)
        for p in params:
            sq += p.grad.double().pow(2).sum()
        dist.all_reduce(sq, group=self.group)
        stats.grad_norm = float(sq.sqrt())
        stats.lr = self.opt.param_groups[0]["lr"]
        if not math.isfinite(stats.grad_norm):
            self.opt.zero_grad(set_to_none=True)
            return stats
        if self.cfg.max_grad_norm > 0:
            coef = min(1.0, self.cfg.max_grad_norm / (stats.grad_norm + 1e-6))  # = clip_grad_norm_ over all links
            for p in params:
                p.grad.mul_(coef)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self._sync_working()
        return stats

    def _sync_working(self) -> None:
        with torch.no_grad():
            for edge, master in self.masters.items():
                for wp, mp in zip(self.agent.outer_links[edge].parameters(), master.parameters()):
                    wp.copy_(mp)

    def grads(self) -> dict[str, dict[str, torch.Tensor]]:
        """Accumulated (unclipped) master grads per edge, for tests."""
        return {e: {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
                for e, m in self.masters.items()}

    # ----------------------------------------------------------------------------- state
    def save_shard(self, path: Path, step: int) -> None:
        """This role's outer links (fp32, our key layout) and optimizer/scheduler state."""
        tensors = {f"outer.{e}.{k}": v.detach().float().cpu().contiguous()
                   for e, m in self.masters.items() for k, v in m.state_dict().items()}
        save_file(tensors, str(path / f"outer-{self.role}.safetensors"))
        torch.save({"optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(), "step": step},
                   path / f"optim-{self.role}.pt")

    def load_shard(self, path: Path) -> int:
        """Restore links, optimizer and scheduler from a checkpoint directory; returns its step."""
        links = read_outer_links(path, roles=[self.role])
        for edge, master in self.masters.items():
            master.load_state_dict(links[edge].state_dict())
        state = torch.load(path / f"optim-{self.role}.pt", map_location=self.device, weights_only=True)
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self._sync_working()
        return int(state["step"])

    def frozen_digest(self) -> str:
        """sha256 over the base model and inner link parameters (they must never change)."""
        h = hashlib.sha256()
        for mod in (self.agent.model, self.agent.inner_link):
            for name, p in mod.state_dict().items():
                h.update(name.encode())
                h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def memory_stats(self) -> dict:
        """Peak saved-activation bytes (tape), peak RSS, CUDA peak (GPU runs)."""
        out = {"peak_saved_bytes": self.meter.peak if self.meter else None,
               "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        if self.device.type == "cuda":
            out["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(self.device)
        return out


# ----------------------------------------------------------------------------- Ray Train worker
def _build_stage(cfg: OuterTrainConfig, style: StyleSpec, role: str, system: dict, link_state, device, group=None):
    """Load this role's base model and links only, and wrap them in a PipelineStage."""
    from recmas_ray.models import load_frozen_model, resolve_dtype

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

    from recmas_ray.system import plan_system
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
