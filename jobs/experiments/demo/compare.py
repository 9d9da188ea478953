"""The comparison: every method on the same held-out questions, accuracy (Wilson 95% CI), NLL, cost, information flow.

One set of agents serves every row: the text methods ignore links, and the RecursiveMAS variants
swap link weights into the running agents (`AgentService.set_links`), so models load once.

  single agent                 the decoder alone                                  R = 1
  single agent given the fact  hidden-operand task only: the planner's question   R = 1
  TextMAS                      one round of text between the agents               R = 1
  Recursive-TextMAS            R rounds of text (R = 1 is TextMAS itself)         R in rounds
  RecursiveMAS (fresh links)   latents through freshly initialised links          R in rounds
  RecursiveMAS (inner only)    trained inner links, fresh outer links             R in rounds
  RecursiveMAS (inner+outer)   trained inner and outer links                      R in rounds
  ablation: shuffled / zero    inner+outer, incoming latents of another question / zeros
  ablation: empty slot         m = 0: every slot empty, so the decoder sees the solver's multi-agent
                               prompt alone (separates the prompt from the latents)

NLL: the decoder teacher-forces the gold answer after the prompt it decodes from (its latents, or
the upstream agents' text), one code path for every method (`run_batch(..., targets=...)`). The
information flow (`demo.flow`: messages per edge, NLL per answer token class) rides on the runner's
`capture` hook of the same runs; paired tests and verdicts are in `demo.verdicts`.
"""

from __future__ import annotations

import json
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from jobs.experiments.demo.flow import FlowRecorder
from recmas_ray.config.placement import PlacementConfig
from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.eval.samples import SampleWriter, own_reply
from recmas_ray.eval.stats import wilson_interval
from recmas_ray.eval.stream import solve_and_grade
from recmas_ray.tasks.math import grade_lenient


@dataclass(frozen=True)
class Variant:
    """One method row of the table."""

    key: str
    label: str
    method: str
    links: str | None = None
    """fresh, inner or trained: the link set swapped in first (None: text methods, links unused)."""
    ablation: str = "none"
    latent_steps: int | None = None
    """m of this row (None: the run's m); 0 sends empty latent blocks, i.e. empty slots."""
    question_from: str | None = None
    """Single agent only: decode from the question text this role sees (the planner's holds the hidden
    fact: the ceiling row of the hidden-operand task)."""


VARIANTS = (
    Variant("single_agent", "single agent", "single_agent"),
    Variant("single_agent/fact", "single agent given the fact (ceiling)", "single_agent", question_from="planner"),
    Variant("textmas", "TextMAS", "textmas"),
    Variant("recursive_textmas", "Recursive-TextMAS", "recursive_textmas"),
    Variant("recursive_mas/fresh", "RecursiveMAS, fresh links", "recursive_mas", "fresh"),
    Variant("recursive_mas/inner", "RecursiveMAS, inner trained", "recursive_mas", "inner"),
    Variant("recursive_mas/trained", "RecursiveMAS, inner+outer trained", "recursive_mas", "trained"),
    Variant("ablation/shuffle", "ablation: latents shuffled", "recursive_mas", "trained", "shuffle"),
    Variant("ablation/zero", "ablation: latents zeroed", "recursive_mas", "trained", "zero"),
    Variant("ablation/empty", "ablation: empty slot (solver prompt alone)", "recursive_mas", "trained",
            latent_steps=0),
)
BY_KEY = {v.key: v for v in VARIANTS}
BASELINE = "recursive_textmas"
ABLATIONS = ("shuffle", "zero", "empty")


def wilson(k: int, n: int) -> tuple[float, float]:
    """Wilson score 95% interval of k successes in n trials (`eval.stats.wilson_interval`, scipy)."""
    return wilson_interval(k, n)


def plan_runs(rounds: list[int], ablation_rounds: list[int], link_rounds: list[int] | None = None, *,
              hidden_fact: bool = False) -> list[tuple[str, int]]:
    """(variant key, R) in the order they run: text methods, then the link sets one after another.

    The fresh and inner-only link sets run at `link_rounds` (default: every R), the trained one at every R;
    `hidden_fact` adds the hidden-operand task's ceiling row (the single agent given the fact).
    """
    runs = [("single_agent", 1)] + ([("single_agent/fact", 1)] if hidden_fact else []) + [("textmas", 1)]
    runs += [("recursive_textmas", r) for r in rounds if r > 1]  # R = 1 is TextMAS, reused
    for links in ("fresh", "inner", "trained"):
        runs += [(f"recursive_mas/{links}", r) for r in rounds
                 if links == "trained" or link_rounds is None or r in link_rounds]
    runs += [(f"ablation/{a}", r) for r in ablation_rounds for a in ABLATIONS]
    return runs


