"""Experiment tracking: one small interface over MLflow (and Weights & Biases) for training and evaluation jobs.

    --tracking mlflow                                  local store <output>/mlruns, no server needed
    --tracking mlflow --tracking_uri http://HOST:5000  a tracking server (or sqlite:///... with full mlflow)
    --tracking wandb                                   W&B (offline unless WANDB_MODE/--tracking_uri says so)

A job opens one run (`start_run`), logs its resolved config as parameters, metrics with their step (per-step
losses, held-out curves, evaluation metrics) and its result files as artifacts, and closes it with the job's
status. Ray Train runs also log each report live from the controller (`TrackingCallback`), so a long run shows
progress in the UI before it ends. The local MLflow store is MLflow's file store (`mlflow ui
--backend-store-uri <output>/mlruns`); MLflow 3 asks file-store users to opt in with MLFLOW_ALLOW_FILE_STORE,
which is set here for file URIs only. Secrets never become parameters (keys files and tokens are dropped).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from ray.train import UserCallback

from recmas_ray.config.tracking import TrackingConfig

_SECRET_WORDS = ("key", "token", "secret", "password")
MAX_PARAM_CHARS = 500
"""MLflow refuses longer parameter values; longer ones are cut (the whole config is also an artifact)."""


def flat_params(config: Any, prefix: str = "") -> dict[str, str]:
    """A config (dataclass or mapping) as flat `a.b.c -> text` parameters, secrets left out."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    out: dict[str, str] = {}
    for key, value in (config or {}).items():
        name = f"{prefix}{key}"
        if any(w in str(key).lower() for w in _SECRET_WORDS):
            continue
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            out |= flat_params(value, name + ".")
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out[name] = text[:MAX_PARAM_CHARS]
    return out


class Tracker:
    """A run that is not tracked (`--tracking none`): every call does nothing."""

    run_id: str | None = None

    def log_params(self, params: dict[str, str]) -> None:
        """Parameters of the run (flat names)."""

    def log_metrics(self, metrics: dict[str, float], *, step: int | None = None) -> None:
        """Numeric metrics at `step` (non-finite and non-numeric values are skipped)."""

    def log_artifact(self, path: str | os.PathLike) -> None:
        """A result file (or folder) of the run."""

    def close(self, *, failed: bool = False) -> None:
        """End the run with its status."""

    def callback(self):
        """A Ray Train callback logging each report live, or None."""
        return None


def metric_name(key: str) -> str:
    """lm-eval's `metric,filter` keys as `metric/filter` (MLflow allows no commas; slashes group its charts); the
    `none` filter (a metric with no grader, e.g. tokens_per_sample,none) is left out: `tokens_per_sample`."""
    key = re.sub(r",none$", "", str(key).replace(",none/", "/"))
    return re.sub(r"[^\w\-. :/]", "_", key.replace(",", "/"))


def without_secrets(value: Any) -> Any:
    """A config as plain JSON values, every key naming a secret (key, token, ...) left out at any depth."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: without_secrets(v) for k, v in value.items()
                if not any(w in str(k).lower() for w in _SECRET_WORDS)}
    if isinstance(value, (list, tuple)):
        return [without_secrets(v) for v in value]
    return value


def _numeric(metrics: dict) -> dict[str, float]:
    return {metric_name(k): float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}


def ensure_mlflow_experiment(uri: str, experiment: str, *, client=None) -> str:
    """The experiment's id in the store at `uri`, created if missing; a concurrent creator is tolerated."""
    from mlflow.exceptions import MlflowException  # lazy: optional dependency
    from mlflow.tracking import MlflowClient  # lazy: optional dependency

    if uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = client or MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(experiment)
    except MlflowException:  # another process created it between the two calls
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise
        return found.experiment_id


