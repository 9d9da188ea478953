"""`System.generate`: input checks (types and sizes, before any agent runs), stop strings, n, finish_reason,
per-agent prompt tokens, and the streaming hook of the final decode (`System.run(on_token=...)`)."""

import pytest

import recmas_ray as rm
from recmas_ray.config.recursion import DecodeConfig, RecursionConfig

MODELS = {"planner": "tiny:qwen3", "critic": "tiny:llama", "solver": "tiny:qwen3"}
GEN = dict(num_recursive_rounds=1, latent_steps=2, max_new_tokens=12)


@pytest.fixture(scope="module")
def system(tiny_cache):
    with rm.System.build("sequential_light", role_models=MODELS, backend="local", seed=3) as system:
        yield system


@pytest.mark.parametrize("questions, error, message", [
    ({"q": "What is 1 + 1?"}, TypeError, "questions must be a str or a list of str, got dict"),
    (["What is 1 + 1?", 7], TypeError, r"questions\[1\] must be a str, got int"),
    (["ok", ["nested"]], TypeError, r"questions\[1\] must be a str, got list"),
    (42, TypeError, "got int"),
    (["  "], ValueError, r"questions\[0\] is empty"),
    ("x" * 100_001, ValueError, "at most max_question_chars=32000"),
])
def test_bad_questions_are_refused_before_anything_runs(system, questions, error, message, monkeypatch):
    monkeypatch.setattr(system, "run", lambda *a, **k: pytest.fail("an agent ran"))
    with pytest.raises(error, match=message):
        system.generate(questions, **GEN)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"stop": 5}, TypeError, "stop must be a str or a list of str"),
    ({"stop": [""]}, ValueError, "non-empty strings"),
    ({"n": 0}, ValueError, "n=0: expected an integer in \\[1, "),
    ({"n": True}, TypeError, "n: expected an integer, got bool True"),
    ({"task": ["math", 3]}, TypeError, r"task\[1\] must be a str"),
])
def test_bad_stop_n_and_task_are_refused(system, kwargs, error, message):
    with pytest.raises(error, match=message):
        system.generate(["q"], **GEN, **kwargs)


def test_generate_gives_one_list_per_question_for_any_n_and_nothing_for_no_questions(system, monkeypatch):
    one = system.generate(["What is 1 + 1?", "What is 2 + 2?"], **GEN)
    assert [len(answers) for answers in one] == [1, 1] and isinstance(one[1][0], rm.SampleResult)
    assert [len(a) for a in system.generate("What is 1 + 1?", n=2, **GEN)] == [2]
    monkeypatch.setattr(system, "run", lambda *a, **k: pytest.fail("an agent ran"))
    assert system.generate([], **GEN) == [] and system.generate((), n=3, **GEN) == []
    with pytest.raises(ValueError, match="n=0: expected an integer in"):  # arguments are still checked
        system.generate([], n=0, **GEN)


def test_progress_bar_counts_each_question_when_its_row_stops(system):
    """Sampled rows stop decoding at different steps (EOS): the bar moves at each one, not once per batch."""
    import io
    import re

    from recmas_ray import console

    questions = [f"What is {i} + {i}?" for i in range(4)]
    kwargs = dict(num_recursive_rounds=1, latent_steps=2, max_new_tokens=40, do_sample=True, temperature=5.0,
                  seed=2, batch_size=4)
    plain = system.generate(questions, **kwargs)
    lengths = sorted(a[0].trace[-1]["text_tokens"] for a in plain)
    assert lengths[0] < lengths[-1], f"precondition: rows should stop at different steps, got {lengths}"
    err = io.StringIO()
    saved = console._current
    from tqdm import tqdm

    class EveryUpdate(console.Console):  # draws every update (tqdm skips draws within 0.1 s of the last one)
        def bar(self, total, desc, *, unit="it", initial=0, enabled=True):
            return tqdm(total=total, desc=desc, unit=unit, file=self.err, disable=not enabled, mininterval=0,
                        miniters=1)

    console._current = EveryUpdate(stream=io.StringIO(), err=err, progress=True)
    try:
        shown = system.generate(questions, progress=True, **kwargs)
    finally:
        console._current = saved
    assert [a[0].prediction for a in shown] == [a[0].prediction for a in plain]
    counts = [int(c) for c in re.findall(r"(\d)/4 \[", err.getvalue())]
    # one batch of 4: a bar moving per batch would show 0/4 then 4/4 only
    assert any(0 < c < 4 for c in counts) and counts[-1] == 4, err.getvalue()


