"""The outer links' bridge initialisations on tiny models (distillation: expert tiny:mistral d=256 -> learner
tiny:qwen3 d=64): the rollout-state bridge (`--outer_init state_bridge`) sends the expert's rollout latents
closer to the learner's embeddings of the expert's own argmax tokens than the token-pair bridge does, it fits
only the links of stages that receive no latents, and the Ray Train pipeline starts from it and runs a step."""

import pytest
import torch

from recmas_ray.styles import render_prompt
from recmas_ray.system.plan import plan_system
from recmas_ray.train.bridge import (bridge_outer_links, first_stage_edges, rollout_state_pairs,
                                     state_bridge_outer_links)
from recmas_ray.train.synthetic_facts import split_by_value

M = 4
"""Rollout steps of the fit."""


def _questions(n):
    from recmas_ray.train.data import question_text

    train, _, _ = split_by_value("recall", "distillation", num_train=n, num_seen=2, num_unseen=0, seed=0)
    return [question_text(r) for r in train]


def _pairs(plan, questions):
    """(x, y) of the expert's rollout states on `questions`: what the state bridge fits, measured per link."""
    from recmas_ray.engine.agent import Agent
    from recmas_ray.models.loader import load_frozen_model

    style = plan.style
    expert_model, expert_tok = load_frozen_model(plan.role_models["expert"], dtype=torch.float32)
    learner_model, learner_tok = load_frozen_model(plan.role_models["learner"], dtype=torch.float32)
    expert = Agent(expert_model, expert_tok, plan.links.inner["expert"], role="expert",
                   model_name=plan.role_models["expert"], system_prompt=style.system_prompt)
    users = [render_prompt(style, "expert", "base", "qa", q) for q in questions]
    x, y, _ = rollout_state_pairs(expert, users, learner_tok, learner_model.get_input_embeddings(), num_steps=M)
    return x, y


def test_first_stage_edges_are_the_links_of_stages_without_incoming_latents():
    from recmas_ray.styles import get_style

    assert set(first_stage_edges(get_style("distillation"), 1)) == {"expert->learner"}
    assert set(first_stage_edges(get_style("sequential_light"), 2)) == {"planner->critic"}
    mixture = get_style("mixture")
    assert set(first_stage_edges(mixture, 1)) == {e for e in mixture.edges if not e.startswith(mixture.decoder)}


def test_state_bridge_sends_rollout_latents_closer_to_the_argmax_embeddings_than_the_token_bridge(tiny_cache):
    questions = _questions(300)
    train_q, test_q = questions[:200], questions[200:]
    token = plan_system("distillation", preset="tiny", seed=0, task="qa")
    bridge_outer_links(token, ridge=1e-2)
    state = plan_system("distillation", preset="tiny", seed=0, task="qa")
    counts = state_bridge_outer_links(state, train_q, task="qa", num_steps=M, num_rounds=1, ridge=1e-2)
    assert 16 <= counts["expert->learner"] <= len(train_q) * M
    # the feedback edge's source receives latents: it keeps the token bridge
    for k, v in token.links.outer["learner->expert"].state_dict().items():
        assert torch.equal(v, state.links.outer["learner->expert"].state_dict()[k]), k
    for questions in (train_q, test_q):  # the fitted questions and others of the same task
        x, y = _pairs(state, questions)
        with torch.no_grad():
            mse = {name: float(((p.links.outer["expert->learner"](x) - y) ** 2).mean())
                   for name, p in (("state", state), ("token", token))}
        assert mse["state"] < mse["token"], mse


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_pipeline_starts_from_the_state_bridge_and_runs_a_step(ray_cluster, tmp_path):
    from recmas_ray.system.checkpoints import load_links
    from recmas_ray.system.config import with_system
    from recmas_ray.train.config import OuterTrainConfig
    from recmas_ray.train.data import question_text
    from recmas_ray.train.pipeline import train_outer
    from recmas_ray.train.synthetic import write_jsonl

    rows, _, _ = split_by_value("recall", "distillation", num_train=240, num_seen=2, num_unseen=0, seed=0)
    data = write_jsonl(rows, tmp_path / "train.jsonl")
    cfg = with_system(OuterTrainConfig, style="distillation", preset="tiny", dataset_name=str(data), task="qa",
                      save_dir=str(tmp_path / "out"), num_recursive_rounds=1, max_steps=1, batch_size=2, lr=1e-9,
                      warmup_steps=0, seed=0, rollout_latent_steps=M, outer_init="state_bridge", progress=False)
    res = train_outer(cfg)
    assert len(res.log) == 1 and torch.isfinite(torch.tensor(res.log[0]["loss"]))
    want = plan_system("distillation", preset="tiny", seed=0, task="qa")
    state_bridge_outer_links(want, [question_text(r) for r in rows], task="qa", num_steps=M, num_rounds=1, ridge=1e-2)
    saved = load_links(res.save_dir).outer
    for edge in ("expert->learner", "learner->expert"):  # one step at lr 1e-9 leaves the init in place
        for k, v in want.links.outer[edge].state_dict().items():
            assert torch.allclose(saved[edge].state_dict()[k], v, atol=1e-6), (edge, k)
    # the start is kept beside the trained links, and the untrained-links row loads it: the same links as
    # re-fitting the bridge (what a folder without it gets), without rolling the training questions out again
    from recmas_ray.eval.rows import untrained_outer_links

    start = load_links(res.save_dir / "init")
    assert start.manifest["outer_init"] == "state_bridge" and start.manifest["step"] == 0
    trained = plan_system("distillation", preset="tiny", seed=0, task="qa", ckpt_override={"outer": str(res.save_dir)})
    loaded = untrained_outer_links(trained, str(res.save_dir))
    (res.save_dir / "init" / "manifest.json").unlink()
    refit = untrained_outer_links(trained, str(res.save_dir))
    assert "state_bridge init saved by training" in loaded.sources["outer:expert->learner"]
    assert "saved" not in refit.sources["outer:expert->learner"]
    for edge in ("expert->learner", "learner->expert"):
        for k, v in want.links.outer[edge].state_dict().items():
            assert torch.equal(start.outer[edge].state_dict()[k], v), (edge, k)
            assert torch.equal(loaded.links.outer[edge].state_dict()[k], v), (edge, k)
            assert torch.allclose(refit.links.outer[edge].state_dict()[k], v, atol=1e-6), (edge, k)


