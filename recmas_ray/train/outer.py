"""Outer-loop training: the training samples and one stage of the unrolled,
teacher-forced system as a function of its incoming latents.

Every step of `build_schedule(style, R)` is one *stage call* on the role that owns it:

    latents in (one flat block per slot, [sum M_b, D])
      -> per sample: chat(prompt with the latents spliced into its slots, assistant = gold turn of the role),
         left-truncated to max_length tokens
      -> frozen forward (left-padded microbatch) -> H over the gold assistant tokens
      -> z = inner_role(first K of H)                       K = max_latent_tokens
      -> message per output edge: outer_edge(z)              flat [sum K_b, E], sent to the edge's target
      -> decoder role only: CE on its gold answer, weighted 1 in round R and
         non_last_loss_weight / (R - 1) in rounds 1..R-1 (the release: loss_R + 0.1 * mean(loss_1..R-1))

The pipeline workers (`pipeline.py`) call `encode_stage` + `emit_messages` for their own steps; the single-
process reference (`reference.py`) is written separately, per sample, on purpose. A stage with no incoming
latents (round 1) runs the frozen model under no_grad: only its outer links can receive gradient.

Legend: B samples in a microbatch, L padded sequence, T assistant tokens, K kept latents, D role hidden size,
E target hidden size, N = sum over samples of K_b.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from recmas_ray.engine.agent import Agent
from recmas_ray.engine.kv_cache import left_pad
from recmas_ray.engine.links import OuterLink, outer_link_from_state_dict
from recmas_ray.styles import Step, StyleSpec, render_prompt
from recmas_ray.system.checkpoints import LinkSet, group_link_tensors, read_safetensors, save_links
from recmas_ray.train.core import read_state
from recmas_ray.train.data import question_text, role_target, validate_rows

@dataclass
class OuterRunResult:
    """What `pipeline.train_outer` returns (either schedule)."""

    save_dir: Path
    """Final outer links in our format (links.safetensors + manifest.json; --schedule hop_by_hop: links.pt)."""
    checkpoint_dir: str
    """The Ray Train checkpoint they were exported from (a path on the storage filesystem)."""
    metrics: dict
    """Rank 0's last reported metrics (per-worker memory and frozen-weight checks under "workers")."""
    log: list
    """Per-step log: loss, round losses, grad norm, lr, step seconds, truncated samples."""
    eval_log: list
    """Held-out evaluations (--eval_every): step, eval_loss, eval_objective, num_eval_rows."""


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
    return [Sample(str(row.get("id", i)), question_text(row), {r: role_target(style, r, row) for r in style.roles})
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
    truncated: list[bool]
    """Per sample: the prompt was longer than max_length and lost its start."""


def truncate_left(e_LD: torch.Tensor, ids_L: torch.Tensor, asst_L: torch.Tensor, max_length: int):
    """Keep the last max_length positions (the gold turn survives; the prompt loses its start); a first kept
    position inside the turn has no predecessor and is no longer supervised. Returns (e, ids, asst, cut)."""
    cut = e_LD.shape[0] - max_length
    if cut <= 0:
        return e_LD, ids_L, asst_L, False
    asst_L = asst_L[cut:].clone()
    asst_L[0] = False
    return e_LD[cut:], ids_L[cut:], asst_L, True


def encode_stage(agent: Agent, style: StyleSpec, step: Step, samples: list[Sample], latents: dict[str, Latent], *,
                 task: str, num_rounds: int, max_latent_tokens: int, non_last_loss_weight: float,
                 batch_size: int, max_length: int = 1 << 20, value_token_weight: float = 1.0,
                 rollout_latent_steps: int = 0, rollout_stages: str = "first",
                 rollout_cache: dict | None = None, rollout_feedback: str = "graph") -> Encoded:
    """Teacher-forced pass of one schedule step over a microbatch; see the module docstring.
    `rollout_latent_steps` > 0 (non-reference): a non-decoder stage without incoming latents sends its latent
    rollout from the prompt instead (`rollout_stage`; memoised per question in `rollout_cache`: the stage and
    its input are frozen). With `rollout_stages="all"` every message is what inference sends: a stage with
    incoming latents sends its rollout from its prompt with those latents spliced in, graph kept
    (`rollout_stage_with_grad`), and the decoder's feedback (rounds < R) is its rollout too, not its hidden
    states over the gold answer; the decoder's loss stays teacher-forced on the gold answer. `rollout_feedback`
    "detached" (non-reference) cuts each rollout step's fed-back inner(h) from the graph there."""
    if rollout_latent_steps and not latents and step.role != style.decoder:
        return rollout_stage(agent, style, step, samples, task=task, num_steps=rollout_latent_steps,
                             cache=rollout_cache)
    if rollout_latent_steps and rollout_stages == "all":
        sent = rollout_stage_with_grad(agent, style, step, samples, latents, task=task,
                                       num_steps=rollout_latent_steps,
                                       detach_feedback=rollout_feedback == "detached") if step.outputs else None
        if step.role != style.decoder:
            return sent
        told = encode_stage(agent, style, step, samples, latents, task=task, num_rounds=num_rounds,
                            max_latent_tokens=max_latent_tokens, non_last_loss_weight=non_last_loss_weight,
                            batch_size=batch_size, max_length=max_length, value_token_weight=value_token_weight)
        if sent is None:
            return told
        return Encoded(sent.z, sent.lengths, told.objective, told.sample_losses, told.truncated)
    per_sample = {m: torch.split(lat.flat, lat.lengths) for m, lat in latents.items()}
    # Without incoming latents nothing upstream is trainable: run the frozen model without a graph.
    track = torch.is_grad_enabled() and any(lat.flat.requires_grad for lat in latents.values())
    with torch.set_grad_enabled(track):
        rows, ids, asst, truncated = [], [], [], []
        for b, s in enumerate(samples):
            user = render_prompt(style, step.role, step.variant, task, s.question)
            e_LD, ids_L, asst_L, cut = truncate_left(*agent.embed_teacher_forced(
                user, {m: blocks[b] for m, blocks in per_sample.items()}, s.targets[step.role]), max_length)
            truncated.append(cut)
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
            sizes = [len(p) for p in pos]
            ce_B = torch.stack([chunk.mean() for chunk in torch.split(nll, sizes)])
            sample_losses = [float(x) for x in ce_B.detach()]
            if value_token_weight != 1.0:  # non-reference: the answer's value tokens count more than its wording
                w = value_token_weights(agent.tokenizer, gold.tolist(), value_token_weight).to(nll.device)
                ce_B = torch.stack([(n * v).sum() / v.sum() for n, v in zip(torch.split(nll, sizes),
                                                                           torch.split(w, sizes))])
            if weight > 0:
                objective = ce_B.sum() * (weight / batch_size)
    return Encoded(z_ND, lengths, objective, sample_losses, truncated)


@torch.no_grad()
def rollout_stage(agent: Agent, style: StyleSpec, step: Step, samples: list[Sample], *, task: str,
                  num_steps: int, cache: dict | None = None) -> Encoded:
    """z = inner(H) of the m-step latent rollout from each sample's prompt: what `AgentService.rollout` sends
    at inference (no gold turn read, nothing trainable upstream, so no graph). `cache` (prompt -> z [m, D])
    keeps each question's z: frozen model, frozen inner link, no input latents, so it never changes."""
    users = [render_prompt(style, step.role, step.variant, task, s.question) for s in samples]
    keys = [(agent.role, num_steps, u) for u in users]
    todo = [b for b, k in enumerate(keys) if cache is None or k not in cache]
    got = {}
    if todo:
        e_BLD, mask_BL = agent.embed_batch([users[b] for b in todo])
        z_BMD = agent.inner_link(agent.latent_rollout(e_BLD, mask_BL, num_steps))
        got = {b: z_BMD[i] for i, b in enumerate(todo)}
        if cache is not None:
            cache.update({keys[b]: z for b, z in got.items()})
    z_ND = torch.cat([got[b] if b in got else cache[keys[b]] for b in range(len(samples))])
    return Encoded(z_ND, [num_steps] * len(samples), None, [], [False] * len(samples))


def rollout_stage_with_grad(agent: Agent, style: StyleSpec, step: Step, samples: list[Sample],
                            latents: dict[str, Latent], *, task: str, num_steps: int,
                            detach_feedback: bool = False) -> Encoded:
    """z = inner(H) of the m-step rollout from each sample's prompt with its incoming latents spliced into the
    slots (what inference sends), keeping the graph back to those latents when grad is enabled and they
    require it. Non-reference (the release's stages read their gold turn). `detach_feedback`: see
    `Agent.latent_rollout_with_grad`."""
    per_sample = {m: torch.split(lat.flat, lat.lengths) for m, lat in latents.items()}
    track = torch.is_grad_enabled() and any(lat.flat.requires_grad for lat in latents.values())
    with torch.set_grad_enabled(track):
        rows = [agent.embed_prompt(render_prompt(style, step.role, step.variant, task, s.question),
                                   {m: blocks[b] for m, blocks in per_sample.items()})[0]
                for b, s in enumerate(samples)]
        e_BLD, mask_BL = left_pad(rows)
        h_BMD = agent.latent_rollout_with_grad(e_BLD, mask_BL, num_steps, detach_feedback=detach_feedback)
        z_ND = agent.inner_link(h_BMD).reshape(-1, h_BMD.shape[-1])
    return Encoded(z_ND, [num_steps] * len(samples), None, [], [False] * len(samples))


def value_token_weights(tokenizer, token_ids: list[int], weight: float) -> torch.Tensor:
    """Per-token loss weights: `weight` for tokens whose text holds a digit (the answer's value), 1 otherwise."""
    pieces = [tokenizer.decode([t]) for t in token_ids]
    return torch.tensor([weight if any(c.isdigit() for c in p) else 1.0 for p in pieces], dtype=torch.float32)


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
        groups |= {name: sd for (_, name), sd in group_link_tensors(read_safetensors(f)).items()}
    return {e: outer_link_from_state_dict(sd, what=f"{path}: outer link {e}") for e, sd in groups.items()}


def export_checkpoint(ckpt_dir: Path, save_dir: Path, manifest: dict) -> Path:
    """Merge the role shards of a pipeline checkpoint into one link checkpoint (`load_links` format)."""
    state = read_state(ckpt_dir)
    full = {**manifest, "kind": "outer", "step": state["step"], "log": state["log"],
            **({"chosen": state["chosen"]} if state.get("chosen") else {})}
    return save_links(save_dir, LinkSet(outer=read_outer_links(ckpt_dir)), full)
