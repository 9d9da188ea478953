"""One definition of time: the progress bar's rate, the printed table's Samples/s and the results file's
throughput all come from the same wall-clock span of one run; every sample's latency is its batch's submission
to its result."""

import io
import json
import re

import pytest

import recmas_ray as rm
from recmas_ray import console

MODELS = {"planner": "tiny:qwen3", "critic": "tiny:llama", "solver": "tiny:qwen3"}


def _bar_rate(text: str) -> float:
    """The final rate tqdm drew (samples per second), from either of its forms."""
    last = text.replace("\r", "\n").strip().splitlines()[-1]
    m = re.search(r"([\d.]+)(sample/s|s/sample)", last)
    assert m, last
    value = float(m.group(1))
    return value if m.group(2) == "sample/s" else 1.0 / value


@pytest.fixture
def captured_console():
    saved, err, out = console._current, io.StringIO(), io.StringIO()
    console._current = console.Console(stream=out, err=err, progress=True)
    try:
        yield out, err
    finally:
        console._current = saved


def test_bar_table_and_results_give_the_same_throughput(tiny_cache, question_file, tmp_path, captured_console):
    out, err = captured_console
    with rm.System.build("sequential_light", role_models=MODELS, backend="local", seed=3) as system:
        report = system.evaluate(str(question_file), num_recursive_rounds=1, latent_steps=2, max_new_tokens=8,
                                 batch_size=2, output_path=str(tmp_path))
    data = json.loads(open(report["results_path"]).read())
    row = data["results"]["questions/recursive_mas"]
    results_rate = row["throughput_samples_per_s,none"]
    header, _, first, *_ = report["table"].splitlines()
    columns = [c.rstrip("*") for c in header.strip("|").split("|")]
    table_rate = float(first.strip("|").split("|")[columns.index("Samples/s")])
    bar_rate = _bar_rate(err.getvalue())
    assert abs(table_rate / results_rate - 1) < 0.05 and abs(bar_rate / results_rate - 1) < 0.05, \
        (bar_rate, table_rate, results_rate)
    samples = [json.loads(line) for line in open(report["samples_path"])]
    # two batches of two: the questions of a batch share its latency, and a batch's latency fits in the run
    assert samples[0]["latency_s"] == samples[1]["latency_s"] and samples[2]["latency_s"] == samples[3]["latency_s"]
    wall = row["n_samples"] / results_rate
    assert all(0 < s["latency_s"] <= wall for s in samples)
    assert abs(row["latency_s,none"] - sum(s["latency_s"] for s in samples) / 4) < 1e-9
    assert data["machine"]["cpu_count"] >= 1 and len(data["machine"]["load_avg"]) == 3
