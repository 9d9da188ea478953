"""The demo's table (method x R) and its PNG (accuracy with 95% CI bars, NLL, tokens, seconds)."""

from __future__ import annotations

import math
from pathlib import Path


def _f(v, fmt: str) -> str:
    return "N/A" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


COLUMNS = ("Method", "R", "n", "Accuracy", "95% CI", "NLL", "Tokens/sample", "s/sample", "Speedup",
           "Token reduction")


def table(rows: list[dict]) -> str:
    """Markdown table, one line per (method, R); speedup and token reduction vs Recursive-TextMAS at that R."""
    lines = ["|" + "|".join(COLUMNS) + "|", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for r in rows:
        lines.append("|" + "|".join([
            r["label"], str(r["rounds"]), str(r["n"]), _f(r["accuracy"], ".3f"),
            f"[{_f(r['ci_low'], '.3f')}, {_f(r['ci_high'], '.3f')}]", _f(r["nll"], ".3f"),
            _f(r["tokens_per_sample"], ".1f"), _f(r["seconds_per_sample"], ".3f"),
            _f(r.get("speedup"), ".2f") + ("x" if r.get("speedup") else ""),
            _f(100 * r["token_reduction"] if r.get("token_reduction") is not None else None, ".1f")
            + ("%" if r.get("token_reduction") is not None else "")]) + "|")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> Path:
    """Four panels against R, one line per method: accuracy (95% Wilson CI bars), NLL (+- stderr), tokens
    per sample, seconds per sample. Methods with one R (single agent, TextMAS) are single points."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(16, 4.2))
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
        ax = fig.add_subplot(1, 4, i + 1)
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
        ax = fig.add_subplot(1, 4, i + 1)
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
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    return path
