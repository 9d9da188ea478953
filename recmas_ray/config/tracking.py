"""The tracking section every training and evaluation config nests (`--tracking mlflow`, `--tracking_uri`);
the trackers themselves are in `recmas_ray/tracking.py`. No torch, no Ray, no MLflow imported here."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Annotated

from recmas_ray.config.checks import OneOf

TRACKERS = ("none", "mlflow", "wandb")


@dataclass(kw_only=True)
class TrackingConfig:
    """Where a job's parameters, metrics and result files are tracked."""

    SHORT_FLAGS = ("experiment_name", "tracking", "tracking_uri")
    """Fields with a plain flag (`--name`) wherever this section is nested (config/cli.py)."""

    tracking: Annotated[str, OneOf(TRACKERS)] = "none"
    """none, mlflow (a local store under the job's output folder unless --tracking_uri names another) or wandb."""
    tracking_uri: str | None = None
    """MLflow tracking URI (file:DIR, http://HOST:PORT, sqlite:///FILE) or the W&B project name; None: a local
    MLflow store `<output>/mlruns`, or W&B project recmas_ray."""
    experiment_name: str = "recmas_ray"
    """MLflow experiment (W&B group) the run belongs to."""

    def validate(self) -> None:
        """A URI only means something for a tracker; an empty one is a typo."""
        if self.tracking_uri is not None and not self.tracking_uri.strip():
            raise ValueError("--tracking_uri '': expected a tracking URI, or leave it out for the local store")
        if self.tracking_uri and self.tracking == "none":
            raise ValueError(f"--tracking_uri {self.tracking_uri!r} needs --tracking mlflow or wandb")
        if not self.experiment_name.strip():
            raise ValueError("--experiment_name '': expected a name")
        check_tracking_available(self)


def check_tracking_available(cfg: TrackingConfig) -> None:
    """The tracker's package is installed (checked with the other inputs, before the job starts)."""
    package = {"mlflow": "mlflow", "wandb": "wandb"}.get(cfg.tracking)
    if package and importlib.util.find_spec(package) is None:
        extra = "pip install mlflow-skinny (or mlflow for its UI)" if package == "mlflow" else "pip install wandb"
        raise ValueError(f"--tracking {cfg.tracking}: the {package} package is not installed ({extra})")
