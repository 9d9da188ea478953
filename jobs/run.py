"""Evaluate a RecursiveMAS system (and its text baselines) on a benchmark or a local question file.

Examples (CPU, offline):
  python jobs/run.py --style sequential_light --preset tiny --dataset questions.jsonl \
      --backend local --num_recursive_rounds 2 --latent_steps 8 --output_path out
  python jobs/run.py --style mixture --preset tiny --dataset questions.jsonl --backend ray \
      --method recursive_mas,recursive_textmas --num_recursive_rounds 2
On a cluster (GPU agents, one per GPU):
  ray job submit --working-dir . --runtime-env cluster/runtime_env.yaml -- \
      python jobs/run.py --style sequential_scaled --preset paper --dataset math500 \
      --placement one_gpu_per_agent --device cuda --output_path /mnt/shared/results
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from recmas_ray.agent import DecodeConfig  # noqa: E402
from recmas_ray.distributed.placement import PRESETS, PlacementConfig  # noqa: E402
from recmas_ray.system import parse_overrides  # noqa: E402


def parse_role_amounts(text: str | None, flag: str) -> dict[str, float]:
    """`"science=1,math=0.5"` -> {"science": 1.0, "math": 0.5}."""
    out = {}
    for item in filter(None, (text or "").split(",")):
        role, sep, value = item.partition("=")
        try:
            out[role] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"{flag} item {item!r} is not ROLE=NUMBER")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--style", required=True)
    p.add_argument("--dataset", required=True, help="benchmark name or a local .jsonl/.json file")
    p.add_argument("--dataset_path", default=None, help="local copy of a named benchmark")
    p.add_argument("--dataset_json_field", default=None)
    p.add_argument("--preset", default="tiny", help="tiny | demo | paper")
    p.add_argument("--ckpt_override", action="extend", nargs="+", default=[], metavar="ROLE=PATH")
    p.add_argument("--method", default="recursive_mas", help="comma list of recursive_mas, recursive_textmas, "
                   "textmas, single_agent")
    p.add_argument("--num_recursive_rounds", type=int, default=3)
    p.add_argument("--latent_steps", type=int, default=32)
    p.add_argument("--num_samples", type=int, default=None)
    p.add_argument("--num_rollouts", type=int, default=1)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--max_inflight_batches", type=int, default=2)
    p.add_argument("--max_new_tokens", type=int, default=256)
    p.add_argument("--do_sample", action="store_true", help="sample (T, top_p) instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top_p", type=float, default=0.95)
    p.add_argument("--decode_every_round", action="store_true", help="mixture reference behaviour")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--backend", default="ray", choices=["ray", "local"])
    p.add_argument("--placement", default="cpu", choices=list(PRESETS))
    p.add_argument("--role_gpus", default=None, help="per-role GPUs, e.g. science=1,math=0.5")
    p.add_argument("--role_cpus", default=None, help="per-role logical CPUs")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--grader", default="strict", choices=["strict", "reference"])
    p.add_argument("--output_path", default="out")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--plot", action="store_true")
    p.add_argument("--timeout_s", type=float, default=900.0)
    p.add_argument("--torch_threads", type=int, default=0)
    p.add_argument("--no_progress", action="store_true")
    return p


def config_from_args(args):
    from recmas_ray.evaluate import EvalConfig

    placement = PlacementConfig(preset=args.placement, role_gpus=parse_role_amounts(args.role_gpus, "--role_gpus"),
                                role_cpus=parse_role_amounts(args.role_cpus, "--role_cpus"))
    decode = DecodeConfig(max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
                          temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    return EvalConfig(
        style=args.style, dataset=args.dataset, dataset_path=args.dataset_path,
        dataset_json_field=args.dataset_json_field, preset=args.preset,
        ckpt_override=parse_overrides(args.ckpt_override), methods=[m.strip() for m in args.method.split(",")],
        num_recursive_rounds=args.num_recursive_rounds, latent_steps=args.latent_steps, decode=decode,
        decode_every_round=args.decode_every_round, num_samples=args.num_samples, num_rollouts=args.num_rollouts,
        batch_size=args.batch_size, max_inflight_batches=args.max_inflight_batches, backend=args.backend,
        placement=placement, device=args.device, dtype=args.dtype, seed=args.seed, grader=args.grader,
        output_path=args.output_path, resume=args.resume, plot=args.plot, timeout_s=args.timeout_s,
        torch_threads=args.torch_threads)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from recmas_ray.evaluate import evaluate

    try:
        cfg = config_from_args(args)
        out = evaluate(cfg, progress=not args.no_progress)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"samples: {out['samples_path']}\nresults: {out['results_path']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
