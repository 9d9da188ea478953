r"""Outer-loop training of RecursiveMAS: backpropagation through R rounds of frozen agents, pipeline-parallel on
Ray Train (one worker per role; latents and their gradients travel between workers by torch.distributed p2p).

Only the outer links train; base models and inner links (from `--ckpt_override ROLE=INNER_DIR`, the inner-loop
results) stay frozen. The result loads with `jobs/run.py --ckpt_override outer=SAVE_DIR`. The console shows a
per-step bar and, on stdout, one JSON summary; Ray, Ray Train and worker output goes to
SAVE_DIR/logs/train_outer.log (--verbose shows it).

Examples
  CPU, offline, tiny models (a few seconds per step):
    python -m jobs.train_outer --style sequential --preset tiny --dataset_name synthetic:64 \
        --save_dir out/outer_seq --num_recursive_rounds 2 --max_latent_tokens 16 --max_steps 20 \
        --batch_size 2 --num_microbatches 2 --lr 1e-3 --warmup_steps 2
  with a held-out loss curve every 5 steps (eval_curve.jsonl + eval_curve.png in --save_dir):
    python -m jobs.train_outer ... --eval_every 5 --eval_dataset heldout.jsonl
  after inner training (each role's base model comes from its inner checkpoint):
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

from recmas_ray.config.cli import run_job
from recmas_ray.train.config import OuterTrainConfig

def main_cfg(cfg: OuterTrainConfig) -> int:
    """Run a parsed, checked config (heavy imports happen here, after parsing), holding --save_dir's lock."""
    from recmas_ray.train_api import run_training_job

    return run_training_job(cfg, "train_outer", _train)


def _train(cfg, console) -> int:
    from recmas_ray.train.pipeline import train_outer

    console.settle_logs()
    result = train_outer(cfg)  # the console shows its per-step bar; stdout stays one JSON document
    last = result.log[-1] if result.log else {}
    console.line(json.dumps({"save_dir": str(result.save_dir), "checkpoint": str(result.checkpoint_dir),
                             "step": last.get("step"), "loss": last.get("loss"),
                             "eval_loss": result.eval_log[-1]["eval_loss"] if result.eval_log else None}, indent=2))
    return 0


def main(argv=None) -> int:
    """Parse argv (flags, --config FILE) and train; returns the exit status (2: bad input, before any model)."""
    return run_job(main_cfg, OuterTrainConfig, argv, prog="train_outer", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
