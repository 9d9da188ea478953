"""Non-reference recipe options of outer training, on tiny models: latents rescaled to the receiving model's
token-embedding norm at splice time, answer value tokens weighted in the loss, the ridge bridge's token pairs,
and the config fields (off by default, checked before any model loads)."""

import pytest
import torch

from recmas_ray.engine.agent import Agent
from recmas_ray.train.config import LATENT_NORMS, OuterTrainConfig
from recmas_ray.engine.links import InnerLink
from recmas_ray.models.loader import load_frozen_model
from recmas_ray.styles import build_schedule, get_style

SLOT = "<<LATENT_PLANNER_SLOT>>"


@pytest.fixture(scope="module")
def agents(tiny_cache):
    out = {}
    for family in ("qwen3", "gemma3"):
        model, tok = load_frozen_model(f"tiny:{family}", dtype=torch.float32)
        torch.manual_seed(0)
        out[family] = Agent(model, tok, InnerLink(model.config.hidden_size), role="critic", model_name=f"tiny:{family}")
    return out


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_spliced_latents_get_the_token_embedding_norm(agents, family):
    agent = agents[family]
    emb = agent.model.get_input_embeddings()
    want = float(emb(torch.arange(len(agent.tokenizer))).norm(dim=-1).mean())  # Gemma's sqrt(d) scaling included
    block = torch.randn(3, agent.hidden_size) * 10
    e_plain, ids = agent.embed_prompt(f"Plan: {SLOT} go", {SLOT: block})
    at = ids == -100
    assert torch.allclose(e_plain[at], block)  # the release: spliced as they come
    agent.set_latent_norm("embedding")
    try:
        e_scaled, _ = agent.embed_prompt(f"Plan: {SLOT} go", {SLOT: block})
        assert torch.allclose(e_scaled[at].norm(dim=-1), torch.full((3,), want), rtol=1e-4)
        assert torch.allclose(e_scaled[~at], e_plain[~at])  # text positions untouched
        grad_in = block.clone().requires_grad_()
        agent.embed_teacher_forced(f"Plan: {SLOT} go", {SLOT: grad_in}, "ok")[0].sum().backward()
        assert grad_in.grad is not None and grad_in.grad.abs().sum() > 0  # training still reaches the links
    finally:
        agent.set_latent_norm("none")
    assert agent.latent_norm is None
    with pytest.raises(ValueError, match="latent_norm"):
        agent.set_latent_norm("tokens")


def test_value_token_weights_mark_digit_tokens(agents):
    from recmas_ray.train.outer import value_token_weights

    tok = agents["qwen3"].tokenizer
    ids = tok("17 - 8 = 9. \\boxed{9}", add_special_tokens=False).input_ids
    w = value_token_weights(tok, ids, 5.0)
    for t, wt in zip(ids, w.tolist()):
        assert wt == (5.0 if any(c.isdigit() for c in tok.decode([t])) else 1.0)
    assert 5.0 in w.tolist() and 1.0 in w.tolist()


def test_value_token_weight_changes_the_objective_not_the_logged_loss(agents):
    from recmas_ray.train.outer import encode_stage, prepare_samples
    from recmas_ray.train.synthetic_hidden import make_hidden_operand_dataset

    style = get_style("sequential_light")
    model, tok = load_frozen_model("tiny:qwen3", dtype=torch.float32)
    torch.manual_seed(0)
    solver = Agent(model, tok, InnerLink(64), role="solver", model_name="tiny:qwen3")
    samples = prepare_samples(make_hidden_operand_dataset(3, seed=0), style, "qa")
    step = next(s for s in build_schedule(style, 1) if s.decode)
    lat = {m: torch.randn(12, 64, requires_grad=True) for m, _ in step.inputs}
    from recmas_ray.train.outer import Latent

    kw = dict(task="qa", num_rounds=1, max_latent_tokens=8, non_last_loss_weight=0.0, batch_size=3)
    runs = {w: encode_stage(solver, style, step, samples, {m: Latent(x, [4, 4, 4]) for m, x in lat.items()},
                            value_token_weight=w, **kw) for w in (1.0, 5.0)}
    assert runs[1.0].sample_losses == pytest.approx(runs[5.0].sample_losses)  # logs stay the plain CE
    assert float(runs[1.0].objective.detach()) == pytest.approx(sum(runs[1.0].sample_losses) / 3, rel=1e-5)
    assert float(runs[5.0].objective.detach()) != pytest.approx(float(runs[1.0].objective.detach()), rel=1e-3)
    runs[5.0].objective.backward()
    assert all(x.grad is not None and x.grad.abs().sum() > 0 for x in lat.values())


