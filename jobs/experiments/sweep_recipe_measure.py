"""Measurements of `jobs/experiments/sweep_recipe.py` on the hidden-operand held-out set: accuracy, fact / result token NLL,
a linear probe of the hidden x per edge, paired tests.

In-process agents (`pool.LocalPool`) loaded once; link sets are swapped into them (`AgentService.set_links`)
and the measured quantities are taken from the very calls `run_batch` makes: `CapturePool` keeps every latent
message it passes on and scores the decoder's gold answer token by token from the prompt it decodes from.
"""

from __future__ import annotations

import ctypes
import gc
import math
import time

import numpy as np
import torch

from jobs.experiments.probe import held_out_predictions
from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.eval import stats as eval_stats
from recmas_ray.eval.stream import format_retry
from recmas_ray.engine.pool import LocalPool
from recmas_ray.engine.runner import run_batch
from recmas_ray.system.launch import local_pool, set_plan_links
from recmas_ray.system.plan import plan_system
from recmas_ray.tasks.math import grade_lenient, grade_math_strict
from recmas_ray.train.bridge import bridge_outer_links
from recmas_ray.train.data import question_text


def mcnemar_exact(a: list[bool], b: list[bool]) -> dict:
    """McNemar's exact test (`eval.stats.mcnemar_exact`, the one definition) in the keys the sweep's result.json
    has always used (only_a, only_b, p)."""
    t = eval_stats.mcnemar_exact(a, b)
    return {"only_a": t["a_only"], "only_b": t["b_only"], "p": t["p"]}


def paired(a: list[float], b: list[float]) -> dict:
    """Mean and standard error of b - a over the pairs where both are present."""
    d = np.array([y - x for x, y in zip(a, b) if x is not None and y is not None], dtype=np.float64)
    if len(d) < 2:
        return {"mean": None, "se": None, "n": int(len(d))}
    return {"mean": float(d.mean()), "se": float(d.std(ddof=1) / math.sqrt(len(d))), "n": int(len(d))}


def probe_x(features_NE: np.ndarray, x: list[float], seed: int = 0) -> dict:
    """5-fold cross-validated ridge (penalty chosen inside each training fold, `probe.held_out_predictions`)
    from features to x: held-out R^2 (0 = the constant baseline) and the share of questions whose rounded
    prediction equals x."""
    y = np.asarray(x, dtype=np.float64)
    pred, _ = held_out_predictions(np.asarray(features_NE, dtype=np.float64), y, num_folds=5, seed=seed)
    r2 = 1.0 - float(((y - pred) ** 2).sum() / max(1e-12, ((y - y.mean()) ** 2).sum()))
    return {"r2": r2, "exact": float(np.mean(np.round(pred) == y))}


def _spans(target: str, value: str, start: int) -> tuple[int, int]:
    at = target.index(value, start)
    return at, at + len(value)


def token_classes(tokenizer, target: str, fact: str, result: str, turn_end: str) -> list[str]:
    """fact / result / other per token of `target + turn_end` (as the decoder is scored): the hidden value's
    digits at the start of the answer, and the value after '=' (the boxed value where that is the fact itself)."""
    fact_span = _spans(target, fact, 0)
    res_span = _spans(target, result, target.index("=") + 1)
    if res_span == fact_span and "\\boxed{" in target:  # recall ("x = 17. \\boxed{17}"): the boxed copy
        res_span = _spans(target, result, target.index("\\boxed{"))
    enc = tokenizer(target + turn_end, add_special_tokens=False, return_offsets_mapping=True)
    out = []
    for a, b in enc["offset_mapping"]:
        overlaps = lambda s: a < s[1] and b > s[0]  # noqa: E731
        out.append("fact" if overlaps(fact_span) else "result" if overlaps(res_span) else "other")
    return out


class CapturePool(LocalPool):
    """LocalPool that records every latent message and the decoder's per-token answer NLL."""

    def __init__(self, services: dict):
        super().__init__(services)
        self.messages: dict[str, list[torch.Tensor]] = {}
        self.token_nll: list[list[float]] = []

    def rollout(self, role, users, slot_names, num_steps, edges, latents):
        msgs, stats = super().rollout(role, users, slot_names, num_steps, edges, latents)
        for edge, m in zip(edges, msgs):
            self.messages.setdefault(edge, []).append(m.detach().float().cpu())  # later rounds come last
        return msgs, stats

    def score(self, role, users, slot_names, targets, latents):
        """The service's scorer (`Agent.score_targets`, the one teacher-forced scorer), keeping the per-token NLL."""
        t0 = time.perf_counter()
        scored = self.services[role].agent.score_targets(list(users), dict(zip(slot_names, latents)), list(targets))
        self.token_nll.extend(s.token_nll for s in scored)
        return [s.mean_nll for s in scored], {"role": role, "seconds": time.perf_counter() - t0}


