"""`run_demo`: data -> inner training (3 roles at once) -> outer training -> the comparison -> table + PNG."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

from jobs.experiments.demo import compare, report, verdicts
from jobs.experiments.demo.config import DemoConfig
from jobs.experiments.probe import question_facts
from recmas_ray.console import Console
from recmas_ray.styles.role_context import question_for_role, with_role_context
from recmas_ray.system.config import with_system
from recmas_ray.system.presets import role_models
from recmas_ray.system.provenance import link_origin
from recmas_ray.tasks.benchmarks import load_benchmark
from recmas_ray.train.config import InnerTrainConfig, OuterTrainConfig
from recmas_ray.train.synthetic import (check_disjoint, make_arithmetic_dataset, make_hidden_operand_dataset,
                                        write_jsonl)


def make_data(cfg: DemoConfig, out: Path) -> tuple[Path, Path, list[dict]]:
    """Generate the training rows from the train split and the held-out rows from the test split (fixed per
    question for every seed, `train.splits`), check they share no question and write both files."""
    def rows_of(num_rows: int, split: str) -> list[dict]:
        if cfg.task_family == "hidden_operand":
            return make_hidden_operand_dataset(num_rows, seed=cfg.system.seed, question_kind=cfg.hidden_question,
                                               split=split)
        return make_arithmetic_dataset(num_rows, seed=cfg.system.seed, difficulty=cfg.difficulty, split=split)

    train, heldout = rows_of(cfg.num_train, "train"), rows_of(cfg.num_eval, "test")
    # a question is what its best-informed agent sees (the hidden fact included)
    check_disjoint([{"question": full_question(r)} for r in train], [{"question": full_question(r)} for r in heldout])
    return write_jsonl(train, out / "train.jsonl"), write_jsonl(heldout, out / "heldout.jsonl"), heldout


def role_questions_of(row: dict) -> dict[str, str]:
    """role -> the question text that role sees, for rows where roles see different things (empty: all
    see `question`). THE one place the demo reads a per-role view: the `role_context` (role -> text told
    only to that role) of a generated row (`train.synthetic.make_hidden_operand_dataset`), rendered as
    `styles.role_context.question_for_role` shows it to the role."""
    if isinstance(row.get("role_context"), dict) and row["role_context"]:
        carried = with_role_context(row["question"], row["role_context"])
        return {str(k): question_for_role(carried, str(k)) for k in row["role_context"]}
    return {}


def full_question(row: dict) -> str:
    """The question with every role's extra context (what an agent seeing everything would read)."""
    views = role_questions_of(row)
    return max([row["question"], *views.values()], key=len)


def hidden_facts_of(row: dict, facts: dict) -> tuple[str, ...]:
    """Facts (numbers) some role's view states but the plain question does not: the hidden operand."""
    shown = set(re.findall(r"\d+", row["question"]))
    extra = {n for v in role_questions_of(row).values() for n in re.findall(r"\d+", v)} - shown
    return tuple(k for k, v in facts.items()
                 if isinstance(v, (int, float)) and float(v).is_integer() and str(int(v)) in extra)


