"""The main job's hidden-fact tasks through the product (`--facts.pipeline product`): the jobs a user runs.

For each (style, task) of the config, in the job's one Ray session, everything under
OUTPUT/product/<style>-<task>/:

    data/        train / validation / test question files (`train.synthetic_facts.split_by_value`, the split of
                 every question fixed by `train.splits`; each test row carries `split` seen / unseen), and
                 test_told.jsonl: the same rows, the question stating the fact (the ceiling row's)
    system/      python -m jobs.train_inner --mas_role all --num_workers 1   (Ray Train, a worker per role, roles
                 in parallel), then python -m jobs.train_outer --links system (Ray Train; the recipe's settings
                 from `sweep_recipe.RECIPES`, --schedule hop_by_hop for the two-hop token recipe; the step whose
                 links it keeps chosen by the held-out loss on validation.jsonl, --keep_best)
    eval/<row>/  python -m jobs.run --backend ray --links system, one output folder per row (`product_rows.ROWS`);
                 the rows of one set of agents share its Ray actors (`eval.batch_runner.keep_agents`)
    compare/     `eval.compare` over those folders (compare.json, compare.md): the table and the lead lines,
                 computed from the samples files only
    commands.txt the jobs.run and jobs.serve commands that reuse system/ (R and m as evaluated), and a request
                 to the server with the first test question, its fact in `role_context`

Each job is called through its entry point (`main(argv)`) with the very arguments printed, so the printed
`python -m jobs.run ...` command is what produced the own-latent row. A step whose output is there already
(a rerun) is skipped. This is the main job's default; `--facts.pipeline experiment` runs the recipe sweep's
in-process path (`demo.facts`) instead.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shlex
import time
from pathlib import Path

from jobs.experiments.demo.facts import sweep_config
from jobs.experiments.demo.product_rows import ROWS, product_lines, report_tasks
from jobs.experiments.sweep_recipe import recipe_settings
from recmas_ray.eval.batch_runner import keep_agents
from recmas_ray.eval.compare import compare_pooled, markdown, write_table
from recmas_ray.eval.results import library_versions
from recmas_ray.styles import get_style
from recmas_ray.system.next_steps import command, system_flags
from recmas_ray.train.synthetic import check_disjoint, write_jsonl
from recmas_ray.train.synthetic_facts import make_fact_dataset, split_by_value, told_rows


def _call(job: str, argv: list[str]) -> None:
    """Run `python -m jobs.<job> ARGV` in this process (this Ray session); a failure stops the task."""
    status = importlib.import_module(f"jobs.{job}").main(list(argv))
    if status != 0:
        raise RuntimeError(f"{command(job, *argv)} exited with status {status} (its log is under its output folder)")


def _flags(settings: dict) -> list[str]:
    """A recipe's OuterTrainConfig fields as jobs.train_outer flags."""
    out: list[str] = []
    for k, v in settings.items():
        if isinstance(v, bool):
            out.append(f"--{k}" if v else f"--no_{k}")
        else:
            out += [f"--{k}", str(v)]
    return out


def task_settings(cfg, style: str, task: str, out: Path) -> dict:
    """What the experiment path's sweep would use for this task (`demo.facts.sweep_config`), as plain values."""
    sc = sweep_config(cfg, style, task, out)
    return {"sweep": sc, "recipe": sc.recipes[0], "outer": recipe_settings(sc.recipes[0], sc),
            "system": system_flags(style, sc.preset, dict(sc.role_models))}


def write_data(cfg, style: str, task: str, folder: Path) -> dict[str, Path]:
    """train / validation / test / test_told files of one task; test rows carry `id` and `split`."""
    f, seed = cfg.facts, cfg.system.seed
    train, seen, unseen = split_by_value(task, style, num_train=f.num_train, num_seen=f.num_seen,
                                         num_unseen=f.num_unseen, seed=seed)
    validation = make_fact_dataset(task, style, f.num_validation, seed=seed + 3, split="validation") \
        if f.num_validation else []
    test = [{**r, "id": i, "split": split} for i, (r, split) in
            enumerate([(r, "seen") for r in seen] + [(r, "unseen") for r in unseen])]
    check_disjoint(train, test)
    check_disjoint(train, validation)
    told = told_rows(test)
    folder.mkdir(parents=True, exist_ok=True)
    files = {"train": write_jsonl(train, folder / "train.jsonl"), "test": write_jsonl(test, folder / "test.jsonl"),
             "told": write_jsonl(told, folder / "test_told.jsonl")}
    if validation:
        files["validation"] = write_jsonl(validation, folder / "validation.jsonl")
    return files


