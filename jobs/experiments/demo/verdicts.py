"""Paired tests between the demo's methods and the verdict lines they support.

Every comparison is the inner+outer-trained system against another method on the same held-out questions:
McNemar's exact test for accuracy, the paired NLL difference (other - trained, so positive means the trained
latents make the gold answer more likely) with its standard error and t-test p, per answer token class
too (`eval.stats`). Verdicts use these tests (alpha = 0.05), never overlapping intervals, plus the
information-flow figures of the trained messages (`demo.flow`). Every verdict decides on Holm-adjusted
p-values (`stats.holm`) over the family of tests it draws on: the McNemar tests of one task at one R, its NLL
tests, the per-class tests of one line, the two tests of a headline.

`headline(tasks)` gives the lines printed first, one per task ("trained links carry the fact: X/N own vs Y/N
shuffled vs Z/N fresh"); a task is a dict {"task": name, "style": style, "rows": compare rows[, "tests"]}, so a
pipeline running several tasks passes all of them.
"""

from __future__ import annotations

import math

from jobs.experiments.probe import TOKEN_CLASSES
from recmas_ray.eval.stats import holm, mcnemar_by_key, paired_by_key

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
    for r in {t["rounds"] for t in out}:  # one family per R: every McNemar test, every NLL test
        family = [t for t in out if t["rounds"] == r]
        for key in ("mcnemar", "nll_diff"):
            for t, adj in zip(family, holm([t[key]["p"] for t in family])):
                t[key]["p_holm"] = adj
    return out


def _p(d: dict) -> float:
    """The p-value a verdict decides on: Holm-adjusted where the test belongs to a family, else its own."""
    return d.get("p_holm", d.get("p", float("nan")))


def _ps(d: dict) -> str:
    """"p 0.021, Holm 0.15" (or the plain p of a lone test)."""
    raw = d.get("p", float("nan"))
    if "p_holm" in d and math.isfinite(d["p_holm"]):
        return f"p {raw:.2g}, Holm {d['p_holm']:.2g}"
    return f"p {raw:.2g}"


def _pm(d: dict) -> str:
    if not math.isfinite(d.get("mean", float("nan"))):
        return "N/A"
    se = f"{d['se']:.3f}" if math.isfinite(d["se"]) else "?"
    return f"{d['mean']:+.3f} +- {se} ({_ps(d)})" if math.isfinite(d["p"]) else f"{d['mean']:+.3f} +- {se}"


def _significant(d: dict) -> int:
    """+1 / -1 where the paired difference is significant at ALPHA (Holm-adjusted p) with that sign, else 0."""
    p, mean = _p(d), d.get("mean", float("nan"))
    return (1 if mean > 0 else -1) if math.isfinite(p) and p < ALPHA else 0


def _with_class_holm(t: dict) -> dict:
    """The per-class NLL tests of one paired test, Holm-adjusted together with its overall NLL test."""
    by_class = {c: dict(d) for c, d in t["nll_diff_by_class"].items()}
    overall = dict(t["nll_diff"])
    family = [overall, *by_class.values()]
    for d, adj in zip(family, holm([d.get("p") for d in family])):
        d["p_holm"] = max(adj, d.get("p_holm", adj)) if math.isfinite(adj) else d.get("p_holm", adj)
    return {**t, "nll_diff": overall, "nll_diff_by_class": by_class}


def paired_verdicts(tests: list[dict]) -> list[str]:
    """One line per paired test: what it shows, in words, with the numbers."""
    lines = []
    for t in map(_with_class_holm, tests):
        mc, nll = t["mcnemar"], t["nll_diff"]
        acc = ("trained more accurate" if mc["a_only"] > mc["b_only"] else "trained less accurate") \
            if _p(mc) < ALPHA else "no significant accuracy difference"
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
            meaning = (" => the latents add to the solver's prompt alone" if sig > 0 or _p(mc) < ALPHA and
                       mc["a_only"] > mc["b_only"] else " => no evidence the latents add to the solver's prompt alone")
        lines.append(f"paired: trained R={t['rounds']} vs {t['other_label']} R={t['other_rounds']}: accuracy "
                     f"{t['accuracy']:.3f} vs {t['other_accuracy']:.3f} (McNemar exact {_ps(mc)}, "
                     f"{mc['a_only']} vs {mc['b_only']} discordant), {acc}; answer NLL other - trained "
                     f"{_pm(nll)}, {like}" + (f" [{cls}]" if cls else "") + meaning + ".")
    return lines