def train_links(cfg: DemoConfig, train_file: Path, out: Path, models: dict[str, str], console: Console) -> dict:
    """THE one place the demo calls training (re-point it here when training's API changes).

    Returns {role: inner dir, ..., "outer": outer dir} for `--ckpt_override`-style plans.
    """
    from recmas_ray.train.inner_job import train_all_roles  # lazy: demo.py loads this before checking input
    from recmas_ray.train.pipeline import train_outer  # lazy: demo.py loads this before checking input

    roles = list(models)
    inner_options, outer_options = cfg.typed_options()
    console.start(f"inner training: {', '.join(roles)} at once, {cfg.inner_steps} steps each")
    inner_dirs = train_all_roles(
        with_system(InnerTrainConfig, system=cfg.system, mas_role="all", role_models=dict(models),
                    dataset_name=str(train_file), save_dir=str(out / "inner"),
                    max_steps=cfg.inner_steps, batch_size=cfg.inner_batch_size, lr=cfg.inner_lr, task=cfg.task,
                    **{"warmup_steps": min(2, cfg.inner_steps - 1), "save_every": cfg.inner_steps,
                       "num_workers": 0, "progress": False, "max_length": 512,
                       "log_every": max(1, cfg.inner_steps // 4), **inner_options}))
    losses = {}
    for role, d in inner_dirs.items():
        try:
            losses[role] = json.loads((Path(d) / "manifest.json").read_text()).get("loss")
        except (OSError, ValueError):
            losses[role] = None
    console.done("final cosine loss " + ", ".join(f"{r} {v:.3f}" if v is not None else f"{r} ?"
                                                  for r, v in losses.items()))
    overrides = {role: str(path) for role, path in inner_dirs.items()}

    console.start(f"outer training: R={cfg.outer_r()}, {cfg.outer_steps} steps of {cfg.outer_batch_size} rows")
    outer = train_outer(with_system(
        OuterTrainConfig, system=cfg.system, ckpt_override=overrides, role_models=dict(models),
        dataset_name=str(train_file), task=cfg.task,
        save_dir=str(out / "outer"), num_recursive_rounds=cfg.outer_r(), max_latent_tokens=cfg.max_latent_tokens,
        max_steps=cfg.outer_steps, batch_size=cfg.outer_batch_size, lr=cfg.outer_lr,
        **{"save_every": cfg.outer_steps, "cpus_per_worker": 0.5, "max_failures": 0, "warmup_steps": 1,
           **outer_options}))
    log = outer.log or []
    first, last = (log[0]["loss"], log[-1]["loss"]) if log else (None, None)
    console.done(f"loss {first:.3f} -> {last:.3f}" if log else "no steps logged")
    return {**overrides, "outer": str(outer.save_dir), "_inner_losses": losses, "_outer_log": log}


def link_origins(trained: dict[str, str]) -> dict:
    """Where each link folder of the run came from (`system.provenance.link_origin`: path, sha256 of its files,
    the command and config that trained it)."""
    return {name: link_origin(path) for name, path in trained.items()}


def link_plans(cfg: DemoConfig, models: dict[str, str], trained: dict[str, str]) -> dict:
    """The three link sets as system plans: fresh, inner-trained (fresh outer links), inner+outer trained."""
    from recmas_ray.system.plan import plan_system  # lazy: demo.py loads this before checking input

    inner_only = {r: d for r, d in trained.items() if r != "outer"}
    return {name: plan_system(cfg.system, task=cfg.task, ckpt_override=links, role_models=models)
            for name, links in (("fresh", None), ("inner", inner_only), ("trained", trained))}


def run_demo(cfg: DemoConfig, console: Console | None = None, lead_tasks=()) -> dict:
    """Run the whole pipeline; returns the rows, the table, and the paths written. `lead_tasks` (report tasks
    of the hidden-fact runs, `demo.facts`) come first in the PNG."""
    from recmas_ray.models.loader import resolve_model_path  # lazy: demo.py loads this before checking input

    console = console or Console()
    out = Path(cfg.output_path).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    phases: dict[str, float] = {}
    t_start = time.perf_counter()

    console.start(f"data: {cfg.difficulty if cfg.task_family == 'arithmetic' else cfg.task_family} questions, {cfg.num_train} training rows, {cfg.num_eval} held-out")
    train_file, eval_file, heldout = make_data(cfg, out)
    phases["data"] = console.done(f"{train_file.name}, {eval_file.name} (no held-out question in training)")

    models = role_models(cfg.system.style, cfg.system.preset, cfg.system.role_models)
    console.start(f"preparing models: {', '.join(sorted(set(models.values())))}")
    for name in sorted(set(models.values())):  # convert GGUF -> safetensors once, before workers need it
        resolve_model_path(name)
    phases["prepare"] = console.done(", ".join(f"{r}={m}" for r, m in models.items()))

    t0 = time.perf_counter()
    trained = train_links(cfg, train_file, out, models, console)
    phases["training"] = time.perf_counter() - t0
    inner_losses, outer_log = trained.pop("_inner_losses"), trained.pop("_outer_log")

    console.start("starting agents" + (" (Ray actors)" if cfg.backend == "ray" else " (in-process)"))
    plans = link_plans(cfg, models, trained)
    agents = compare.Agents(plans, cfg.backend, torch_threads=cfg.torch_threads)
    phases["start_agents"] = console.done()

    items = load_benchmark(str(eval_file), task_type=cfg.task)
    targets = {i["doc_id"]: row["answer"] for i, row in zip(items, heldout)}
    assert all(i["question"] == row["question"] for i, row in zip(items, heldout))
    facts = {i["doc_id"]: question_facts(row) for i, row in zip(items, heldout)}
    views = {i["doc_id"]: role_questions_of(row) for i, row in zip(items, heldout)}
    hidden = tuple(sorted({k for i, row in zip(items, heldout) for k in hidden_facts_of(row, facts[i["doc_id"]])}))
    role_questions = views if any(views.values()) else None
    plan = compare.plan_runs(cfg.rounds, cfg.ablation_r(), cfg.link_r(), hidden_fact=role_questions is not None)
    rows, by_run = [], {}
    (out / "samples").mkdir(exist_ok=True)
    try:
        for key, r in plan:
            variant = compare.BY_KEY[key]
            console.start(f"evaluate {variant.label}, R={r}")

            def tick(done, ok, secs, n=len(items)):
                console.update(f"{done}/{n} acc {ok / done:.3f} {secs / done:.2f} s/question")

            row = compare.run_one(agents, variant, r, items, targets, latent_steps=cfg.latent_steps,
                                  max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size, seed=cfg.system.seed,
                                  num_in_flight=cfg.num_in_flight, facts=facts if cfg.information_flow else None,
                                  role_questions=role_questions, hidden_facts=hidden,
                                  samples_path=out / "samples" / f"{key.replace('/', '_')}_R{r}.jsonl", on_sample=tick)
            phases[f"eval {key} R={r}"] = console.done(
                f"acc {row['accuracy']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}] n={row['n']}, "
                f"NLL {row['nll']:.3f}, {row['tokens_per_sample']:.0f} tokens/question")
            by_run[(key, r)] = row
    finally:
        agents.close()
    for key, r in plan:
        rows.append(by_run[(key, r)])
        if key == "textmas" and 1 in cfg.rounds:  # Recursive-TextMAS at R = 1 is TextMAS: the same run
            rows.append(compare.replace_round(by_run[(key, r)], compare.BY_KEY["recursive_textmas"], 1))
    order = [v.key for v in compare.VARIANTS]
    rows.sort(key=lambda x: (order.index(x["variant"]), x["rounds"]))
    compare.add_comparisons(rows)
    tests = verdicts.paired_tests(rows)
    task = {"style": cfg.system.style, "rows": rows, "tests": tests,
            "task": cfg.task_family if cfg.task_family == "arithmetic" else f"{cfg.task_family} ({cfg.hidden_question})"}
    first = verdicts.headline([task])
    lines = verdicts.channel_verdicts(rows, tests) + verdicts.paired_verdicts(tests) + verdicts.flow_verdicts(rows, tests)
    text = "\n\n".join(t for t in (report.table(rows), report.flow_table(rows), report.paired_table(tests)) if t)
    png = report.plot_tasks([*lead_tasks, task], out / "demo_results.png")
    phases["total"] = time.perf_counter() - t_start
    results = {"headline": first, "rows": [compare.public_row(r) for r in rows], "verdicts": lines, "paired_tests": tests,
               "task_family": cfg.task_family, "hidden_facts": list(hidden),
               "per_question": {f"{r['variant']} R={r['rounds']}": {
                   "nll": r["nll_per_doc"], "correct": r["correct_per_doc"],
                   "correct_lenient": r.get("correct_lenient_per_doc"), "prediction": r.get("prediction_per_doc"),
                   "nll_by_class": (r.get("flow") or {}).get("nll_by_class_per_doc")} for r in rows},
               "training": {"inner_final_loss": inner_losses, "outer_log": outer_log, "checkpoints": trained,
                            "link_origins": link_origins(trained)},
               "phase_seconds": phases, "config": dataclasses.asdict(cfg), "heldout_size": len(items),
               "role_models": models}
    compare.write_json(out / "demo_results.json", results)
    console.line()
    for v in first:  # the answer first: do trained links carry the question?
        console.line(v)
    console.line()
    console.line(text)
    console.line()
    for v in lines:
        console.line(v)
    console.line(f"\nplot: {png}\nresults: {out / 'demo_results.json'}  (samples/, logs/ beside it)")
    return {"headline": first, "rows": rows, "table": text, "verdicts": lines, "paired_tests": tests, "plot": str(png), "output_path": str(out),
            "phase_seconds": phases}
