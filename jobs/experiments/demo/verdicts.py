"""Paired tests between the demo's methods and the verdict lines they support.

Every comparison is the inner+outer-trained system against another method on the same held-out questions:
McNemar's exact test for accuracy, the paired NLL difference (other - trained, so positive means the trained
latents make the gold answer more likely) with its standard error and t-test p, per answer token class
too (`eval.stats`). Verdicts use these tests (alpha = 0.05), never overlapping intervals, plus the
information-flow figures of the trained messages (`demo.flow`).
"""

from __future__ import annotations

import math

from recmas_ray.eval.probe import TOKEN_CLASSES
from recmas_ray.eval.stats import mcnemar_by_key, paired_by_key

ALPHA = 0.05
REFERENCE = "recursive_mas/trained"
AGAINST = ("recursive_mas/fresh", "recursive_mas/inner", "ablation/shuffle", "ablation/zero", "ablation/empty",
           "textmas", "recursive_textmas", "single_agent", "single_agent/fact")
"""What the trained system is tested against (text methods and single agents at their own R)."""


def _partner(by: dict, key: str, r: int) -> dict | None:
    if key in ("textmas", "single_agent", "single_agent/fact"):
        return by.get((key, 1))
    if key == "recursive_textmas":
        return by.get((key, r)) if r > 1 else None  # R = 1 is the TextMAS row itself
    return by.get((key, r))


def paired_tests(rows: list[dict]) -> list[dict]:
    """One record per (trained at R, other method): McNemar and paired NLL differences, overall and per class."""
    by = {(r["variant"], r["rounds"]): r for r in rows if not r.get("same_run_as")}
    out = []
    for (key, r), ref in sorted(by.items(), key=lambda kv: kv[0][1]):
        if key != REFERENCE:
            continue
        for other_key in AGAINST:
            other = _partner(by, other_key, r)
            if other is None:
                continue
            rec = {"reference": REFERENCE, "rounds": r, "other": other_key, "other_label": other["label"],
                   "other_rounds": other["rounds"], "accuracy": ref["accuracy"], "other_accuracy": other["accuracy"],
                   "mcnemar": mcnemar_by_key(ref["correct_per_doc"], other["correct_per_doc"]),
                   "nll_diff": paired_by_key(other["nll_per_doc"], ref["nll_per_doc"]), "nll_diff_by_class": {}}
            a, b = (ref.get("flow") or {}).get("nll_by_class_per_doc"), (other.get("flow") or {}).get("nll_by_class_per_doc")
            if a and b:
                rec["nll_diff_by_class"] = {c: paired_by_key(b[c], a[c]) for c in TOKEN_CLASSES
                                            if any(v is not None for v in a[c].values())}
            out.append(rec)
    return out


def _pm(d: dict) -> str:
    if not math.isfinite(d.get("mean", float("nan"))):
        return "N/A"
    se = f"{d['se']:.3f}" if math.isfinite(d["se"]) else "?"
    return f"{d['mean']:+.3f} +- {se} (p {d['p']:.2g})" if math.isfinite(d["p"]) else f"{d['mean']:+.3f} +- {se}"


def _significant(d: dict) -> int:
    """+1 / -1 where the paired difference is significant at ALPHA with that sign, else 0."""
    p, mean = d.get("p", float("nan")), d.get("mean", float("nan"))
    return (1 if mean > 0 else -1) if math.isfinite(p) and p < ALPHA else 0


