"""Print what crosses each token-like outer link of a system: per edge, the mean top-1 probability of the link's
softmax, the residual's share of the output norm and the nearest-token string of the message for the first three
questions (issue 48, item 4).

  python -m jobs.inspect_links --style sequential_light --links DIR --dataset FILE --num_samples 8 --backend local

It is `jobs.run` with the one method `recursive_mas` (every other flag as there: system, rounds, m, backend,
output folder): the figures are the results file's `channel` entry (`recmas_ray/eval/channel.py`), which every
recursive_mas run through a token link records, read back and printed. Links of other kinds send no token
distribution: the tool says so.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from recmas_ray.config.cli import run_job
from recmas_ray.console import job_console
from recmas_ray.eval.channel import channel_lines
from recmas_ray.eval.config import EvalConfig

HIDDEN = ("recursion.method", "recursion.decode.seed")


def inspect(cfg: EvalConfig) -> int:
    """Evaluate `cfg` with recursive_mas only, then print the channel figures of its results file."""
    from recmas_ray.eval.run import evaluate  # lazy: imports torch; --help and bad input must not

    if cfg.methods != ["recursive_mas"] or cfg.sweep_rounds:
        raise ValueError(f"--methods {','.join(cfg.methods)} / --sweep_rounds: inspect_links runs recursive_mas once "
                         "(the method that sends through the links); drop them")
    cfg = dataclasses.replace(cfg, plot=False)
    with job_console(Path(cfg.output_path) / "logs", verbose=cfg.verbose, name="inspect_links",
                     progress=cfg.progress) as console:
        out = evaluate(cfg, progress=cfg.progress, echo=False)
        channel = json.loads(Path(out["results_path"]).read_text(encoding="utf-8")).get("channel") or {}
        for line in channel_lines(channel) or ["no token-like outer link sent a message in this system (the "
                                               "figures apply to token links)"]:
            console.line(line)
        console.line(f"results: {out['results_path']}")
    return 1 if out.get("num_errored") else 0


def main(argv=None) -> int:
    return run_job(inspect, EvalConfig, argv, prog="python -m jobs.inspect_links", description=__doc__,
                   hidden=HIDDEN)


if __name__ == "__main__":
    sys.exit(main())
