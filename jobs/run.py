"""Evaluate a RecursiveMAS system (and its text baselines) on a benchmark or a local question file.

Examples (CPU, offline):
  python -m jobs.run --style sequential_light --preset tiny --dataset jobs/examples/questions.jsonl \
      --backend local --num_recursive_rounds 2 --latent_steps 8 --output_path out
  python -m jobs.run --style mixture --preset tiny --dataset jobs/examples/questions.jsonl --backend ray \
      --method recursive_mas,recursive_textmas --num_recursive_rounds 2
  Trained links (the system folder train_inner + train_outer wrote; its rows prompted with the task the links
  were trained on, or each row's `task` field, or --task; another task is refused unless --allow_task_mismatch):
  python -m jobs.run --style sequential_light --preset tiny --links ckpt/sys --dataset jobs/examples/questions.jsonl
  A sweep over R (one sub-directory R<r> per value, one plot across them):
  python -m jobs.run --style sequential_light --dataset jobs/examples/questions.jsonl --sweep_rounds 1,2,3 --plot
On a cluster (GPU agents, one per GPU):
  ray job submit --working-dir . --runtime-env cluster/runtime_env.yaml -- \
      python -m jobs.run --style sequential_scaled --preset paper --dataset math500 \
      --placement one_gpu_per_agent --device cuda --output_path /mnt/shared/results
Every setting below can also come from --config FILE (JSON/YAML, nested by section); the resolved
config is saved as config.json next to the results. The console shows a phase line per step from the first second
(checking inputs, starting Ray, starting agents) and a per-sample progress bar on stderr, the results table on
stdout; Ray, HF and grader output goes to OUTPUT_PATH/logs/run.log (--verbose shows it). Ctrl-C stops with one line
(exit status 130); rerun with --resume to continue.
"""

from __future__ import annotations

import sys
from pathlib import Path

from recmas_ray.config.cli import parse_config, run_job
from recmas_ray.console import job_console
from recmas_ray.eval.config import EvalConfig
from recmas_ray.eval.protocol import reference
from recmas_ray.tasks.benchmarks import check_available

# Set by the evaluation driver itself (per method, and from --seed).
HIDDEN = ("recursion.method", "recursion.decode.seed")


def recipe(cfg: EvalConfig) -> EvalConfig | None:
    """The recipe a command line starts from: with --protocol reference, the release's config for its style
    and dataset (`eval.protocol.reference`); the --config file and the flags apply over it."""
    return reference(cfg.system.style, cfg.dataset) if cfg.protocol == "reference" else None


def parse(argv) -> EvalConfig:
    """The checked config of a command line (what `main` would run)."""
    return parse_config(EvalConfig, argv, hidden=HIDDEN, start=recipe)[0]


def evaluate(cfg: EvalConfig) -> int:
    """Run the evaluation of a checked config; print where the outputs went.

    The console shows a per-sample bar (ETA, accuracy so far), the results table and the output paths;
    Ray, HF and grader output goes to OUTPUT_PATH/logs/run.log (--verbose shows it).
    """
    if not cfg.dry_run:  # a plan needs no questions: a named benchmark's task type is known without them
        check_available(cfg.dataset, cfg.dataset_path)  # before torch is imported: an offline benchmark says so
    # lazy: imports torch; --help and bad input must not (tests/jobs/test_bad_inputs_run.py)
    from recmas_ray.eval.run import dry_run, evaluate_all

    if cfg.dry_run:
        return dry_run(cfg)
    with job_console(Path(cfg.output_path) / "logs", verbose=cfg.verbose, name="run",
                     progress=cfg.progress) as console:
        outs = evaluate_all(cfg)
        for out in outs:
            console.line(f"samples: {out['samples_path']}\nresults: {out['results_path']}")
        if "plot_path" in outs[-1]:
            console.line(f"plot: {outs[-1]['plot_path']}")
    return 1 if any(out.get("num_errored") for out in outs) else 0


def main(argv=None) -> int:
    return run_job(evaluate, EvalConfig, argv, prog="python -m jobs.run", description=__doc__, hidden=HIDDEN,
                   start=recipe)


if __name__ == "__main__":
    sys.exit(main())