def flow_verdicts(rows: list[dict], tests: list[dict] | None = None) -> list[str]:
    """Two separate questions per trained edge and R: is the fact PRESENT in the message (a held-out linear probe
    reads it back above the constant baseline; the messages' spread is reported beside, since nearly parallel
    vectors can still be linearly separable) and is it USED by the decoder (the shuffle gap: answer NLL and
    accuracy with another question's latents minus with its own, from the paired test)."""
    by = {(r["variant"], r["rounds"]): r for r in rows}
    lines = []
    for (key, r), row in sorted(by.items(), key=lambda kv: kv[0][1]):
        if key != REFERENCE:
            continue
        for name, e in ((row.get("flow") or {}).get("edges") or {}).items():
            probes = ", ".join(f"{k} {'acc' if p['kind'] == 'accuracy' else 'R^2'} {p['score']:.2f} vs {p['baseline']:.2f}"
                               for k, p in e["probe"].items())
            read = [k for k, p in e["probe"].items() if p["score"] > p["baseline"] + (0.2 if p["kind"] == "r2" else 0.1)]
            lines.append(f"flow: trained {name}: present in the message (probe, held-out vs constant): {probes or 'N/A'}"
                         f" -> {'reads ' + ', '.join(read) if read else 'no fact read above the baseline'}; spread "
                         f"between questions: cosine {e['mean_cosine']:.3f}, variance ratio {e['variance_ratio']:.4f}.")
        shuffle = next((t for t in tests or [] if t["rounds"] == r and t["other"] == "ablation/shuffle"), None)
        if shuffle is not None:
            t = _with_class_holm(shuffle)
            mc, nll = t["mcnemar"], t["nll_diff"]
            classes = "; ".join(f"{c} tokens {_pm(d)}" for c, d in t["nll_diff_by_class"].items())
            used = _significant(nll) > 0 or any(_significant(d) > 0 for d in t["nll_diff_by_class"].values()) or (
                _p(mc) < ALPHA and mc["a_only"] > mc["b_only"])
            lines.append(f"flow: trained R={r}: used by the decoder (shuffle gap, answer NLL shuffled - own): "
                         f"{_pm(nll)}" + (f" [{classes}]" if classes else "") + f"; accuracy own "
                         f"{row['correct']}/{row['n']} vs shuffled {by[('ablation/shuffle', r)]['correct']}/"
                         f"{by[('ablation/shuffle', r)]['n']} ({_ps(mc)}) -> "
                         + ("the decoder uses question-specific content of the latents." if used else
                            "no evidence the decoder uses question-specific content of the latents."))
    return lines


CHANNEL_ALPHA = 0.01
CHANNEL_MIN_N = 128
CHANNEL_AGAINST = ("ablation/shuffle", "recursive_mas/fresh")
"""The two tests of a headline: trained links against the same links fed another question's latents, and
against fresh links."""


def _channel(rows: list[dict]) -> list[tuple[int, dict, dict, dict, dict, dict]]:
    """Per R with all three rows: (R, own, shuffled, fresh, McNemar own vs shuffled, own vs fresh), the two
    McNemar p-values Holm-adjusted together."""
    by = {(r["variant"], r["rounds"]): r for r in rows if not r.get("same_run_as")}
    out = []
    for r in sorted({k[1] for k in by if k[0] == REFERENCE}):
        own, others = by[(REFERENCE, r)], [by.get((k, r)) for k in CHANNEL_AGAINST]
        if any(o is None for o in others):
            continue
        tests = [mcnemar_by_key(own["correct_per_doc"], o["correct_per_doc"]) for o in others]
        for t, adj in zip(tests, holm([t["p"] for t in tests])):
            t["p_holm"] = adj
        out.append((r, own, *others, *tests))
    return out


def headline(tasks: list[dict]) -> list[str]:
    """The lines printed first: per task and R, "STYLE / TASK, R=r: trained links carry the fact: X/N own vs Y/N
    shuffled vs Z/N fresh (McNemar p ...)" (strict grading; "do not show the fact" where either Holm-adjusted
    test fails alpha = 0.01 or own is not above). `tasks`: [{"task", "style", "rows"}]."""
    lines = []
    for task in tasks:
        for r, own, shuf, fresh, vs_shuf, vs_fresh in _channel(task["rows"]):
            holds = all(t["p_holm"] < CHANNEL_ALPHA and t["a_only"] > t["b_only"] for t in (vs_shuf, vs_fresh))
            lines.append(f"{task.get('style', '?')} / {task.get('task', '?')}, R={r}: trained links "
                         f"{'carry the fact' if holds else 'do not show the fact'}: {own['correct']}/{own['n']} own vs "
                         f"{shuf['correct']}/{shuf['n']} shuffled vs {fresh['correct']}/{fresh['n']} fresh (McNemar p "
                         f"{vs_shuf['p']:.2g} vs shuffled, {vs_fresh['p']:.2g} vs fresh; Holm {vs_shuf['p_holm']:.2g}, "
                         f"{vs_fresh['p_holm']:.2g}; alpha {CHANNEL_ALPHA})")
    return lines


