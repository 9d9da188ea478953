"""What a training run leaves for people to read: its tracker run (`--tracking`), the logged per-step history
with the result files as artifacts, and the inner loop's loss curve PNG. Used by inner and outer training."""

from __future__ import annotations

import contextlib
from pathlib import Path

from recmas_ray.tracking import start_run
from recmas_ray.train.config import TrainConfig


@contextlib.contextmanager
def tracked_run(cfg: TrainConfig, run_name: str):
    """The training run's tracker (`--tracking`; a do-nothing one by default), closed FAILED on an error."""
    tracker = start_run(cfg.track, output_dir=cfg.save_dir, run_name=run_name, config=cfg)
    try:
        yield tracker
    except BaseException:
        tracker.close(failed=True)
        raise
    tracker.close()


def log_history(tracker, log: list, *, save_dir: Path, files: tuple[str, ...]) -> None:
    """Per-step metrics of a finished run (its whole history: the live reports come only at checkpoints)
    and its result files as artifacts."""
    for entry in log:
        if isinstance(entry, dict):
            tracker.log_metrics({k: v for k, v in entry.items() if k != "step"}, step=int(entry.get("step", 0)))
        elif isinstance(entry, (list, tuple)) and len(entry) == 2:  # inner manifests: [step, loss]
            tracker.log_metrics({"loss": entry[1]}, step=int(entry[0]))
    for name in files:
        if (Path(save_dir) / name).is_file():
            tracker.log_artifact(Path(save_dir) / name)


LOSS_CURVE = "loss_curve.png"


def write_loss_curve(save_dir: Path, loss_log: list, *, title: str) -> Path | None:
    """loss_curve.png: training loss vs step (the inner loop's; the outer loop draws eval_curve.png)."""
    points = [(int(e[0]), float(e[1])) for e in loss_log if isinstance(e, (list, tuple)) and len(e) == 2]
    if not points:
        return None
    import matplotlib  # lazy: matplotlib (~1 s) loads only for plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib (~1 s) loads only for plots

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p[0] for p in points], [p[1] for p in points], "o-", ms=3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png = Path(save_dir) / LOSS_CURVE
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png
