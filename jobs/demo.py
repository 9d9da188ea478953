"""The main job: real heterogeneous language models collaborating in latent space, trained and compared.

On a local Ray cluster (or the one `ray job submit` runs in), offline: first the hidden-fact tasks of --tasks
(`jobs.experiments.demo.facts`; by default distillation:recall, one hop, and sequential_light:recall, two hops,
whose lines "trained links carry the fact: X/N own vs Y/N shuffled vs Z/N fresh (McNemar p ...)" print first),
then, with --tasks ...,arithmetic or --full:
  1. generate arithmetic questions ("What is 17 - 8?"; train / held-out split, no question in both)
  2. train the sequential style's inner links (three roles at once), then its outer links
  3. compare on the same held-out questions: single agent, TextMAS, Recursive-TextMAS and RecursiveMAS
     (fresh, inner-trained, inner+outer-trained links), plus the latent ablation (shuffled, zeroed, empty slot)
  4. print the tables (accuracy with 95% CI, NLL overall and per answer token class, tokens, seconds, speedup,
     token reduction; per edge: message cosine, variance ratio, held-out probes; paired tests: McNemar,
     NLL differences +- SE) and the verdicts, and write a PNG

  python jobs/demo.py                    # the hidden-fact tasks: do trained links carry what only the first
                                         # agent was told, across one hop and two? (real small models,
                                         # 32 + 32 held-out each)
  python jobs/demo.py --tasks distillation:recall,arithmetic   # one hop, then the standard arithmetic task
  python jobs/demo.py --tasks arithmetic --rounds 1,2           # arithmetic alone, also R = 2
  python jobs/demo.py --full             # every fact task (128 + 128 held-out) and arithmetic, hours on 2 cores
  python jobs/demo.py --quick            # smoke run, a few minutes
  python jobs/demo.py --preset tiny --quick --backend local   # random tiny models, about a minute
  python jobs/demo.py --role_model critic=pkg:smollm2-135m-instruct   # any base model per role
  python jobs/demo.py --task_family hidden_operand   # only the planner knows x: the answer needs the channel
  python jobs/demo.py --outer_options NAME=VALUE     # any further OuterTrainConfig field (a recipe's options)

The console shows one line per phase; Ray, training and grader output goes to OUTPUT/logs/ (--verbose
shows it). Every setting below can also come from --config FILE (JSON/YAML).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # `python jobs/demo.py` from a checkout: import this checkout's package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

try:
    if __name__ == "__main__":  # the first line at once: the imports below take a second or more
        from recmas_ray.console import announce  # noqa: E402

        announce()
    from recmas_ray.config.cli import run_job  # noqa: E402
    from recmas_ray.console import job_console  # noqa: E402
    from jobs.experiments.demo import report  # noqa: E402
    from jobs.experiments.demo.config import RECIPES, DemoConfig  # noqa: E402
    from jobs.experiments.demo.pipeline import run_demo  # noqa: E402
except KeyboardInterrupt:  # Ctrl-C during those imports: the job's one line and status, as anywhere later
    if __name__ != "__main__":
        raise
    from recmas_ray.console import retract  # noqa: E402

    retract()
    print("interrupted; nothing ran yet", file=sys.stderr)
    sys.exit(130)

SHORTCUTS = {"--quick": ["--recipe", "quick"], "--full": ["--recipe", "full"]}


def expand(argv: list[str]) -> list[str]:
    """`--quick` / `--full` are the recipes of those names (flags given with them still win)."""
    out: list[str] = []
    picked = [a for a in argv if a in SHORTCUTS]
    if len(picked) > 1:
        raise SystemExit("error: --quick and --full exclude each other")
    for a in argv:
        out += SHORTCUTS.get(a, [a])
    return out


def run(cfg: DemoConfig) -> int:
    out = Path(cfg.output_path).resolve()
    with job_console(out / "logs", verbose=cfg.verbose, name="demo", progress=cfg.progress) as console:
        # A private local cluster unless RAY_ADDRESS names one (`ray job submit` sets it): on a shared machine
        # the newest cluster's address file may belong to someone else's run, which can end at any time.
        from recmas_ray.distributed.cluster import start_ray  # lazy: Ray, once the input is checked

        start_ray()
        if cfg.facts.pipeline == "product":  # the jobs a user runs (`demo.product`); its commands come last
            from jobs.experiments.demo.product import run_product_facts as run_facts  # lazy: torch, once checked
        else:
            from jobs.experiments.demo.facts import run_facts  # lazy: imports torch, once the input is checked
        facts = run_facts(cfg, out, console) if cfg.fact_task_pairs() else None
        if facts:  # the answer first: one line per style and task, then the tables
            console.line()
            for line in facts["lines"]:
                console.line(line)
            for table in facts["tables"]:
                console.line()
                console.line(table)
        if "arithmetic" in cfg.tasks:
            console.line()
            run_demo(cfg, console, lead_tasks=facts["tasks"] if facts else ())
            if facts:
                console.line()
                for line in facts["lines"]:
                    console.line(line)
        elif facts:  # the PNG of the fact tasks alone: own vs shuffled vs fresh per style, task and split first
            png = report.plot_tasks(facts["tasks"], out / "demo_results.png")
            summary = facts.get("summary") or out / "facts" / "summary.json"
            console.line(f"\nplot: {png}\nresults: {summary}  ({Path(summary).parent.name}/, logs/ beside it)")
        for line in (facts or {}).get("commands", []):
            console.line(line)
    return 0


def main(argv=None) -> int:
    announce = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv = expand(argv)
    except SystemExit as e:
        print(e.code, file=sys.stderr)
        return 2
    return run_job(run, DemoConfig, argv, prog="python jobs/demo.py", description=__doc__, recipes=RECIPES,
                   announce=announce, on_interrupt="the demo does not resume: rerun it (Ray was shut down; what "
                   "finished is under --output_path)")


if __name__ == "__main__":
    sys.exit(main())
