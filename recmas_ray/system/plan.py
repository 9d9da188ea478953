"""Plan a multi-agent system: base model per role, hidden sizes, links (fresh or from checkpoints).

The plan is pure data (model names, dims, link weights), built once by the driver and handed to
agents wherever they live. All checks that need no model weights happen here, before compute:
unknown roles in `--ckpt_override`, link dims that do not match a role's base model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from recmas_ray.engine.links import InnerLink, OuterLink, link_kind, link_state
from recmas_ray.system.config import SystemConfig
from recmas_ray.system.checkpoints import LinkSet, declared_base_model, load_links, read_manifest
from recmas_ray.system.link_init import init_links
from recmas_ray.models.registry import SIMULATED, model_kind
from recmas_ray.system.presets import role_models
from recmas_ray.engine.service import AgentSpec, link_states
from recmas_ray.styles import StyleSpec, get_style, tool_styles
from recmas_ray.styles.prompts import load_prompt_set, prompt_set_hash

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from recmas_ray.config.recursion import ToolLoopConfig


@dataclass
class SystemPlan:
    """Resolved system: what every role runs and with which links."""

    style_name: str
    style: StyleSpec
    role_models: dict[str, str]
    hidden_sizes: dict[str, int]
    links: LinkSet
    specs: dict[str, AgentSpec]
    sources: dict[str, str] = field(default_factory=dict)
    """Where each link came from: "init(seed=..)" or a checkpoint path."""

    def service_args(self, role: str) -> tuple[AgentSpec, dict, dict]:
        """(spec, inner state, outer states of the role's outgoing edges) for an AgentService."""
        outgoing = {e: m for e, m in self.links.outer.items() if e.split("->")[0] == role}
        return (self.specs[role], *link_states(self.links.inner[role], outgoing))

    def manifest(self) -> dict:
        """What a saved checkpoint records about the system."""
        return {"style": self.style_name, "roles": {r: {"base_model": m, "hidden_size": self.hidden_sizes[r]}
                                                      for r, m in self.role_models.items()},
                "edges": list(self.style.edges), "sources": self.sources,
                "prompt_set_hash": prompt_set_hash(self.style)}


def served_links(plan: SystemPlan) -> dict[str, dict]:
    """Per role: its base model, and its inner link and outgoing outer links, each with its kind, the folder it
    came from (None: fresh, seeded) and the sha256 of its tensors (what `GET /v1/models` lists)."""
    def entry(key: str, link) -> dict:
        h = hashlib.sha256()
        for name, t in sorted(link_state(link).items()):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        source = plan.sources.get(key, "")
        return {"kind": link_kind(link), "path": None if source.startswith("init(") else source,
                "sha256": h.hexdigest()}

    return {role: {"base_model": plan.role_models[role], "inner": entry(f"inner:{role}", plan.links.inner[role]),
                   "outer": {e: entry(f"outer:{e}", m) for e, m in plan.links.outer.items() if e.split("->")[0] == role}}
            for role in plan.style.roles}


def model_hidden_size(name: str) -> int:
    """Hidden size from the model's config alone (no weights loaded; packaged models are not converted)."""
    return model_kind(name).hidden_size(name)


def same_model(a: str, b: str) -> bool:
    """Whether two model names or paths name the same model (equal text, or the same directory)."""
    if a == b:
        return True
    return os.path.isdir(a) and os.path.isdir(b) and os.path.realpath(a) == os.path.realpath(b)


def parse_overrides(items: list[str] | None) -> dict[str, str]:
    """`["planner=DIR", "outer=DIR"]` -> dict, rejecting malformed items."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"--ckpt_override {item!r} is not of the form ROLE=PATH")
        out[key] = value
    return out


def check_link_styles(style, overrides: dict[str, str], *, allow: bool) -> None:
    """Links whose manifest records another style than `style` are refused unless `allow` (their prompts and
    schedule were another system's); aliases count as their style, release layouts record none."""
    for role, path in overrides.items():
        try:
            recorded = read_manifest(path).get("style")
        except (OSError, ValueError):  # unreadable manifests are reported by the loader, naming the folder
            continue
        if not isinstance(recorded, str) or allow:
            continue
        try:
            recorded_name = get_style(recorded).name
        except ValueError:
            recorded_name = recorded
        if recorded_name != style.name:
            raise ValueError(f"--ckpt_override {role}={path}: links trained for style {recorded!r}, but this system "
                             f"runs {style.name!r}; pass --allow_style_mismatch to load them anyway")


def plan_system(system: SystemConfig | str, *, task: str = "math", tools: ToolLoopConfig | None = None,
                **fields) -> SystemPlan:
    """Resolve models and links of `system`; raise ValueError on any mismatch before compute.

    `system` is a job's `SystemConfig` section, or a style name with the other `SystemConfig` fields as
    keywords (`plan_system("mixture", preset="tiny", seed=0)`); keywords given with a section replace its
    fields (`ckpt_override=` resolved Hub ids). `role_models` are base models the user names per role: they
    win over the preset, and a checkpoint that names another model for the role is an error unless
    `allow_base_model_mismatch`. `prompt_set` replaces the style's own prompts (checked against its slots
    first). `task` picks the release adapters that load; `tools` turns on the deliberation toolcaller's tool
    loop (styles that use tools only). `system.links` is not read here: the caller folds it into ckpt_override.
    """
    system = SystemConfig(style=system, **fields) if isinstance(system, str) else \
        dataclasses.replace(system, **fields)
    style_name, preset, seed, prompt_set = system.style, system.preset, system.seed, system.prompt_set
    dtype, device, message_dtype = system.dtype, system.device, system.message_dtype
    style = get_style(style_name)
    if prompt_set:
        style = load_prompt_set(prompt_set, style)
    if tools is not None and not style.uses_tools:
        raise ValueError(f"tool settings (--tavily_keys_file, --max_tool_rounds, --python_timeout) apply to a "
                         f"style with tools ({', '.join(tool_styles())}) only, got style {style_name!r}")
    overrides = dict(system.ckpt_override or {})
    bad = [k for k in overrides if k != "outer" and k not in style.roles]
    if bad:
        raise ValueError(f"--ckpt_override for {bad}: not roles of style {style_name}; "
                         f"expected one of {list(style.roles)} or 'outer'")
    # Base models first (manifests only, no weights): a checkpoint names its role's base model and
    # presets fill the other roles; a model the user also names must agree unless they opt in.
    check_link_styles(style, overrides, allow=system.allow_style_mismatch)
    explicit = dict(system.role_models or {})
    manifest_models = {}
    for role, path in overrides.items():
        base = declared_base_model(path, role) if role != "outer" else None
        if not base:
            continue
        if role in explicit and not same_model(explicit[role], base) and not system.allow_base_model_mismatch:
            raise ValueError(f"role {role}: the configured base model {explicit[role]!r} differs from "
                             f"{base!r}, named by the checkpoint {path}; pass --allow_base_model_mismatch to run "
                             "the configured one")
        manifest_models[role] = base
    try:
        preset_models = role_models(style_name, preset)
    except ValueError:  # a style the preset does not cover: nothing to compare against
        preset_models = {}
    for role, base in list(manifest_models.items()):  # the preset's model is configured as surely as a named one
        if role in explicit or same_model(base, preset_models.get(role, base)):
            continue
        if not system.allow_base_model_mismatch:
            raise ValueError(f"role {role}: preset {preset} gives base model {preset_models[role]!r}, but the "
                             f"checkpoint {overrides[role]} was trained on {base!r}; name it (--models {role}={base}) "
                             "or pass --allow_base_model_mismatch to run the preset's")
        del manifest_models[role]  # opted in: the preset's model runs (its link sizes are still checked)
    models = role_models(style_name, preset, {**manifest_models, **explicit})
    hidden = {role: model_hidden_size(name) for role, name in models.items()}
    loaded_inner, sources = {}, {}
    for role, path in overrides.items():
        if role == "outer":
            continue
        ls = load_links(path, role=role, style=style, task=task, hidden_sizes=hidden)
        if role in ls.inner:
            link = ls.inner[role]
        elif len(ls.inner) == 1:  # a single-role inner checkpoint may be reused for another role
            link = next(iter(ls.inner.values()))
        else:
            raise ValueError(f"--ckpt_override {role}={path}: no inner link for role {role} in it "
                             f"(it holds {sorted(ls.inner)})")
        loaded_inner[role], sources[f"inner:{role}"] = link, path
    links = init_links(style, hidden, seed=seed)
    sources |= {f"inner:{r}": f"init(seed={seed})" for r in style.roles if r not in loaded_inner}
    for role, link in loaded_inner.items():
        if link.hidden_size != hidden[role]:
            raise ValueError(f"role {role}: inner link from {overrides[role]} has hidden size {link.hidden_size}, "
                             f"but its base model {models[role]} has {hidden[role]}")
        links.inner[role] = link
    latent_norm = "none"  # a non-reference option trained into the outer links must hold at inference too
    if "outer" in overrides:
        outer = load_links(overrides["outer"], style=style, task=task, hidden_sizes=hidden)
        foreign = sorted(set(outer.outer) - set(style.edges))
        if foreign:
            raise ValueError(f"--ckpt_override outer={overrides['outer']}: holds outer links {foreign} of another "
                             f"style; style {style.name} has edges {list(style.edges)}")
        recorded = outer.manifest.get("roles") if isinstance(outer.manifest.get("roles"), dict) else {}
        for role, info in recorded.items():
            base = info.get("base_model") if isinstance(info, dict) else None
            if (isinstance(base, str) and role in models and not same_model(base, models[role])
                    and not system.allow_base_model_mismatch):
                raise ValueError(f"--ckpt_override outer={overrides['outer']}: trained with {role} on {base!r}, but "
                                 f"this system runs {models[role]!r} there; pass --models {role}={base} or "
                                 "--allow_base_model_mismatch")
        trained_with = outer.manifest.get("train_config")
        latent_norm = str((trained_with.get("latent_norm") if isinstance(trained_with, dict) else None) or "none")
        if latent_norm not in ("none", "embedding"):
            raise ValueError(f"--ckpt_override outer={overrides['outer']}: manifest train_config.latent_norm "
                             f"{latent_norm!r}; expected none or embedding")
        for edge, link in outer.outer.items():
            src, dst = edge.split("->")
            if (link.in_dim, link.out_dim) != (hidden[src], hidden[dst]):
                raise ValueError(f"outer link {edge} from {overrides['outer']} maps {link.in_dim}->{link.out_dim}, "
                                 f"but {src} ({models[src]}) -> {dst} ({models[dst]}) needs {hidden[src]}->{hidden[dst]}")
            links.outer[edge] = link
            sources[f"outer:{edge}"] = overrides["outer"]
    sources |= {f"outer:{e}": f"init(seed={seed})" for e in style.edges if f"outer:{e}" not in sources}
    specs = {r: AgentSpec(role=r, model_name=models[r], system_prompt=style.system_prompt, dtype=dtype,
                          device=device, message_dtype=message_dtype,
                          tools=tools if r == style.decoder else None, latent_norm=latent_norm,
                          continuous_batching=system.continuous_batching,
                          outer_targets={e: models[e.split("->")[1]] for e in style.edges if e.split("->")[0] == r})
             for r in style.roles}
    return SystemPlan(style_name, style, models, hidden, links, specs, sources)


def simulated_plan(style_name: str, model_name: str | dict[str, str] = SIMULATED.name("hidden=2048"), *,
                   message_dtype: str = "auto") -> SystemPlan:
    """A SystemPlan of cost-simulated agents (`recmas_ray.models.sim`): `model_name` for every role, or a
    `sim:` name per role. Links are 8-wide placeholders (the simulated agents ignore them, so nothing
    large is shipped at start-up)."""
    style = get_style(style_name)
    models = dict(model_name) if isinstance(model_name, dict) else {r: model_name for r in style.roles}
    missing = [r for r in style.roles if r not in models]
    if missing:
        raise ValueError(f"simulated_plan: no sim: model for roles {missing} of {style_name}")
    real = sorted(r for r in style.roles if model_kind(models[r]).has_weights)
    if real:
        raise ValueError(f"simulated_plan: roles {real} name models with weights; expected simulated (sim:) models")
    links = LinkSet()
    links.inner.update({r: InnerLink(8) for r in style.roles})
    links.outer.update({e: OuterLink(8, 8) for e in style.edges})
    # simulated agents run one call at a time (they sleep for their costs; no scheduler merges their steps)
    specs = {r: AgentSpec(role=r, model_name=models[r], system_prompt=style.system_prompt,
                          message_dtype=message_dtype, continuous_batching=False) for r in style.roles}
    hidden = {r: model_hidden_size(models[r]) for r in style.roles}
    return SystemPlan(style_name, style, {r: models[r] for r in style.roles}, hidden, links, specs,
                      {"links": "placeholder (simulated agents)"})