class Measurer:
    """Agents of the sweep's system, loaded once; each measurement swaps link sets into them."""

    def __init__(self, cfg, inner: dict[str, str], heldout: list[dict]):
        self.cfg, self.rows = cfg, heldout
        self.questions = [question_text(r) for r in heldout]
        self.plan_of = lambda overrides: plan_system(cfg.style, preset=cfg.preset, ckpt_override=overrides,
                                                     seed=cfg.seed, task=cfg.task,
                                                     role_models=dict(cfg.role_models))
        self.inner = dict(inner)
        base = self.plan_of(self.inner)
        self.style = base.style
        torch.set_num_threads(2)
        self.pool = local_pool(base, pool_cls=CapturePool)

    def _use(self, plan, latent_norm: str) -> None:
        set_plan_links(self.pool, plan)
        for svc in self.pool.services.values():
            svc.agent.set_latent_norm(latent_norm)

    def _run(self, method: str, rounds: int, *, ablation: str = "none", questions=None) -> dict:
        cfg, questions = self.cfg, questions or self.questions
        rc = RecursionConfig(method=method, num_recursive_rounds=rounds, latent_steps=cfg.latent_steps,
                             latent_ablation=ablation, decode=DecodeConfig(max_new_tokens=cfg.max_new_tokens,
                                                                           seed=cfg.seed))
        correct, lenient, fact_nll, result_nll, feats, preds = [], [], [], [], {}, []
        decoder = self.pool.services[self.style.decoder].agent

        def retry(texts, suffixes, n, decode, context=None):
            return self.pool.retry_format(self.style.decoder, texts, suffixes, n, cfg=decode, context=context)

        for k in range(0, len(self.rows), cfg.eval_batch_size):
            rows = self.rows[k:k + cfg.eval_batch_size]
            self.pool.messages, self.pool.token_nll = {}, []
            res = run_batch(self.pool, self.style, questions[k:k + cfg.eval_batch_size], [cfg.task] * len(rows), rc,
                            targets=[r["answer"] for r in rows])
            # the demo's and jobs.run's answer-format retry (on by default there): output without \boxed{}
            # is continued after "Final Answer: \boxed{" by the decoder's base model, then graded strictly
            infos = format_retry([{"task_type": cfg.task}] * len(rows), res, rc.decode, retry)
            for r, s, tok, info in zip(rows, res, self.pool.token_nll, infos):
                correct.append(bool(grade_math_strict(s.prediction, r["gold"])))
                own = info["raw_prediction"] if info else s.prediction  # the reply before the format retry
                lenient.append(grade_lenient(own, r["gold"], strict=correct[-1]).correct)
                preds.append(s.prediction)
                cls = token_classes(decoder.tokenizer, r["answer"], str(r["facts"]["fact"]), r["gold"],
                                    decoder.assistant_turn_end())
                for name, into in (("fact", fact_nll), ("result", result_nll)):
                    vals = [v for v, c in zip(tok, cls) if c == name]
                    into.append(float(np.mean(vals)) if vals else None)
            for edge, per_round in self.pool.messages.items():
                feats.setdefault(edge, []).append(per_round[-1].mean(dim=1).numpy())
        out = {"accuracy": float(np.mean(correct)), "correct": correct, "fact_nll": fact_nll,
               "accuracy_lenient": float(np.mean(lenient)), "correct_lenient": lenient,
               "result_nll": result_nll, "predictions": preds,  # every held-out question's, in row order
               "doc_ids": [r.get("doc_id", k) for k, r in enumerate(self.rows)]}
        x = [float(r["facts"]["fact"]) for r in self.rows]
        out["probe"] = {e: probe_x(np.concatenate(f), x, self.cfg.seed) for e, f in feats.items()}
        return out

    def baselines(self) -> dict:
        """Single agent without the fact (floor), with it (ceiling), TextMAS (text can carry the fact)."""
        self._use(self.plan_of(self.inner), "none")
        full = [r["full_question"] for r in self.rows]
        return {"single_floor": self._run("single_agent", 1), "single_ceiling": self._run("single_agent", 1, questions=full),
                "textmas": self._run("textmas", 1)}

    def recipe(self, outer_dir: str | None, settings: dict, rows: tuple[str, ...] = ("zeroed", "bridge_init"),
               attach=None) -> dict:
        """Trained links (own, shuffled latents) and fresh outer links, at the recipe's R and latent norm; `rows`
        adds zeroed latents and the untrained bridge init (a bridge recipe only). The trained links are the
        checkpoint in `outer_dir`, or, with `attach(pool)`, what it attaches to the agents (`hop_by_hop`)."""
        rounds, norm = settings.get("num_recursive_rounds", 2), settings.get("latent_norm", "none")
        if attach is None:
            self._use(self.plan_of({**self.inner, "outer": outer_dir}), norm)
        else:
            self._use(self.plan_of(self.inner), norm)
            attach(self.pool)
        got = {"trained": self._run("recursive_mas", rounds), "shuffled": self._run("recursive_mas", rounds, ablation="shuffle")}
        compared = ["shuffled", "fresh"]
        if "zeroed" in rows:
            got["zeroed"] = self._run("recursive_mas", rounds, ablation="zero")
            compared.append("zeroed")
        self._use(self.plan_of(self.inner), norm)
        got["fresh"] = self._run("recursive_mas", rounds)
        if settings.get("outer_init") == "bridge" and "bridge_init" in rows:  # the bridge before training

            plan = self.plan_of(self.inner)
            bridge_outer_links(plan, ridge=settings.get("bridge_ridge", 1e-2))
            self._use(plan, norm)
            got["bridge_init"] = self._run("recursive_mas", rounds)
            compared.append("bridge_init")
        t = got["trained"]
        got["tests"] = {f"vs_{k}": {"mcnemar": mcnemar_exact(t["correct"], got[k]["correct"]),
                                    "fact_nll": paired(t["fact_nll"], got[k]["fact_nll"]),
                                    "result_nll": paired(t["result_nll"], got[k]["result_nll"])}
                        for k in compared}
        return got

    def close(self) -> None:
        """Drop the agents (their models' memory goes back before the next training run)."""
        self.pool.shutdown()  # the step threads hold their agents (and models) until they end
        self.pool.services.clear()
        gc.collect()
        try:  # hand the freed heap back to the OS: the Ray Train workers that train next load models of their own
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc: the memory stays with this process until it ends
            pass


