"""Adaptive rounds: a question stops its recursion once its decoder's latent input stops changing.

Threshold 0 runs every check and stops nothing (exactly the fixed-R outputs); a question stopped before
round r's decoder step gets exactly what a fixed R = r run gives it; a threshold between two questions'
changes stops one and not the other. The same runner drives the Ray pool (tests/distributed).
"""

import dataclasses

import pytest
import torch

from recmas_ray.config.checks import ConfigError
from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.engine.runner import run_batch
from recmas_ray.system.launch import local_pool
from recmas_ray.system.plan import plan_system

QUESTIONS = ["What is 2 + 3?", "Tom has 4 apples and buys 3 more. How many?", "What is 6 * 7?"]
STYLE_NAMES = ["sequential_light", "mixture", "distillation", "deliberation"]
ATOL = 1e-5


def cfg(rounds: int, threshold: float | None = None) -> RecursionConfig:
    return RecursionConfig(num_recursive_rounds=rounds, latent_steps=4, adaptive_threshold=threshold,
                           decode=DecodeConfig(max_new_tokens=6))


@pytest.fixture(scope="module")
def pools(tiny_cache):
    return {name: (plan := plan_system(name, preset="tiny", seed=3), local_pool(plan)) for name in STYLE_NAMES}


def run(pool, plan, c, questions=QUESTIONS):
    inputs = []

    def capture(event):
        if event["kind"] == "decoder_input":
            inputs.append(event)

    return run_batch(pool, plan.style, questions, ["math"] * len(questions), c, capture=capture), inputs


def same_outputs(a, b, *, rows=None):
    """Predictions, token and latent-step counts, and traces (less timings) are equal, row by row."""
    def key(r):
        return (r.prediction, r.num_text_tokens, r.num_latent_steps, r.num_rounds,
                [{k: v for k, v in t.items() if k != "seconds"} for t in r.trace])
    return [key(r) for r in a] == [key(b[i]) for i in (rows or range(len(b)))]


@pytest.mark.parametrize("name", STYLE_NAMES)
def test_threshold_zero_checks_every_round_and_gives_the_fixed_rounds_outputs(pools, name):
    plan, pool = pools[name]
    run(pool, plan, cfg(4))  # warms the agents' prompt-prefix KV reuse, which moves latents by ~1e-6
    fixed, fixed_in = run(pool, plan, cfg(4))
    adaptive, adaptive_in = run(pool, plan, cfg(4, 0.0))
    assert same_outputs(adaptive, fixed)
    assert all(r.num_rounds == 4 and len(r.round_changes) == 2 and min(r.round_changes) > 0 for r in adaptive)
    assert len(adaptive_in) == 1 and "rows" not in adaptive_in[0]  # nothing stopped: one decode of all
    for x, y in zip(adaptive_in[0]["latents"], fixed_in[0]["latents"]):
        # the decoder received the same latents: to rounding, since continuous batching (the default) places a
        # call's rows at other cache columns from one run to the next (~1e-7 here)
        assert (x - y).abs().max() <= ATOL


@pytest.mark.parametrize("name", ["sequential_light", "mixture"])
def test_a_large_threshold_stops_every_question_at_the_first_check(pools, name):
    # the first check is before round 2's decoder step (round 1 has nothing to compare with), so every
    # question decodes from round 2's latents: exactly a fixed R = 2 run
    plan, pool = pools[name]
    run(pool, plan, cfg(2))  # prefix KV reuse warmed, as above
    fixed2, fixed2_in = run(pool, plan, cfg(2))
    stopped, stopped_in = run(pool, plan, cfg(5, 1e30))
    assert same_outputs(stopped, fixed2)
    assert all(r.num_rounds == 2 and len(r.round_changes) == 1 for r in stopped)
    for x, y in zip(stopped_in[0]["latents"], fixed2_in[0]["latents"]):
        assert (x - y).abs().max() <= ATOL


