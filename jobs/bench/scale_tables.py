"""The scaling section's tables (docs/results.md) from the JSONs that hold their figures, as Markdown:

    python -m jobs.bench.scale_tables [docs/scale_costs.json] [docs/scale_real.json]

Measured figures are printed plain; every modelled figure is marked "(modelled)". Regenerate the JSONs with
`python -m jobs.bench.scale_fit` then `python -m jobs.bench.scale_real` (in that order: the second reads the
first), then paste this output.
"""

from __future__ import annotations

import json
import sys

from jobs.bench.scale_fit import QUANTITIES
from recmas_ray.models.registry import PACKAGED


def fit_table(costs: dict) -> str:
    """Per model and quantity: the fitted line and the measured medians (min-max) at each row count."""
    rows = sorted({p["rows"] for m in costs["measurements"] for p in m["points"]})
    head = "| model | quantity | fit: a + b x rows (ms) | r2 | " + " | ".join(f"{r} rows: median (min-max) ms"
                                                                              for r in rows) + " |"
    lines = [head, "|" + "---|" * (4 + len(rows))]
    for m in costs["measurements"]:
        fit = costs["fit"][m["model"]]["lines"]
        by_rows = {p["rows"]: p for p in m["points"]}
        for q in QUANTITIES:
            cells = []
            for r in rows:
                p = by_rows.get(r)
                cells.append(f"{p[q]:.1f} ({min(p[q + '_samples']):.1f}-{max(p[q + '_samples']):.1f})" if p else "")
            lines.append(f"| {PACKAGED.key(m['model'])} | {q.removesuffix('_ms').replace('_', ' ')} | "
                         f"{fit[q]['a']:.2f} + {fit[q]['b']:.2f} x rows | {fit[q]['r2']:.2f} | " + " | ".join(cells) + " |")
    loads = [m["loadavg_1_5_15_before"][0] for m in costs["measurements"]] + \
            [m["loadavg_1_5_15_after"][0] for m in costs["measurements"]]
    clock = costs["measurements"][0].get("clock", "wall")
    lines.append(f"\n{clock} time; {costs['measurements'][0]['repeats']} interleaved passes; load average (1 min) "
                 f"{min(loads):.1f}-{max(loads):.1f}; {costs['versions']}; {costs.get('measured_at', '')}")
    return "\n".join(lines)


def real_table(real: dict) -> str:
    """Per layout: measured throughput, the model's (marked), CPU per batch and the cores the run had."""
    lines = ["| layout | agents | throughput, batches/s: measured median (min-max) | modelled at the probed cores | "
             "measured vs modelled | probed cores | CPU s per batch: measured / modelled | cores the agents had "
             "(modelled at those) | modelled at all host cores |", "|---|---|---|---|---|---|---|---|---|"]
    for name, lay in real["layouts"].items():
        layout = (f"{real['whole_system_replicas']} whole systems" if name == "whole_system" else
                  "pools " + " / ".join(f"{r} {n}" for r, n in real["pool_copies"].items()))
        lines.append(
            f"| {layout} | {real['agents']} | {lay['measured_throughput_batches_per_s']:.3f} "
            f"({lay['measured_spread'][0]:.3f}-{lay['measured_spread'][1]:.3f}) | "
            f"{lay['modelled_throughput_batches_per_s']:.3f} (modelled) | {lay['measured_vs_modelled']:+.1%} | "
            f"{lay['probed_cores']:.2f} | "
            f"{lay['measured_cpu_s_per_batch']:.2f} / {lay['modelled_cpu_s_per_batch']:.2f} (modelled) | "
            f"{lay['effective_cores']:.2f} ({lay['modelled_at_run_cores']:.3f}, modelled) | "
            f"{lay['modelled_at_host_cores']:.3f} (modelled) |")
    r = real["pools_vs_whole"]
    loads = [x for lay in real["layouts"].values() for run in lay["runs"]
             for x in (run["loadavg_1_5_15_before"][0], run["loadavg_1_5_15_after"][0])]
    lines.append(f"\npools / whole systems: measured {r['measured']:.2f}x, modelled {r['modelled']:.2f}x (modelled); "
                 f"{len(next(iter(real['layouts'].values()))['runs'])} interleaved runs per layout; load average "
                 f"(1 min) {min(loads):.1f}-{max(loads):.1f}; the online rule on the pools' measured busy "
                 f"{ {k: round(v, 2) for k, v in real['resize_rule_on_measured_busy']['busy'].items()} } gives "
                 f"{real['resize_rule_on_measured_busy']['copies']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    costs_path = argv[0] if argv else "docs/scale_costs.json"
    real_path = argv[1] if len(argv) > 1 else "docs/scale_real.json"
    print(fit_table(json.load(open(costs_path))))
    print()
    print(real_table(json.load(open(real_path))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
