"""The memory plan: which roles and copies land on which GPU, and the bytes each needs, before any weight loads.

Per agent actor (one copy of a role), from its model's config alone (the model is built on the meta device, so
no weights are read):
  weights   parameters x bytes per value (dtype auto = bf16 on GPUs), plus the role's inner and outer links
  KV        rows x tokens x 2 (K and V) x layers x KV heads x head dim x bytes, where rows = batch size x the
            calls an agent runs at once (1, or the batches in flight with continuous batching) and tokens =
            prompt tokens + the latent positions spliced in + its own latent steps (or, for the decoder, its
            decode budget when larger)
  prefix    the prompt-prefix KV cache it may fill (`EngineConfig.prefix_cache_mib`)
  context   an allowance for the CUDA context and allocator slack of each process on each GPU it uses
A role split over K GPUs puts 1/K of its weights and KV on each. Actors are assigned to GPUs the way Ray hands
out GPU instances: a replica's bundles on one node when they fit there (STRICT_PACK, as `distributed/placement.py`
creates them), else bundle by bundle, whole GPUs to requests of 1 or more and fractions first-fit on a GPU with
room. `check_fit` refuses a plan whose busiest GPU needs more than the GPU holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from recmas_ray.config.engine import EngineConfig
from recmas_ray.models.registry import model_kind

GIB = 1 << 30
CUDA_CONTEXT_BYTES = 512 << 20
"""Allowance per process per GPU for the CUDA context, kernels and allocator slack (not measured here: PyTorch's
context alone takes a few hundred MiB depending on driver and GPU; raise `--gpu_memory_gib` headroom if yours
needs more)."""
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}


@dataclass
class RoleMemory:
    """Estimated bytes of one actor copy of a role (all of its GPUs together)."""

    role: str
    model: str
    weight_bytes: int
    kv_bytes: int
    prefix_bytes: int
    rows: int
    tokens_per_row: int
    num_gpus: float

    @property
    def total(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.prefix_bytes


@dataclass
class GpuShare:
    """What one actor puts on one GPU."""

    replica: int
    role: str
    copy: int
    weight_bytes: int
    kv_bytes: int
    other_bytes: int

    @property
    def total(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.other_bytes


@dataclass
class MemoryPlan:
    """Per GPU (node index, GPU index on the node): the actors' shares; `capacity` bytes per GPU when known."""

    gpus: dict[tuple[int, int], list[GpuShare]] = field(default_factory=dict)
    roles: dict[str, RoleMemory] = field(default_factory=dict)
    capacity: int | None = None

    def used(self, gpu: tuple[int, int]) -> int:
        return sum(s.total for s in self.gpus[gpu])

    def lines(self) -> list[str]:
        """The plan as printed by `--dry_run`: one line per GPU, then the per-role estimate it comes from."""
        cap = f" of {self.capacity / GIB:.1f} GiB" if self.capacity else " (GPU memory unknown: not checked)"
        out = []
        for (node, gpu), shares in sorted(self.gpus.items()):
            used = self.used((node, gpu))
            parts = ", ".join(f"{s.role}#{s.copy} r{s.replica} (weights {_gib(s.weight_bytes)} + KV "
                              f"{_gib(s.kv_bytes)} + other {_gib(s.other_bytes)})" for s in shares)
            flag = "  DOES NOT FIT" if self.capacity and used > self.capacity else ""
            out.append(f"node {node} GPU {gpu}: {_gib(used)}{cap}: {parts}{flag}")
        for r in self.roles.values():
            out.append(f"  {r.role} ({r.model}): weights {_gib(r.weight_bytes)}, KV {_gib(r.kv_bytes)} "
                       f"({r.rows} rows x {r.tokens_per_row} tokens), prefix cache {_gib(r.prefix_bytes)}"
                       + (f", {r.num_gpus:g} GPU per copy" if r.num_gpus else ""))
        return out

    def check_fit(self) -> None:
        """ValueError (one line) naming the fullest GPU when it needs more than `capacity`."""
        if not self.capacity or not self.gpus:
            return
        worst = max(self.gpus, key=self.used)
        need = self.used(worst)
        if need > self.capacity:
            who = ", ".join(f"{s.role}#{s.copy} r{s.replica} {_gib(s.total)}" for s in self.gpus[worst])
            raise ValueError(f"memory plan: node {worst[0]} GPU {worst[1]} needs {_gib(need)} ({who}) but a GPU "
                             f"holds {_gib(self.capacity)}; give roles more GPUs (--role_gpus ROLE=K), fewer copies "
                             "or a smaller --batch_size (python -m jobs.run --dry_run ... prints the whole plan)")


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB // 10 else f"{n / (1 << 20):.1f} MiB"


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a model: parameters and the KV bytes of one token, per value of its dtype."""

    num_params: int
    kv_values_per_token: int
    """2 (K and V) x layers x KV heads x head dim."""


def model_shape(name: str) -> ModelShape:
    """From the model's config: the model is built on the meta device (no weights read) to count parameters."""
    kind = model_kind(name)
    if not kind.has_weights:  # stand-in agents (cost-simulated) hold no model
        return ModelShape(0, 0)

    config = AutoConfig.from_pretrained(kind.path(name))
    with torch.device("meta"):  # (accelerate's init_empty_weights unties tied embeddings: counted twice)
        model = AutoModelForCausalLM.from_config(config)
    num_params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    text = config.get_text_config()
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    return ModelShape(int(num_params), 2 * int(text.num_hidden_layers) * kv_heads * head_dim)


