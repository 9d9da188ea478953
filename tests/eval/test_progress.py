"""Progress per question: the bar counts each question once, when its row of the final decode stops or its result
arrives, on both backends. On Ray the agents report stopped rows through a relay actor, so the bar moves inside a
batch although the batch's results come back together; its rate stays the run's throughput (table, results)."""

import io
import json
import re

import pytest
from tqdm import tqdm

import recmas_ray as rm
from recmas_ray import console
from recmas_ray.engine.decoding import RowsStopped
from recmas_ray.eval.progress import QuestionProgress

MODELS = {"planner": "tiny:qwen3", "critic": "tiny:llama", "solver": "tiny:qwen3"}
# sampled at a high temperature, a batch's rows reach EOS at different steps of the final decode
SPREAD = dict(num_recursive_rounds=1, latent_steps=2, max_new_tokens=48, do_sample=True, temperature=5.0,
              batch_size=4)


class EveryUpdate(console.Console):
    """Draws every update (tqdm skips draws within 0.1 s of the last one)."""

    def bar(self, total, desc, *, unit="it", initial=0, enabled=True):
        return tqdm(total=total, desc=desc, unit=unit, file=self.err, disable=not enabled, mininterval=0, miniters=1,
                    smoothing=0)


@pytest.fixture
def drawn():
    """The console's stderr, every bar update drawn on it."""
    saved, err = console._current, io.StringIO()
    console._current = EveryUpdate(stream=io.StringIO(), err=err, progress=True)
    try:
        yield err
    finally:
        console._current = saved


def counts(text: str, total: int) -> list[int]:
    return [int(c) for c in re.findall(rf"(\d+)/{total} \[", text)]


def bar_rate(text: str) -> float:
    """The final rate tqdm drew (per second), from either of its forms."""
    last = text.replace("\r", "\n").strip().splitlines()[-1]
    m = re.search(r"([\d.]+)(sample/s|s/sample)", last)
    assert m, last
    return float(m.group(1)) if m.group(2) == "sample/s" else 1.0 / float(m.group(1))


def test_each_question_counts_once_whether_its_row_stops_or_its_result_arrives():
    bar = tqdm(total=5, file=io.StringIO(), disable=False)
    counter = QuestionProgress(bar)
    on_token = counter.batch("b0", ["q0", "q1", "q2"])
    counter.batch("b1", ["q3", "q4"])
    on_token([7, 8, 9])
    assert bar.n == 0
    on_token([None, 8, 9])  # row 0 stopped
    on_token([None, None, 9])  # row 1 stopped; row 0 is not counted again
    assert bar.n == 2
    counter.done(["q0", "q1", "q2"])  # the batch's results: only q2 is new
    counter.rows_done("b0", [2])  # a late report changes nothing
    assert bar.n == 3
    counter.done(["q3", "q4"])
    counter.close()
    assert bar.n == 5
    counter.done(["q5"])  # after close nothing moves
    assert bar.n == 5


def test_a_disabled_bar_gives_no_decode_callback():
    counter = QuestionProgress(tqdm(total=2, disable=True), relay=True)
    assert counter.batch("b0", ["q0", "q1"]) is None and counter.relay is None
    counter.close()


def test_rows_stopped_reports_each_row_once():
    seen = []
    sink = RowsStopped(seen.append)
    for ids in ([1, 2, 3], [None, 2, 3], [None, 2, None], [None, None, None]):
        sink(ids)
    assert seen == [[0], [2], [1]]


@pytest.fixture(scope="module")
def ray_system(ray_cluster):
    with rm.System.build("sequential_light", role_models=MODELS, backend="ray", seed=3, timeout_s=300) as system:
        yield system


@pytest.mark.integration  # a Ray system of its own: a minute or more on a busy 2-core machine
def test_generate_on_ray_moves_the_bar_per_question(ray_system, drawn):
    questions = [f"What is {i} + {i}?" for i in range(4)]
    shown = ray_system.generate(questions, progress=True, seed=2, **SPREAD)
    lengths = sorted(a[0].trace[-1]["text_tokens"] for a in shown)
    assert lengths[0] < lengths[-1], f"precondition: rows should stop at different steps, got {lengths}"
    seen = counts(drawn.getvalue(), 4)
    # one batch of 4 whose results come back together: a bar moving per batch would draw 0/4 then 4/4 only
    assert any(0 < c < 4 for c in seen) and seen[-1] == 4, drawn.getvalue()
    assert seen == sorted(seen)


@pytest.fixture(scope="module")
def local_system(tiny_cache):
    with rm.System.build("sequential_light", role_models=MODELS, backend="local", seed=3) as system:
        yield system


@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.integration)])
def test_evaluate_moves_the_bar_per_question_at_the_runs_throughput(backend, request, drawn, tmp_path):
    system = request.getfixturevalue(f"{backend}_system")
    rows = [{"question": f"What is {a} + {a}?", "answer": str(2 * a)} for a in range(8)]
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = system.evaluate(str(data), num_recursive_rounds=1, latent_steps=2, max_new_tokens=48,
                             do_sample=True, temperature=5.0, batch_size=4, format_retry=False,
                             output_path=str(tmp_path / "out"))
    text = drawn.getvalue()
    seen = counts(text, 8)
    # two batches of 4: a bar moving per batch would draw only 0, 4 and 8
    assert any(c % 4 for c in seen) and seen[-1] == 8, text
    result = json.loads(open(report["results_path"]).read())["results"]["questions/recursive_mas"]
    results_rate = result["throughput_samples_per_s,none"]
    header, _, first, *_ = report["table"].splitlines()
    columns = [c.rstrip("*") for c in header.strip("|").split("|")]
    table_rate = float(first.strip("|").split("|")[columns.index("Samples/s")])
    assert abs(table_rate / results_rate - 1) < 0.05 and abs(bar_rate(text) / results_rate - 1) < 0.05, \
        (bar_rate(text), table_rate, results_rate)