def test_bridge_pairs_tokens_with_the_same_text(agents):
    from recmas_ray.train.bridge import shared_token_pairs

    a, b = agents["qwen3"].tokenizer, agents["gemma3"].tokenizer
    src, dst = shared_token_pairs(a, b, max_pairs=50)
    assert 16 <= len(src) == len(dst) <= 50
    assert all(a.decode([i]) == b.decode([j]) for i, j in zip(src, dst))


def test_recipe_fields_default_to_the_reference_and_are_checked():
    cfg = OuterTrainConfig()
    assert (cfg.latent_norm, cfg.outer_init, cfg.value_token_weight, cfg.warmup_from_zero) == \
        ("none", "default", 1.0, False)
    assert LATENT_NORMS == ("none", "embedding")
    from recmas_ray.config.checks import check_tree

    for bad in ({"latent_norm": "tokens"}, {"outer_init": "ridge"}, {"value_token_weight": 0.0}):
        with pytest.raises(ValueError):
            check_tree(OuterTrainConfig(**bad))


@pytest.mark.parametrize("mode", ["embedding", None])
def test_inference_follows_the_latent_norm_the_outer_links_were_trained_with(tmp_path, tiny_cache, mode):
    from recmas_ray.engine.service import AgentService
    from recmas_ray.system.checkpoints import LinkSet, save_links
    from recmas_ray.system.plan import plan_system

    fresh = plan_system("sequential_light", preset="tiny", seed=0)
    train_config = {"latent_norm": mode} if mode else {}
    save_links(tmp_path, LinkSet(outer=dict(fresh.links.outer)), {**fresh.manifest(), "kind": "outer",
                                                                    "train_config": train_config})
    plan = plan_system("sequential_light", preset="tiny", seed=0, ckpt_override={"outer": str(tmp_path)})
    assert {s.latent_norm for s in plan.specs.values()} == {mode or "none"}
    assert {s.latent_norm for s in fresh.specs.values()} == {"none"}
    svc = AgentService(*plan.service_args("solver"))
    assert (svc.agent.latent_norm is not None) == (mode == "embedding")


def test_rollout_latents_are_the_inference_paths_and_only_replace_stages_without_inputs(tiny_cache):
    """--rollout_latent_steps m: round 1's first stage sends the messages inference sends (the service's rollout
    of the same prompts), gold text unread; the decoder stays teacher-forced and its gradient reaches the link."""
    from recmas_ray.engine.service import AgentService
    from recmas_ray.styles import render_prompt
    from recmas_ray.system.plan import plan_system
    from recmas_ray.train.outer import Latent, emit_messages, encode_stage, prepare_samples
    from recmas_ray.train.synthetic_hidden import make_hidden_operand_dataset

    plan = plan_system("distillation", preset="tiny", seed=0, task="qa")
    style, m = plan.style, 5
    expert = AgentService(*plan.service_args("expert"))
    learner = AgentService(*plan.service_args("learner"))
    samples = prepare_samples(make_hidden_operand_dataset(3, seed=0, question_kind="recall"), style, "qa")
    first, last = build_schedule(style, 1)
    kw = dict(task="qa", num_rounds=1, max_latent_tokens=80, non_last_loss_weight=0.0, batch_size=3)
    enc = encode_stage(expert.agent, style, first, samples, {}, rollout_latent_steps=m, **kw)
    assert enc.lengths == [m] * 3 and enc.objective is None
    sent = emit_messages(expert.agent, enc.z, first.outputs)["expert->learner"]
    users = [render_prompt(style, "expert", first.variant, "qa", s.question) for s in samples]
    (want, _stats) = expert.rollout(users, [], m, ["expert->learner"])
    assert torch.allclose(sent.detach().reshape(3, m, -1), want.float(), atol=1e-5)
    gold = encode_stage(expert.agent, style, first, samples, {}, **kw)  # the reference reads the gold turn
    assert gold.lengths != enc.lengths
    # changing the gold text changes nothing in rollout mode (it is never read)
    other = [type(s)(s.sample_id, s.question, {**s.targets, "expert": "something else entirely"}) for s in samples]
    again = encode_stage(expert.agent, style, first, other, {}, rollout_latent_steps=m, **kw)
    # (to rounding: continuous batching, the default, places a call's rows at other cache columns from run to run)
    assert (again.z - enc.z).abs().max() <= 1e-5, (again.z - enc.z).abs().max()
    # the decoder, which has incoming latents, stays teacher-forced and trains the link through them
    lat = Latent(sent.detach().clone().requires_grad_(), enc.lengths)
    out = encode_stage(learner.agent, style, last, samples, {last.inputs[0][0]: lat}, rollout_latent_steps=m, **kw)
    assert out.objective is not None
    out.objective.backward()
    assert lat.flat.grad is not None and lat.flat.grad.abs().sum() > 0