class Agents:
    """The running agents (in-process or Ray actors, `distributed.launch.start_agents`) with link sets to swap in."""

    def __init__(self, plans: dict, backend: str, *, torch_threads: int = 1, timeout_s: float = 1800.0):
        from recmas_ray.distributed.launch import start_agents  # lazy: demo.py loads this before checking input

        self.plans, self.backend, self.current = plans, backend, None
        base = plans["fresh"]
        self.style, self.decoder = base.style, base.style.decoder
        if backend == "local":
            import torch  # lazy: demo.py loads this before checking input

            torch.set_num_threads(torch_threads or os.cpu_count() or 1)  # 0: every core (Ray may set OMP to 1)
        agents = start_agents(base, backend=backend, placement=PlacementConfig(preset="cpu"), timeout_s=timeout_s,
                              torch_threads=torch_threads)
        self.system = None if backend == "local" else agents
        self.pool = agents if backend == "local" else agents.pool()
        self.current = "fresh"

    def use_links(self, which: str) -> None:
        """Swap link set `which` (fresh, inner, trained) into every agent."""
        from recmas_ray.system.launch import set_plan_links  # lazy: demo.py loads this before checking input

        if which == self.current:
            return
        set_plan_links(self.pool, self.plans[which])
        self.current = which

    def retry(self, texts, suffixes, n, decode, context=None):
        """The answer-format retry on the decoder, continuing each reply after what it received."""
        return self.pool.get(self.pool.retry_format(self.decoder, texts, suffixes, n, cfg=decode, context=context),
                             what="format retry")

    def close(self) -> None:
        if self.system is not None:
            self.system.shutdown()

    def decoder_agent(self):
        """The decoder's `Agent` when it runs in this process (token-class NLL), else None."""
        return self.pool.services[self.decoder].agent if self.system is None else None


def run_one(agents: Agents, variant: Variant, rounds: int, items: list[dict], targets: dict[str, str], *,
            latent_steps: int, max_new_tokens: int, batch_size: int, seed: int, samples_path: Path,
            num_in_flight: int = 1, on_sample: Callable[[int, int, float], None] | None = None,
            facts: dict[str, dict] | None = None, role_questions: dict[str, dict[str, str]] | None = None,
            hidden_facts: tuple[str, ...] = ()) -> dict:
    """Evaluate one (variant, R) on `items`; writes its samples file and returns its summary row.

    `num_in_flight` batches run at once (Ray backend): each agent is its own process, so while the
    solver decodes one batch the planner and critic already work on the next ones. `facts` (doc id ->
    `jobs.experiments.probe.question_facts`) turns on the information-flow figures (`demo.flow`); `role_questions`
    (doc id -> role -> question text) gives roles different views of a question (the hidden fact).
    """
    from recmas_ray.engine.runner import run_batch  # lazy: demo.py loads this before checking input

    if variant.links:
        agents.use_links(variant.links)
    m = latent_steps if variant.latent_steps is None else variant.latent_steps
    rc = RecursionConfig(method=variant.method, num_recursive_rounds=rounds, latent_steps=m,
                         latent_ablation=variant.ablation,
                         decode=DecodeConfig(max_new_tokens=max_new_tokens, seed=seed))
    recorder = FlowRecorder(facts, agents.decoder_agent(), hidden_facts=hidden_facts) if facts is not None else None

    def views(batch):
        if role_questions is None:
            return None
        got = [dict(role_questions.get(i["doc_id"], {})) for i in batch]
        if variant.question_from:  # the single agent reads that role's view of the question
            got = [{agents.decoder: v.get(variant.question_from, i["question"])} for v, i in zip(got, batch)]
        return got

    def one_batch(batch: list[dict]) -> list[dict]:
        got: list = []
        gold = [targets[i["doc_id"]] for i in batch]
        capture = recorder.hook([i["doc_id"] for i in batch], gold) if recorder else None

        # the recorder scoring in this process gives the row's NLL from its token NLLs (one forward, the same
        # Agent.target_nll); otherwise the runner scores (`targets`), e.g. on Ray actors
        self_scored = recorder is not None and recorder.agent is not None

        def solve(qs, ts, rc):
            res = run_batch(agents.pool, agents.style, qs, ts, rc, targets=None if self_scored else gold,
                            role_questions=views(batch), capture=capture)
            got.extend(res)
            return res

        recs = solve_and_grade(batch, 0, variant.key, rc, "strict", solve, agents.retry)
        if recorder is not None:
            recorder.score_pending()
        for rec, res in zip(recs, got):
            nll = recorder.mean_nll.get(rec["doc_id"]) if self_scored else res.nll
            rec.update(variant=variant.key, label=variant.label, nll=nll, target=targets[rec["doc_id"]])
            rec.update(graded_both_ways(rec))
        return recs

    load_before = machine_load()
    batches = [items[k:k + batch_size] for k in range(0, len(items), batch_size)]
    workers = max(1, min(num_in_flight if agents.system is not None else 1, len(batches)))
    records, ok = [], 0
    t0 = time.perf_counter()
    with SampleWriter(samples_path) as writer, ThreadPoolExecutor(workers, thread_name_prefix="demo-batch") as pool:
        for recs in pool.map(one_batch, batches):  # in order, so samples files and progress are deterministic
            for rec in recs:
                writer.write(rec)
                records.append(rec)
                ok += int(rec["correct"])
                if on_sample:
                    on_sample(len(records), ok, time.perf_counter() - t0)
    row = summarize_run(variant, rounds, records, wall_s=time.perf_counter() - t0)
    row["load"] = {"before": load_before, "after": machine_load()}  # what the seconds were measured under
    if recorder is not None:
        row["flow"] = recorder.summary([i["doc_id"] for i in items], seed=seed)
    return row


