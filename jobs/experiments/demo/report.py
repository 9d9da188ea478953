"""The demo's tables (method x R; information flow per edge; paired tests) and its PNG.

Every figure comes from the rows of `demo.compare` (and the tests of `demo.verdicts`); nothing is typed in.
Timings are shown only beside the load they were measured under (`compare.machine_load`: 1-minute load
average / cores), since on a shared machine they rank methods by their neighbours' work. The PNG
(`plot_tasks`) leads with the answer: own vs shuffled vs fresh links per style and task; below it, per task,
accuracy strict and lenient and the answer NLL of every method, as horizontal bars from zero with the labels
on the axis (no legend over bars).
"""

from __future__ import annotations

import math
from pathlib import Path

from jobs.experiments.demo.verdicts import _channel
from jobs.experiments.probe import TOKEN_CLASSES


def _f(v, fmt: str) -> str:
    return "N/A" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


COLUMNS = ("Method", "R", "n", "Accuracy (strict)", "95% CI", "Lenient", "NLL", "Tokens/sample",
           "s/sample @ load/cores", "Token reduction")


def _classes(rows: list[dict]) -> list[str]:
    got = [((r.get("flow") or {}).get("nll_by_class") or {}) for r in rows]
    return [c for c in TOKEN_CLASSES if any(g.get(c) is not None for g in got)]


def timed(row: dict) -> str:
    """"0.412 @ 3.1/2": seconds per question at the highest 1-minute load average seen during the run, on that
    many cores; N/A where the load was not recorded (then the time is not shown at all)."""
    load = row.get("load") or {}
    seen = [x["loadavg_1m"] for x in (load.get("before"), load.get("after")) if x]
    if not seen or row.get("seconds_per_sample") is None:
        return "N/A"
    cores = (load.get("before") or load.get("after"))["num_cores"]
    return f"{_f(row['seconds_per_sample'], '.3f')} @ {max(seen):.1f}/{cores}"