def test_full_rollout_middle_stage_sends_the_inference_message_and_passes_gradient(tiny_cache):
    """--rollout_stages all: the critic, which receives latents, sends what the service's rollout of the same
    prompts and latents sends (gold text unread), with a graph back to the latents it received; the decoder's
    feedback at R = 2 is its rollout, never its hidden states over the gold answer; first-stage rollouts are
    memoised per question and equal to a fresh computation."""
    from recmas_ray.engine.agent import find_slots
    from recmas_ray.engine.service import AgentService
    from recmas_ray.styles import render_prompt
    from recmas_ray.system.plan import plan_system
    from recmas_ray.train.outer import Latent, emit_messages, encode_stage, prepare_samples
    from recmas_ray.train.synthetic_facts import make_fact_dataset

    plan = plan_system("sequential_light", preset="tiny", seed=0, task="qa")
    style, m = plan.style, 4
    svc = {r: AgentService(*plan.service_args(r)) for r in style.roles}
    samples = prepare_samples(make_fact_dataset("two_fact", "sequential_light", 3, seed=0), style, "qa")
    steps = build_schedule(style, 2)
    kw = dict(task="qa", num_rounds=2, max_latent_tokens=80, non_last_loss_weight=0.5, batch_size=3,
              rollout_latent_steps=m, rollout_stages="all")
    cache: dict = {}
    first = encode_stage(svc["planner"].agent, style, steps[0], samples, {}, rollout_cache=cache, **kw)
    assert len(cache) == 3
    assert torch.equal(encode_stage(svc["planner"].agent, style, steps[0], samples, {}, rollout_cache=cache, **kw).z,
                       first.z)
    sent = emit_messages(svc["planner"].agent, first.z, steps[0].outputs)["planner->critic"].detach()
    lat = Latent(sent.clone().requires_grad_(), first.lengths)
    crit = steps[1]
    assert crit.role == "critic"
    enc = encode_stage(svc["critic"].agent, style, crit, samples, {crit.inputs[0][0]: lat}, **kw)
    assert enc.lengths == [m] * 3 and enc.objective is None
    msg = emit_messages(svc["critic"].agent, enc.z, crit.outputs)["critic->solver"]
    users = [render_prompt(style, "critic", crit.variant, "qa", s.question) for s in samples]
    slots = find_slots(svc["critic"].agent.render_chat(users[0]))
    want, _ = svc["critic"].rollout(users, slots, m, ["critic->solver"], sent.reshape(3, m, -1))
    assert torch.allclose(msg.detach().reshape(3, m, -1), want.float(), atol=1e-4)
    other = [type(s)(s.sample_id, s.question, {**s.targets, "critic": "unrelated text"}) for s in samples]
    assert torch.equal(encode_stage(svc["critic"].agent, style, crit, other, {crit.inputs[0][0]: lat}, **kw).z, enc.z)
    msg.sum().backward()
    assert lat.flat.grad is not None and lat.flat.grad.abs().sum() > 0
    # the decoder in round 1 (R = 2): CE on the gold answer, feedback = its rollout, independent of the gold answer
    dec = next(s for s in steps if s.role == style.decoder and s.round == 1)
    lat2 = {mk: Latent(torch.randn(3 * m, svc["solver"].agent.hidden_size), [m] * 3) for mk, _ in dec.inputs}
    a = encode_stage(svc["solver"].agent, style, dec, samples, lat2, **kw)
    changed = [type(s)(s.sample_id, s.question, {**s.targets, "solver": "x = 11. \\boxed{11}"}) for s in samples]
    b = encode_stage(svc["solver"].agent, style, dec, changed, lat2, **kw)
    assert a.lengths == [m] * 3 and torch.equal(a.z, b.z) and a.sample_losses != b.sample_losses