def summarize_run(variant: Variant, rounds: int, records: list[dict], *, wall_s: float | None = None) -> dict:
    """accuracy, its Wilson 95% CI and n; NLL (mean and standard error); tokens, latent steps, seconds."""
    n = len(records)
    k = sum(bool(r["correct"]) for r in records)
    lo, hi = wilson(k, n)
    nlls = [float(r["nll"]) for r in records if r.get("nll") is not None]
    mean_nll = sum(nlls) / len(nlls) if nlls else float("nan")
    se = math.sqrt(sum((x - mean_nll) ** 2 for x in nlls) / (len(nlls) - 1) / len(nlls)) if len(nlls) > 1 else float("nan")
    return {"variant": variant.key, "label": variant.label, "method": variant.method, "links": variant.links,
            "ablation": variant.ablation, "rounds": rounds, "n": n, "correct": k, "accuracy": k / n if n else float("nan"),
            "ci_low": lo, "ci_high": hi, "nll": mean_nll, "nll_stderr": se,
            "tokens_per_sample": sum(float(r["tokens"]) for r in records) / n if n else float("nan"),
            "latent_steps_per_sample": sum(float(r["latent_steps"]) for r in records) / n if n else float("nan"),
            "seconds_per_sample": sum(float(r["latency_s"]) for r in records) / n if n else float("nan"),
            "wall_seconds": wall_s, "nll_per_doc": {r["doc_id"]: r.get("nll") for r in records},
            "correct_per_doc": {r["doc_id"]: bool(r["correct"]) for r in records}, **lenient_summary(records)}


def graded_both_ways(rec: dict) -> dict:
    """A sample's strict verdict (the graded format) and lenient one (`tasks.math.grade_lenient`: the final number
    of the reply the agent wrote itself, before any format retry) and that number."""
    g = grade_lenient(own_reply(rec), str(rec["gold"]), strict=bool(rec["correct"]))
    return {"correct_strict": bool(rec["correct"]), "correct_lenient": g.correct, "stated_value": g.extracted}


def lenient_summary(records: list[dict]) -> dict:
    """Lenient accuracy with its Wilson 95% CI, and per question: lenient verdicts and every prediction."""
    n = len(records)
    per_doc = {r["doc_id"]: bool(r.get("correct_lenient", r["correct"])) for r in records}
    k = sum(per_doc.values())
    lo, hi = wilson(k, n)
    return {"correct_lenient": k, "accuracy_lenient": k / n if n else float("nan"), "ci_low_lenient": lo,
            "ci_high_lenient": hi, "correct_lenient_per_doc": per_doc,
            "prediction_per_doc": {r["doc_id"]: r.get("prediction") for r in records}}


def machine_load() -> dict:
    """The machine's load averages (1, 5, 15 min) and core count: timings mean nothing without them."""
    one, five, fifteen = os.getloadavg()
    return {"loadavg_1m": one, "loadavg_5m": five, "loadavg_15m": fifteen, "num_cores": os.cpu_count()}


def add_comparisons(rows: list[dict]) -> list[dict]:
    """Speedup (baseline s / s) and token reduction (1 - tokens / baseline tokens) vs Recursive-TextMAS at
    the same R (R = 1 for the single-agent rows and TextMAS, where Recursive-TextMAS is TextMAS itself)."""
    base = {r["rounds"]: r for r in rows if r["variant"] == BASELINE}
    for r in rows:
        b = base.get(r["rounds"] if not r["variant"].startswith(("single_agent", "textmas")) else 1)
        s, bs = r["seconds_per_sample"], (b or {}).get("seconds_per_sample")
        t, bt = r["tokens_per_sample"], (b or {}).get("tokens_per_sample")
        r["speedup"] = bs / s if b and s and bs else None
        r["token_reduction"] = 1 - t / bt if b and bt else None
    return rows


PER_DOC = ("nll_per_doc", "correct_per_doc", "correct_lenient_per_doc", "prediction_per_doc")


def public_row(row: dict) -> dict:
    """The row without per-question detail (for the results file's table)."""
    out = {k: v for k, v in row.items() if k not in PER_DOC}
    if row.get("flow"):
        out["flow"] = {k: v for k, v in row["flow"].items() if k != "nll_by_class_per_doc"}
    return out


def write_json(path: Path, data) -> Path:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    tmp.replace(path)
    return path


def replace_round(row: dict, variant: Variant, rounds: int) -> dict:
    """A copy of `row` relabelled as `variant` at R = `rounds` (Recursive-TextMAS R=1 is the TextMAS run)."""
    return {**row, "variant": variant.key, "label": variant.label,
            "method": variant.method, "rounds": rounds, "same_run_as": row["variant"]}