def train_argv(cfg, s: dict, files: dict, system: Path) -> tuple[list[str], list[str]]:
    """(jobs.train_inner argv, jobs.train_outer argv) with the experiment path's settings."""
    sc, quiet = s["sweep"], [] if cfg.progress else ["--no_progress"]
    inner = [*s["system"], "--mas_role", "all", "--task", sc.task, "--dataset_name", str(files["train"]),
             "--save_dir", str(system), "--max_steps", str(sc.inner_steps), "--batch_size", "4",
             "--lr", str(sc.inner_lr), "--warmup_steps", "2", "--save_every", str(sc.inner_steps),
             "--seed", str(sc.seed), "--num_workers", "1", "--max_length", "512",
             "--lr_scheduler_type", sc.inner_schedule, "--log_every", str(max(1, sc.inner_steps // 4)), *quiet]
    # the validation questions choose the outer training's length: held-out loss every quarter of the steps,
    # the links of the lowest kept (--keep_best); the test questions are read only by the rows
    chosen = ["--eval_dataset", str(files["validation"]), "--eval_every", str(max(1, sc.outer_steps // 4)),
              "--keep_best"] if "validation" in files and s["outer"].get("schedule") != "hop_by_hop" else []
    # with the first stage's rollouts computed once by the driver (the state bridge's), only the decoder's
    # worker computes in a step: it may use every core (the other worker waits on its sends)
    threads = ["--torch_threads", str(os.cpu_count() or 1)]
    outer = [*s["system"], "--links", str(system), "--task", sc.task, "--dataset_name", str(files["train"]),
             "--max_steps", str(sc.outer_steps), "--batch_size", str(sc.outer_batch_size),
             "--save_every", str(sc.outer_steps), "--seed", str(sc.seed), "--cpus_per_worker", "0.5",
             "--max_failures", "0", "--log_every", str(max(1, sc.outer_steps // 8)), *chosen, *threads,
             *_flags(s["outer"]), *quiet]
    return inner, outer


def row_argv(cfg, s: dict, row, files: dict, system: Path, out: Path) -> list[str]:
    """The jobs.run arguments of one row."""
    sc = s["sweep"]
    if row.links == "trained":
        links = ["--links", str(system)]
    else:  # the inner links alone: fresh outer links of the seed
        links = ["--ckpt_override", *[f"{r}={system / r}" for r in get_style(sc.style).roles]]
    return [*s["system"], *links, "--task", sc.task, "--dataset", str(files[row.data]), "--backend", "ray",
            "--num_recursive_rounds", str(s["outer"].get("num_recursive_rounds", 1)),
            "--latent_steps", str(sc.latent_steps), "--max_new_tokens", str(sc.max_new_tokens),
            "--batch_size", str(sc.eval_batch_size), "--seed", str(sc.seed), "--output_path", str(out),
            *row.args, *([] if cfg.progress else ["--no_progress"])]


def _done(folder: Path, pattern: str) -> bool:
    return folder.is_dir() and any(folder.glob(pattern))


def run_seed(cfg, style: str, task: str, folder: Path, console) -> dict:
    """One seed of a fact task (its question draw, training and rows) through the jobs, under `folder`."""
    s = task_settings(cfg, style, task, folder)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    files = write_data(cfg, style, task, folder / "data")
    system = folder / "system"
    inner_argv, outer_argv = train_argv(cfg, s, files, system)
    if not all(_done(system / r, "manifest.json") for r in _roles(style)):
        console.line(f"{style} {task}: " + command("train_inner", *inner_argv))
        _call("train_inner", inner_argv)
    seconds["train_inner"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    if not (_done(system / "outer", "links.pt") or _done(system / "outer", "manifest.json")):
        console.line(f"{style} {task}: " + command("train_outer", *outer_argv))
        _call("train_outer", outer_argv)
    seconds["train_outer"] = time.perf_counter() - t1
    argvs, folders = {}, []
    # rows whose agents would start identically (ROWS keeps them together) run on one set of Ray actors: each
    # row is still its own jobs.run (questions, samples, fingerprint, results), only the start-up is shared
    with keep_agents():
        for row in ROWS:
            t2, out = time.perf_counter(), folder / "eval" / row.name
            argvs[row.name] = row_argv(cfg, s, row, files, system, out)
            if not _done(out, "results_*.json"):
                _call("run", argvs[row.name])
            seconds[f"eval/{row.name}"] = time.perf_counter() - t2
            folders.append(str(out))
    seconds["total"] = time.perf_counter() - t0
    chosen = json.loads((system / "outer" / "manifest.json").read_text()).get("chosen")
    split_of = {str(r["id"]): r["split"] for r in map(json.loads, files["test"].read_text().splitlines())}
    return {"settings": s, "argvs": argvs, "folders": folders, "seconds": seconds, "system": system,
            "split_of": split_of, "chosen": chosen, "files": files}


def seeded(cfg, seed: int):
    """`cfg` with its system seed (question draw, link initialisation, training order) set to `seed`."""
    return dataclasses.replace(cfg, system=dataclasses.replace(cfg.system, seed=seed))


def run_task(cfg, style: str, task: str, root: Path, console) -> dict:
    """One fact task through the jobs, once per seed (`FactsConfig.num_seeds`), the rows pooled over the seeds;
    returns its lines, table, report tasks, commands and timings."""
    folder = root / f"{style}-{task}"
    seeds = [cfg.system.seed + k for k in range(cfg.facts.num_seeds)]
    runs = {}
    for seed in seeds:
        runs[str(seed)] = got = run_seed(seeded(cfg, seed), style, task, folder / f"seed{seed}", console)
        console.line(f"{style} {task} seed {seed}: {got['seconds']['total']:.0f} s (" + ", ".join(
            f"{k} {v:.0f} s" for k, v in got["seconds"].items() if k != "total") + ")")
        if got["chosen"]:
            console.line(f"{style} {task} seed {seed}: {chosen_line(got['chosen'], cfg.facts.num_validation)}")
    table = compare_pooled({label: r["folders"] for label, r in runs.items()}, [r.name for r in ROWS])
    write_table(table, folder / "compare")
    split_of = {f"{label}/{d}": sp for label, r in runs.items() for d, sp in r["split_of"].items()} \
        if len(runs) > 1 else runs[str(seeds[0])]["split_of"]
    tasks = report_tasks(style, task, table, split_of)
    first = runs[str(seeds[0])]
    s = first["settings"]
    own = first["argvs"][ROWS[0].name]
    recursion = [x for flag in ("--num_recursive_rounds", "--latent_steps")  # served as evaluated
                 for x in (flag, own[own.index(flag) + 1])]
    commands = [f"{style} / {task}: the saved system of seed {seeds[0]}, evaluated and served by the product's jobs:",
                "  " + command("run", *own),
                "  " + command("serve", *s["system"], "--links", str(first["system"]), "--task", s["sweep"].task,
                               *recursion, "--port", "8000"),
                "  " + example_request(style, first["files"]["test"], s["sweep"].max_new_tokens)]
    (folder / "commands.txt").write_text("\n".join(commands) + "\n")
    seconds = {k: sum(r["seconds"][k] for r in runs.values()) for k in first["seconds"]}
    choices = "; ".join(f"seed {k}: {chosen_line(r['chosen'], cfg.facts.num_validation)}"
                        for k, r in runs.items() if r["chosen"])
    head = (f"{style}, task {task} (product pipeline: jobs.train_inner, jobs.train_outer, jobs.run --backend ray); "
            f"recipe {s['recipe']}; seeds {', '.join(runs)} pooled; correct strict (lenient) / n"
            + (f"\n{choices}" if choices else ""))
    return {"lines": product_lines(style, task, table), "table": head + "\n" + markdown(table), "tasks": tasks,
            "commands": commands, "seconds": seconds, "folder": str(folder),
            "compare": str(folder / "compare" / "compare.json"), "seeds": seeds,
            "chosen": {k: r["chosen"] for k, r in runs.items()}}


def example_request(style: str, test_file: Path, max_tokens: int) -> str:
    """A curl request to the served system with the first test question, its fact told as the rows tell it
    (`role_context`: only to the roles that know it)."""
    row = json.loads(test_file.read_text().splitlines()[0])
    body = {"model": style, "messages": [{"role": "user", "content": row["question"]}], "max_tokens": max_tokens,
            **({"role_context": row["role_context"]} if row.get("role_context") else {})}
    return ("curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' -d "
            + shlex.quote(json.dumps(body)))


def chosen_line(chosen: dict, num_validation: int) -> str:
    """What the validation questions chose (`--keep_best`'s record in the outer links' manifest), in words."""
    steps = chosen["among_steps"]
    return (f"outer links of step {chosen['step']} kept, the lowest held-out loss ({chosen['eval_loss']:.4f}) on "
            f"{num_validation} validation questions among steps {', '.join(map(str, steps))}")


def _roles(style: str) -> tuple[str, ...]:
    return tuple(get_style(style).roles)


def run_product_facts(cfg, out: Path, console) -> dict:
    """Every fact task of the config through the product; returns {"lines", "tables", "tasks", "results",
    "commands", "summary"} (also in <out>/product/summary.json)."""
    root = out / "product"
    lines, tables, tasks, commands, results = [], [], [], [], {}
    for style, task in cfg.fact_task_pairs():
        # phase lines, not an open phase: the jobs called inside open and close phases of their own
        console.line(f"{style} {task} (product): jobs.train_inner, jobs.train_outer, {len(ROWS)} x jobs.run ...")
        got = run_task(cfg, style, task, root, console)
        console.line(f"{style} {task} (product): done ({got['seconds']['total']:.0f} s: " + ", ".join(
            f"{k} {v:.0f} s" for k, v in got["seconds"].items() if k != "total") + ")")
        lines += got["lines"]
        tables.append(got["table"])
        tasks += got["tasks"]
        commands += got["commands"]
        results[f"{style}:{task}"] = {k: got[k] for k in ("lines", "seconds", "folder", "compare", "commands", "seeds",
                                                           "chosen")}
    root.mkdir(parents=True, exist_ok=True)
    summary = root / "summary.json"
    summary.write_text(json.dumps({"pipeline": "product", "lines": lines, "tables": tables, "runs": results,
                                   "rows": [r.name for r in ROWS], "seeds": [cfg.system.seed + k for k in range(cfg.facts.num_seeds)],
                                   "versions": library_versions()}, indent=2))
    return {"lines": lines, "tables": tables, "tasks": tasks, "results": results, "commands": commands,
            "summary": str(summary)}


__all__ = ["run_product_facts", "run_task", "write_data", "train_argv", "row_argv"]
