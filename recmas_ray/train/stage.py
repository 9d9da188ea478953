"""One pipeline stage of outer-loop training: a role's frozen agent, its fp32 master outer links, the tape.

`PipelineStage.accumulate` walks the global schedule (rounds x microbatches x steps), runs this role's
steps, sends latents forward and receives their gradients back by torch.distributed point-to-point
(length headers first: latent lengths vary), sums fan-out gradients before one backward, and keeps
only stage inputs under `--recompute`. The Ray Train job around it lives in `pipeline.py`.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import math
import resource
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from recmas_ray.engine.agent import Agent
from recmas_ray.train.config import OuterTrainConfig
from recmas_ray.engine.links import OuterLink
from recmas_ray.styles import StyleSpec, build_schedule, split_edge
from recmas_ray.train import core
from recmas_ray.train.outer import (Latent, Sample, SavedTensorMeter, emit_messages, encode_stage, read_outer_links,
                                    split_microbatches)


@dataclass
class StepStats:
    """What every worker knows after the backward sweep of one step."""

    round_losses: list[float]
    """Mean decoder CE per round (rounds whose loss was computed; NaN if any sample was NaN)."""
    nan_samples: list[int]
    """Positions in the batch whose loss was NaN or Inf."""
    num_truncated: int = 0
    """Samples whose prompt lost its start to max_length in some stage."""
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
        self.sched = core.make_scheduler(self.opt, cfg)
        self.schedule = build_schedule(style, cfg.num_recursive_rounds)
        self.order = [(mb, i) for rnd in range(1, cfg.num_recursive_rounds + 1) for mb in range(cfg.num_microbatches)
                      for i, s in enumerate(self.schedule) if s.round == rnd]
        self.tape: dict[tuple[int, int], _Tape] = {}
        self.rollout_cache: dict = {}
        """Frozen first-stage rollouts per question (`outer.rollout_stage`): computed once, not every step."""
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
                            non_last_loss_weight=c.non_last_loss_weight, batch_size=batch_size,
                            max_length=c.max_length, value_token_weight=c.value_token_weight,
                            rollout_latent_steps=c.rollout_latent_steps, rollout_stages=c.rollout_stages,
                            rollout_cache=self.rollout_cache, rollout_feedback=c.rollout_feedback)

    def _forward(self, mb: int, i: int, samples: list[Sample], batch_size: int, inject_nan: bool,
                 record: bool = True) -> tuple[list[float], list[bool]]:
        step = self.schedule[i]
        inputs = {}
        for marker, edge in step.inputs:
            src = self.role_ranks[split_edge(edge)[0]]
            lengths = self._recv((len(samples),), torch.int64, src).tolist()
            inputs[marker] = Latent(self._recv((sum(lengths), self.agent.hidden_size), self.dtype, src)
                                    .requires_grad_(), lengths)
        with torch.set_grad_enabled(record and not self.cfg.recompute):
            enc = self._encode(step, samples, inputs, batch_size)
            msgs = emit_messages(self.agent, enc.z, step.outputs)
        for edge, msg in msgs.items():
            dst = self.role_ranks[split_edge(edge)[1]]
            self._isend(torch.tensor(enc.lengths, dtype=torch.int64, device=self.device), dst)
            self._isend(msg, dst)
        if record:
            entry = _Tape(inputs, samples)
            if not self.cfg.recompute:
                entry.messages, entry.objective = msgs, enc.objective
            elif not inputs:
                entry.z = enc.z  # no upstream graph: z is this stage's constant input, no need to re-run the model
            self.tape[(mb, i)] = entry
        if inject_nan and enc.sample_losses:
            return [float("nan")] * len(enc.sample_losses), enc.truncated
        return enc.sample_losses, enc.truncated

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
    def _sweep(self, batch: list[Sample], *, train: bool, inject_nan: bool = False, mid_step_hook=None) -> StepStats:
        # Forward sweep (and, when training, the backward sweep), then one all-reduce of the step's statistics:
        # [loss per round | NaN flag per sample | truncation flag per sample].
        R, B = self.cfg.num_recursive_rounds, len(batch)
        micro = split_microbatches(list(range(B)), min(self.cfg.num_microbatches, B))
        stats = torch.zeros(R + 2 * B, dtype=torch.float64, device=self.device)
        ctx = self.meter.track() if self.meter and train else contextlib.nullcontext()
        try:
            with ctx:
                for mb, i in self.order:
                    if self.schedule[i].role != self.role or mb >= len(micro):
                        continue
                    rnd = self.schedule[i].round
                    losses, cuts = self._forward(mb, i, [batch[j] for j in micro[mb]], B, inject_nan and rnd == R,
                                                 record=train)
                    for j, loss in zip(micro[mb], losses):
                        stats[rnd - 1] += loss / B
                        stats[R + j] += float(not math.isfinite(loss))
                    for j, cut in zip(micro[mb], cuts):
                        stats[R + B + j] += float(cut)
                self._flush_sends()
                if train:
                    if mid_step_hook is not None:
                        mid_step_hook()
                    for mb, i in reversed(self.order):
                        if self.schedule[i].role == self.role and mb < len(micro):
                            self._backward(mb, i, B, inject_nan and self.schedule[i].round == R)
                    self._flush_sends()
        finally:
            self.tape.clear()  # a failed step must not pin activations
        dist.all_reduce(stats, group=self.group)
        decoder_rounds = [s.round for s in self.schedule if s.role == self.style.decoder]
        return StepStats([float(stats[r - 1]) for r in decoder_rounds], [j for j in range(B) if stats[R + j] > 0],
                         num_truncated=int((stats[R + B:] > 0).sum()))

    def accumulate(self, batch: list[Sample], *, inject_nan: bool = False, mid_step_hook=None) -> StepStats:
        """Forward and backward sweeps over the batch; link grads land in the fp32 masters."""
        return self._sweep(batch, train=True, inject_nan=inject_nan, mid_step_hook=mid_step_hook)

    def evaluate(self, batch: list[Sample]) -> StepStats:
        """The training loss of a batch without gradients or tape (held-out evaluation); every worker calls it."""
        with torch.no_grad():
            return self._sweep(batch, train=False)

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
    def save_shard(self, path: Path) -> None:
        """This role's outer links (fp32, our key layout) and optimizer/scheduler state."""
        tensors = {f"outer.{e}.{k}": v.detach().float().cpu().contiguous()
                   for e, m in self.masters.items() for k, v in m.state_dict().items()}
        save_file(tensors, str(path / f"outer-{self.role}.safetensors"))
        core.save_optim(path, self.role, self.opt, self.sched)

    def links_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """A copy of this role's outer links (the fp32 masters), edge -> state dict."""
        return {e: {k: v.detach().clone() for k, v in m.state_dict().items()} for e, m in self.masters.items()}

    def load_links_state(self, states: dict[str, dict[str, torch.Tensor]]) -> None:
        """Set this role's outer links to `states` (from `links_state`); the optimizer is left as it is."""
        for edge, master in self.masters.items():
            master.load_state_dict(states[edge])
        self._sync_working()

    def load_shard(self, path: Path) -> None:
        """Restore links, optimizer and scheduler from a checkpoint directory."""
        links = read_outer_links(path, roles=[self.role])
        for edge, master in self.masters.items():
            master.load_state_dict(links[edge].state_dict())
        core.load_optim(path, self.role, self.opt, self.sched, map_location=self.device)
        self._sync_working()

    def frozen_digest(self) -> str:
        """sha256 over the base model and inner link parameters (they must never change)."""
        return frozen_digest(self.agent)

    def memory_stats(self) -> dict:
        """Peak saved-activation bytes (tape), peak RSS, CUDA peak (GPU runs)."""
        out = {"peak_saved_bytes": self.meter.peak if self.meter else None,
               "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        if self.device.type == "cuda":
            out["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(self.device)
        return out


def frozen_digest(agent: Agent) -> str:
    """sha256 over an agent's base model and inner link parameters (training must never change them)."""
    h = hashlib.sha256()
    for mod in (agent.model, agent.inner_link):
        for name, p in mod.state_dict().items():
            h.update(name.encode())
            h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