def collaboration(tasks: list[dict]) -> list[str]:
    """Per task marked {"collaboration": True}: "STYLE / TASK, R=r: trained RecursiveMAS X/N vs single agent Y/N
    vs TextMAS Z/N (McNemar p ...; Holm ...)" and whether it beats both (Holm-adjusted p < ALPHA, more right)."""
    lines = []
    for task in tasks:
        if not task.get("collaboration"):
            continue
        by = {(r["variant"], r["rounds"]): r for r in task["rows"] if not r.get("same_run_as")}
        single, text = by.get(("single_agent", 1)), by.get(("textmas", 1))
        for (key, r), own in sorted(by.items(), key=lambda kv: kv[0][1]):
            if key != REFERENCE or single is None or text is None:
                continue
            tests = [mcnemar_by_key(own["correct_per_doc"], o["correct_per_doc"]) for o in (single, text)]
            for t, adj in zip(tests, holm([t["p"] for t in tests])):
                t["p_holm"] = adj
            wins = all(t["p_holm"] < ALPHA and t["a_only"] > t["b_only"] for t in tests)
            lines.append(f"{task.get('style', '?')} / {task.get('task', '?')}, R={r}: trained RecursiveMAS "
                         f"{own['correct']}/{own['n']} vs single agent {single['correct']}/{single['n']} vs TextMAS "
                         f"{text['correct']}/{text['n']} (McNemar p {tests[0]['p']:.2g} vs single, {tests[1]['p']:.2g} "
                         f"vs TextMAS; Holm {tests[0]['p_holm']:.2g}, {tests[1]['p_holm']:.2g}): "
                         + ("collaboration beats both" if wins else f"not shown to beat both at alpha {ALPHA}"))
    return lines


def channel_verdicts(rows: list[dict], tests: list[dict]) -> list[str]:
    """Hidden-fact task: between the floor (single agent without the fact) and the ceiling (given it), strict
    and lenient, do trained links beat fresh and shuffled ones with McNemar p < 0.01 (Holm-adjusted over those
    two tests at that R) on >= 128 questions?"""
    by = {(r["variant"], r["rounds"]): r for r in rows}
    floor, ceiling = by.get(("single_agent", 1)), by.get(("single_agent/fact", 1))
    if ceiling is None:
        return []

    def both(row):
        return "N/A" if row is None else f"{row['accuracy']:.3f} / {row.get('accuracy_lenient', float('nan')):.3f}"

    chosen = [t for t in tests if t["other"] in CHANNEL_AGAINST]
    adjusted = {}
    for r in {t["rounds"] for t in chosen}:
        family = [t for t in chosen if t["rounds"] == r]
        adjusted.update(zip(map(id, family), holm([t["mcnemar"]["p"] for t in family])))
    lines = []
    for t in chosen:
        mc = {**t["mcnemar"], "p_holm": adjusted[id(t)]}
        holds = mc["p_holm"] < CHANNEL_ALPHA and mc["a_only"] > mc["b_only"] and mc["n"] >= CHANNEL_MIN_N
        lines.append(f"channel: hidden fact, R={t['rounds']}: trained {t['accuracy']:.3f} vs {t['other_label']} "
                     f"{t['other_accuracy']:.3f} (McNemar exact {_ps(mc)}, n {mc['n']}; strict / lenient: floor "
                     f"{both(floor)}, ceiling {both(ceiling)}, trained {both(by.get((REFERENCE, t['rounds'])))}): "
                     + ("the trained links transmit the fact (p < 0.01 after Holm, n >= 128)" if holds else
                        f"not shown at p < {CHANNEL_ALPHA} with n >= {CHANNEL_MIN_N} (Holm-adjusted)") + ".")
    return lines


__all__ = ["paired_tests", "paired_verdicts", "flow_verdicts", "channel_verdicts", "headline", "collaboration",
           "ALPHA"]
