r"""Outer-loop training of RecursiveMAS: backpropagation through R rounds of frozen agents, pipeline-parallel on
Ray Train (one worker per role; latents and their gradients travel between workers by torch.distributed p2p).

Only the outer links train; base models and inner links (from `--ckpt_override ROLE=INNER_DIR`, the inner-loop
results) stay frozen. `--links DIR` (the folder `train_inner --mas_role all --save_dir DIR` wrote) reads the inner
links from DIR's role folders and writes the outer links to DIR/outer, so DIR is one system folder that
`--links DIR` loads in jobs.run, jobs.serve, jobs.push_links, the API and lm-eval. The console shows a per-step bar,
then where the links went with their last losses (also SAVE_DIR/train_summary.json) and the exact jobs.run /
jobs.serve commands; Ray, Ray Train and worker output goes to SAVE_DIR/logs/train_outer.log (--verbose shows it).

Examples
  CPU, offline, tiny models (a few seconds per step):
    python -m jobs.train_outer --style sequential --preset tiny --dataset_name synthetic:64 \
        --save_dir out/outer_seq --num_recursive_rounds 2 --max_latent_tokens 16 --max_steps 20 \
        --batch_size 2 --num_microbatches 2 --lr 1e-3 --warmup_steps 2
  with a held-out loss curve every 5 steps (eval_curve.jsonl + eval_curve.png in --save_dir):
    python -m jobs.train_outer ... --eval_every 5 --eval_dataset heldout.jsonl
  after `train_inner --mas_role all --save_dir ckpt` (one folder: ckpt/outer is added next to the roles):
    python -m jobs.train_outer --style sequential --preset tiny --links ckpt --dataset_name synthetic:64 \
        --num_recursive_rounds 2 --max_latent_tokens 16 --max_steps 20 --batch_size 2
  the same with each folder named (each role's base model comes from its inner checkpoint):
    python -m jobs.train_outer --style sequential --ckpt_override planner=ckpt/inner/planner \
        critic=ckpt/inner/critic solver=ckpt/inner/solver --dataset_name data/sequential_math.json \
        --dataset_json_field data --save_dir ckpt/outer --use_gpu --recompute
  resume a stopped run (same --save_dir / --storage_path):
    python -m jobs.train_outer ... --resume
  on a cluster (one GPU per role; storage_path on shared disk or object storage):
    ray job submit --working-dir . --runtime-env cluster/runtime_env.yaml -- python -m jobs.train_outer \
        --style mixture --preset paper --dataset_name data/mixture_outer.json --dataset_json_field data \
        --save_dir /mnt/shared/outer_mixture --storage_path s3://bucket/ray_runs --use_gpu --recompute
"""

import json
import sys
from pathlib import Path

from recmas_ray.config.cli import run_job
from recmas_ray.system.next_steps import next_commands
from recmas_ray.train.config import OuterTrainConfig

def main_cfg(cfg: OuterTrainConfig) -> int:
    """Run a parsed, checked config (heavy imports happen here, after parsing), holding --save_dir's lock;
    --links DIR is folded into --ckpt_override and --save_dir DIR/outer first."""
    # lazy: train_api imports torch; --help and bad input must not (tests/jobs/test_train_flags.py)
    from recmas_ray.train_api import run_training_job

    return run_training_job(cfg.with_links_folded(), "train_outer", _train)


def _train(cfg, console) -> int:
    # lazy: Ray Train and torch, after the checks (tests/jobs/test_train_flags.py)
    from recmas_ray.train.pipeline import train_outer

    console.settle_logs()
    console.start(f"outer training: {cfg.system.style}, R={cfg.num_recursive_rounds}, {cfg.max_steps} steps, "
                  f"into {cfg.save_dir}")
    result = train_outer(cfg)  # the console shows its per-step bar
    console.done()
    summarize(cfg, result, console)
    return 0


def summarize(cfg, result, console) -> None:
    """The end-of-job lines (where the links went, the last losses, the commands that reuse them); the same
    figures as JSON in SAVE_DIR/train_summary.json, with the run's own checkpoint (under _ray_runs, for --resume)."""
    last = result.log[-1] if result.log else {}
    summary = {"save_dir": str(result.save_dir), "ray_run_checkpoint": str(result.checkpoint_dir),
               "step": last.get("step"), "loss": last.get("loss"),
               "eval_loss": result.eval_log[-1]["eval_loss"] if result.eval_log else None}
    (Path(result.save_dir) / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    losses = f"loss {summary['loss']:.4f}" if isinstance(summary["loss"], float) else "no loss logged"
    if summary["eval_loss"] is not None:
        losses += f", held-out loss {summary['eval_loss']:.4f}"
    console.line(f"outer links: {result.save_dir} (step {summary['step']}, {losses})")
    inner = {r: p for r, p in cfg.system.ckpt_override.items() if r != "outer"}
    save = Path(result.save_dir)
    folder = save.parent if save.name == "outer" and inner and all(
        Path(p).resolve() == (save.parent / r).resolve() for r, p in inner.items()) else None
    if folder is None:  # not one system folder: name every link folder
        console.line("use with: python -m jobs.run --style " + cfg.system.style + " --preset " + cfg.system.preset
                     + " --task " + cfg.task
                     + " --ckpt_override " + " ".join(f"{r}={p}" for r, p in {**inner, "outer": save}.items())
                     + " --dataset QUESTIONS.jsonl")
        return
    console.line(f"system folder: {folder} (inner links of {', '.join(inner)}; outer links in outer/)")
    for line in next_commands(str(folder), style=cfg.system.style, preset=cfg.system.preset, task=cfg.task,
                              role_models=cfg.system.role_models, dataset=evaluation_file(cfg)):
        console.line(line)


def evaluation_file(cfg) -> str | None:
    """The question file the printed jobs.run command names: the held-out rows when they are a file, else the
    example math questions for a math system (None: a placeholder)."""
    if cfg.eval_dataset and not cfg.eval_dataset.startswith("synthetic"):
        return cfg.eval_dataset
    return "jobs/examples/questions.jsonl" if cfg.task == "math" else None


def main(argv=None) -> int:
    """Parse argv (flags, --config FILE) and train; returns the exit status (2: bad input, before any model)."""
    return run_job(main_cfg, OuterTrainConfig, argv, prog="train_outer", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