def test_rollout_with_grad_matches_the_no_grad_inference_rollout(agents):
    agent = agents["qwen3"]
    e_BLD, mask_BL = agent.embed_batch(["hello there", "a longer prompt with more words in it"])
    want = agent.latent_rollout(e_BLD, mask_BL, 5)
    e = e_BLD.clone().requires_grad_()
    got = agent.latent_rollout_with_grad(e, mask_BL, 5)
    assert got.requires_grad and torch.allclose(got.detach(), want, atol=1e-5)
    got.sum().backward()
    assert e.grad.abs().sum() > 0


@pytest.mark.parametrize("feedback", ["graph", "detached"])
def test_middle_stage_rollout_gradient_equals_the_single_sample_autograd_reference(tiny_cache, feedback):
    """--rollout_stages all through the critic (a stage that receives latents): the batched, cached rollout's
    gradient w.r.t. the received latents equals the reference's per-sample no-cache rollout, with the fed-back
    inner(h) kept in the graph (exact) or detached (--rollout_feedback detached: same message values, gradient
    only through attention to the received latents, and a different gradient from the exact one)."""
    from recmas_ray.engine.service import AgentService
    from recmas_ray.styles import render_prompt
    from recmas_ray.system.plan import plan_system
    from recmas_ray.train.outer import Latent, emit_messages, encode_stage, prepare_samples
    from recmas_ray.train.reference import _rollout_no_cache
    from recmas_ray.train.synthetic_facts import make_fact_dataset

    plan = plan_system("sequential_light", preset="tiny", seed=0, task="qa")
    style, m = plan.style, 3
    critic = AgentService(*plan.service_args("critic")).agent
    rows = make_fact_dataset("recall", "sequential_light", 3, seed=0)
    samples = prepare_samples(rows, style, "qa")
    crit = build_schedule(style, 1)[1]
    marker = crit.inputs[0][0]
    torch.manual_seed(0)
    block = torch.randn(3 * 4, critic.hidden_size)  # 4 received latents per sample
    kw = dict(task="qa", num_rounds=1, max_latent_tokens=80, non_last_loss_weight=0.0, batch_size=3,
              rollout_latent_steps=m, rollout_stages="all")

    def pipeline_grad(mode):
        lat = Latent(block.clone().requires_grad_(), [4, 4, 4])
        enc = encode_stage(critic, style, crit, samples, {marker: lat}, rollout_feedback=mode, **kw)
        msg = emit_messages(critic, enc.z, crit.outputs)["critic->solver"]
        (msg * torch.linspace(-1, 1, msg.shape[-1])).sum().backward()
        return msg.detach(), lat.flat.grad

    msg, got = pipeline_grad(feedback)
    want = []
    for b, s in enumerate(samples):
        lat_b = block[4 * b:4 * (b + 1)].clone().requires_grad_()
        user = render_prompt(style, "critic", crit.variant, "qa", s.question)
        h = _rollout_no_cache(critic, user, {marker: lat_b}, m, detach_feedback=feedback == "detached")
        ref = critic.outer_links["critic->solver"](critic.inner_link(h))
        assert torch.allclose(ref.detach(), msg[m * b:m * (b + 1)], atol=1e-5)
        (ref * torch.linspace(-1, 1, ref.shape[-1])).sum().backward()
        want.append(lat_b.grad)
    torch.testing.assert_close(got, torch.cat(want), rtol=1e-4, atol=1e-6)
    assert got.abs().sum() > 0
    if feedback == "detached":
        exact_msg, exact = pipeline_grad("graph")
        assert torch.allclose(exact_msg, msg, atol=1e-6) and not torch.allclose(exact, got, atol=1e-6)
