"""Outer-loop training (spec section 8): the run config, the training samples, and one stage of the unrolled,
teacher-forced system as a function of its incoming latents.

Every step of `build_schedule(style, R)` is one *stage call* on the role that owns it:

    latents in (one flat block per slot, [sum M_b, D])
      -> per sample: chat(prompt with the latents spliced into its slots, assistant = gold text of the role)
      -> frozen forward (left-padded microbatch) -> H over the gold assistant tokens
      -> z = inner_role(first K of H)                       K = max_latent_tokens
      -> message per output edge: outer_edge(z)              flat [sum K_b, E], sent to the edge's target
      -> decoder role only: CE on its gold answer, weighted 1 in round R and
         non_last_loss_weight / (R - 1) in rounds 1..R-1 (spec: loss_R + 0.1 * mean(loss_1..R-1))

The pipeline workers (`pipeline.py`) call `encode_stage` + `emit_messages` for their own steps; the single-
process reference (`reference.py`) is written separately, per sample, on purpose. A stage with no incoming
latents (round 1) runs the frozen model under no_grad: only its outer links can receive gradient.

Legend: B samples in a microbatch, L padded sequence, T assistant tokens, K kept latents, D role hidden size,
E target hidden size, N = sum over samples of K_b.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from recmas_ray.agent import Agent, left_pad
from recmas_ray.system.checkpoints import LinkSet, save_links
from recmas_ray.links import OuterLink, outer_link_from_state_dict
from recmas_ray.styles import Step, StyleSpec, get_style, render_prompt
from recmas_ray.styles.base import TASK_TYPES
from recmas_ray.train.data import role_target, validate_rows

TRAIN_STATE = "train_state.json"


@dataclass(kw_only=True)
class OuterTrainConfig:
    """One outer-loop run: the flags of the original `train_outer.py` plus the Ray Train ones."""

    style: str = "sequential"
    """Collaboration style (sequential[_light|_scaled], mixture, distillation, deliberation)."""
    ckpt_overrides: dict[str, str] = field(default_factory=dict)
    """ROLE -> inner checkpoint dir (frozen inner link; the role's base model comes from its manifest);
    "outer" -> an outer checkpoint to start from instead of the seeded init."""
    preset: str = "tiny"
    """Base models of the roles without an inner checkpoint: tiny, demo or paper."""
    task: str = "math"
    """Task type of the prompts: math, code or choice."""
    dataset_name: str = "synthetic:64"
    """Local .json/.jsonl, a HF dataset id (train split) or synthetic[:N] (offline arithmetic set)."""
    dataset_json_field: str | None = None
    """Field holding the rows in a `{"data": [...]}` JSON file."""
    save_dir: str = "checkpoints/outer"
    """Where the final outer links go (links.safetensors + manifest.json; `jobs/run.py --ckpt_override outer=DIR`)."""
    storage_path: str | None = None
    """Ray Train storage (shared disk for multi-node runs); default <save_dir>/_ray_runs."""
    num_recursive_rounds: int = 3
    """R: rounds unrolled in every training step."""
    max_latent_tokens: int = 80
    """K: latents passed between agents are the first K assistant positions."""
    max_steps: int = 20000
    """Optimizer steps (the cosine schedule spans exactly these)."""
    batch_size: int = 2
    """Samples per optimizer step (the loss is their mean)."""
    num_microbatches: int = 1
    """Microbatches per step, pipelined GPipe-style across the role workers (<= batch_size)."""
    lr: float = 5e-4
    """Peak learning rate (reference value; a third-party re-run found 1e-4 more stable, spec section 8)."""
    warmup_steps: int = 10
    """Linear warmup before the cosine decay (num_cycles 0.5)."""
    weight_decay: float = 0.0
    """AdamW weight decay (reference 0)."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip over every outer link on every worker (0 disables)."""
    non_last_loss_weight: float = 0.0
    """0 supervises the final round only (reference default); w adds w * mean(loss of rounds 1..R-1)."""
    seed: int = 42
    """Seed of the link init and of the data order."""
    dtype: str = "auto"
    """Base model dtype: auto (bf16 on CUDA, fp32 on CPU), bfloat16, float32. Outer links keep fp32 masters."""
    recompute: bool = False
    """Keep only each stage's inputs in forward and re-run the stage during backward (flat activation memory)."""
    resume: bool = False
    """Continue from the latest checkpoint of this run in the storage path."""
    use_gpu: bool = False
    """One GPU per role worker (NCCL); otherwise CPU workers with gloo."""
    cpus_per_worker: float = 1.0
    """Logical CPUs reserved per role worker."""
    gpus_per_worker: float = 1.0
    """GPUs reserved per role worker when use_gpu."""
    save_every: int = 100
    """Report a checkpoint every this many steps (and always at the end); 0 = only at the end."""
    stop_at_step: int = 0
    """Stop at this step after saving, keeping the max_steps schedule (continue later with resume); 0 = run on."""
    log_every: int = 1
    """Print a log line every this many steps (rank 0)."""
    max_failures: int = 2
    """Worker-group restarts Ray Train may do; each resumes from the latest checkpoint."""
    num_to_keep: int = 2
    """Checkpoints kept in storage."""
    verify_frozen: bool = False
    """Hash every base model and inner link at start and end and report whether they stayed bit-identical."""
    profile_memory: bool = False
    """Measure the peak memory held for backward per worker (saved activations; CUDA peak on GPU)."""
    fault_kill_rank: int = -1
    """Test hook: this worker rank exits (os._exit) once, mid-step, at fault_kill_step."""
    fault_kill_step: int = 0
    """Test hook: 1-based step at which fault_kill_rank dies (a marker file makes it happen once)."""
    fault_nan_step: int = 0
    """Test hook: make the loss NaN at this 1-based step."""


def validate_config(cfg: OuterTrainConfig) -> StyleSpec:
    """Check the config up front (no models loaded); returns the style."""
    style = get_style(cfg.style)
    if cfg.task not in TASK_TYPES:
        raise ValueError(f"unknown task {cfg.task!r}; expected one of {TASK_TYPES}")
    for name in ("num_recursive_rounds", "max_latent_tokens", "max_steps", "batch_size", "num_microbatches",
                 "log_every"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.num_microbatches > cfg.batch_size:
        raise ValueError(f"--num_microbatches {cfg.num_microbatches} exceeds --batch_size {cfg.batch_size}")
    for name in ("warmup_steps", "save_every", "stop_at_step", "max_grad_norm", "non_last_loss_weight",
                 "max_failures", "weight_decay"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"--{name} must be >= 0, got {getattr(cfg, name)}")
    if not cfg.lr > 0:
        raise ValueError(f"--lr must be > 0, got {cfg.lr}")
    if cfg.storage_path and "://" in cfg.storage_path:
        raise ValueError(f"storage_path {cfg.storage_path!r}: only local or shared-disk paths are supported")
    return style


# ----------------------------------------------------------------------------- data
@dataclass
class Sample:
    """One training row reduced to what the stages read."""

    sample_id: str
    """The row's `id` field if present, else its index in the dataset."""
    question: str
    targets: dict[str, str]
    """role -> gold assistant text."""


def prepare_samples(rows: list[dict], style: StyleSpec, task: str) -> list[Sample]:
    """Validate rows (every role needs its gold text) and keep question, id and one target per role."""
    validate_rows(rows, style, style.roles, task=task)
    return [Sample(str(row.get("id", i)), str(row["question"]), {r: role_target(style, r, row) for r in style.roles})
            for i, row in enumerate(rows)]


def round_loss_weight(rnd: int, num_rounds: int, non_last_loss_weight: float) -> float:
    """Weight of round `rnd`'s decoder CE in the objective."""
    if rnd == num_rounds:
        return 1.0
    return non_last_loss_weight / (num_rounds - 1)


def split_microbatches(items: list, num_microbatches: int) -> list[list]:
    """Contiguous, nearly equal chunks (the first ones one longer)."""
    size, extra = divmod(len(items), num_microbatches)
    out, start = [], 0
    for i in range(num_microbatches):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out


# ----------------------------------------------------------------------------- one stage
@dataclass
class Latent:
    """One edge's message for a microbatch: samples' blocks stacked along the sequence axis."""

    flat: torch.Tensor
    """[N, D] with N = sum(lengths)."""
    lengths: list[int]


@dataclass
class Encoded:
    """What a stage computed before its outer links."""

    z: torch.Tensor
    """inner(first K of H over the gold assistant tokens), flat [N, D]."""
    lengths: list[int]
    objective: torch.Tensor | None
    """This stage's weighted share of the loss (already divided by the global batch size); None if none."""
    sample_losses: list[float]
    """Unweighted per-sample CE (decoder stages only)."""


def encode_stage(agent: Agent, style: StyleSpec, step: Step, samples: list[Sample], latents: dict[str, Latent], *,
                 task: str, num_rounds: int, max_latent_tokens: int, non_last_loss_weight: float,
                 batch_size: int) -> Encoded:
    """Teacher-forced pass of one schedule step over a microbatch; see the module docstring."""
    per_sample = {m: torch.split(lat.flat, lat.lengths) for m, lat in latents.items()}
    # Without incoming latents nothing upstream is trainable: run the frozen model without a graph.
    track = torch.is_grad_enabled() and any(lat.flat.requires_grad for lat in latents.values())
    with torch.set_grad_enabled(track):
        rows, ids, asst = [], [], []
        for b, s in enumerate(samples):
            user = render_prompt(style, step.role, step.variant, task, s.question)
            e_LD, ids_L, asst_L = agent.embed_teacher_forced(user, {m: blocks[b] for m, blocks in per_sample.items()},
                                                             s.targets[step.role])
            rows.append(e_LD)
            ids.append(ids_L)
            asst.append(asst_L)
        e_BLD, mask_BL = left_pad(rows)
        h_BLD = agent.forward_hidden(e_BLD, mask_BL)
        L = h_BLD.shape[1]
        pos = [L - a.shape[0] + torch.nonzero(a).squeeze(1) for a in asst]  # assistant positions, padded coords
        h_ND = torch.cat([h_BLD[b, p[:max_latent_tokens]] for b, p in enumerate(pos)])
        z_ND = agent.inner_link(h_ND)
    lengths = [min(len(p), max_latent_tokens) for p in pos]
    objective, sample_losses = None, []
    if step.role == style.decoder:
        weight = round_loss_weight(step.round, num_rounds, non_last_loss_weight)
        with torch.set_grad_enabled(track and weight > 0):
            # logits at position t predict token t + 1: gather the positions just before each answer token
            pred = torch.cat([h_BLD[b, p - 1] for b, p in enumerate(pos)])
            gold = torch.cat([ids[b][a] for b, a in enumerate(asst)]).to(pred.device)
            nll = F.cross_entropy(agent.logits(pred).float(), gold, reduction="none")
            ce_B = torch.stack([chunk.mean() for chunk in torch.split(nll, [len(p) for p in pos])])
            sample_losses = [float(x) for x in ce_B.detach()]
            if weight > 0:
                objective = ce_B.sum() * (weight / batch_size)
    return Encoded(z_ND, lengths, objective, sample_losses)


def emit_messages(agent: Agent, z_ND: torch.Tensor, edges: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """outer_edge(z) for each output edge (the trainable part of a stage)."""
    return {e: agent.outer_links[e](z_ND) for e in edges}


# ----------------------------------------------------------------------------- memory meter
class SavedTensorMeter:
    """Peak bytes of tensors saved for backward (the activation memory a stage tape pins), deduplicated by storage.

    Used as `with meter.track(): ...` around forward and backward; works on CPU, where torch has no
    allocator statistics. Freed graphs release their saved tensors, which the weakref finalizers count.
    """

    def __init__(self, *, exclude: set[int] = frozenset()):
        self.exclude = set(exclude)
        """Storage pointers not to count (frozen weights that backward saves but that are not activations)."""
        self.live: dict[int, list] = {}
        self.current = 0
        self.peak = 0

    def _release(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self.live[key]

    def _pack(self, t: torch.Tensor):
        import weakref

        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.exclude:
            return _Box(t)
        entry = self.live.setdefault(key, [storage.nbytes(), 0])
        if entry[1] == 0:
            self.current += entry[0]
            self.peak = max(self.peak, self.current)
        entry[1] += 1
        box = _Box(t)
        weakref.finalize(box, self._release, key)
        return box

    def track(self):
        """Context manager installing the saved-tensor hooks."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda box: box.t)


class _Box:
    __slots__ = ("t", "__weakref__")

    def __init__(self, t):
        self.t = t


def lr_lambda(step: int, *, warmup_steps: int, max_steps: int) -> float:
    """HF `get_cosine_schedule_with_warmup` (num_cycles 0.5): 0 at step 0 when warming up, 0 at max_steps."""
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def step_indices(num_rows: int, step: int, batch_size: int, seed: int) -> list[int]:
    """Row indices of 0-based step `step`: a fresh permutation per epoch seeded by (seed, epoch), drop_last.

    A pure function of (seed, step), so a resumed run sees the same batches as an uninterrupted one.
    """
    from recmas_ray.system.checkpoints import stable_seed

    steps_per_epoch = num_rows // batch_size
    if steps_per_epoch < 1:
        raise ValueError(f"{num_rows} rows cannot fill one batch of {batch_size}")
    epoch, pos = divmod(step, steps_per_epoch)
    gen = torch.Generator().manual_seed(stable_seed(seed, f"outer-epoch:{epoch}"))
    return torch.randperm(num_rows, generator=gen)[pos * batch_size:(pos + 1) * batch_size].tolist()


# ----------------------------------------------------------------------------- checkpoint files
# A pipeline checkpoint directory holds one shard per role (outer-<role>.safetensors with our key layout,
# optim-<role>.pt) plus train_state.json from rank 0; `export_checkpoint` merges it into `load_links` format.
def read_outer_links(path: str | os.PathLike, roles=None) -> dict[str, OuterLink]:
    """Outer links from a pipeline checkpoint directory (one shard per role)."""
    path = Path(path)
    files = sorted(path.glob("outer-*.safetensors")) if roles is None else \
        [path / f"outer-{r}.safetensors" for r in roles]
    groups: dict[str, dict] = {}
    for f in files:
        if not f.exists():
            raise ValueError(f"checkpoint {path} has no shard {f.name}")
        for key, value in load_file(str(f)).items():
            _, rest = key.split(".", 1)
            edge, param = rest.rsplit(".", 2)[0], ".".join(rest.rsplit(".", 2)[1:])
            groups.setdefault(edge, {})[param] = value
    return {e: outer_link_from_state_dict(sd, what=f"{path}: outer link {e}") for e, sd in groups.items()}


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The complete checkpoint (train state and every role's shards) with the highest step, or None."""
    def complete(p: Path) -> bool:
        if not (p / TRAIN_STATE).exists():
            return False
        roles = json.loads((p / TRAIN_STATE).read_text()).get("roles", {})
        return all((p / f"outer-{r}.safetensors").exists() and (p / f"optim-{r}.pt").exists() for r in roles)

    done = [p for p in Path(run_dir).glob("checkpoint_*") if complete(p)]
    return max(done, key=lambda p: p.name) if done else None


def export_checkpoint(ckpt_dir: Path, save_dir: Path, manifest: dict) -> Path:
    """Merge the role shards of a pipeline checkpoint into one link checkpoint (`load_links` format)."""
    state = json.loads((Path(ckpt_dir) / TRAIN_STATE).read_text())
    full = {**manifest, "kind": "outer", "step": state["step"], "log": state["log"]}
    return save_links(save_dir, LinkSet(outer=read_outer_links(ckpt_dir)), full)
