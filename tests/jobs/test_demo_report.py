"""The demo's report from synthetic per-question results: every figure it prints or draws is recomputed here
from the per-question outcomes (counts, exact McNemar p, Holm, accuracies, NLL), so none can be a constant."""

import math
import random
import re

import pytest
from scipy.stats import binomtest

from jobs.experiments.demo import compare, report, verdicts


def _records(key: str, rounds: int, p_correct: float, rng: random.Random, n: int, *, lenient_extra: float = 0.2):
    out = []
    for i in range(n):
        ok = rng.random() < p_correct
        out.append({"doc_id": f"q{i}", "correct": ok, "correct_lenient": ok or rng.random() < lenient_extra,
                    "prediction": f"reply {i} of {key}", "nll": rng.uniform(0.2, 3.0), "tokens": rng.randint(3, 9),
                    "latent_steps": 8, "latency_s": rng.uniform(0.1, 0.5)})
    return out


def _task(seed: int, n: int = 64) -> dict:
    rng = random.Random(seed)
    chances = {"single_agent": 0.2, "single_agent/fact": 0.9, "textmas": 0.3, "recursive_mas/fresh": 0.05,
               "recursive_mas/inner": 0.1, "recursive_mas/trained": 0.6 + 0.3 * rng.random(),
               "ablation/shuffle": 0.05, "ablation/zero": 0.05, "ablation/empty": 0.1}
    rows = []
    for key, chance in chances.items():
        row = compare.summarize_run(compare.BY_KEY[key], 1, _records(key, 1, chance, rng, n), wall_s=1.0)
        row["load"] = {"before": compare.machine_load(), "after": compare.machine_load()}
        rows.append(row)
    compare.add_comparisons(rows)
    return {"style": "distillation", "task": f"hidden fact {seed}", "rows": rows}


def _mcnemar_p(a: dict, b: dict) -> float:
    only_a = sum(a[d] and not b[d] for d in a)
    only_b = sum(b[d] and not a[d] for d in a)
    return binomtest(only_a, only_a + only_b, 0.5).pvalue if only_a + only_b else 1.0


@pytest.mark.parametrize("seed", [1, 2])
def test_headline_counts_and_p_values_are_recomputed_from_the_questions(seed):
    tasks = [_task(seed), _task(seed + 10, n=40)]
    lines = verdicts.headline(tasks)
    assert len(lines) == 2
    for line, task in zip(lines, tasks):
        by = {r["variant"]: r for r in task["rows"]}
        own, shuf, fresh = by["recursive_mas/trained"], by["ablation/shuffle"], by["recursive_mas/fresh"]
        m = re.fullmatch(r"distillation / (.+), R=1: trained links (carry the fact|do not show the fact): "
                         r"(\d+)/(\d+) own vs (\d+)/(\d+) shuffled vs (\d+)/(\d+) fresh \(McNemar p (\S+) vs "
                         r"shuffled, (\S+) vs fresh; Holm (\S+), (\S+); alpha 0.01\)", line)
        assert m, line
        assert m.group(1) == task["task"]
        counts = [int(x) for x in m.groups()[2:8]]
        want = [sum(r["correct_per_doc"].values()) for r in (own, shuf, fresh) for _ in (0,)]
        assert counts == [want[0], len(own["correct_per_doc"]), want[1], len(shuf["correct_per_doc"]), want[2],
                          len(fresh["correct_per_doc"])]
        p_shuf, p_fresh = (_mcnemar_p(own["correct_per_doc"], o["correct_per_doc"]) for o in (shuf, fresh))
        assert float(m.group(9)) == pytest.approx(p_shuf, rel=0.01)
        assert float(m.group(10)) == pytest.approx(p_fresh, rel=0.01)
        lo, hi = sorted([p_shuf, p_fresh])
        holm_lo, holm_hi = min(1, 2 * lo), max(min(1, 2 * lo), hi)
        got = {float(m.group(11)), float(m.group(12))}
        assert any(g == pytest.approx(holm_lo, rel=0.01) for g in got)
        assert any(g == pytest.approx(holm_hi, rel=0.01) for g in got)
        carries = holm_hi < 0.01 and counts[0] > counts[2] and counts[0] > counts[4]
        assert (m.group(2) == "carry the fact") == carries


def test_table_cells_are_the_rows_figures_and_timings_carry_their_load():
    task = _task(3)
    text = report.table(task["rows"])
    for row in task["rows"]:
        line = next(ln for ln in text.splitlines() if ln.startswith(f"|{row['label']}|"))
        cells = line.strip("|").split("|")
        k = sum(row["correct_per_doc"].values())
        k_len = sum(row["correct_lenient_per_doc"].values())
        assert cells[2] == str(row["n"]) and float(cells[3]) == pytest.approx(k / row["n"], abs=5e-4)
        assert float(cells[5]) == pytest.approx(k_len / row["n"], abs=5e-4)
        nll = sum(row["nll_per_doc"].values()) / row["n"]
        assert float(cells[6]) == pytest.approx(nll, abs=5e-4)
        seconds, load = cells[8].split(" @ ")
        assert float(seconds) == pytest.approx(row["seconds_per_sample"], abs=5e-4)
        assert load.endswith(f"/{row['load']['before']['num_cores']}")
    bare = {**task["rows"][0], "load": None}
    assert report.timed(bare) == "N/A"  # no load recorded: no time shown


