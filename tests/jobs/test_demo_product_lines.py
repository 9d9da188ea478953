"""The main job's first lines (`jobs/experiments/demo/product_rows.product_lines`): counts and Holm p read from the
comparison table, and the verdict "carry the fact" only where every control is below own latents at Holm p < 0.01,
strict and lenient."""

from __future__ import annotations

import re

from jobs.experiments.demo.product_rows import product_lines
from recmas_ray.eval.compare import compare_pooled
from tests.eval.test_compare import write_run

N = 24


def _table(tmp_path, *, zeroed_lenient):
    """own right on 20 of 24, every control on none strict; zeroed's lenient outcomes as given; relay on 10."""
    split = ["seen"] * 12 + ["unseen"] * 12
    rows = {"own": ([True] * 20 + [False] * 4, None), "shuffled": ([False] * N, None), "zeroed": ([False] * N,
            zeroed_lenient), "fresh": ([False] * N, None), "untrained_links": ([False] * N, None),
            "text_relay": ([True] * 10 + [False] * 14, None)}
    folders = [write_run(tmp_path / name, strict, lenient, split=split) for name, (strict, lenient) in rows.items()]
    return compare_pooled({"0": folders}, list(rows))


def test_the_lines_read_the_table_and_the_verdict_needs_strict_and_lenient(tmp_path):
    lines = product_lines("distillation", "recall", _table(tmp_path / "a", zeroed_lenient=None))
    first = next(x for x in lines if "(all held-out, n=24" in x)
    assert "trained links carry the fact: own 20 (20) vs shuffled 0 (0), zeroed 0 (0), fresh links 0 (0), " \
           "untrained links 0 (0)" in first and "seeds 0" in first
    relay = lines[lines.index(first) + 1]
    assert relay.startswith("    same questions as text: text relay 10 (10)")
    p = re.search(r"Holm p ([\d.e-]+)/([\d.e-]+)", relay)
    assert float(p.group(1)) < 0.01 and float(p.group(2)) < 0.01  # 10 own-only vs 0 relay-only of 24
    assert [x for x in lines if "(seen values, n=12" in x] and [x for x in lines if "(unseen values, n=12" in x]
    # zeroed right leniently wherever own is: the lenient test fails, so no claim, even though strict passes
    lines = product_lines("distillation", "recall", _table(tmp_path / "b", zeroed_lenient=[True] * 20 + [False] * 4))
    first = next(x for x in lines if "(all held-out, n=24" in x)
    assert "do not show the fact" in first and "zeroed 0 (20)" in first