def role_memory(plan, *, rows: int, prompt_tokens: int, latent_steps: int, max_new_tokens: int,
                gpus: dict[str, float], shapes: dict[str, ModelShape] | None = None,
                gpu: bool = True) -> dict[str, RoleMemory]:
    """Estimated bytes of one copy of each role of `plan` (a `SystemPlan`): dtype auto is bf16 on GPUs, fp32 on
    CPUs (`models.loader.resolve_dtype`)."""
    shapes = shapes or {}
    out = {}
    for role in plan.style.roles:
        spec = plan.specs[role]
        shape = shapes.get(role) or model_shape(spec.model_name)
        per_value = DTYPE_BYTES.get(spec.dtype, 2 if gpu else 4)
        links = sum(p.numel() for p in plan.links.inner[role].parameters())
        links += sum(p.numel() for e, m in plan.links.outer.items() if e.split("->")[0] == role
                     for p in m.parameters())
        num_slots = len(plan.style.slots.get(role, {}))
        own = max(latent_steps, max_new_tokens) if role == plan.style.decoder else latent_steps
        tokens = prompt_tokens + num_slots * latent_steps + own
        out[role] = RoleMemory(role, spec.model_name, (shape.num_params + links) * per_value,
                               rows * tokens * shape.kv_values_per_token * per_value,
                               int(EngineConfig().prefix_cache_mib * (1 << 20)) if shape.num_params else 0,
                               rows, tokens, gpus.get(role, 0.0))
    return out


class GpuShortfall(ValueError):
    """The cluster's GPUs cannot hold the actors at all (whatever their memory)."""


def assign_gpus(pplan, node_gpus: list[int], num_replicas: int, strict: bool) -> list[tuple[int, str, int, int, list]]:
    """(replica, role, copy, node, [(gpu, fraction), ...]) for every GPU actor of `num_replicas` replicas of
    `pplan` (a `PlacementPlan`) on nodes with `node_gpus` GPUs each; ValueError when they do not fit."""
    free = [[1.0] * n for n in node_gpus]
    out = []
    actors = [(role, k, pplan.gpus[role]) for role, bundles in pplan.copy_bundles.items()
              for k in range(len(bundles)) if pplan.gpus[role] > 0]
    need = sum(g for _, _, g in actors)
    for replica in range(num_replicas):
        nodes = range(len(free))
        if strict:  # the whole replica on the first node with room for it
            nodes = [n for n in nodes if sum(free[n]) + 1e-9 >= need][:1] or list(nodes)
        for role, k, g in actors:
            for node in nodes:
                placed = _take_gpus(free[node], g)
                if placed is not None:
                    out.append((replica, role, k, node, placed))
                    break
            else:
                raise GpuShortfall(f"memory plan: {role} copy {k} of replica {replica} ({g:g} GPU) finds no GPU with "
                                 f"room on nodes with {node_gpus} GPUs")
    return out


def _take_gpus(free: list[float], g: float) -> list | None:
    """Take `g` GPUs from one node's free fractions: whole ones for g >= 1, else first fit; None if no room."""
    if g >= 1:
        whole = [i for i, f in enumerate(free) if f >= 1 - 1e-9][:int(math.floor(g + 1e-9))]
        if len(whole) < int(math.floor(g + 1e-9)):
            return None
        for i in whole:
            free[i] = 0.0
        return [(i, 1.0) for i in whole]
    i = next((i for i, f in enumerate(free) if f + 1e-9 >= g), None)
    if i is None:
        return None
    free[i] -= g
    return [(i, g)]


def memory_plan(plan, pplan, node_gpus: list[int], *, num_replicas: int, rows: int, prompt_tokens: int,
                latent_steps: int, max_new_tokens: int, capacity: int | None, strict: bool = True,
                shapes: dict[str, ModelShape] | None = None) -> MemoryPlan:
    """Place every GPU actor and add up each GPU's bytes (see the module docstring)."""
    roles = role_memory(plan, rows=rows, prompt_tokens=prompt_tokens, latent_steps=latent_steps,
                        max_new_tokens=max_new_tokens, gpus=pplan.gpus, shapes=shapes)
    out = MemoryPlan(roles=roles, capacity=capacity)
    for replica, role, k, node, placed in assign_gpus(pplan, node_gpus, num_replicas, strict):
        mem, share = roles[role], 1.0 / len(placed)
        for gpu, _ in placed:
            out.gpus.setdefault((node, gpu), []).append(GpuShare(
                replica, role, k, int(mem.weight_bytes * share), int(mem.kv_bytes * share),
                int(mem.prefix_bytes * share) + (CUDA_CONTEXT_BYTES if mem.weight_bytes else 0)))
    return out
