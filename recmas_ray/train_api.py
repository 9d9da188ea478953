"""Training from Python: thin wrappers that build the training configs and call the training entry points.

    rm.train_inner("sequential_light", rows=rows, save_dir="ckpt")          -> ckpt/{planner,critic,solver}/
    rm.train_outer("sequential_light", rows=rows, links="ckpt")             -> ckpt/outer/
    rm.System.build("sequential_light", links="ckpt", ...)                  loads all of them

`rows` is a list of dicts in memory (written to `<save_dir>/train.jsonl`) or anything the trainers' own
`dataset_name` takes (a .json/.jsonl path, synthetic[:N], a HF dataset id). Further keyword arguments
go to `InnerTrainConfig` / `OuterTrainConfig` unchanged (max_steps, lr, batch_size, ...), so these
wrappers follow the trainers' own settings.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

from recmas_ray.api_inputs import rows_file
from recmas_ray.config.checks import ConfigTypeError, check_tree
from recmas_ray.config.inputs import OutputLock
from recmas_ray.console import job_console
from recmas_ray.styles import canonical_role, get_style
from recmas_ray.system.config import system_fields, with_system
from recmas_ray.system.hub import links_overrides
from recmas_ray.system.plan import plan_system
from recmas_ray.train.config import InnerTrainConfig, OuterTrainConfig
from recmas_ray.train.data import load_rows, role_examples, validate_rows

__all__ = ["train_inner", "train_outer"]


def check_training_inputs(cfg, rows: list[dict] | None = None) -> None:
    """Everything a training run reads, read once before it writes anything (no model weights, no Ray): the
    system plan (checkpoints, their manifests and link weights, base-model configs) and the rows with the
    fields each role needs (`rows`: in-memory rows instead of cfg's dataset). The jobs and these wrappers call
    it before taking the save_dir lock."""
    check_tree(cfg)
    style = get_style(cfg.system.style)
    if rows is None:
        rows = load_rows(cfg.dataset_name, cfg.dataset_json_field, split=cfg.dataset_split)
    if isinstance(cfg, InnerTrainConfig):
        # lazy: Ray reads env settings on import; this module loads before the console sets them
        from recmas_ray.train.inner_job import plan_roles, resolve_role_steps

        roles = list(style.roles) if cfg.mas_role == "all" else [canonical_role(style, cfg.mas_role)]
        plan_roles(cfg, roles)
        validate_rows(rows, style, roles, task=cfg.task)
        for role in roles:  # a batch larger than a role's data
            resolve_role_steps(cfg, len(role_examples(rows, style, role, cfg.task)))
        return
    # lazy: train.core imports Ray Train on top: it loads inside the console (check_training_inputs' call)
    from recmas_ray.train.outer import prepare_samples

    # lazy: train.core imports Ray Train on top: it loads inside the console (check_training_inputs' call)
    from recmas_ray.train.core import resolve_steps

    plan_system(cfg.system, task=cfg.task)
    resolve_steps(cfg, len(prepare_samples(rows, style, cfg.task)), cfg.batch_size)  # a batch larger than the data
    if cfg.eval_dataset:
        prepare_samples(load_rows(cfg.eval_dataset, cfg.dataset_json_field), style, cfg.task)


def run_training_job(cfg, name: str, train) -> int:
    """The training jobs' shell (`jobs.train_inner`, `jobs.train_outer`): the quiet console (Ray, Ray Train and
    the workers' output in <save_dir>/logs/<name>.log; --verbose: on the console), every input read before
    anything is written, then `train(cfg, console)` while holding --save_dir's lock."""
    with job_console(Path(cfg.save_dir) / "logs", verbose=cfg.verbose, name=name, progress=cfg.progress) as console:
        check_training_inputs(cfg)  # checkpoints, models' configs and rows read before anything is written
        with OutputLock(cfg.save_dir, "--save_dir"):  # a second run into this folder stops, naming this PID
            return train(cfg, console)


def _config(cls, values: dict[str, Any], options: dict[str, Any], rows, rows_file: Path):
    """(checked training config, in-memory rows or None): every argument validated as the CLI does. In-memory
    rows will be `rows_file` (the config already names it, as the earlier run's config.json does for --resume),
    written only once everything is accepted (`_with_rows`)."""
    # the system's fields (style, seed, ckpt_override, ...) are settings too: with_system nests them
    names = {f.name for f in dataclasses.fields(cls)} - {"system"} | system_fields(cls)
    unknown = sorted(set(options) - names)
    if unknown:
        raise ValueError(f"unknown training setting(s) {unknown} for {cls.__name__}; expected some of {sorted(names)}")
    in_memory = not isinstance(rows, (str, Path))
    if in_memory:
        rows = list(rows) if isinstance(rows, (list, tuple)) else rows
        if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
            raise ConfigTypeError("rows: expected a path, a dataset name, or a non-empty list of dicts, got "
                            f"{type(rows).__name__}")
    dataset = "synthetic:1" if in_memory else str(rows)  # stands in for the rows until they are accepted
    cfg = with_system(cls, **{k: v for k, v in values.items() if k in names}, **{"dataset_name": dataset, **options})
    check_tree(dataclasses.replace(cfg, resume=False), lambda path: path)  # resume: checked on the real rows path
    if not in_memory:
        return cfg, None
    return dataclasses.replace(cfg, dataset_name=str(rows_file)), rows


def _probe(cfg, rows):
    """`cfg` as the checks see it before in-memory rows are on disk (they are checked as rows; --resume is
    compared by `check_resume` on the real config)."""
    return dataclasses.replace(cfg, dataset_name="synthetic:1", resume=False) if rows is not None else \
        dataclasses.replace(cfg, resume=False)


def _with_rows(cfg, rows) -> None:
    """Write the accepted in-memory `rows` where `cfg` reads them."""
    if rows is not None:
        path = Path(cfg.dataset_name)
        rows_file(rows, path.parent, path.name)


def train_inner(style: str, *, rows: str | Path | Sequence[dict], save_dir: str | Path,
                role_models: dict[str, str] | None = None, preset: str = "tiny", roles: Sequence[str] | None = None,
                task: str = "math", **options: Any) -> Path:
    """Train the inner links of every role (or of `roles`) at once; returns `save_dir` with one folder per role.

    Args:
        style: Collaboration style.
        rows: Training rows (dicts with `question` and one gold text per role) or a dataset name/path.
        save_dir: Output folder; role `r`'s link goes to `save_dir/r` (what `System.build(links=...)` reads).
        role_models: Base model per role, over the preset.
        preset: Base models of the other roles: tiny, demo or paper.
        roles: Train only these roles (default: all roles of the style).
        task: Task type of the prompts.
        **options: Other `InnerTrainConfig` settings (max_steps, batch_size, lr, num_workers, ...).

    Example:
        >>> import recmas_ray as rm
        >>> rm.train_inner("sequential_light", rows="synthetic:16", save_dir="ckpt", max_steps=2,
        ...                num_workers=0)  # doctest: +SKIP
        PosixPath('ckpt')
    """
    # lazy: Ray reads env settings on import; this module loads before the console sets them
    from recmas_ray.distributed.cluster import init_ray
    # lazy: Ray reads env settings on import; this module loads before the console sets them
    from recmas_ray.train.inner_job import train_all_roles
    # lazy: Ray reads env settings on import; this module loads before the console sets them
    from recmas_ray.train.inner_job import train_inner as train_one_role

    if not isinstance(save_dir, (str, Path)) or not str(save_dir).strip():
        raise ConfigTypeError(f"save_dir: expected a folder path, got {save_dir!r}")
    save_dir = Path(save_dir)
    if role_models is not None and not isinstance(role_models, dict):
        raise ConfigTypeError(f"role_models: expected a dict ROLE -> model name, got {type(role_models).__name__}")
    cfg, mem = _config(InnerTrainConfig, {"style": style, "task": task, "preset": preset,
                                     "role_models": dict(role_models or {}), "save_dir": str(save_dir)},
                       options, rows, save_dir / "train.jsonl")
    if roles is not None:
        if isinstance(roles, str) or not all(isinstance(r, str) for r in roles):
            raise ConfigTypeError(f"roles: expected a list of role names, got {roles!r:.60}")
        for role in roles:
            canonical_role(get_style(style), role)
            if cfg.resume:
                dataclasses.replace(cfg, mas_role=role, save_dir=str(save_dir / role)).check_resume()
    elif cfg.resume:
        dataclasses.replace(cfg, mas_role="all").check_resume()
    for role in roles or ["all"]:
        check_training_inputs(_probe(dataclasses.replace(cfg, mas_role=role), mem), mem)
    with OutputLock(save_dir, "save_dir"):
        _with_rows(cfg, mem)
        if roles:  # a subset: one run per role, each into save_dir/<role>
            for role in roles:
                if cfg.num_workers > 0:
                    init_ray()
                train_one_role(dataclasses.replace(cfg, mas_role=role, save_dir=str(save_dir / role)))
        else:
            init_ray()
            train_all_roles(dataclasses.replace(cfg, mas_role="all"))
    return save_dir


def train_outer(style: str, *, rows: str | Path | Sequence[dict], links: str | Path | None = None,
                save_dir: str | Path | None = None, preset: str = "tiny", task: str = "math",
                num_recursive_rounds: int = 3, **options: Any) -> Path:
    """Train the outer links through R rounds of the frozen agents; returns the folder of the outer links.

    Args:
        style: Collaboration style.
        rows: Training rows or a dataset name/path.
        links: A folder of inner links (`train_inner`'s `save_dir`) or a Hub id; each role runs on the base
            model named in its link's manifest.
        save_dir: Output folder (default `<links>/outer`, so `links` then holds the whole system).
        preset: Base models of roles without an inner link.
        task: Task type of the prompts.
        num_recursive_rounds: R unrolled in every training step.
        **options: Other `OuterTrainConfig` settings (max_steps, lr, batch_size, max_latent_tokens, ...).
    """
    # lazy: Ray reads env settings on import; this module loads before the console sets them
    from recmas_ray.train.pipeline import train_outer as run_outer

    inner = {r: p for r, p in links_overrides(str(links), get_style(style).roles).items() if r != "outer"} \
        if links else {}
    if save_dir is None:
        if links is None or not Path(links).is_dir():
            raise ValueError("train_outer: give save_dir (links is not a local folder to save next to)")
        save_dir = Path(links) / "outer"
    save_dir = Path(save_dir)
    cfg, mem = _config(OuterTrainConfig, {"style": style, "ckpt_override": inner, "preset": preset, "task": task,
                                     "save_dir": str(save_dir), "num_recursive_rounds": num_recursive_rounds},
                       options, rows, save_dir.parent / f"{save_dir.name}_train.jsonl")
    if cfg.resume:
        cfg.check_resume()
    check_training_inputs(_probe(cfg, mem), mem)
    with OutputLock(save_dir, "save_dir"):
        _with_rows(cfg, mem)
        return Path(run_outer(cfg).save_dir)
