"""Inner-loop training on Ray Train, driver side: one `TorchTrainer` per role (worker: `inner_worker.py`).

    driver      config -> plan_system (base model per role: --role_model, checkpoint manifests, the preset;
                initial link: --ckpt_override / --load_dir, else the seeded init) -> rows -> validate
                -> (user prompt with upstream gold text, gold target) per row -> TorchTrainer.fit
                -> the final checkpoint's link copied into save_dir
    all roles   `train_all_roles` runs the roles of a style concurrently, each fit() in its own Ray task

Links are loaded (and checked against their base models) before any model loads, so a bad
--ckpt_override is a one-line error.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import ray

from recmas_ray.config.checks import check_tree
from recmas_ray.config.tree import save_config
from recmas_ray.distributed import cluster
from recmas_ray.train.config import InnerTrainConfig
from recmas_ray.console import current
from recmas_ray.styles import canonical_role, get_style
from recmas_ray.system.checkpoints import MANIFEST, WEIGHTS
from recmas_ray.system.plan import plan_system
from recmas_ray.system.provenance import write_provenance
from recmas_ray.tracking import ensure_mlflow_experiment
from recmas_ray.train import core, history
from recmas_ray.train.data import load_rows, role_examples, validate_rows
from recmas_ray.train.inner_worker import train_loop_per_worker
from recmas_ray.train.progress import StepBoard


def plan_roles(cfg: InnerTrainConfig, roles: list[str]):
    """The system plan behind a run: base model and initial inner link of every role (no model loaded)."""
    overrides, models = dict(cfg.system.ckpt_override), dict(cfg.system.role_models)
    if cfg.mas_role != "all":
        if cfg.load_dir:
            overrides[roles[0]] = cfg.load_dir
        if cfg.model_name_or_path:
            models[roles[0]] = cfg.model_name_or_path
    return plan_system(cfg.system, task=cfg.task, ckpt_override=overrides, role_models=models)


def resolve_role_steps(cfg: InnerTrainConfig, num_examples: int) -> InnerTrainConfig:
    """`core.resolve_steps` for one role's examples over every worker and accumulation step (ValueError when they
    cannot fill one step; `train_api.check_training_inputs` asks first, before anything starts)."""
    return core.resolve_steps(cfg, num_examples, cfg.batch_size * cfg.grad_accum_steps * max(cfg.num_workers, 1))


def _fit(cfg: InnerTrainConfig, role: str, base_model: str, link_state: dict, examples: list[tuple[str, str]], *,
         faults: dict | None = None, progress=None) -> Path:
    """One role's TorchTrainer run; returns cfg.save_dir holding the final link (`progress`: a StepBoard's
    queue, where rank 0 posts its steps)."""
    cfg = resolve_role_steps(cfg, len(examples))
    storage = core.run_storage(cfg, f"inner-{get_style(cfg.system.style).name}-{role}")
    resume_from = core.start_or_resume(cfg, storage, f"inner {role}", cfg.load_dir)
    if cfg.num_workers == 0:  # local mode logs every report at INFO; our own log line says the same
        logging.getLogger("ray.train.v2._internal.execution.train_fn_utils").setLevel(logging.WARNING)
    loop_config = {"cfg": asdict(cfg), "role": role, "base_model": base_model, "link": link_state,
                   "examples": examples, "storage": (storage.uri, storage.name), "resume_from": resume_from,
                   "progress": progress, "_faults": faults}

    save_config(cfg, cfg.save_dir)  # next to the outputs, once every input has been checked
    with history.tracked_run(cfg, f"inner-{role}") as tracker:
        result = core.fit(train_loop_per_worker, loop_config, cfg, storage, num_workers=cfg.num_workers,
                          tracker=tracker)
        if result.checkpoint is None:
            raise RuntimeError(f"inner training of {role} finished without a checkpoint (run {storage.root})")
        save_dir = Path(cfg.save_dir)
        save_dir.mkdir(parents=True, exist_ok=True)
        with result.checkpoint.as_directory() as d:
            for fname in (WEIGHTS, MANIFEST):
                tmp = save_dir / f".{fname}.tmp"
                shutil.copyfile(Path(d) / fname, tmp)
                os.replace(tmp, save_dir / fname)
        loss_log = json.loads((save_dir / MANIFEST).read_text(encoding="utf-8")).get("loss_log") or []
        history.write_loss_curve(save_dir, loss_log, title=f"inner link of {role}")
        history.log_history(tracker, loss_log, save_dir=save_dir, files=(MANIFEST, "config.json", history.LOSS_CURVE))
    return save_dir


def _role_state(plan, role: str) -> dict:
    return {k: v.detach().float().cpu() for k, v in plan.links.inner[role].state_dict().items()}


def train_inner(cfg: InnerTrainConfig, *, faults: dict | None = None) -> Path:
    """Train one role's inner link with one TorchTrainer; returns cfg.save_dir holding the final link.

    `faults` is the test-only fault-injection dict (see `core.Faults`)."""
    check_tree(cfg)
    style = get_style(cfg.system.style)
    role = canonical_role(style, cfg.mas_role)
    plan = plan_roles(cfg, [role])
    examples = role_examples(load_rows(cfg.dataset_name, cfg.dataset_json_field, split=cfg.dataset_split), style,
                             role, cfg.task)
    if cfg.num_workers == 0:  # Ray Train's local mode: the loop runs here and draws its own bar
        return _recorded(cfg, _fit(cfg, role, plan.role_models[role], _role_state(plan, role), examples, faults=faults))

    cluster.init_ray()
    with StepBoard(current(), enabled=cfg.progress) as board:
        return _recorded(cfg, _fit(cfg, role, plan.role_models[role], _role_state(plan, role), examples,
                                   faults=faults, progress=board.queue))


def _recorded(cfg: InnerTrainConfig, save_dir: Path) -> Path:
    """`save_dir` once its provenance.json records this command and config (`system.provenance`)."""
    write_provenance(save_dir, config=asdict(cfg), inputs=cfg.system.ckpt_override, kind="inner")
    return save_dir


def train_all_roles(cfg: InnerTrainConfig) -> dict[str, Path]:
    """One TorchTrainer per role of the style, all running at once; returns {role: save_dir/role}.

    Each `fit()` blocks, so each runs inside its own `num_cpus=0` task (the trainer reserves its
    own workers); in local mode (num_workers=0) the task itself reserves one worker's resources.
    The tasks may run on any node: on a multi-node cluster save_dir and storage_path must be shared.
    """
    check_tree(cfg)
    style = get_style(cfg.system.style)
    roles = list(style.roles)
    plan = plan_roles(cfg, roles)
    rows = load_rows(cfg.dataset_name, cfg.dataset_json_field, split=cfg.dataset_split)
    validate_rows(rows, style, roles, task=cfg.task)
    save_config(cfg, cfg.save_dir)  # each role's own (mas_role=ROLE) goes to <save_dir>/<role>/
    storage_path = cfg.storage_path or str(Path(cfg.save_dir).resolve() / "_ray_runs")
    track = cfg.track
    if track.tracking == "mlflow" and not track.tracking_uri:  # one store for every role's run
        track = replace(track, tracking_uri=(Path(cfg.save_dir).resolve() / "mlruns").as_uri())
    if track.tracking == "mlflow":  # made here once: the roles' runs start at once and would race to create it

        ensure_mlflow_experiment(track.tracking_uri, track.experiment_name)
    cfgs = {r: replace(cfg, mas_role=r, save_dir=str(Path(cfg.save_dir).resolve() / r), storage_path=storage_path,
                       track=track) for r in roles}

    cluster.init_ray()
    opts = {"num_cpus": 0} if cfg.num_workers else {
        "num_cpus": cfg.cpus_per_worker, "num_gpus": cfg.gpus_per_worker if cfg.use_gpu else 0}
    fit = ray.remote(_fit).options(max_retries=0, **opts)
    with StepBoard(current(), enabled=cfg.progress) as board:  # one bar per role
        refs = {r: fit.remote(c, r, plan.role_models[r], _role_state(plan, r),
                              role_examples(rows, style, r, cfg.task), progress=board.queue)
                for r, c in cfgs.items()}
        try:
            dirs = dict(zip(refs, ray.get(list(refs.values()), timeout=cfg.fit_timeout_s)))
            return {r: _recorded(cfgs[r], Path(d)) for r, d in dirs.items()}  # here: the driver's command line
        except BaseException as e:  # one role failed or timed out: stop the others too
            for ref in refs.values():
                ray.cancel(ref, force=True)
            if isinstance(e, ray.exceptions.GetTimeoutError):
                raise TimeoutError(f"inner training of {roles} did not finish within {cfg.fit_timeout_s} s") \
                    from None
            raise
