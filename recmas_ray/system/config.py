"""`SystemConfig`: the one section of a job config that chooses a system.

Style, base models (preset and per-role `role_models`), links (`links`, `ckpt_override`), prompt set, device,
dtypes and seed: what `plan_system(cfg.system, task=...)` turns into a `SystemPlan`. Every job that builds a
system nests it whole as `system: SystemConfig`; its fields keep their plain flags (`--style`, `--seed`, ...,
declared in `SHORT_FLAGS`) next to the dotted ones (`--system.style`). `role_models` has no plain flag of its
own: each job keeps the spelling it always had as an alias (`--models` / `--role_model`).

A job reads only some of the fields (training runs no `--device`, only Serve reads `links`): its config class
names them in `SYSTEM_FIELDS`; the others get no flag, and `check_tree` refuses a value set for one of them
(from a `--config` file or a Python caller), which would be silently ignored.

Lives on the system floor (not in `config/`) because its checks need the styles' names.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Annotated

from recmas_ray.config.checks import ExistingPath, OneOf, Range
from recmas_ray.config.choices import DEVICES, DTYPES, MESSAGE_DTYPES, MODEL_PRESETS
from recmas_ray.styles import check_role_models, get_style, style_names
from recmas_ray.system.hub import links_overrides, looks_like_hub_id, resolve_overrides


@dataclass(kw_only=True)
class SystemConfig:
    """Which system a job runs: style, base models, links, prompts, device, dtypes and seed."""

    SHORT_FLAGS = ("style", "preset", "ckpt_override", "links", "allow_base_model_mismatch", "allow_style_mismatch",
                   "allow_task_mismatch", "prompt_set",
                   "device", "dtype", "message_dtype", "seed", "continuous_batching")
    """Fields with a plain flag (`--name`) wherever this section is nested (config/cli.py); `role_models`
    gets the job's own spelling as an alias instead."""

    style: Annotated[str, OneOf(style_names)]
    """Collaboration style (sequential[_light|_scaled], mixture, distillation, deliberation; aliases hie,
    distill)."""
    preset: Annotated[str, OneOf(MODEL_PRESETS)] = "tiny"
    """Base models of the roles that role_models or a checkpoint manifest does not name: tiny (random
    weights), demo (small real models) or paper."""
    role_models: dict[str, str] = field(default_factory=dict)
    """ROLE=MODEL base model per role (HF id, local dir, tiny:<family>, pkg:<name>) over the preset and the
    checkpoints' manifests; a role whose checkpoint names another base model is an error (see
    allow_base_model_mismatch). Recorded in results and saved manifests."""
    ckpt_override: dict[str, str] = field(default_factory=dict)
    """ROLE=DIR inner links (ours or the release's adapter.pt; its manifest names the base model) and, where
    the job takes them, outer=DIR outer links; a DIR may be a Hub repo id ORG/NAME[@REVISION][:SUBFOLDER]
    where the job resolves those."""
    links: str | None = None
    """Folder of per-role link folders (planner/, ..., outer/) or a Hub id ORG/NAME[@REVISION][:SUBFOLDER];
    ckpt_override wins over it per role. The folder `train_inner --save_dir DIR` + `train_outer --links DIR` write.
    """
    allow_base_model_mismatch: bool = False
    """Run the model given in role_models even where the role's checkpoint names another one (its link
    sizes are still checked)."""
    allow_style_mismatch: bool = False
    """Load links whose manifest records another style (e.g. trained for sequential, run as sequential_light);
    without it such links are refused."""
    allow_task_mismatch: bool = False
    """Run links under another task type or prompt set than their manifests record (refused otherwise: a link
    learns the prompts it was trained under, `system/trained.py`)."""
    prompt_set: Annotated[str | None, ExistingPath()] = None
    """YAML or JSON prompt set (role -> variant -> task -> template), checked against the style's slots
    before any model loads; unset: the project's own prompts."""
    device: Annotated[str, OneOf(DEVICES)] = "auto"
    """Where agents run: auto (CUDA when present), cpu or cuda."""
    dtype: Annotated[str, OneOf(DTYPES)] = "auto"
    """Model dtype: auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16 or float16."""
    message_dtype: Annotated[str, OneOf(MESSAGE_DTYPES)] = "auto"
    """Dtype of the latent messages between agents: auto (bf16 on CUDA, fp32 on CPU), bf16 (half the
    bytes) or fp32; receivers compute in their own model dtype."""
    seed: Annotated[int, Range(0, 2**32 - 1)] = 42
    """Seed of fresh links (and, per job, of sampling or the data order)."""
    continuous_batching: bool = True
    """Each agent runs the rollouts and decodes of every call in flight together, one shared forward per step
    (recmas_ray/engine/scheduler.py), and on Ray the calls of several batches to one agent leave as one Ray call (bulk
    dispatch); same latents and greedy text. --no_continuous_batching: one call at a time per agent."""

    def check_link_folders(self) -> None:
        """links and every ckpt_override name an existing folder or a Hub id (checked before Ray or a model
        starts); a file where a folder belongs is named as such."""
        named = [("--links ", self.links)] if self.links else []
        named += [(f"--ckpt_override {r}=", p) for r, p in self.ckpt_override.items()]
        for flag, path in named:
            if os.path.isdir(path) or looks_like_hub_id(path):
                continue
            if os.path.exists(path):
                raise ValueError(f"{flag}{path}: is a file; expected a folder of links (or a Hub id ORG/NAME)")
            raise ValueError(f"{flag}{path}: no such folder (nor a Hub id ORG/NAME)")

    def check_tables(self, role_models_flag: str, *, ckpt_extra: tuple[str, ...] = ()) -> None:
        """Every key of role_models and ckpt_override a role of the style (ckpt_override also `ckpt_extra`),
        text values only; errors name `role_models_flag`, the job's spelling of role_models."""
        check_role_models(role_models_flag, self.role_models, self.style)
        check_role_models("--ckpt_override", self.ckpt_override, self.style, extra=ckpt_extra)

    def link_folders(self) -> dict[str, str]:
        """ROLE/outer -> link folder: the folders of `links` (local or Hub, fetched) with ckpt_override over them
        per role, every Hub id resolved to its local copy. What `plan_system(ckpt_override=...)` loads."""
        found = links_overrides(self.links, get_style(self.style).roles) if self.links else {}
        return resolve_overrides({**found, **self.ckpt_override})


def system_fields(cls) -> frozenset[str]:
    """The `SystemConfig` fields a job config class reads (its `SYSTEM_FIELDS`, else all)."""
    return frozenset(getattr(cls, "SYSTEM_FIELDS", [f.name for f in dataclasses.fields(SystemConfig)]))


def with_system(cls, **values):
    """`cls(**values)` where `values` may name the fields of its system section flat (`style=`, `seed=`,
    `role_models=`), as the plain flags do; they go into `system`, over the one given or the class's default.
    For Python callers (the training API, benchmarks, tests) that hold flat settings."""
    own = {k: values.pop(k) for k in list(values) if k in system_fields(cls)}
    section = values.pop("system", None)
    if section is None:
        spec = next(f for f in dataclasses.fields(cls) if f.name == "system")
        section = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else None
    system = dataclasses.replace(section, **own) if section is not None else SystemConfig(**own)
    return cls(system=system, **values)
