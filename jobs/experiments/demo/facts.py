"""The demo's hidden-fact tasks: does a trained link carry what only the upstream agent was told?

For each (style, task) of `DemoConfig.fact_tasks` (`train.synthetic_facts`: recall, two_fact, mixture, compare)
one run of `jobs.experiments.sweep_recipe` with the demo's fact recipe: inner links, the decoder's baselines
(alone without the fact = floor, told the fact in text = ceiling, TextMAS), outer links trained with every
stage sending its latent rollout, then on the same held-out questions (seen-values and unseen-values splits)
the trained links with their own latents, with latents shuffled between questions and fresh outer links.
Its answer comes first: one line per style and task,

    trained links carry the fact: X/N own vs Y/N shuffled vs Z/N fresh (McNemar p ...)

and for the collaboration task (compare) trained RecursiveMAS against the single agent and TextMAS.
"""

from __future__ import annotations

import json
from pathlib import Path

from jobs.experiments.sweep_recipe_measure import mcnemar_exact, split_parts


def sweep_config(cfg, style: str, task: str, out: Path):
    """The sweep run of one (style, task) at the demo's sizes."""
    from jobs.experiments.sweep_recipe import SweepRecipeConfig

    f = cfg.facts
    return SweepRecipeConfig(
        out_dir=str(out / "facts" / f"{style}-{task}"), style=style, preset=cfg.system.preset, fact_task=task,
        task="qa", recipes=[f.recipe], num_train=f.num_train, num_eval=f.num_seen, num_unseen=f.num_unseen,
        inner_steps=f.inner_steps, outer_steps=f.outer_steps, outer_batch_size=f.batch_size,
        latent_steps=f.latent_steps, max_new_tokens=f.max_new_tokens, eval_batch_size=cfg.batch_size,
        baselines=True, extra_rows=[], seed=cfg.system.seed)


def _count(xs: list[bool]) -> str:
    return f"{sum(xs)}/{len(xs)}"


def lead_lines(style: str, task: str, sc, result: dict, baselines: dict) -> list[str]:
    """The answer of one task, one line per held-out split."""
    out = []
    for split, part in split_parts(sc).items():
        pick = lambda row: [row["correct"][i] for i in part]  # noqa: E731
        own, shuf, fresh = pick(result["trained"]), pick(result["shuffled"]), pick(result["fresh"])
        p_s, p_f = mcnemar_exact(own, shuf)["p"], mcnemar_exact(own, fresh)["p"]
        head = f"{style} {task} ({split})"
        if task == "compare":
            single, text = pick(baselines["single_floor"]), pick(baselines["textmas"])
            out.append(f"{head}: trained RecursiveMAS {_count(own)} vs single agent {_count(single)} vs TextMAS "
                       f"{_count(text)} (McNemar p {mcnemar_exact(own, single)['p']:.2g} vs single, "
                       f"{mcnemar_exact(own, text)['p']:.2g} vs TextMAS; shuffled {_count(shuf)}, p {p_s:.2g})")
        else:
            out.append(f"{head}: trained links carry the fact: {_count(own)} own vs {_count(shuf)} shuffled vs "
                       f"{_count(fresh)} fresh (McNemar p {p_s:.2g} vs shuffled, {p_f:.2g} vs fresh)")
    return out


def task_table(style: str, task: str, sc, result: dict, baselines: dict) -> str:
    """Rows x splits: accuracy counts of the baselines and the link sets (strict grader)."""
    rows = {"decoder alone, no fact (floor)": baselines["single_floor"],
            "decoder told the fact in text (ceiling)": baselines["single_ceiling"], "TextMAS": baselines["textmas"],
            "RecursiveMAS trained, own latents": result["trained"], "  latents shuffled between questions": result["shuffled"],
            "  fresh outer links": result["fresh"]}
    parts = split_parts(sc)
    lines = [f"{style}, task {task}: {sc.num_train} training rows, outer {sc.outer_steps} steps x {sc.outer_batch_size}, "
             f"m = {sc.latent_steps}, recipe {sc.recipes[0]}",
             "| row | " + " | ".join(parts) + " |", "|---|" + "---|" * len(parts)]
    for name, row in rows.items():
        lines.append(f"| {name} | " + " | ".join(_count([row["correct"][i] for i in p]) for p in parts.values()) + " |")
    return "\n".join(lines)


def run_facts(cfg, out: Path, console) -> dict:
    """Every fact task of the config; returns {"lines", "tables", "results"} (also in <out>/facts/summary.json)."""
    import time

    from jobs.experiments.sweep_recipe import main_cfg

    lines, tables, results = [], [], {}
    for style, task in cfg.fact_task_pairs():
        sc = sweep_config(cfg, style, task, out)
        console.start(f"{style} {task}: train links on {sc.num_train} rows, measure {sc.num_eval} + {sc.num_unseen} held-out")
        t0 = time.perf_counter()
        main_cfg(sc)
        run = Path(sc.out_dir)
        result = json.loads((run / sc.recipes[0] / "result.json").read_text())
        baselines = json.loads((run / "baselines.json").read_text())
        got = lead_lines(style, task, sc, result, baselines)
        console.done(f"{time.perf_counter() - t0:.0f} s")
        lines += got
        tables.append(task_table(style, task, sc, result, baselines))
        results[f"{style}:{task}"] = {"lines": got, "seconds": time.perf_counter() - t0, "out_dir": str(run)}
    (out / "facts").mkdir(parents=True, exist_ok=True)
    (out / "facts" / "summary.json").write_text(json.dumps({"lines": lines, "tables": tables, "runs": results}, indent=2))
    return {"lines": lines, "tables": tables, "results": results}