def paired_verdicts(tests: list[dict]) -> list[str]:
    """One line per paired test: what it shows, in words, with the numbers."""
    lines = []
    for t in tests:
        mc, nll = t["mcnemar"], t["nll_diff"]
        acc = ("trained more accurate" if mc["a_only"] > mc["b_only"] else "trained less accurate") \
            if mc["p"] < ALPHA else "no significant accuracy difference"
        sig = _significant(nll)
        like = {1: "trained makes the answer more likely", -1: "trained makes the answer less likely",
                0: "no significant NLL difference"}[sig]
        by_class = t["nll_diff_by_class"]
        cls = "; ".join(f"{c} tokens {_pm(by_class[c])}" for c in by_class)
        meaning = ""
        res_sig = _significant(by_class.get("result", {})) if by_class else 0
        fact_sig = _significant(by_class.get("fact", {})) if by_class else 0
        if t["other"] == "ablation/shuffle":
            meaning = (" => the latents carry question-specific information the decoder uses"
                       if sig > 0 or res_sig > 0 or fact_sig > 0 else
                       " => no evidence that the latents carry question-specific information the decoder uses")
        elif t["other"] == "ablation/zero":
            meaning = " => the decoder uses the latent slots" if sig > 0 else " => no evidence the decoder uses the slots"
        elif t["other"] == "ablation/empty":
            meaning = (" => the latents add to the solver's prompt alone" if sig > 0 or mc["p"] < ALPHA and
                       mc["a_only"] > mc["b_only"] else " => no evidence the latents add to the solver's prompt alone")
        lines.append(f"paired: trained R={t['rounds']} vs {t['other_label']} R={t['other_rounds']}: accuracy "
                     f"{t['accuracy']:.3f} vs {t['other_accuracy']:.3f} (McNemar exact p {mc['p']:.2g}, "
                     f"{mc['a_only']} vs {mc['b_only']} discordant), {acc}; answer NLL other - trained "
                     f"{_pm(nll)}, {like}" + (f" [{cls}]" if cls else "") + meaning + ".")
    return lines


def flow_verdicts(rows: list[dict]) -> list[str]:
    """Per edge of the trained system: do its messages collapse to one vector, and what does a probe read?"""
    by = {(r["variant"], r["rounds"]): r for r in rows}
    lines = []
    for (key, r), row in sorted(by.items(), key=lambda kv: kv[0][1]):
        if key != REFERENCE or not (row.get("flow") or {}).get("edges"):
            continue
        fresh = ((by.get(("recursive_mas/fresh", r)) or {}).get("flow") or {}).get("edges", {})
        for name, e in row["flow"]["edges"].items():
            f = fresh.get(name)
            ref = f" (fresh {f['mean_cosine']:.3f} / {f['variance_ratio']:.4f})" if f else ""
            probes = ", ".join(f"{k} {'acc' if p['kind'] == 'accuracy' else 'R^2'} {p['score']:.2f} vs {p['baseline']:.2f}"
                               for k, p in e["probe"].items())
            read = [k for k, p in e["probe"].items() if p["score"] > p["baseline"] + (0.2 if p["kind"] == "r2" else 0.1)]
            collapsed = math.isfinite(e["variance_ratio"]) and e["variance_ratio"] < 0.05
            what = ("nearly one vector for every question" if collapsed else "question-dependent") + \
                (f", yet a held-out probe reads {', '.join(read)}" if read else ", and no fact is read back above the constant baseline")
            lines.append(f"flow: trained {name}: between-question cosine {e['mean_cosine']:.3f}, variance ratio "
                         f"{e['variance_ratio']:.4f}{ref}, vector norm {e['mean_vector_norm']:.1f}; held-out probe "
                         f"(vs constant) {probes or 'N/A'}: {what}.")
    return lines


CHANNEL_ALPHA = 0.01
CHANNEL_MIN_N = 128


def channel_verdicts(rows: list[dict], tests: list[dict]) -> list[str]:
    """Hidden-operand task: between the floor (single agent without the fact) and the ceiling (given it), do
    trained links beat fresh and shuffled ones with McNemar p < 0.01 on >= 128 questions?"""
    by = {(r["variant"], r["rounds"]): r for r in rows}
    floor, ceiling = by.get(("single_agent", 1)), by.get(("single_agent/fact", 1))
    if ceiling is None:
        return []
    lines = []
    for t in tests:
        if t["other"] not in ("recursive_mas/fresh", "ablation/shuffle"):
            continue
        mc = t["mcnemar"]
        holds = mc["p"] < CHANNEL_ALPHA and mc["a_only"] > mc["b_only"] and mc["n"] >= CHANNEL_MIN_N
        lines.append(f"channel: hidden operand, R={t['rounds']}: trained {t['accuracy']:.3f} vs {t['other_label']} "
                     f"{t['other_accuracy']:.3f} (McNemar exact p {mc['p']:.2g}, n {mc['n']}; floor "
                     f"{floor['accuracy'] if floor else float('nan'):.3f}, ceiling {ceiling['accuracy']:.3f}): "
                     + ("the trained links transmit the fact (p < 0.01, n >= 128)" if holds else
                        f"not shown at p < {CHANNEL_ALPHA} with n >= {CHANNEL_MIN_N}") + ".")
    return lines


__all__ = ["paired_tests", "paired_verdicts", "flow_verdicts", "channel_verdicts", "ALPHA"]