class MlflowTracker(Tracker):
    """One MLflow run, addressed by id through `MlflowClient` (no global active run, safe in Ray actors)."""

    def __init__(self, uri: str, experiment: str, run_name: str):
        from mlflow.tracking import MlflowClient  # lazy: optional dependency

        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        experiment_id = ensure_mlflow_experiment(uri, experiment, client=self.client)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id

    def log_params(self, params):
        from mlflow.entities import Param  # lazy: optional dependency

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow's batch limit
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def log_metrics(self, metrics, *, step=None):
        from mlflow.entities import Metric  # lazy: optional dependency

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, int(step or 0)) for k, v in _numeric(metrics).items()]
        if items:
            self.client.log_batch(self.run_id, metrics=items)

    def log_artifact(self, path):
        p = Path(path)
        if p.is_dir():
            self.client.log_artifacts(self.run_id, str(p), artifact_path=p.name)
        elif p.is_file():
            self.client.log_artifact(self.run_id, str(p))

    def close(self, *, failed=False):
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")

    def callback(self):
        return TrackingCallback(self.uri, self.run_id)


class WandbTracker(Tracker):
    """One W&B run (offline by default, so nothing leaves the machine unless the user says so)."""

    def __init__(self, project: str, experiment: str, run_name: str, directory: Path):
        import wandb  # lazy: optional dependency

        os.environ.setdefault("WANDB_MODE", "offline")
        self.wandb = wandb
        self.run = wandb.init(project=project, group=experiment, name=run_name, dir=str(directory), reinit=True)
        self.run_id = self.run.id

    def log_params(self, params):
        self.run.config.update(params, allow_val_change=True)

    def log_metrics(self, metrics, *, step=None):
        values = _numeric(metrics)
        if values:
            self.run.log(values, step=step)

    def log_artifact(self, path):
        if Path(path).exists():
            self.run.save(str(path), base_path=str(Path(path).parent), policy="now")

    def close(self, *, failed=False):
        self.run.finish(exit_code=1 if failed else 0)


class TrackingCallback:
    """Ray Train `UserCallback` (made lazily, Ray is not imported here): logs rank 0's report metrics live."""

    def __new__(cls, uri: str, run_id: str):
        class _Callback(UserCallback):
            def __init__(self):
                self.uri, self.run_id = uri, run_id

            def after_report(self, run_context, metrics, checkpoint):
                if not metrics:
                    return
                from mlflow.tracking import MlflowClient  # lazy: optional dependency

                if self.uri.startswith("file:"):
                    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
                client, values = MlflowClient(tracking_uri=self.uri), _numeric(metrics[0])
                step = int(values.pop("step", 0))
                for key, value in values.items():
                    client.log_metric(self.run_id, key, value, step=step)

        return _Callback()


def start_run(cfg: TrackingConfig, *, output_dir: str | os.PathLike, run_name: str, config: Any = None) -> Tracker:
    """Open the run `cfg` asks for (a do-nothing `Tracker` for none) and log `config` as its parameters."""
    if cfg.tracking == "none":
        return Tracker()
    if cfg.tracking == "mlflow":
        uri = cfg.tracking_uri or Path(output_dir, "mlruns").resolve().as_uri()
        tracker: Tracker = MlflowTracker(uri, cfg.experiment_name, run_name)
    else:
        tracker = WandbTracker(cfg.tracking_uri or "recmas_ray", cfg.experiment_name, run_name, Path(output_dir))
    if config is not None:
        tracker.log_params(flat_params(config))
        log_config_artifact(tracker, config)
    return tracker


def log_config_artifact(tracker: Tracker, config: Any) -> None:
    """The whole resolved config as the run's `config.json` artifact (parameters are cut at MAX_PARAM_CHARS)."""
    with tempfile.TemporaryDirectory(prefix="recmas-config-") as folder:
        path = Path(folder) / "config.json"
        path.write_text(json.dumps(without_secrets(config), indent=2, default=str, ensure_ascii=False),
                        encoding="utf-8")
        tracker.log_artifact(path)
