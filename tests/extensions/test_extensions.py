"""The extension checklist, end to end (docs/architecture.md, "Adding a transport / model kind / task family /
style"): a toy transport, a toy task family and a toy style, each added in one file of this folder, run through
`System.build` on tiny models on both backends.

  toy_style.py      draft_review: a two-agent loop whose first agent decodes; its roles run in its schedule's order
  toy_task.py       parity: its own instruction, extraction and grader; the grader grades every prediction
  toy_transport.py  toy:bytes: latents cross as `torch.save` bytes; it carries every message of every batch, and
                    the predictions equal the default transport's and the local backend's exactly
(A model kind is the same checklist: tests/models/test_registry.py, `test_a_new_kind_is_one_entry`.)
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys

import pytest

import recmas_ray as rm
from recmas_ray.config.extensions import EXTENSION_MODULES
from recmas_ray.config.transport import TRANSPORTS, get_transport, transport_names
from recmas_ray.styles import STYLES, build_schedule, get_style, render_prompt, style_names
from recmas_ray.tasks import TASKS, get_task, grade, task_names
from tests.conftest import write_jsonl

TOY_MODULES = ("tests.extensions.toy_style", "tests.extensions.toy_task", "tests.extensions.toy_transport")

QUESTIONS = ["Is 7 even or odd?", "Is 10 even or odd?", "Is 3 even or odd?"]
GOLD = ["odd", "even", "odd"]
ROUNDS = 2
SEED = 0  # (tiny random models: a seed under which the questions' predictions differ)
GEN = dict(task="parity", num_recursive_rounds=ROUNDS, latent_steps=3, max_new_tokens=8, batch_size=2)
NUM_BATCHES = 2  # 3 questions, batch_size 2
SCHEDULE = [("drafter", 1, "rollout"), ("reviewer", 1, "rollout"), ("drafter", 2, "decode")]


@pytest.fixture(scope="module")
def toys():
    """The three toy files imported, which registers them (as a user's import would), and their registrations
    taken out again afterwards, so that no other test sees them."""
    registries = (TASKS, STYLES, TRANSPORTS)
    before = [dict(r) for r in registries], list(EXTENSION_MODULES)
    modules = [importlib.import_module(m) for m in TOY_MODULES]
    yield modules
    for registry, saved in zip(registries, before[0]):
        registry.clear()
        registry.update(saved)
    EXTENSION_MODULES[:] = before[1]
    for m in TOY_MODULES:
        sys.modules.pop(m, None)


def test_each_toy_is_one_registration_that_every_choice_reads(toys):
    toy_style, toy_task, toy_transport = toys
    assert "draft_review" in style_names() and get_style("draft_review") is toy_style.DRAFT_REVIEW
    assert "parity" in task_names() and get_task("parity") is toy_task.PARITY
    assert "toy:bytes" in transport_names() and get_transport("toy:bytes") is toy_transport.TOY_BYTES
    # the prompt format is the family's own, in a style declared before the family was registered
    assert toy_task.PARITY.instruction in render_prompt(get_style("sequential_light"), "solver", "base", "parity", "q")
    assert [(s.role, s.round, "decode" if s.decode else "rollout")
            for s in build_schedule(toy_style.DRAFT_REVIEW, ROUNDS)] == SCHEDULE
    assert set(TOY_MODULES) <= set(EXTENSION_MODULES)  # what the Ray processes of a run import
    # registering the same declaration again is a no-op; another one under a taken name is refused
    from recmas_ray.config.transport import Transport, register_transport
    from recmas_ray.styles import register_style
    from recmas_ray.tasks import register_task

    assert register_transport(toy_transport.TOY_BYTES) is toy_transport.TOY_BYTES
    with pytest.raises(ValueError, match="already registered"):
        register_transport(Transport("toy:bytes"))
    with pytest.raises(ValueError, match="already registered"):
        register_style(dataclasses.replace(toy_style.DRAFT_REVIEW, decoder="reviewer"))
    with pytest.raises(ValueError, match="already registered"):
        register_task(dataclasses.replace(toy_task.PARITY, retry_tokens=4))
    # the family's own answer format, extraction and grader
    assert grade("parity", {"gold": "odd"}, "7 = 2 * 3 + 1.\nParity: odd").correct
    assert grade("parity", {"gold": "even"}, "Parity: odd").extracted == "odd"
    assert grade("parity", {"gold": "even"}, "it is even").parse_failed


def _check_run(out):
    """Each question's answer, after checking that the toy style's roles ran in its schedule's order."""
    results = [answers[0] for answers in out]
    assert len(results) == len(QUESTIONS)
    for res in results:
        assert [(t["role"], t["round"], t["action"]) for t in res.trace] == SCHEDULE
    return [r.prediction for r in results]


@pytest.fixture(scope="module")
def local_predictions(toys, tiny_cache):
    with rm.System.build("draft_review", backend="local", seed=SEED, task="parity") as system:
        return _check_run(system.generate(QUESTIONS, **GEN))


def test_toy_style_and_task_on_the_local_backend_graded_by_the_toy_grader(local_predictions, tiny_cache, tmp_path):
    data = write_jsonl(tmp_path / "parity.jsonl", [{"question": q, "answer": a} for q, a in zip(QUESTIONS, GOLD)])
    with rm.System.build("draft_review", backend="local", seed=SEED, task="parity") as system:
        report = system.evaluate(str(data), num_recursive_rounds=ROUNDS, latent_steps=3, max_new_tokens=8,
                                 batch_size=2, output_path=str(tmp_path / "out"), progress=False, format_retry=False)
    samples = [json.loads(line) for line in open(report["samples_path"])]
    assert [s["prediction"] for s in sorted(samples, key=lambda s: int(s["doc_id"]))] == local_predictions
    assert len(set(local_predictions)) > 1  # the questions' answers differ (the latents carry something)
    for s in samples:  # graded by the family's grader: its verdict, as the grader gives it for this prediction
        want = grade("parity", {"gold": s["gold"]}, s["prediction"])
        assert s["task"] == "parity" and s["gold"] in ("even", "odd") and s["grade_detail"]["grader"] == "parity"
        assert (s["correct"], s["extracted"], s["parse_failed"]) == (want.correct, want.extracted, want.parse_failed)


@pytest.mark.integration  # two Ray systems of their own: a minute or more on a busy 2-core machine
def test_toys_on_ray_carried_by_the_toy_transport_equal_local_and_default(ray_cluster, toys, local_predictions):
    toy_style, _, toy_transport = toys
    counter = toy_transport.MessageCounter.options(name=toy_transport.COUNTER_NAME).remote()
    try:
        with rm.System.build("draft_review", backend="ray", seed=SEED, task="parity", transport="toy:bytes",
                             timeout_s=180) as system:
            toy = _check_run(system.generate(QUESTIONS, **GEN))
        seen = ray_cluster.get(counter.get.remote(), timeout=60)
    finally:
        ray_cluster.kill(counter)
    with rm.System.build("draft_review", backend="ray", seed=SEED, task="parity", timeout_s=180) as system:
        default = _check_run(system.generate(QUESTIONS, **GEN))
    assert toy == default == local_predictions and len(set(toy)) > 1
    # every message of every batch crossed as bytes, and arrived as it left
    per_batch = sum(len(s.outputs) for s in build_schedule(toy_style.DRAFT_REVIEW, ROUNDS))
    assert len(seen["sent"]) == len(seen["received"]) == NUM_BATCHES * per_batch
    assert sorted(seen["sent"]) == sorted(seen["received"]) and all(total != 0 for _, total in seen["sent"])