def table(rows: list[dict]) -> str:
    """Markdown table, one line per (method, R): accuracy strict (with its Wilson 95% CI) and lenient, NLL,
    tokens, seconds with the load they ran under, token reduction vs Recursive-TextMAS at that R; then the
    answer NLL per token class (result / operand / fact / wording) where it was measured."""
    classes = _classes(rows)
    cols = COLUMNS + tuple(f"NLL {c}" for c in classes)
    lines = ["|" + "|".join(cols) + "|", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        by_class = (r.get("flow") or {}).get("nll_by_class") or {}
        lines.append("|" + "|".join([
            r["label"], str(r["rounds"]), str(r["n"]), _f(r["accuracy"], ".3f"),
            f"[{_f(r['ci_low'], '.3f')}, {_f(r['ci_high'], '.3f')}]", _f(r.get("accuracy_lenient"), ".3f"),
            _f(r["nll"], ".3f"), _f(r["tokens_per_sample"], ".1f"), timed(r),
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
    """The PNG of one task's rows (`plot_tasks` with that one task)."""
    return plot_tasks([{"task": "", "style": "", "rows": rows}], path)


def plot_tasks(tasks: list[dict], path: Path) -> Path:
    """Write `build_figure(tasks)` as a PNG."""
    fig = build_figure(tasks)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    return path


def _name(task: dict) -> str:
    return " / ".join(x for x in (task.get("style"), task.get("task")) if x) or "task"


def build_figure(tasks: list[dict]):
    """First panel: own vs shuffled vs fresh links per style / task (strict accuracy, Wilson 95% CI, X/N on each
    bar; at each task's largest R with all three). Then one row per task: accuracy strict and lenient of every
    method (horizontal bars from 0 to 1), answer NLL of every method (horizontal bars from 0)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib loads only when a plot is drawn
    from matplotlib.figure import Figure  # lazy: matplotlib loads only when a plot is drawn

    heights = [max(2.0, 0.32 * len(t["rows"]) + 1.0) for t in tasks]
    fig = Figure(figsize=(max(13.0, 2.3 * len(tasks)), 3.6 + sum(heights)))  # ~2.3 in per task's three bars
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(1 + len(tasks), 2, height_ratios=[3.2, *heights], width_ratios=[3, 2])
    ax = fig.add_subplot(grid[0, :])
    ticks, labels = [], []
    for k, task in enumerate(tasks):
        found = _channel(task["rows"])
        if not found:
            continue
        r, own, shuf, fresh, vs_shuf, vs_fresh = found[-1]
        for j, (row, what, color) in enumerate(((own, "own", "C0"), (shuf, "shuffled", "C1"), (fresh, "fresh", "C7"))):
            x = 4 * k + j
            err = [[max(0.0, row["accuracy"] - row["ci_low"])], [max(0.0, row["ci_high"] - row["accuracy"])]]
            ax.bar([x], [row["accuracy"]], yerr=err, capsize=4, color=color, width=0.8)
            test = (None, vs_shuf, vs_fresh)[j]  # McNemar p vs own above the bar, beside its count
            ax.text(x, min(1.0, row["ci_high"]) + 0.02, f"{row['correct']}/{row['n']}" +
                    (f"\np {test['p']:.2g}" if test else ""), ha="center", va="bottom", fontsize=8 if len(tasks) <= 3 else 6)
            ticks.append(x)
            labels.append(what)
        # the task's name above its three bars (tick labels this long would run into the neighbours')
        ax.text(4 * k + 1, 1.13, f"{_name(task)}, R={r}".replace(" / ", " /\n").replace(" (", "\n("), ha="center",
                va="bottom", fontsize=8)
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, fontsize=9 if len(ticks) <= 9 else 7)
    ax.set_ylim(0, 1.45)  # room for the counts above full bars and the three-line task names
    ax.set_ylabel("accuracy (strict)")
    ax.set_title("Do trained links carry the question? Own latents vs another question's (shuffled) vs fresh links\n"
                 "(strict accuracy; X/N and McNemar p vs own above the bars)", fontsize=11)
    if not ticks:
        ax.text(0.5, 0.5, "no run with own, shuffled and fresh links at one R", ha="center", transform=ax.transAxes)
    ax.grid(alpha=0.3, axis="y")
    for k, task in enumerate(tasks):
        rows = task["rows"]
        names = [f"{r['label']} (R={r['rounds']})" for r in rows][::-1]
        ys = list(range(len(rows)))
        acc = fig.add_subplot(grid[1 + k, 0])
        strict = [_finite(r["accuracy"]) for r in rows][::-1]
        lenient = [_finite(r.get("accuracy_lenient")) for r in rows][::-1]
        acc.barh([y + 0.2 for y in ys], strict, height=0.4, color="C0")
        acc.barh([y - 0.2 for y in ys], lenient, height=0.4, color="C2")
        acc.set_yticks(ys)
        acc.set_yticklabels(names, fontsize=8)
        acc.set_xlim(0, 1)
        acc.set_title(f"{_name(task)}: accuracy, strict (blue, upper) and lenient (green, lower)", fontsize=9)
        acc.grid(alpha=0.3, axis="x")
        nll = fig.add_subplot(grid[1 + k, 1])
        values = [_finite(r["nll"]) for r in rows][::-1]
        err = [r["nll_stderr"] if math.isfinite(r.get("nll_stderr", float("nan"))) else 0.0 for r in rows][::-1]
        nll.barh(ys, values, xerr=err, height=0.6, color="C4", capsize=2)
        nll.set_yticks(ys)
        nll.set_yticklabels([""] * len(ys))
        nll.set_xlim(left=0)
        kind = next((r["nll_kind"] for r in rows if r.get("nll_kind")), "answer")
        nll.set_title(f"{kind} NLL (nats/token, +- SE; same rows)", fontsize=9)
        nll.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


def _finite(v) -> float:
    """The value, or NaN (no bar drawn) where it was not measured."""
    return float(v) if v is not None and math.isfinite(float(v)) else float("nan")
