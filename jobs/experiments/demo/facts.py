"""The demo's hidden-fact tasks: does a trained link carry what only the upstream agent was told?

For each (style, task) of `DemoConfig.fact_tasks` (`train.synthetic_facts`: recall, two_fact, mixture, compare)
one run of `jobs.experiments.sweep_recipe` with the demo's fact recipe: inner links, the decoder's baselines
(alone without the fact = floor, told the fact in text = ceiling, TextMAS), outer links trained with the
recipe `FactsConfig.recipe`, then on the same held-out questions (seen-values and unseen-values splits) the
trained links with their own latents, with latents shuffled between questions and fresh outer links.
Its answer comes first: one line per style, task and split,

    STYLE / TASK (SPLIT), R=1: trained links carry the fact: X/N own vs Y/N shuffled vs Z/N fresh (McNemar p ...)

("do not show the fact" where either Holm-adjusted test fails alpha 0.01; `demo.verdicts.headline`), per split
(seen values, unseen values, all held-out), and for the collaboration task (compare) trained RecursiveMAS
against the single agent and TextMAS. The same rows feed the PNG's first panel (`demo.report`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from jobs.experiments.demo import verdicts
from jobs.experiments.demo.sweep_rows import rows_from_measure
from jobs.experiments.sweep_recipe import SweepRecipeConfig, main_cfg
from jobs.experiments.sweep_recipe_measure import split_parts
from recmas_ray.eval.results import library_versions
from recmas_ray.styles import get_style
from recmas_ray.train.synthetic_facts import COLLABORATION_TASKS


def sweep_config(cfg, style: str, task: str, out: Path):
    """The sweep run of one (style, task) at the demo's sizes."""
    f = cfg.facts
    two_hop = {"recipes": [f.two_hop.recipe], "inner_steps": f.two_hop.inner_steps,
               "inner_schedule": f.two_hop.inner_schedule,
               # real base models only with the real preset (tiny runs keep their random families)
               "role_models": dict(f.two_hop.role_models) if cfg.system.preset == "demo" else {}}
    return SweepRecipeConfig(
        out_dir=str(out / "facts" / f"{style}-{task}"), style=style, preset=cfg.system.preset, fact_task=task,
        task="qa", num_train=f.num_train, num_eval=f.num_seen, num_unseen=f.num_unseen,
        **({"recipes": [f.recipe], "inner_steps": f.inner_steps} | (two_hop if get_style(style).num_hops > 1 else {})),
        outer_steps=f.outer_steps, outer_batch_size=f.batch_size,
        latent_steps=f.latent_steps, max_new_tokens=f.max_new_tokens, eval_batch_size=cfg.batch_size,
        baselines=True, extra_rows=[], seed=cfg.system.seed)


def _count(xs: list[bool]) -> str:
    return f"{sum(xs)}/{len(xs)}"


def parts_of(sc) -> dict[str, range]:
    """Held-out positions per split (seen values, unseen values) and, with both, all held-out together."""
    parts = dict(split_parts(sc))
    if len(parts) > 1:
        parts["all held-out"] = range(sc.num_eval + sc.num_unseen)
    return parts


def report_tasks(style: str, task: str, sc, result: dict, baselines: dict) -> list[dict]:
    """One report task per held-out split (`demo.report` / `demo.verdicts` input): the measured rows of that
    split; compare is the collaboration task."""
    return [{"style": style, "task": f"{task} ({split})", "collaboration": task in COLLABORATION_TASKS,
             "rows": rows_from_measure(result, baselines, positions=part, rounds=1)}
            for split, part in parts_of(sc).items()]


def lead_lines(tasks: list[dict]) -> list[str]:
    """The answer of one fact task, one line per split: "trained links carry the fact: X/N own vs Y/N shuffled
    vs Z/N fresh (McNemar p ...; Holm ...)" (or "do not show the fact"); for compare, trained RecursiveMAS against
    the single agent and TextMAS."""
    return [line for t in tasks for line in (verdicts.collaboration([t]) if t["collaboration"] else verdicts.headline([t]))]


def task_table(style: str, task: str, sc, result: dict, baselines: dict) -> str:
    """Rows x splits: correct answers strict (lenient: the value stated as the final number) of the baselines
    and the link sets."""
    rows = {"decoder alone, no fact (floor)": "single_floor", "decoder told the fact in text (ceiling)": "single_ceiling",
            "TextMAS": "textmas", "RecursiveMAS trained, own latents": "trained",
            "  latents shuffled between questions": "shuffled", "  fresh outer links": "fresh"}
    runs = {**baselines, **result}
    parts = parts_of(sc)
    lines = [f"{style}, task {task}: {sc.num_train} training rows, outer {sc.outer_steps} steps x {sc.outer_batch_size}, "
             f"m = {sc.latent_steps}, recipe {sc.recipes[0]}; correct strict (lenient)",
             "| row | " + " | ".join(parts) + " |", "|---|" + "---|" * len(parts)]
    for name, key in rows.items():
        if key not in runs:
            continue
        strict, lenient = runs[key]["correct"], runs[key].get("correct_lenient") or runs[key]["correct"]
        cells = [f"{_count([strict[i] for i in p])} ({sum(strict[i] or lenient[i] for i in p)})" for p in parts.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_facts(cfg, out: Path, console) -> dict:
    """Every fact task of the config; returns {"lines", "tables", "tasks" (report tasks, one per split), "results"}
    (also in <out>/facts/summary.json)."""
    lines, tables, tasks, results = [], [], [], {}
    pairs = cfg.fact_task_pairs()
    # The systems with the most agents train and measure first, while this process holds nothing of an earlier
    # task (its freed heap is not all handed back): the job's memory peak is the first task's, not a sum. Each
    # task seeds its own draws, training and fresh links, so the order changes no figure; lines keep --tasks' order.
    by_task = {}
    for style, task in sorted(pairs, key=lambda p: -len(get_style(p[0]).roles)):
        sc = sweep_config(cfg, style, task, out)
        console.start(f"{style} {task}: train links on {sc.num_train} rows, measure {sc.num_eval} + {sc.num_unseen} held-out")
        t0 = time.perf_counter()
        main_cfg(sc)
        run = Path(sc.out_dir)
        result = json.loads((run / sc.recipes[0] / "result.json").read_text())
        baselines = json.loads((run / "baselines.json").read_text())
        got_tasks = report_tasks(style, task, sc, result, baselines)
        got = lead_lines(got_tasks)
        console.done(f"{time.perf_counter() - t0:.0f} s")
        by_task[(style, task)] = got, got_tasks, task_table(style, task, sc, result, baselines)
        results[f"{style}:{task}"] = {"lines": got, "seconds": time.perf_counter() - t0, "out_dir": str(run),
                                      "train_seconds": result.get("train_seconds")}
    for pair in pairs:  # --tasks' order
        got, got_tasks, table = by_task[pair]
        lines += got
        tasks += got_tasks
        tables.append(table)
    results = {f"{s}:{t}": results[f"{s}:{t}"] for s, t in pairs}
    (out / "facts").mkdir(parents=True, exist_ok=True)

    summary = {"lines": lines, "tables": tables, "runs": results, "seed": cfg.system.seed,
               "versions": library_versions()}
    (out / "facts" / "summary.json").write_text(json.dumps(summary, indent=2))
    return {"lines": lines, "tables": tables, "tasks": tasks, "results": results}
