"""Benchmark RecursiveMAS against Recursive-TextMAS and its own design choices; writes JSON + PNG.

Figures (each a ratio within one run, median of repetitions; see recmas_ray/benchmark.py):
  (a) end-to-end speedup and token reduction vs Recursive-TextMAS at R = 1, 2, 3
  (b) KV-cached latent rollout vs the release's full re-run, m = 16, 32, 64
  (c) Ray backend vs in-process backend
  (d) one latent step vs one decoded token per model, against Proposition 3.1

Examples:
  python jobs/bench.py --preset demo --quick                 # CPU, a few minutes, real small models
  python jobs/bench.py --preset demo --device cuda           # GPU, bf16
  python jobs/bench.py --preset tiny --quick --no_ray        # seconds, random tiny models
"""

import argparse
import json
import os
import sys



def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="demo")
    p.add_argument("--style", default="sequential_light")
    p.add_argument("--quick", action="store_true", help="1 repetition, 2 questions, short decodes")
    p.add_argument("--no_ray", action="store_true", help="skip figure (c)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--output_path", default="out/bench")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    from recmas_ray.perf import BenchConfig, plot_bench, run_bench
    from recmas_ray.train.synthetic import make_arithmetic_dataset

    cfg = BenchConfig(style=args.style, preset=args.preset, ray=not args.no_ray, device=args.device,
                      dtype=args.dtype, seed=args.seed)
    if args.quick:
        cfg.num_questions, cfg.repeats, cfg.max_new_tokens, cfg.latent_steps = 2, 1, 24, 8
    questions = [r["question"] for r in make_arithmetic_dataset(cfg.num_questions, seed=cfg.seed + 1000)]
    try:
        result = run_bench(cfg, questions)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.output_path, exist_ok=True)
    path = os.path.join(args.output_path, "bench.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2, default=str)
    plot_bench(result, os.path.join(args.output_path, "bench.png"))
    for row in result["a_end_to_end"]:
        print(f"(a) R={row['rounds']}: speedup {row['speedup']:.2f}x, token reduction {100 * row['token_reduction']:.1f}%")
    for row in result["b_rollout_cache"]:
        print(f"(b) m={row['latent_steps']}: KV cache {row['speedup']:.2f}x faster than full re-run")
    if "c_backend" in result:
        c = result["c_backend"]
        print(f"(c) ray/local: {c['ray_over_local']:.2f} (1 batch), {c['ray_3_in_flight_over_local']:.2f} (3 in flight)")
    for row in result["d_step_cost"]:
        print(f"(d) {row['model']}: latent step / decoded token = {row['measured_ratio']:.2f} "
              f"(Prop. 3.1 FLOPs: {row['predicted_ratio_prop31']:.2f})")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