def test_figure_bars_are_the_rows_accuracies(tmp_path):
    tasks = [_task(4), _task(5, n=32)]
    fig = report.build_figure(tasks)
    first = fig.axes[0]
    heights = [p.get_height() for p in first.patches]
    want = []
    for task in tasks:
        by = {r["variant"]: r for r in task["rows"]}
        want += [by[k]["accuracy"] for k in ("recursive_mas/trained", "ablation/shuffle", "recursive_mas/fresh")]
    assert heights == pytest.approx(want)
    for k, task in enumerate(tasks):  # then per task: strict and lenient accuracy, NLL, as horizontal bars
        acc, nll = fig.axes[1 + 2 * k], fig.axes[2 + 2 * k]
        widths = [p.get_width() for p in acc.patches]
        rows = task["rows"][::-1]
        assert widths == pytest.approx([r["accuracy"] for r in rows] + [r["accuracy_lenient"] for r in rows])
        assert [p.get_width() for p in nll.patches] == pytest.approx([r["nll"] for r in rows])
        assert nll.get_xlim()[0] == 0 and acc.get_xlim() == (0, 1)  # axes from zero
        assert acc.get_legend() is None and nll.get_legend() is None and first.get_legend() is None
    assert report.plot_tasks(tasks, tmp_path / "r.png").stat().st_size > 20_000


def test_verdicts_decide_on_holm_adjusted_p_values():
    task = _task(6)
    tests = verdicts.paired_tests(task["rows"])
    raw = [t["mcnemar"]["p"] for t in tests]
    from recmas_ray.eval.stats import holm

    assert [t["mcnemar"]["p_holm"] for t in tests] == pytest.approx(holm(raw))
    lines = verdicts.paired_verdicts(tests)
    for t, line in zip(tests, lines):
        assert f"Holm {t['mcnemar']['p_holm']:.2g}" in line
        significant = t["mcnemar"]["p_holm"] < verdicts.ALPHA
        assert ("no significant accuracy difference" not in line) == significant
    flow = verdicts.flow_verdicts(task["rows"], tests)
    used = [ln for ln in flow if "used by the decoder (shuffle gap" in ln]
    assert len(used) == 1 and not any(math.isnan(float(x)) for x in re.findall(r"[-+]?\d+\.\d+", used[0]))


def _measured(rng: random.Random, n: int, chance: float) -> dict:
    correct = [rng.random() < chance for _ in range(n)]
    return {"accuracy": sum(correct) / n, "correct": correct,
            "correct_lenient": [c or rng.random() < 0.3 for c in correct],
            "predictions": [f"p{i}" for i in range(n)], "fact_nll": [rng.uniform(0.1, 4) for _ in range(n)],
            "result_nll": [None] * n, "probe": {}}


def test_sweep_measurements_become_report_rows_per_split():
    from jobs.experiments.demo.sweep_rows import rows_from_measure

    rng = random.Random(7)
    n = 48
    baselines = {k: _measured(rng, n, c) for k, c in (("single_floor", 0.1), ("single_ceiling", 0.9), ("textmas", 0.2))}
    result = {k: _measured(rng, n, c) for k, c in (("trained", 0.8), ("shuffled", 0.05), ("fresh", 0.05))}
    result["tests"] = {"vs_shuffled": {}}  # not a measured run: ignored
    seen, unseen = range(32), range(32, 48)
    for part in (seen, unseen):
        rows = rows_from_measure(result, baselines, positions=part, rounds=1)
        assert [r["variant"] for r in rows] == ["single_agent", "single_agent/fact", "textmas", "recursive_mas/trained",
                                                "ablation/shuffle", "recursive_mas/fresh"]
        by = {r["variant"]: r for r in rows}
        own = by["recursive_mas/trained"]
        assert own["n"] == len(part) and own["correct"] == sum(result["trained"]["correct"][i] for i in part)
        assert own["correct_lenient"] == sum(result["trained"]["correct_lenient"][i] or result["trained"]["correct"][i]
                                             for i in part)
        assert own["nll"] == pytest.approx(sum(result["trained"]["fact_nll"][i] for i in part) / len(part))
        assert list(own["prediction_per_doc"].values()) == [f"p{i}" for i in part]
        line = verdicts.headline([{"style": "distillation", "task": "recall", "rows": rows}])[0]
        assert f"{own['correct']}/{len(part)} own vs {by['ablation/shuffle']['correct']}/{len(part)} shuffled" in line
        assert report.table(rows).count("\n") == len(rows) + 1
        assert report.build_figure([{"style": "distillation", "task": "recall", "rows": rows}]).axes


def test_collaboration_line_tests_trained_against_single_and_textmas():
    task = _task(8)
    task["collaboration"] = True
    (line,) = verdicts.collaboration([task, _task(9)])  # only the marked task
    by = {r["variant"]: r for r in task["rows"]}
    own, single, text = by["recursive_mas/trained"], by["single_agent"], by["textmas"]
    assert f"trained RecursiveMAS {own['correct']}/64 vs single agent {single['correct']}/64 vs TextMAS " \
           f"{text['correct']}/64" in line
    p_single = _mcnemar_p(own["correct_per_doc"], single["correct_per_doc"])
    assert f"McNemar p {p_single:.2g} vs single" in line
