"""The text rows over RecursiveMAS's own senders (`recmas_ray/engine/relay.py`): rollout_as_text sends exactly the
argmax tokens of the sender's rollout; text_relay's senders get the stating prompt (their own fact included) and
the decoder reads their text in its slot."""

import pytest
import torch

from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.engine.pool import LocalPool
from recmas_ray.engine.relay import STATE_PROMPT, state_prompt
from recmas_ray.engine.runner import run_batch
from recmas_ray.styles import render_prompt
from recmas_ray.styles.role_context import with_role_context
from recmas_ray.system.launch import local_pool
from recmas_ray.system.plan import plan_system

QUESTIONS = [with_role_context("What is x?", {"expert": "x = 65."}), "What is 2 + 3?"]
SLOT = "<<DISTILL_EXPERT_SLOT>>"


class RecordingPool(LocalPool):
    """A LocalPool that records every decode's and readout's prompts, by role."""

    def __init__(self, services):
        super().__init__(services)
        self.prompts = []

    def decode(self, role, users, slot_names, cfg, latents, **stream):
        self.prompts.append((role, "decode", list(users)))
        return super().decode(role, users, slot_names, cfg, latents, **stream)

    def rollout_text(self, role, users, slot_names, num_steps, latents):
        self.prompts.append((role, "rollout_text", list(users)))
        return super().rollout_text(role, users, slot_names, num_steps, latents)


@pytest.fixture(scope="module")
def system(tiny_cache):
    plan = plan_system("distillation", preset="tiny", seed=3)
    pool = local_pool(plan)
    yield plan, RecordingPool(pool.services)
    pool.shutdown()


def rc(method, rounds=1, m=5):
    return RecursionConfig(method=method, num_recursive_rounds=rounds, latent_steps=m,
                           decode=DecodeConfig(max_new_tokens=6))


def test_rollout_as_text_sends_exactly_the_argmax_tokens_of_the_rollout(system):
    plan, pool = system
    pool.prompts.clear()
    seen = []
    res = run_batch(pool, plan.style, QUESTIONS, ["math"] * 2, rc("rollout_as_text", m=5), capture=seen.append)
    # the reference, from the expert agent directly: its prompt, the uncached m-step rollout, its own LM head
    expert = pool.services["expert"].agent
    users = [render_prompt(plan.style, "expert", "base", "math", q) for q in QUESTIONS]
    with torch.no_grad():
        h_BMD = expert.latent_rollout(*expert.embed_batch(users), 5, use_cache=False)
        ids = expert.logits(h_BMD).argmax(-1).tolist()
    texts = [expert.tokenizer.decode(row, skip_special_tokens=True) for row in ids]
    assert [p for p in pool.prompts if p[1] == "rollout_text"] == [("expert", "rollout_text", users)]
    want = [render_prompt(plan.style, "learner", "base", "math", q, {SLOT: t}) for q, t in zip(QUESTIONS, texts)]
    assert seen[-1]["users"] == want and seen[-1]["latents"] == []  # text in the slot, no latent block
    for r, row, text in zip(res, ids, texts):
        step = next(t for t in r.trace if t["action"] == "rollout_text")
        assert step["text"] == text and step["latent_steps"] == 5 and step["text_tokens"] == len(row) == 5
    assert "x = 65." not in seen[-1]["users"][0]  # the decoder was not told the fact: only the readout carries it


def test_rollout_as_text_runs_recursive_mas_schedule_with_text_on_feedback_edges(system):
    plan, pool = system
    pool.prompts.clear()
    res = run_batch(pool, plan.style, QUESTIONS, ["math"] * 2, rc("rollout_as_text", rounds=2, m=3))
    assert [(t["role"], t["round"], t["action"]) for t in res[0].trace] == [
        ("expert", 1, "rollout_text"), ("learner", 1, "rollout_text"), ("expert", 2, "rollout_text"),
        ("learner", 2, "decode")]
    feedback = [u for role, kind, u in pool.prompts if role == "expert"][1]
    assert all("<<DISTILL_FEEDBACK_SLOT>>" not in u for u in feedback)


def test_text_relay_senders_state_what_they_were_told_and_the_decoder_reads_it(system):
    plan, pool = system
    pool.prompts.clear()
    seen = []
    res = run_batch(pool, plan.style, QUESTIONS, ["math"] * 2, rc("text_relay", rounds=3), capture=seen.append)
    (sender, _, sent), (decoder, _, _) = pool.prompts
    assert sender == "expert" and decoder == "learner"  # one round, whatever R
    assert sent == [state_prompt("expert", ["learner"], q, {}) for q in QUESTIONS]
    # what the sender was told comes first (an echoing base model's short message still holds it)
    assert sent[0].startswith("Question: x = 65. What is x?") and STATE_PROMPT.split("{role}")[1].split("{receiver}")[0] in sent[0]
    assert "Do not give the final answer" not in sent[0]
    relayed = [next(t for t in r.trace if t["action"] == "text")["text"] for r in res]
    want = [render_prompt(plan.style, "learner", "base", "math", q, {SLOT: t}) for q, t in zip(QUESTIONS, relayed)]
    assert seen[-1]["users"] == want
    assert "x = 65." not in want[0].replace(relayed[0], "")  # the fact reaches the decoder only through the text


def test_text_relay_differs_from_textmas_only_in_the_senders_prompt(system):
    plan, pool = system
    pool.prompts.clear()
    run_batch(pool, plan.style, QUESTIONS, ["math"] * 2, rc("textmas"))
    textmas_sender = pool.prompts[0][2]
    assert "Do not give the final answer" in textmas_sender[0]  # the style's own template
    assert textmas_sender != [state_prompt("expert", ["learner"], q, {}) for q in QUESTIONS]


def test_later_senders_hear_the_earlier_ones(tiny_cache):
    plan = plan_system("sequential_light", preset="tiny", seed=0)
    pool = RecordingPool(local_pool(plan).services)
    res = run_batch(pool, plan.style, QUESTIONS[1:], ["math"], rc("text_relay"))
    planner_text = res[0].trace[0]["text"]
    critic_prompt = next(u for role, _, u in pool.prompts if role == "critic")[0]
    assert critic_prompt == state_prompt("critic", ["solver"], QUESTIONS[1], {"planner": planner_text})
    pool.shutdown()
