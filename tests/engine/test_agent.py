"""Agent: slot splicing, KV-cached latent rollout == full re-run, padding invariance, frozen weights."""

import pytest
import torch

from tests.conftest import tiny_planner_agents

from recmas_ray.engine.agent import Agent, find_slots
from recmas_ray.config.recursion import DecodeConfig
from recmas_ray.engine.links import InnerLink
from recmas_ray.models.loader import load_frozen_model
from recmas_ray.models.tiny import TINY_FAMILIES

SLOT = "<<LATENT_PLANNER_SLOT>>"
USERS = ["Question: what is 2 + 2?\nPlan: " + SLOT + "\nSolve it.",
         "Question: a longer question about apples, oranges and pears, long enough to pass the sliding window "
         "of the tiny Gemma model so both attention kinds are used.\nPlan: " + SLOT + "\nSolve it carefully."]


@pytest.fixture(scope="module")
def agents(tiny_cache):
    return tiny_planner_agents()


@pytest.mark.parametrize("family", list(TINY_FAMILIES))
def test_kv_cached_rollout_equals_full_rerun(agents, family):
    agent = agents[family]
    lat = torch.randn(2, 5, agent.hidden_size)
    e, mask = agent.embed_batch(USERS, {SLOT: lat})
    cached = agent.latent_rollout(e, mask, 12, use_cache=True)
    full = agent.latent_rollout(e, mask, 12, use_cache=False)
    assert cached.shape == (2, 12, agent.hidden_size)
    assert torch.allclose(cached, full, atol=1e-4), (cached - full).abs().max()


@pytest.mark.parametrize("family", list(TINY_FAMILIES))
def test_left_padded_batch_equals_per_sample(agents, family):
    agent = agents[family]
    lat = torch.randn(2, 4, agent.hidden_size)
    e, mask = agent.embed_batch(USERS, {SLOT: lat})
    assert mask[0, 0] == 0 or mask[1, 0] == 0  # one row really is padded
    batch_h = agent.latent_rollout(e, mask, 6)
    batch_txt = agent.decode(e, mask, DecodeConfig(max_new_tokens=12))
    for b in range(2):
        e1, m1 = agent.embed_batch(USERS[b:b + 1], {SLOT: lat[b:b + 1]})
        assert torch.allclose(agent.latent_rollout(e1, m1, 6)[0], batch_h[b], atol=1e-4)
        assert agent.decode(e1, m1, DecodeConfig(max_new_tokens=12))[0] == batch_txt[b]


def test_latents_are_spliced_into_the_slot_not_prefixed(agents):
    agent = agents["qwen3"]
    lat = torch.full((3, agent.hidden_size), 7.0)
    e, ids = agent.embed_prompt(USERS[0], {SLOT: lat})
    pos = (ids == -100).nonzero().flatten().tolist()
    assert len(pos) == 3 and pos[0] > 10 and pos[-1] < len(ids) - 5
    assert torch.equal(e[pos], lat)
    text = agent.render_chat(USERS[0])
    before = agent.tokenizer(text.split(SLOT)[0], add_special_tokens=False).input_ids
    assert ids[:len(before)].tolist() == before


def test_zero_latent_steps_gives_empty_block(agents):
    agent = agents["llama"]
    e, mask = agent.embed_batch(USERS[:1], {SLOT: torch.randn(1, 2, agent.hidden_size)})
    assert agent.latent_rollout(e, mask, 0).shape == (1, 0, agent.hidden_size)
    e0, _ = agent.embed_prompt(USERS[0], {SLOT: torch.zeros(0, agent.hidden_size)})
    assert e0.shape[0] > 0


def test_gemma_and_mistral_templates_merge_the_system_prompt(agents):
    for family in ("gemma3", "mistral"):
        text = agents[family].render_chat("hello")
        assert "You are a helpful assistant." in text and "hello" in text


def test_slot_errors_name_the_problem(agents):
    agent = agents["qwen3"]
    with pytest.raises(ValueError, match="slots without latents"):
        agent.embed_prompt(USERS[0], {})
    with pytest.raises(ValueError, match="latents without a slot"):
        agent.embed_prompt("no slot here", {SLOT: torch.zeros(2, agent.hidden_size)})
    with pytest.raises(ValueError, match="expected \\[M, 64\\]"):
        agent.embed_prompt(USERS[0], {SLOT: torch.zeros(2, 5)})
    with pytest.raises(ValueError, match="latent_steps must be >= 0"):
        agent.latent_rollout(*agent.embed_batch(["hi"]), -1)
    assert find_slots(USERS[0]) == [SLOT]


def test_inner_link_dim_mismatch_is_rejected(tiny_cache):
    model, tok = load_frozen_model("tiny:qwen3", dtype=torch.float32)
    with pytest.raises(ValueError, match="inner link has hidden size 96.*has 64"):
        Agent(model, tok, InnerLink(96), role="planner", model_name="tiny:qwen3")


def test_base_model_is_frozen_and_untouched(agents):
    agent = agents["mistral"]
    before = {k: v.clone() for k, v in agent.model.state_dict().items()}
    assert not any(p.requires_grad for p in agent.model.parameters()) and not agent.model.training
    e, mask = agent.embed_batch(USERS, {SLOT: torch.randn(2, 3, agent.hidden_size)})
    agent.latent_rollout(e, mask, 4)
    agent.decode(e, mask, DecodeConfig(max_new_tokens=4, do_sample=True, seed=3))
    assert all(torch.equal(v, before[k]) for k, v in agent.model.state_dict().items())


def test_sampling_is_reproducible_by_seed(agents):
    agent = agents["qwen3"]
    e, mask = agent.embed_batch(["Say something."])
    a = agent.decode(e, mask, DecodeConfig(max_new_tokens=10, do_sample=True, temperature=1.0, seed=5))
    b = agent.decode(e, mask, DecodeConfig(max_new_tokens=10, do_sample=True, temperature=1.0, seed=5))
    assert a == b


def test_logits_helper_matches_model_forward(agents):
    for agent in agents.values():
        e, mask = agent.embed_batch(["check logits"])
        ref = agent.model(inputs_embeds=e, attention_mask=mask).logits
        assert torch.allclose(agent.logits(agent.forward_hidden(e, mask)), ref, atol=1e-4)
