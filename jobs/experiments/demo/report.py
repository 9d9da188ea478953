"""The demo's tables (method x R; information flow per edge; paired tests) and its PNG (accuracy with 95% CI
bars, NLL, tokens, seconds, NLL by answer token class)."""

from __future__ import annotations

import math
from pathlib import Path


def _f(v, fmt: str) -> str:
    return "N/A" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


COLUMNS = ("Method", "R", "n", "Accuracy", "95% CI", "NLL", "Tokens/sample", "s/sample", "Speedup",
           "Token reduction")


def _classes(rows: list[dict]) -> list[str]:
    from recmas_ray.eval.probe import TOKEN_CLASSES

    got = [((r.get("flow") or {}).get("nll_by_class") or {}) for r in rows]
    return [c for c in TOKEN_CLASSES if any(g.get(c) is not None for g in got)]


def table(rows: list[dict]) -> str:
    """Markdown table, one line per (method, R); speedup and token reduction vs Recursive-TextMAS at that R;
    then the answer NLL per token class (result / operand / fact / wording) where it was measured."""
    classes = _classes(rows)
    cols = COLUMNS + tuple(f"NLL {c}" for c in classes)
    lines = ["|" + "|".join(cols) + "|", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        by_class = (r.get("flow") or {}).get("nll_by_class") or {}
        lines.append("|" + "|".join([
            r["label"], str(r["rounds"]), str(r["n"]), _f(r["accuracy"], ".3f"),
            f"[{_f(r['ci_low'], '.3f')}, {_f(r['ci_high'], '.3f')}]", _f(r["nll"], ".3f"),
            _f(r["tokens_per_sample"], ".1f"), _f(r["seconds_per_sample"], ".3f"),
            _f(r.get("speedup"), ".2f") + ("x" if r.get("speedup") else ""),
            _f(100 * r["token_reduction"] if r.get("token_reduction") is not None else None, ".1f")
            + ("%" if r.get("token_reduction") is not None else "")] + [_f(by_class.get(c), ".3f") for c in classes]) + "|")
    return "\n".join(lines)


def flow_table(rows: list[dict]) -> str:
    """One line per (method, R, edge): the messages' between-question cosine, variance ratio, vector norm and
    the held-out probes (score vs constant baseline: accuracy for labels, R^2 for numbers)."""
    cols = ("Method", "R", "Edge", "Cosine", "Var ratio", "Norm", "Probe (held-out vs constant)")
    lines = ["|" + "|".join(cols) + "|", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        if r.get("same_run_as"):
            continue
        for name, e in ((r.get("flow") or {}).get("edges") or {}).items():
            probes = ", ".join(f"{k} {_f(p['score'], '.2f')}/{_f(p['baseline'], '.2f')}" for k, p in e["probe"].items())
            lines.append("|" + "|".join([r["label"], str(r["rounds"]), name, _f(e["mean_cosine"], ".3f"),
                                         _f(e["variance_ratio"], ".4f"), _f(e["mean_vector_norm"], ".1f"),
                                         probes or "N/A"]) + "|")
    return "\n".join(lines) if len(lines) > 2 else ""


def paired_table(tests: list[dict]) -> str:
    """One line per paired test of the trained system: accuracies, McNemar's exact p, NLL difference
    (other - trained) +- SE with its t-test p, and the same per token class."""
    classes = sorted({c for t in tests for c in t["nll_diff_by_class"]},
                     key=lambda c: ("result", "fact", "operand", "wording").index(c))
    cols = ("Trained vs", "R", "Accuracy trained / other", "McNemar p", "NLL diff +- SE", "t-test p") + tuple(
        f"{c} diff +- SE" for c in classes)
    lines = ["|" + "|".join(cols) + "|", "|" + "|".join("---" for _ in cols) + "|"]
    for t in tests:
        d = t["nll_diff"]
        cells = [f"{t['other_label']} (R={t['other_rounds']})", str(t["rounds"]),
                 f"{_f(t['accuracy'], '.3f')} / {_f(t['other_accuracy'], '.3f')}", _f(t["mcnemar"]["p"], ".3g"),
                 f"{_f(d['mean'], '+.3f')} +- {_f(d['se'], '.3f')}", _f(d["p"], ".3g")]
        for c in classes:
            x = t["nll_diff_by_class"].get(c)
            cells.append(f"{_f(x['mean'], '+.3f')} +- {_f(x['se'], '.3f')}" if x else "N/A")
        lines.append("|" + "|".join(cells) + "|")
    return "\n".join(lines) if tests else ""


def plot(rows: list[dict], path: Path) -> Path:
    """Four panels against R, one line per method: accuracy (95% Wilson CI bars), NLL (+- stderr), tokens
    per sample, seconds per sample. Methods with one R (single agent, TextMAS) are single points."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(20, 4.2))
    FigureCanvasAgg(fig)
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["label"], []).append(r)
    if len({r["rounds"] for r in rows}) == 1:  # one R: methods side by side, not points on an R axis
        return _plot_one_round(fig, rows, path)
    panels = [("accuracy", "accuracy (95% CI)"), ("nll", "answer NLL (nats/token)"),
              ("tokens_per_sample", "tokens / sample"), ("seconds_per_sample", "seconds / sample")]
    n_methods = max(1, len(by))
    for i, (key, title) in enumerate(panels):
        ax = fig.add_subplot(1, 5, i + 1)
        for j, (label, rs) in enumerate(by.items()):
            rs = sorted(rs, key=lambda r: r["rounds"])
            xs = [r["rounds"] + (j - n_methods / 2) * 0.03 for r in rs]  # small dodge so CI bars do not overlap
            ys = [r[key] if r[key] is not None and math.isfinite(r[key]) else float("nan") for r in rs]
            if key == "accuracy":
                err = [[max(0.0, r["accuracy"] - r["ci_low"]) for r in rs],
                       [max(0.0, r["ci_high"] - r["accuracy"]) for r in rs]]
                ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
            elif key == "nll":
                se = [r["nll_stderr"] if math.isfinite(r["nll_stderr"]) else 0.0 for r in rs]
                ax.errorbar(xs, ys, yerr=se, marker="o", capsize=3, label=label)
            else:
                ax.plot(xs, ys, marker="o", label=label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("recursion rounds R")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    ax = fig.add_subplot(1, 5, 5)  # the result tokens: where question-specific content has to show
    for j, (label, rs) in enumerate(by.items()):
        rs = sorted(rs, key=lambda r: r["rounds"])
        ys = [((r.get("flow") or {}).get("nll_by_class") or {}).get("result") for r in rs]
        ax.plot([r["rounds"] + (j - n_methods / 2) * 0.03 for r in rs],
                [y if y is not None else float("nan") for y in ys], marker="o", label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("recursion rounds R")
    ax.set_title("answer NLL, result tokens", fontsize=10)
    ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    return path


def _plot_one_round(fig, rows: list[dict], path: Path) -> Path:
    """The four panels as one bar per method (accuracy with its 95% CI, NLL with its standard error)."""
    panels = [("accuracy", "accuracy (95% CI)"), ("nll", "answer NLL (nats/token)"),
              ("tokens_per_sample", "tokens / sample"), ("seconds_per_sample", "seconds / sample")]
    labels = [r["label"].replace("RecursiveMAS, ", "RecursiveMAS\n").replace("ablation: ", "ablation:\n")
              for r in rows]
    xs = list(range(len(rows)))
    colors = [f"C{i}" for i in xs]
    for i, (key, title) in enumerate(panels):
        ax = fig.add_subplot(1, 5, i + 1)
        ys = [r[key] if r[key] is not None and math.isfinite(r[key]) else float("nan") for r in rows]
        if key == "accuracy":
            err = [[max(0.0, r["accuracy"] - r["ci_low"]) for r in rows],
                   [max(0.0, r["ci_high"] - r["accuracy"]) for r in rows]]
        elif key == "nll":
            err = [r["nll_stderr"] if math.isfinite(r["nll_stderr"]) else 0.0 for r in rows]
        else:
            err = None
        ax.bar(xs, ys, yerr=err, capsize=3, color=colors)
        if key == "nll":
            finite = [y for y in ys if math.isfinite(y)]
            if finite:  # NLL differences are small next to its size: zoom in
                ax.set_ylim(min(finite) - 0.05, max(finite) + 0.05)
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"{title}, R = {rows[0]['rounds']}", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    classes = _classes(rows)
    ax = fig.add_subplot(1, 5, 5)  # NLL per answer token class: a constant soft prompt wins only the wording
    width = 0.8 / max(1, len(classes))
    for k, c in enumerate(classes):
        ys = [((r.get("flow") or {}).get("nll_by_class") or {}).get(c) for r in rows]
        ax.bar([x + (k - (len(classes) - 1) / 2) * width for x in xs], [y if y is not None else float("nan") for y in ys],
               width=width, label=c)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_title(f"answer NLL by token class, R = {rows[0]['rounds']}", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    if classes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    return path
