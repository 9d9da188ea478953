"""How agent actors are placed: the `PlacementConfig` leaf type (flags `--placement`, `--role_gpus`, ...).

A plain dataclass with no Ray import, so every job config can hold it; `distributed/placement.py` turns it
into placement groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from recmas_ray.config.checks import OneOf, Range
from recmas_ray.config.inputs import check_cuda

PRESETS = ("one_gpu_per_agent", "colocated", "spread", "cpu")


@dataclass(kw_only=True)
class PlacementConfig:
    """Where agent actors go, what each one asks for, and how many copies of the system run."""

    SHORT_FLAGS = ("agent_max_restarts", "auto_role_replicas", "autoscaling", "cpus_per_agent", "num_replicas",
                   "placement_timeout_s", "ready_timeout_s", "role_cpus", "role_gpus", "role_replicas")
    """Fields with a plain flag (`--name`) wherever this section is nested (config/cli.py)."""

    preset: Annotated[str, OneOf(PRESETS)] = "cpu"
    """one_gpu_per_agent, colocated, spread or cpu (applies to every replica)."""
    role_gpus: Annotated[dict[str, float], Range(0, 64)] = field(default_factory=dict)
    """Per-role GPU override, e.g. {"science": 1, "math": 0.5}; above 1 a whole number K, and the
    role's model is split over its K GPUs (device map)."""
    role_cpus: Annotated[dict[str, float], Range(0, 1024)] = field(default_factory=dict)
    """Per-role logical CPU override."""
    cpus_per_agent: Annotated[float, Range(0, 1024)] = 0.25
    """Logical CPUs per agent actor (fractions leave room for Ray Data read tasks)."""
    role_replicas: Annotated[dict[str, int], Range(1, 64)] = field(default_factory=dict)
    """Actor copies of a role inside each replica (role copies), e.g. {"solver": 3}: each batch's
    steps for that role go to its least-loaded copy, and stay there (distributed/role_copies.py)."""
    auto_role_replicas: bool = False
    """Size every role's copies (roles not named in role_replicas) from its cost per batch, parameters x
    tokens (sim: agents: their configured times), the cheapest role one copy."""
    num_replicas: Annotated[int, Range(0, 1024)] = 1
    """Independent copies of the system (own placement group and orchestrator each); batches go to
    whichever replica is free. 0 = auto: as many as the cluster's resources hold now."""
    ready_timeout_s: Annotated[float, Range(0, 86400, lo_open=True)] = 180.0
    """Seconds to wait for each actor to load its model and answer ready() (and for a placement
    group on a cluster that cannot grow)."""
    autoscaling: bool | None = None
    """The cluster can grow (an autoscaler is configured): requests wait for resources instead of
    failing at once. Unset: detected from the Ray cluster."""
    placement_timeout_s: Annotated[float, Range(0, 7 * 86400, lo_open=True)] = 1800.0
    """With autoscaling: seconds to wait for each replica's placement group, progress every 30 s."""
    gpu_memory_gib: Annotated[float | None, Range(0, 1 << 20, lo_open=True)] = None
    """Memory of one GPU for the memory plan (`--dry_run`, and the check before agents load); unset: read from
    the GPUs (torch on this machine, else a short probe per GPU node)."""
    plan_node_gpus: Annotated[list[int], Range(1, 1024)] = field(default_factory=list)
    """The GPUs of each node of the machine(s) a `--dry_run` plans for, e.g. 8 (one node of 8 GPUs) or 8,8 (two
    nodes), with their memory in --placement.gpu_memory_gib: the plan then needs no Ray and no GPU here (plan a GPU
    deployment from a laptop). Empty: the connected Ray cluster's GPUs (a private local cluster: this machine's)."""
    plan_prompt_tokens: Annotated[int, Range(1, 10_000_000)] = 1024
    """Prompt tokens per question (template + question) the memory plan reserves KV for, besides the latent
    positions and the decode budget."""
    agent_max_restarts: Annotated[int, Range(-1, 10_000)] = 2
    """Restarts of a crashed agent actor (it reloads its model; idempotent calls are retried); -1
    no limit, 0 fail fast. Ray Direct Transport agents never restart (their latents live in them)."""

    def validate(self) -> None:
        """Settings that do not depend on the style."""
        if self.plan_node_gpus and not self.gpu_memory_gib:
            raise ValueError(f"--placement.plan_node_gpus {','.join(map(str, self.plan_node_gpus))} plans for GPUs "
                             "this machine may not have: give their memory with --placement.gpu_memory_gib GIB")
        if self.preset == "cpu" and any(v > 0 for v in self.role_gpus.values()):
            raise ValueError("--placement cpu cannot give GPUs to roles (--role_gpus); use one_gpu_per_agent "
                             "or colocated")
        odd = {r: g for r, g in self.role_gpus.items() if g > 1 and g != int(g)}
        if odd:
            raise ValueError(f"--role_gpus {' '.join(f'{r}={g:g}' for r, g in odd.items())}: above one GPU a role "
                             "needs a whole number of GPUs (its model is split over them)")

    def wants_gpus(self) -> bool:
        """Whether this placement asks Ray for GPUs (a GPU preset, or a role given some)."""
        return self.preset != "cpu" or any(g > 0 for g in self.role_gpus.values())

    def check_gpus_visible(self, backend: str, *, dry_run: bool = False) -> None:
        """A GPU placement on a local Ray cluster of a machine without CUDA is refused before Ray starts (on a
        named cluster the GPUs live on other nodes: Ray's own resource check answers there; a dry run with
        --placement.plan_node_gpus plans for other machines' GPUs). `plan_node_gpus` outside a dry run is
        refused: a real run places agents on the GPUs it finds."""
        if self.plan_node_gpus and not dry_run:
            raise ValueError(f"--placement.plan_node_gpus {','.join(map(str, self.plan_node_gpus))} is for --dry_run "
                             "(a plan for other machines' GPUs); a real run uses the GPUs of its Ray cluster: drop it "
                             "or add --dry_run")
        if dry_run and self.plan_node_gpus:
            return
        if backend == "ray" and self.wants_gpus():
            gpus = {r: g for r, g in self.role_gpus.items() if g > 0}
            check_cuda(f"--placement {self.preset}" if self.preset != "cpu" else
                       "--role_gpus " + " ".join(f"{r}={g:g}" for r, g in gpus.items()),
                       "places agents on GPUs", on_cluster=True, plan_hint=dry_run)

    def check_roles(self, roles) -> None:
        """Per-role overrides must name roles of the style."""
        self.validate()
        for name, table in (("role_gpus", self.role_gpus), ("role_cpus", self.role_cpus),
                            ("role_replicas", self.role_replicas)):
            bad = [r for r in table if r not in roles]
            if bad:
                raise ValueError(f"--{name} names {bad}, not roles of this style {list(roles)}")
