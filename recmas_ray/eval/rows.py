"""The evaluation's row options beside the methods: `--format_help` (the decoder's prompt gets the answer format)
and `--outer_init untrained` (each loaded outer link replaced by its kind's untrained initial state).

Both act on the planned system before any model loads (`apply_row_options`, called by `eval.run.prepare` after
the trained-task check, which compares the links' recorded prompts with the prompts they were trained with), and
both are recorded: in the run's fingerprint (`row_fingerprint`: nothing when off, so older samples files resume)
and in its results (`row_record`).

Format help: the decoder's prompt, in every method (the single agent's prompt too, since it is the decoder's),
ends with the answer-format instruction and one worked example (`format_help.decoder_help_text`); no other
role's prompt changes. A row "decoder told the fact in text + format help" is then a run of `single_agent` on
questions that hold the fact, with `--format_help`, beside the same run without it.

Untrained outer links, per kind its manifest names (`links.LINK_KINDS`):
  token_link            the same token pairs and tau, the residual at zero: the pure translation before training
  outer_ln_res_adapter  the link training started from: where training fitted a bridge (`--outer_init bridge` /
                        `state_bridge`), the fit it saved (`<outer folder>/init`); in an older folder without it,
                        rebuilt from the manifest's `train_config`: the seeded default init
                        (`link_init.seeded_outer_link` under the training seed), then the bridge re-fitted (the
                        state bridge on the recorded training questions' rollouts, with this run's inner links)
A folder without a training record (the release's files) gets the seeded default init under this run's seed.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import torch

from recmas_ray.engine.links import TokenLink, link_from_state, link_kind, link_state
from recmas_ray.eval.channel import channel_record
from recmas_ray.styles.base import RolePrompts
from recmas_ray.system.checkpoints import OUTER_INIT_DIR, LinkSet, contained, load_links, read_manifest
from recmas_ray.system.link_manifest import MANIFEST
from recmas_ray.system.link_init import seeded_outer_link
from recmas_ray.tasks.math import decoder_help_text
from recmas_ray.train.bridge import bridge_outer_links, state_bridge_outer_links
from recmas_ray.train.data import load_rows

def apply_row_options(cfg, plan):
    """`plan` with the row options of `cfg` applied (`--outer_init untrained`, then `--format_help`)."""
    if cfg.outer_init == "untrained":
        plan = untrained_outer_links(plan, cfg.system.link_folders().get("outer"))
    if cfg.format_help:
        plan = dataclasses.replace(plan, style=with_decoder_format_help(plan.style))
    return plan


def row_fingerprint(cfg) -> dict:
    """Fingerprint fields of the row options that are on (none when both are off: older samples files resume)."""
    return {**({"format_help": True} if cfg.format_help else {}),
            **({"outer_init": cfg.outer_init} if cfg.outer_init != "trained" else {})}


def row_record(cfg, samples: list[dict]) -> dict:
    """What the results file records of the row options (always, off included) and, where a token-like link sent
    messages, what crossed it (`eval.channel.channel_record` of the run's `samples`)."""
    return {"row_options": {"format_help": cfg.format_help, "format_help_text": decoder_help_text()
                            if cfg.format_help else "", "outer_init": cfg.outer_init}, **channel_record(samples)}


def with_decoder_format_help(style):
    """`style` with the answer-format help before every prompt of its decoder (each variant and task type) and
    before the single agent's prompt; every other role's prompts unchanged. Before, not after: the worked example
    is read first and the question last, as in few-shot prompting (appended after the question, SmolLM2-135M
    answered the example's question: 0/64 where the bare prompt gave 33/64, main job at 53a7b3c)."""
    prefix = decoder_help_text() + "\n\n"
    own = style.prompts[style.decoder]
    helped = RolePrompts(base={t: prefix + p for t, p in own.base.items()},
                         feedback={t: prefix + p for t, p in own.feedback.items()})
    return dataclasses.replace(style, prompts={**style.prompts, style.decoder: helped},
                               single_agent_prompt=prefix + style.single_agent_prompt)


def untrained_outer_links(plan, folder: str | None):
    """`plan` with every outer link loaded from `folder` replaced by its kind's untrained initial state (see the
    module docstring); its sources name them `untrained(<kind>) of <folder>`."""
    loaded = [e for e in plan.style.edges if folder and plan.sources.get(f"outer:{e}") == folder]
    if not loaded:
        raise ValueError("--outer_init untrained: this run loads no outer links (give --links DIR holding outer/, "
                         "or --ckpt_override outer=DIR); their untrained state is built from the kind they name")
    trained = read_manifest(folder).get("train_config")
    trained = trained if isinstance(trained, dict) else {}
    seed = int((trained.get("system") or {}).get("seed", plan_seed(plan)))
    init = str(trained.get("outer_init") or "default")
    outer, sources, releases = dict(plan.links.outer), dict(plan.sources), []
    for edge in loaded:
        link = outer[edge]
        if isinstance(link, TokenLink):
            fresh = link_from_state(link_state(link), place="outer", what=f"outer link {edge}")
            with torch.no_grad():
                fresh.residual.weight.zero_()
                fresh.residual.bias.zero_()
        else:
            fresh = seeded_outer_link(link.in_dim, link.out_dim, seed=seed, edge=edge)
            releases.append(edge)
        how = "" if isinstance(link, TokenLink) else f", {init} init, seed={seed}"
        outer[edge] = fresh
        sources[f"outer:{edge}"] = f"untrained({link_kind(link)}{how}) of {folder}"
    plan = dataclasses.replace(plan, links=dataclasses.replace(plan.links, outer=outer), sources=sources)
    if releases and init != "default" and not _saved_init(plan, releases, folder, init):
        _bridge(plan, releases, trained, init)
    return plan


def _saved_init(plan, edges: list[str], folder: str, init: str) -> bool:
    """Set `edges` of `plan` (in place) to the links training started from, where its folder keeps them
    (`<folder>/init`, written by jobs.train_outer after its bridge fit); False where it does not (an older
    folder: the caller re-fits). Checked as any link folder is: kinds and shapes against the plan."""
    path = Path(folder) / OUTER_INIT_DIR
    if not (path / MANIFEST).is_file():
        return False
    contained(Path(folder), OUTER_INIT_DIR, what=folder)  # an untrusted folder: no link out of it
    saved = load_links(path, hidden_sizes=plan.hidden_sizes)
    if saved.manifest.get("outer_init") != init or not set(edges) <= set(saved.outer):
        raise ValueError(f"{path}: holds the {saved.manifest.get('outer_init')!r} start of links "
                         f"{sorted(saved.outer)}, but training recorded --outer_init {init} for {sorted(edges)}")
    for edge in edges:
        if link_kind(saved.outer[edge]) != link_kind(plan.links.outer[edge]):
            raise ValueError(f"{path}: link {edge} is a {link_kind(saved.outer[edge])}, the trained one a "
                             f"{link_kind(plan.links.outer[edge])}")
        plan.links.outer[edge] = saved.outer[edge]
        plan.sources[f"outer:{edge}"] = plan.sources[f"outer:{edge}"].replace(" init,", " init saved by training,")
    return True


def plan_seed(plan) -> int:
    """The seed the plan's fresh links were drawn with (its sources say `init(seed=S)`), else 42."""
    for source in plan.sources.values():
        found = re.fullmatch(r"init\(seed=(\d+)\)", source)
        if found:
            return int(found.group(1))
    return 42


def _bridge(plan, edges: list[str], trained: dict, init: str) -> None:
    """Refit the bridge initialisation training started from, on the seeded links of `edges` (in place)."""
    links = LinkSet()
    links.inner.update(plan.links.inner)
    links.outer.update({e: plan.links.outer[e] for e in edges})
    view = SimpleNamespace(style=plan.style, role_models=plan.role_models, links=links)
    ridge = float(trained.get("bridge_ridge", 1e-2))
    dtype = str((trained.get("system") or {}).get("dtype", "float32"))
    if init == "bridge":
        bridge_outer_links(view, ridge=ridge, dtype=dtype)
        return
    # lazy: Ray reads env settings on import; this module loads before the console sets them
    from recmas_ray.train.outer import prepare_samples

    name = trained.get("dataset_name")
    task = str(trained.get("task") or "math")
    try:
        rows = load_rows(str(name), trained.get("dataset_json_field"), split=str(trained.get("dataset_split",
                                                                                            "train")))
    except (OSError, ValueError) as e:
        raise ValueError(f"--outer_init untrained: the outer links were initialised by the state bridge on the "
                         f"training questions {name!r}, which cannot be read here ({e})") from None
    questions = [s.question for s in prepare_samples(rows, plan.style, task)]
    state_bridge_outer_links(view, questions, task=task, num_steps=int(trained.get("rollout_latent_steps") or 0),
                             num_rounds=int(trained.get("num_recursive_rounds", 1)), ridge=ridge, dtype=dtype)


__all__ = ["apply_row_options", "row_fingerprint", "row_record", "with_decoder_format_help",
           "untrained_outer_links"]
