r"""Inner-loop training: warm-start each role's inner link on its frozen base model, with Ray Train.

Every InnerTrainConfig field is a flag (see --help); the public release's flag names work too
(--mas_design, --mas_task, --adapter_lr, --adapter_cos_weight, --adapter_mse_weight, --save_steps).
`--mas_role all` trains every role of the style at once, one Ray Train run per role, each on its own
base model (--preset, --role_model ROLE=NAME) and writing <save_dir>/<role>/.

Examples (CPU, offline, tiny random models and the generated arithmetic set):
  python -m jobs.train_inner --model_name_or_path tiny:qwen3 --style sequential --mas_role planner \
      --dataset_name synthetic:256 --save_dir checkpoints/inner/planner --max_steps 100 --num_workers 0
  python -m jobs.train_inner --style sequential --mas_role all --preset tiny \
      --dataset_name synthetic:256 --save_dir checkpoints/inner --max_steps 200 --lr 1e-3
  python -m jobs.train_outer --style sequential --preset tiny --links checkpoints/inner --dataset_name synthetic:64
  python -m jobs.run --style sequential --preset tiny --links checkpoints/inner --dataset questions.jsonl
With --mas_role all, SAVE_DIR is one system folder (one sub-folder per role; train_outer --links SAVE_DIR adds
outer/): the job ends with the exact jobs.train_outer, jobs.run and jobs.serve commands that use it.
The console shows phase lines from the first second and a per-step bar per role; Ray, Ray Train and worker output
goes to SAVE_DIR/logs/train_inner.log (--verbose shows it). Ctrl-C stops with one line (exit status 130).
Resume a stopped run (same flags plus --resume; ends with the weights of an uninterrupted run):
  python -m jobs.train_inner ... --resume
On a cluster (one GPU per role, shared storage for checkpoints):
  ray job submit --working-dir . --runtime-env cluster/runtime_env.yaml -- \
      python -m jobs.train_inner --style sequential --mas_role all --preset paper \
      --dataset_name RecursiveMAS/Sequential-Math --save_dir /mnt/shared/inner --storage_path s3://bucket/ray \
      --use_gpu --num_workers 1 --dtype bfloat16 --max_steps 20000 --max_failures 3
"""

import json
import sys
from pathlib import Path

from recmas_ray.config.cli import run_job
from recmas_ray.styles import canonical_role, get_style
from recmas_ray.system.next_steps import next_commands
from recmas_ray.train.config import InnerTrainConfig

def main_cfg(cfg: InnerTrainConfig) -> int:
    """Run a parsed, checked config (heavy imports happen here, after parsing), holding --save_dir's lock."""
    # lazy: train_api imports torch; --help and bad input must not (tests/jobs/test_train_flags.py)
    from recmas_ray.train_api import run_training_job

    return run_training_job(cfg, "train_inner", _train)


def _train(cfg, console) -> int:
    # lazy: Ray Train and torch, after the checks (tests/jobs/test_train_flags.py)
    from recmas_ray.train import inner_job

    roles = get_style(cfg.system.style).roles if cfg.mas_role == "all" else [cfg.mas_role]
    if cfg.num_workers or cfg.mas_role == "all":  # Ray Train workers, or one Ray task per role
        from recmas_ray.distributed.cluster import start_ray  # lazy: Ray, only when workers or several roles run

        start_ray()  # a phase line of its own, before the training's
    console.start(f"inner training: {', '.join(roles)}, {cfg.max_steps} steps")
    if cfg.mas_role == "all":
        dirs = inner_job.train_all_roles(cfg)
    else:
        dirs = {canonical_role(get_style(cfg.system.style), cfg.mas_role): inner_job.train_inner(cfg)}
    console.done()
    summarize(cfg, dirs, console)
    return 0


def summarize(cfg, dirs: dict, console) -> None:
    """The end-of-job lines: where each role's inner link went (step, last loss) and the commands that reuse it."""
    for role, path in dirs.items():
        try:
            m = json.loads((Path(path) / "manifest.json").read_text())
            detail = f"step {m.get('step')}, loss {m['loss']:.4f}" if isinstance(m.get("loss"), float) else \
                f"step {m.get('step')}"
        except (OSError, ValueError, KeyError):
            detail = "no manifest"
        console.line(f"inner link of {role}: {path} ({detail})")
    if cfg.mas_role == "all":  # one system folder: the roles' folders side by side, outer/ next
        folder = str(cfg.save_dir)
        for line in next_commands(folder, style=cfg.system.style, preset=cfg.system.preset, task=cfg.task,
                                  role_models=cfg.system.role_models, outer_trained=False,
                                  train_rows=cfg.dataset_name,
                                  dataset="jobs/examples/questions.jsonl" if cfg.task == "math" else None):
            console.line(line)
    else:
        console.line("use with: python -m jobs.run --style " + cfg.system.style + " --preset " + cfg.system.preset
                     + " --task " + cfg.task
                     + " --ckpt_override " + " ".join(f"{r}={p}" for r, p in dirs.items())
                     + " --dataset QUESTIONS.jsonl (or train every role: --mas_role all, one folder for --links)")


def main(argv=None) -> int:
    """Parse argv (flags, --config FILE) and train; returns the exit status (2: bad input, before any model)."""
    return run_job(main_cfg, InnerTrainConfig, argv, prog="train_inner", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