def test_questions_stop_each_at_their_own_round(pools):
    plan, pool = pools["sequential_light"]
    probe, _ = run(pool, plan, cfg(4, 0.0))
    at2 = [r.round_changes[0] for r in probe]
    assert len(set(at2)) == 3
    # stop the question(s) with the smallest change at round 2; the others go on to round 3's check
    # (halfway to the next one: a rerun's changes move by ~1e-7 where continuous batching places rows elsewhere)
    threshold = (sorted(at2)[0] + sorted(at2)[1]) / 2
    mixed, inputs = run(pool, plan, cfg(4, threshold))
    stop = [b for b, c in enumerate(at2) if c < threshold]
    assert stop and len(stop) < 3
    assert [r.num_rounds for r in mixed] == [2 if b in stop else (3 if probe[b].round_changes[1] < threshold else 4)
                                             for b in range(3)]
    fixed = {r: run(pool, plan, cfg(r))[0] for r in {res.num_rounds for res in mixed}}
    for b, res in enumerate(mixed):
        ref = fixed[res.num_rounds][b]
        # the same greedy text from the same latents (a batch of other rows: allclose, not bitwise)
        assert res.prediction == ref.prediction and res.num_latent_steps == ref.num_latent_steps
        assert [(t["role"], t["round"], t["action"]) for t in res.trace] == \
            [(t["role"], t["round"], t["action"]) for t in ref.trace]
    assert sorted(b for inp in inputs for b in inp.get("rows", [])) == [0, 1, 2]
    # the stopped question's decoder got the same latents as a fixed R = 2 run gave it
    _, fixed2_in = run(pool, plan, cfg(2))
    first = inputs[0]
    assert first["rows"] == stop
    for x, y in zip(first["latents"], fixed2_in[0]["latents"]):
        assert torch.allclose(x, y[stop], atol=1e-5)


def test_adaptive_rounds_refuse_streaming_and_negative_thresholds(pools):
    plan, pool = pools["sequential_light"]
    with pytest.raises(ValueError, match="do not stream"):
        run_batch(pool, plan.style, QUESTIONS[:1], ["math"], cfg(3, 0.1), on_token=lambda ids: None)
    with pytest.raises(ConfigError, match="adaptive_threshold"):
        run_batch(pool, plan.style, QUESTIONS[:1], ["math"], cfg(3, -1.0))


def test_adaptive_rounds_need_the_object_store_transport():
    from recmas_ray.config.transport import get_transport

    get_transport("object_store").check_adaptive_rounds(0.1)
    with pytest.raises(ValueError, match="adaptive_threshold 0.1 needs --transport object_store"):
        get_transport("rdt:gloo").check_adaptive_rounds(0.1)
    get_transport("rdt:gloo").check_adaptive_rounds(None)


def test_samples_report_rounds_used_and_changes(pools):
    from recmas_ray.eval.results import summarize
    from recmas_ray.eval.stream import sample_record

    plan, pool = pools["sequential_light"]
    c = cfg(3, 1e30)
    results, _ = run(pool, plan, c, QUESTIONS[:2])
    items = [{"doc_id": i, "question": q, "gold": "5", "task_type": "math", "benchmark": "t"}
             for i, q in enumerate(QUESTIONS[:2])]
    recs = [sample_record(item, "recursive_mas", 0, res, "strict", c) for item, res in zip(items, results)]
    assert [r["rounds"] for r in recs] == [2, 2] and all(len(r["round_changes"]) == 1 for r in recs)
    fixed = [sample_record(items[0], "recursive_mas", 0, run(pool, plan, cfg(3), QUESTIONS[:1])[0][0], "strict",
                           cfg(3))]
    assert fixed[0]["rounds"] == 3 and "round_changes" not in fixed[0]
    assert summarize(recs)["rounds_per_sample,none"] == 2.0
    assert dataclasses.replace(c).adaptive_threshold == 1e30
