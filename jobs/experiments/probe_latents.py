"""Information flow of a trained demo system: what its latent messages carry and what the decoder uses.

Reads a finished demo's folder (`python jobs/demo.py` writes it: demo_config.json, heldout.jsonl, the
inner/ and outer/ checkpoints named in demo_results.json) and, on its held-out questions, for each link
set (fresh, trained) x latent ablation (none, shuffle, zero, empty slot) x R:
  per edge and round   between-question cosine and variance ratio of the messages, held-out linear probes
                       of the question's facts (cross-validated ridge, vs a constant baseline)
  decoder              the gold answer's NLL, overall and per token class (result / operand / fact /
                       wording), with paired differences (ablated - intact) and their standard errors

No text is decoded beyond one token (accuracy is the demo's job); in-process, one torch thread per core.

  python jobs/experiments/probe_latents.py --demo_dir out/demo
  python jobs/experiments/probe_latents.py --demo_dir out/demo --links trained --ablations none,shuffle --num_eval 32
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

if __package__ in (None, ""):  # `python jobs/experiments/probe_latents.py` from a checkout: import this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from recmas_ray.config.checks import ExistingPath, OneOf, Range  # noqa: E402
from recmas_ray.config.cli import run_job  # noqa: E402
from recmas_ray.config.recursion import MAX_ROUNDS  # noqa: E402

LINK_SETS = ("fresh", "inner", "trained")
ABLATIONS = ("none", "shuffle", "zero", "empty")


@dataclass(kw_only=True)
class ProbeLatentsConfig:
    """What to measure on a finished demo run."""

    demo_dir: Annotated[str, ExistingPath()] = "out/demo"
    """A demo output folder (demo_config.json, demo_results.json, heldout.jsonl and the checkpoints)."""
    links: Annotated[list[str], OneOf(LINK_SETS)] = field(default_factory=lambda: ["fresh", "trained"])
    """Link sets measured: fresh, inner (trained inner links, fresh outer links), trained (inner + outer)."""
    ablations: Annotated[list[str], OneOf(ABLATIONS)] = field(default_factory=lambda: list(ABLATIONS))
    """What the decoder receives: none, shuffle (another question's latents), zero, empty (m = 0, empty slots)."""
    rounds: Annotated[list[int], Range(1, MAX_ROUNDS)] = field(default_factory=list)
    """R values (empty: the largest R the demo evaluated)."""
    latent_steps: Annotated[int, Range(0, 4096)] = 0
    """m (0: the demo's)."""
    num_eval: Annotated[int, Range(0, 100_000)] = 0
    """Held-out questions used (0: all of the demo's)."""
    batch_size: Annotated[int, Range(1, 1024)] = 32
    """Questions per agent call."""
    output_path: str = ""
    """Results file (empty: DEMO_DIR/probe_latents.json)."""
    seed: Annotated[int, Range(0, 2**31 - 1)] = 0
    """Seed of the probes' folds."""

    def validate(self) -> None:
        d = Path(self.demo_dir)
        for name in ("demo_config.json", "demo_results.json", "heldout.jsonl"):
            if not (d / name).is_file():
                raise ValueError(f"--demo_dir {self.demo_dir!r}: no {name} (expected the folder of a finished "
                                 "`python jobs/demo.py` run)")
        ckpts = self.checkpoints()
        for role, path in ckpts.items():
            if not Path(path).is_dir():
                raise ValueError(f"--demo_dir {self.demo_dir!r}: checkpoint {role} = {path!r} is not a folder")
        if not self.links or not self.ablations:
            raise ValueError("--links and --ablations must each name at least one value")

    def checkpoints(self) -> dict[str, str]:
        import json

        try:
            data = json.loads((Path(self.demo_dir) / "demo_results.json").read_text(encoding="utf-8"))
            ckpts = data["training"]["checkpoints"]
        except (OSError, ValueError, KeyError, TypeError):
            raise ValueError(f"--demo_dir {self.demo_dir!r}: demo_results.json names no training checkpoints") from None
        if not isinstance(ckpts, dict) or "outer" not in ckpts:
            raise ValueError(f"--demo_dir {self.demo_dir!r}: demo_results.json names no outer checkpoint")
        return {str(k): str(v) for k, v in ckpts.items()}


def run(cfg: ProbeLatentsConfig) -> int:
    import json

    from recmas_ray.config.tree import from_dict
    from jobs.experiments.demo import compare
    from jobs.experiments.demo.config import DemoConfig
    from jobs.experiments.demo.flow import FlowRecorder
    from jobs.experiments.demo.pipeline import hidden_facts_of, link_plans, role_questions_of
    from jobs.experiments.demo.report import flow_table
    from jobs.experiments.probe import TOKEN_CLASSES, question_facts
    from recmas_ray.eval.stats import paired_by_key
    from recmas_ray.runner import run_batch
    from recmas_ray.config.recursion import DecodeConfig, RecursionConfig

    d = Path(cfg.demo_dir)
    demo = from_dict(DemoConfig, json.loads((d / "demo_config.json").read_text(encoding="utf-8")),
                     where=str(d / "demo_config.json"))
    results = json.loads((d / "demo_results.json").read_text(encoding="utf-8"))
    rows = [json.loads(line) for line in (d / "heldout.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = rows[:cfg.num_eval] if cfg.num_eval else rows
    ids = [f"q{i}" for i in range(len(rows))]
    facts = {i: question_facts(r) for i, r in zip(ids, rows)}
    views = {i: role_questions_of(r) for i, r in zip(ids, rows)}
    hidden = tuple(sorted({k for i, r in zip(ids, rows) for k in hidden_facts_of(r, facts[i])}))
    plans = link_plans(demo, results["role_models"], cfg.checkpoints())
    agents = compare.Agents(plans, "local")
    m = cfg.latent_steps or demo.latent_steps
    out_rows, tests = [], []
    for r in cfg.rounds or [max(demo.rounds)]:
        for links in cfg.links:
            agents.use_links(links)
            by_ablation = {}
            for ablation in cfg.ablations:
                rc = RecursionConfig(method="recursive_mas", num_recursive_rounds=r,
                                     latent_steps=0 if ablation == "empty" else m,
                                     latent_ablation="none" if ablation == "empty" else ablation,
                                     decode=DecodeConfig(max_new_tokens=1))
                rec = FlowRecorder(facts, agents.decoder_agent(), hidden_facts=hidden)
                nll = {}
                for k in range(0, len(rows), cfg.batch_size):
                    chunk, cid = rows[k:k + cfg.batch_size], ids[k:k + cfg.batch_size]
                    gold = [x["answer"] for x in chunk]
                    run_batch(agents.pool, agents.style, [x["question"] for x in chunk], [demo.task] * len(chunk),
                              rc, role_questions=[views[i] for i in cid] if any(views.values()) else None,
                              capture=rec.hook(cid, gold))
                    rec.score_pending()  # the decoder's token NLLs; their mean is the answer's NLL
                    nll.update({i: rec.mean_nll[i] for i in cid})
                flow = rec.summary(ids, seed=cfg.seed)
                row = {"label": f"{links} links, {ablation}", "links": links, "ablation": ablation, "rounds": r,
                       "n": len(rows), "nll": sum(nll.values()) / len(nll), "nll_per_doc": nll, "flow": flow}
                by_ablation[ablation] = row
                out_rows.append(row)
                print(f"{row['label']}, R={r}: NLL {row['nll']:.3f}; by class "
                      + ", ".join(f"{c} {v:.3f}" for c, v in (flow['nll_by_class'] or {}).items() if v is not None),
                      flush=True)
            intact = by_ablation.get("none")
            for ablation, row in by_ablation.items():
                if intact is None or ablation == "none":
                    continue
                a, b = row["flow"]["nll_by_class_per_doc"], intact["flow"]["nll_by_class_per_doc"]
                tests.append({"links": links, "rounds": r, "ablation": ablation,
                              "nll_diff": paired_by_key(row["nll_per_doc"], intact["nll_per_doc"]),
                              "nll_diff_by_class": {c: paired_by_key(a[c], b[c]) for c in TOKEN_CLASSES
                                                    if any(v is not None for v in b[c].values())}})
    agents.close()
    print(flow_table(out_rows))
    for t in tests:
        parts = [f"all {t['nll_diff']['mean']:+.3f} +- {t['nll_diff']['se']:.3f} (p {t['nll_diff']['p']:.2g})"]
        parts += [f"{c} {x['mean']:+.3f} +- {x['se']:.3f}" for c, x in t["nll_diff_by_class"].items()]
        print(f"{t['links']} links R={t['rounds']}: NLL {t['ablation']} - intact: " + "; ".join(parts))
    path = Path(cfg.output_path) if cfg.output_path else d / "probe_latents.json"
    compare.write_json(path, {"config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}, "hidden_facts": list(hidden),
                              "rows": [{k: v for k, v in x.items() if k != "nll_per_doc"} for x in out_rows],
                              "paired": tests})
    print(f"results: {path}")
    return 0


def main(argv=None) -> int:
    return run_job(run, ProbeLatentsConfig, argv, prog="python jobs/experiments/probe_latents.py", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