def test_state_bridge_rollouts_are_what_the_training_stage_would_send(tiny_cache):
    """The rollouts the fit computes are handed to training (`rollout_cache`): the same z as `rollout_stage`."""
    from recmas_ray.styles import build_schedule
    from recmas_ray.train.outer import prepare_samples, rollout_stage

    rows, _, _ = split_by_value("recall", "distillation", num_train=40, num_seen=2, num_unseen=0, seed=0)
    plan = plan_system("distillation", preset="tiny", seed=0, task="qa")
    from recmas_ray.train.data import question_text

    cache: dict = {}
    state_bridge_outer_links(plan, [question_text(r) for r in rows], task="qa", num_steps=M, num_rounds=1,
                             ridge=1e-2, rollouts=cache)
    assert len(cache) == len(rows) and {k[:2] for k in cache} == {("expert", M)}
    from recmas_ray.engine.agent import Agent
    from recmas_ray.models.loader import load_frozen_model

    model, tok = load_frozen_model(plan.role_models["expert"], dtype=torch.float32)
    expert = Agent(model, tok, plan.links.inner["expert"], role="expert", model_name=plan.role_models["expert"],
                   system_prompt=plan.style.system_prompt)
    samples = prepare_samples(rows[:6], plan.style, "qa")
    assert all(("expert", M, render_prompt(plan.style, "expert", "base", "qa", s.question)) in cache for s in samples)
    fresh = rollout_stage(expert, plan.style, build_schedule(plan.style, 1)[0], samples, task="qa", num_steps=M)
    cached = rollout_stage(expert, plan.style, build_schedule(plan.style, 1)[0], samples, task="qa", num_steps=M,
                           cache=cache)
    assert torch.allclose(cached.z, fresh.z, atol=1e-5), (cached.z - fresh.z).abs().max()


class _ByteFallbackTokenizer:
    """Gemma's layout in six ids: byte-fallback tokens (<0x32>) decode like the digit tokens and come first by
    id, but the tokenizer writes "2" with its own digit token."""

    all_special_ids = [0]
    _texts = ["<pad>", "2", "0", "2", "0", " ", "x"]  # 1, 2: <0x32>, <0x30>; 3, 4: the digits; 5: a blank

    def __len__(self):
        return len(self._texts)

    def decode(self, ids):
        return "".join(self._texts[i] for i in ids)

    def __call__(self, text, add_special_tokens=False):
        from types import SimpleNamespace

        return SimpleNamespace(input_ids=[{"2": 3, "0": 4, " ": 5, "x": 6}[c] for c in text])


def test_vocabulary_pairs_the_token_the_tokenizer_writes_not_a_byte_fallback_twin():
    from recmas_ray.train.bridge import vocabulary_strings

    tok = _ByteFallbackTokenizer()
    assert vocabulary_strings(tok) == {"2": 3, "0": 4, "x": 6}
    assert vocabulary_strings(tok, blanks=True) == {"2": 3, "0": 4, " ": 5, "x": 6}
