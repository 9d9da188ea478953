"""Evaluation plots: accuracy, tokens and seconds per sample against recursion rounds (`jobs.run`'s PNG)."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence


def plot_vs_rounds(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path:
    """PNG with accuracy, tokens and seconds per sample against recursion rounds, one line per
    method. Each row needs `method`, `rounds` and any of `accuracy`, `tokens_per_sample`,
    `seconds_per_sample`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib (~1 s) loads only for plots
    from matplotlib.figure import Figure  # lazy: matplotlib (~1 s) loads only for plots
    from matplotlib.ticker import MaxNLocator  # lazy: matplotlib (~1 s) loads only for plots

    if not rows:
        raise ValueError("plot_vs_rounds() got no rows")
    panels = [("accuracy", "accuracy"), ("tokens_per_sample", "tokens / sample"),
              ("seconds_per_sample", "seconds / sample")]
    # Figure + Agg canvas directly: no global pyplot backend state, safe inside Ray workers.
    fig = Figure(figsize=(12, 3.6))
    FigureCanvasAgg(fig)
    by_method: dict[str, list[Mapping]] = defaultdict(list)
    for r in rows:
        by_method[str(r["method"])].append(r)
    for i, (key, label) in enumerate(panels):
        ax = fig.add_subplot(1, 3, i + 1)
        for method, rs in sorted(by_method.items()):
            pts = sorted((int(r["rounds"]), float(r[key])) for r in rs if r.get(key) is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("recursion rounds")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    return out