def test_stop_strings_cut_the_prediction(system):
    q = "What is 9 + 9?"
    whole = system.generate(q, **GEN)[0][0]
    assert whole.finish_reason == ("length" if whole.trace[-1]["text_tokens"] == GEN["max_new_tokens"] else "stop")
    assert len(whole.prediction) >= 4, whole.prediction
    stop = whole.prediction[2:4]
    cut = system.generate(q, stop=["\x00never", stop], **GEN)[0][0]
    assert cut.prediction == whole.prediction[:whole.prediction.find(stop)] and cut.finish_reason == "stop"
    assert system.generate(q, stop="\x00never", **GEN)[0][0].prediction == whole.prediction


def test_n_answers_per_question(system):
    greedy = system.generate(["What is 1 + 2?", "What is 3 + 4?"], n=2, **GEN)
    assert len(greedy) == 2 and all(len(g) == 2 for g in greedy)
    assert greedy[0][0].prediction == greedy[0][1].prediction and greedy[0][0] is not greedy[0][1]
    sampled = system.generate("What is 1 + 2?", n=3, do_sample=True, temperature=1.5, seed=11, **GEN)
    assert len(sampled) == 1 and len(sampled[0]) == 3 and all(isinstance(s, rm.SampleResult) for s in sampled[0])
    again = system.generate("What is 1 + 2?", n=3, do_sample=True, temperature=1.5, seed=11, **GEN)
    assert [s.prediction for s in again[0]] == [s.prediction for s in sampled[0]]


def test_batched_questions_answer_as_single_ones_with_every_agents_prompt_tokens(system):
    questions = ["What is 2 + 2?", "A much longer question: what is 12 times 12, in words?"]
    together = [answers[0] for answers in system.generate(questions, **GEN)]
    alone = [system.generate(q, **GEN)[0][0] for q in questions]
    assert [r.prediction for r in together] == [r.prediction for r in alone]
    for res in together:
        assert [t["role"] for t in res.trace] == ["planner", "critic", "solver"]
        assert all(t["prompt_tokens"] > 10 for t in res.trace)  # each agent's own chat prompt
    assert together[1].trace[0]["prompt_tokens"] > together[0].trace[0]["prompt_tokens"]
    assert [t["prompt_tokens"] for t in together[1].trace] == [t["prompt_tokens"] for t in alone[1].trace]


def test_final_decode_reports_every_token(system):
    from recmas_ray.engine.agent import _eos_ids

    rc = RecursionConfig(num_recursive_rounds=1, latent_steps=2, decode=DecodeConfig(max_new_tokens=12))
    steps = []
    results = system.run(["What is 2 + 2?", "What is 5 + 5?"], ["math", "math"], rc, on_token=steps.append)
    assert 1 < len(steps) <= 12 and all(len(s) == 2 for s in steps)
    solver = system.agents.services["solver"].agent
    eos = set(_eos_ids(solver.model, solver.tokenizer).tolist())
    for b, res in enumerate(results):
        ids = [s[b] for s in steps if s[b] is not None]
        assert len(ids) == res.trace[-1]["text_tokens"]
        assert solver.tokenizer.decode([i for i in ids if i not in eos], skip_special_tokens=True) == res.prediction
