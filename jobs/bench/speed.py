"""Benchmark RecursiveMAS against Recursive-TextMAS and its own design choices; writes JSON + PNG.

Figures (each a ratio within one run, median of interleaved repetitions; see jobs/bench/perf.py):
  (a) end-to-end speedup and token reduction vs Recursive-TextMAS at R = 1, 2, 3
  (b) latent rollout: static KV cache and growing cache vs the release's full re-run, m = 16, 32, 64
  (c) Ray backend vs in-process backend
  (d) one latent step vs one decoded token per model, against Proposition 3.1
  (e) prompt-prefix KV reuse over R rounds: prompt tokens prefilled per round, seconds, same predictions
  (f) decode loop: static cache + EOS read every k tokens vs growing cache + every token
  (g) torch.compile of the one-position step (only with --figures including g)

Examples:
  python -m jobs.bench.speed --preset demo --quick                 # CPU, a few minutes, real small models
  python -m jobs.bench.speed --preset demo --device cuda           # GPU, bf16
  python -m jobs.bench.speed --preset tiny --quick --no_ray        # seconds, random tiny models
  python -m jobs.bench.speed --preset demo --figures b,e,f --no_ray # the cache / reuse / decode figures only
"""

from __future__ import annotations

import json
import os
import sys

from jobs.bench.perf import plot_bench, run_bench
from recmas_ray.config.cli import run_job
from recmas_ray.config.tree import save_config
from jobs.bench.perf_config import BenchConfig, quick
from recmas_ray.train.synthetic import make_arithmetic_dataset


def bench(cfg: BenchConfig) -> int:
    """Run the figures, write config.json, then bench.json / bench.png after each figure; one line per figure."""
    questions = [r["question"] for r in make_arithmetic_dataset(cfg.num_questions, seed=cfg.system.seed + 1000)]
    save_config(cfg, cfg.output_path)
    path = os.path.join(cfg.output_path, "bench.json")

    def write(result: dict) -> None:  # after every figure: a long run keeps what it finished
        with open(path + ".tmp", "w") as f:
            json.dump(result, f, indent=2, default=str)
        os.replace(path + ".tmp", path)
        plot_bench(result, os.path.join(cfg.output_path, "bench.png"))

    result = run_bench(cfg, questions, on_figure=write)
    for line in summary_lines(result):
        print(line)
    print(f"wrote {path}")
    return 0


def summary_lines(result: dict) -> list[str]:
    """One line per measured figure."""
    lines = []
    for row in result.get("a_end_to_end", []):
        lines.append(f"(a) R={row['rounds']}: speedup {row['speedup']:.2f}x, "
                     f"token reduction {100 * row['token_reduction']:.1f}%")
    for row in result.get("b_rollout_cache", []):
        lines.append(f"(b) m={row['latent_steps']}: static cache {row['speedup']:.2f}x faster than full re-run "
                     f"(growing cache {row['growing_speedup']:.2f}x); max |diff| {row['max_abs_diff_vs_full']:.1e}")
    if "c_backend" in result:
        c = result["c_backend"]
        lines.append(f"(c) ray/local: {c['ray_over_local']:.2f} (1 batch), {c['ray_3_in_flight_over_local']:.2f} (3 in flight)")
    for row in result.get("d_step_cost", []):
        lines.append(f"(d) {row['model']}: latent step / decoded token = {row['measured_ratio']:.2f} "
                     f"(Prop. 3.1 FLOPs: {row['predicted_ratio_prop31']:.2f})")
    if "e_prefix_reuse" in result:
        e = result["e_prefix_reuse"]
        fmt = lambda k: " / ".join(str(r["tokens_prefilled"]) for r in e[k]["per_round"])  # noqa: E731
        lines.append(f"(e) prompt tokens prefilled per round, reuse: {fmt('reuse')}; without: {fmt('no_reuse')}; "
                     f"{e['speedup']:.2f}x per batch; same predictions: {e['same_predictions']}")
    if "f_decode" in result:
        f = result["f_decode"]
        lines.append(f"(f) decode: {1e3 * f['static_s_per_token']:.1f} ms/token vs {1e3 * f['growing_s_per_token']:.1f} "
                     f"({f['speedup']:.2f}x); same greedy text: {f['same_greedy_text']}")
    if "g_compile" in result:
        g = result["g_compile"]
        lines.append(f"(g) compiled step: {g['speedup']:.2f}x eager at m={g['latent_steps']} "
                     f"(first call {g['first_call_s']:.0f} s); max |diff| {g['max_abs_diff']:.1e}")
    return lines


def main(argv=None) -> int:
    return run_job(bench, BenchConfig, argv, prog="python -m jobs.bench.speed", description=__doc__,
                   recipes={"quick": quick})


if __name__ == "__main__":
    sys.exit(main())