def _pm(d: dict) -> str:
    return "n/a" if d.get("mean") is None else f"{d['mean']:+.3f} +- {d['se']:.3f}"


def summary_table(results: dict, cfg) -> str:
    """Markdown table: per recipe accuracies, McNemar p, paired fact/result NLL gaps, probe R^2 per edge."""
    n = cfg.num_eval
    lines = [f"hidden-fact task ({cfg.style}, {cfg.fact_task}), {n} seen-values + {cfg.num_unseen} unseen-values held-out questions, {cfg.num_train} training rows, outer {cfg.outer_steps} "
             f"steps x {cfg.outer_batch_size} rows, inner {cfg.inner_steps} steps, m = {cfg.latent_steps}", ""]
    base = results.get("_baselines")
    if base:
        lines.append("baselines (strict, lenient): " + ", ".join(
            f"{k} {v['accuracy']:.1%}, {v.get('accuracy_lenient', float('nan')):.1%}" for k, v in base.items()))
        lines.append("")
    lines += ["| recipe | loss first -> last | acc trained / shuffled / zeroed / fresh | McNemar p vs shuffled / fresh "
              "| fact NLL shuffled - own | result NLL shuffled - own | probe R^2 of x (exact) per edge, trained | fresh |",
              "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        if name.startswith("_"):
            continue
        acc = " / ".join(f"{r[k]['accuracy']:.1%}" if k in r else "-" for k in ("trained", "shuffled", "zeroed", "fresh"))
        if "bridge_init" in r:
            acc += f" (bridge untrained {r['bridge_init']['accuracy']:.1%})"
        t = r["tests"]
        probes = lambda v: ", ".join(f"{e} {p['r2']:.2f} ({p['exact']:.0%})" for e, p in r[v]["probe"].items())  # noqa: E731
        lines.append(f"| {name} | {r['loss_first']:.3f} -> {r['loss_last']:.3f} | {acc} | "
                     f"{t['vs_shuffled']['mcnemar']['p']:.2g} / {t['vs_fresh']['mcnemar']['p']:.2g} | "
                     f"{_pm(t['vs_shuffled']['fact_nll'])} | {_pm(t['vs_shuffled']['result_nll'])} | "
                     f"{probes('trained')} | {probes('fresh')} |")
    lines += ["", "| recipe | split | n | own | shuffled | zeroed | fresh | McNemar p own vs shuffled / fresh |",
              "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        if name.startswith("_"):
            continue
        for split, part in split_parts(cfg).items():
            got = {k: [r[k]["correct"][i] for i in part] if k in r else None for k in ("trained", "shuffled", "zeroed", "fresh")}
            cells = " | ".join(f"{sum(v)}/{len(v)}" if v is not None else "-" for v in got.values())
            ps = [mcnemar_exact(got["trained"], got[k])["p"] for k in ("shuffled", "fresh")]
            lines.append(f"| {name} | {split} | {len(part)} | {cells} | {ps[0]:.2g} / {ps[1]:.2g} |")
    return "\n".join(lines)


def split_parts(cfg) -> dict[str, range]:
    """Held-out positions of each split: the first num_eval rows have seen values, the rest unseen ones."""
    parts = {"seen values": range(cfg.num_eval)}
    if getattr(cfg, "num_unseen", 0):
        parts["unseen values"] = range(cfg.num_eval, cfg.num_eval + cfg.num_unseen)
    return parts
