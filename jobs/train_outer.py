"""Outer-loop training of RecursiveMAS: backpropagation through R rounds of frozen agents, pipeline-parallel on
Ray Train (one worker per role; latents and their gradients travel between workers by torch.distributed p2p).

Only the outer links train; base models and inner links (from `--ckpt_override ROLE=INNER_DIR`, the inner-loop
results) stay frozen. The result loads with `jobs/run.py --ckpt_override outer=SAVE_DIR`.

Examples
  CPU, offline, tiny models (a few seconds per step):
    python jobs/train_outer.py --style sequential --preset tiny --dataset_name synthetic:64 \
        --save_dir out/outer_seq --num_recursive_rounds 2 --max_latent_tokens 16 --max_steps 20 \
        --batch_size 2 --num_microbatches 2 --lr 1e-3 --warmup_steps 2
  after inner training (each role's base model comes from its inner checkpoint):
    python jobs/train_outer.py --style sequential --ckpt_override planner=ckpt/inner/planner \
        critic=ckpt/inner/critic solver=ckpt/inner/solver --dataset_name data/sequential_math.json \
        --dataset_json_field data --save_dir ckpt/outer --use_gpu --recompute
  resume a stopped run (same --save_dir / --storage_path):
    python jobs/train_outer.py ... --resume
  on a cluster (one GPU per role; storage_path on shared disk):
    ray job submit --working-dir . --runtime-env cluster/runtime_env.yaml -- python jobs/train_outer.py \
        --style mixture --preset paper --dataset_name data/mixture_outer.json --dataset_json_field data \
        --save_dir /mnt/shared/outer_mixture --storage_path /mnt/shared/ray_runs --use_gpu --recompute
"""

import argparse
import json


from recmas_ray.system.plan import parse_overrides
from recmas_ray.train.outer import OuterTrainConfig


def build_parser() -> argparse.ArgumentParser:
    d = OuterTrainConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--style", required=True, help="sequential[_light|_scaled], mixture, distillation, deliberation")
    p.add_argument("--ckpt_override", action="extend", nargs="+", default=[], metavar="ROLE=DIR",
                   help="inner checkpoint per role (frozen); outer=DIR starts from trained outer links")
    p.add_argument("--preset", default=d.preset, help="base models of roles without an override: tiny | demo | paper")
    p.add_argument("--task", default=d.task, choices=["math", "code", "choice"])
    p.add_argument("--dataset_name", default=d.dataset_name, help=".json/.jsonl, a HF dataset id or synthetic[:N]")
    p.add_argument("--dataset_json_field", default=None)
    p.add_argument("--save_dir", required=True)
    p.add_argument("--storage_path", default=None, help="Ray Train storage (shared disk on multi-node clusters)")
    p.add_argument("--num_recursive_rounds", type=int, default=d.num_recursive_rounds)
    p.add_argument("--max_latent_tokens", type=int, default=d.max_latent_tokens)
    p.add_argument("--max_steps", type=int, default=d.max_steps)
    p.add_argument("--batch_size", type=int, default=d.batch_size)
    p.add_argument("--num_microbatches", type=int, default=d.num_microbatches)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--warmup_steps", type=int, default=d.warmup_steps)
    p.add_argument("--max_grad_norm", type=float, default=d.max_grad_norm)
    p.add_argument("--non_last_loss_weight", type=float, default=d.non_last_loss_weight)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--dtype", default=d.dtype, help="auto (bf16 on CUDA, fp32 on CPU) | bfloat16 | float32")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint of this run")
    p.add_argument("--use_gpu", action="store_true", help="one GPU per role worker, NCCL")
    p.add_argument("--recompute", action="store_true", help="keep only stage inputs, re-run stages in backward")
    p.add_argument("--save_every", type=int, default=d.save_every)
    p.add_argument("--stop_at_step", type=int, default=d.stop_at_step)
    p.add_argument("--max_failures", type=int, default=d.max_failures)
    p.add_argument("--cpus_per_worker", type=float, default=d.cpus_per_worker)
    p.add_argument("--gpus_per_worker", type=float, default=d.gpus_per_worker)
    return p


def config_from_args(args) -> OuterTrainConfig:
    """The run config of parsed flags (every flag maps 1:1 onto a field)."""
    fields = vars(args).copy()
    fields["ckpt_overrides"] = parse_overrides(fields.pop("ckpt_override"))
    return OuterTrainConfig(**fields)


def main(argv=None) -> None:
    cfg = config_from_args(build_parser().parse_args(argv))
    from recmas_ray.train.pipeline import train_outer

    result = train_outer(cfg)
    last = result.log[-1] if result.log else {}
    print(json.dumps({"save_dir": str(result.save_dir), "checkpoint": str(result.checkpoint_dir),
                      "step": last.get("step"), "loss": last.get("loss")}, indent=2))


if __name__ == "__main__":
    main()
