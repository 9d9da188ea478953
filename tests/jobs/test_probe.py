"""jobs.experiments.probe on synthetic data with known answers: planted signals are read back, noise is not."""

import numpy as np
import pytest
import torch

from jobs.experiments import probe


def test_probe_recovers_a_planted_linear_signal_and_not_noise():
    rng = np.random.default_rng(0)
    n, f = 96, 300  # more features than questions, as with real messages; the content lives in a few directions
    z = rng.normal(size=(n, 4))
    x = z @ rng.normal(size=(4, f)) + 0.3 * rng.normal(size=(n, f))
    y = 3 * z[:, 0] - 2 * z[:, 1] + 0.1 * rng.normal(size=n)
    found = probe.probe_numeric(x, y)
    assert found["score"] > 0.8 and found["baseline"] < 0.05
    noise = probe.probe_numeric(x, rng.normal(size=n))
    assert noise["score"] < noise["baseline"] + 0.1 and noise["score"] < 0.1
    labels = ["+" if v > 0 else "-" for v in z[:, 2]]
    cls = probe.probe_categorical(x, labels)
    assert cls["score"] > 0.8 and cls["baseline"] < 0.65
    random_labels = list(rng.choice(["+", "-"], size=n))
    assert probe.probe_categorical(x, random_labels)["score"] < 0.7


def test_a_small_signal_on_a_large_constant_is_still_read():
    # the collapsed-soft-prompt situation: every message is nearly one vector, the content tiny next to it
    rng = np.random.default_rng(1)
    n, m, e = 64, 4, 32
    a = rng.integers(1, 21, size=n).astype(float)
    msg = np.tile(rng.normal(size=(1, m, e)) * 10, (n, 1, 1)) + 1e-3 * rng.normal(size=(n, m, e))
    msg[:, :, 0] += 0.01 * a[:, None]
    geo = probe.message_geometry(torch.tensor(msg))
    assert geo["mean_cosine"] > 0.999 and geo["variance_ratio"] < 1e-4
    facts = [{"operand_a": float(v), "constant": 1.0} for v in a]
    res = probe.probe_facts(probe.message_features(torch.tensor(msg)), facts)
    assert set(res) == {"operand_a"}  # a constant fact has nothing to probe
    assert res["operand_a"]["score"] > 0.9


def test_geometry_of_independent_messages():
    msg = torch.randn(50, 3, 64)
    geo = probe.message_geometry(msg)
    assert abs(geo["mean_cosine"]) < 0.05 and geo["variance_ratio"] == pytest.approx(1.0, abs=0.1)
    assert geo["mean_vector_norm"] == pytest.approx(8.0, rel=0.1)


def test_question_facts_and_answer_token_classes():
    assert probe.question_facts({"question": "What is 17 - 8?", "gold": "9"}) == {
        "operation": "-", "operand_a": 17.0, "operand_b": 8.0, "answer": 9.0}
    assert probe.question_facts({"question": "x?", "gold": "4", "facts": {"x": 17, "op": "-"}}) == {
        "x": 17.0, "op": "-", "answer": 4.0}
    target = "17 - 8 = 9. \\boxed{9}"
    offsets = [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 11), (11, 19), (19, 20), (20, 21), (21, 21)]
    assert probe.answer_token_classes(target, offsets, hidden_values=[17]) == [
        "fact", "wording", "operand", "wording", "result", "wording", "wording", "result", "wording", "wording"]
    got = probe.nll_by_class([1.0, 2.0, 3.0, 4.0], ["result", "wording", "result", "wording"])
    assert got == {"result": 2.0, "operand": None, "fact": None, "wording": 3.0}
