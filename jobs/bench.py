"""Benchmark RecursiveMAS against Recursive-TextMAS and its own design choices; writes JSON + PNG.

Figures (each a ratio within one run, median of repetitions; see recmas_ray/perf.py):
  (a) end-to-end speedup and token reduction vs Recursive-TextMAS at R = 1, 2, 3
  (b) KV-cached latent rollout vs the release's full re-run, m = 16, 32, 64
  (c) Ray backend vs in-process backend
  (d) one latent step vs one decoded token per model, against Proposition 3.1

Examples:
  python -m jobs.bench --preset demo --quick                 # CPU, a few minutes, real small models
  python -m jobs.bench --preset demo --device cuda           # GPU, bf16
  python -m jobs.bench --preset tiny --quick --no_ray        # seconds, random tiny models
"""

from __future__ import annotations

import json
import os
import sys

from recmas_ray.config.cli import run_job, save_config
from recmas_ray.config.perf import BenchConfig, quick


def bench(cfg: BenchConfig) -> int:
    """Run the figures, write bench.json / bench.png / config.json, print one line per figure."""
    from recmas_ray.perf import plot_bench, run_bench
    from recmas_ray.train.synthetic import make_arithmetic_dataset

    questions = [r["question"] for r in make_arithmetic_dataset(cfg.num_questions, seed=cfg.seed + 1000)]
    result = run_bench(cfg, questions)
    save_config(cfg, cfg.output_path)
    path = os.path.join(cfg.output_path, "bench.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2, default=str)
    plot_bench(result, os.path.join(cfg.output_path, "bench.png"))
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


def main(argv=None) -> int:
    return run_job(bench, BenchConfig, argv, prog="python -m jobs.bench", description=__doc__,
                   recipes={"quick": quick})


if __name__ == "__main__":
    sys.exit(main())
