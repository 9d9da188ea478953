"""Runner: all styles for R = 1, 2, 3, text only from the final agent, baselines, bad input."""

import pytest
import torch

from recmas_ray.config.recursion import DecodeConfig
from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.engine.runner import run_batch
from recmas_ray.engine.service import AgentService
from recmas_ray.styles import STYLES
from recmas_ray.styles.base import RolePrompts, StyleSpec
from recmas_ray.system.launch import local_pool
from recmas_ray.system.plan import plan_system

QUESTIONS = ["What is 2 + 3?", "Tom has 4 apples and buys 3 more. How many?"]
STYLE_NAMES = ["sequential_light", "mixture", "distillation", "deliberation"]


@pytest.fixture(scope="module")
def pools(tiny_cache):
    out = {}
    for name in STYLE_NAMES:
        plan = plan_system(name, preset="tiny", seed=0)
        out[name] = (plan, local_pool(plan))
    return out


def cfg(method="recursive_mas", rounds=2, m=4, tokens=6):
    return RecursionConfig(method=method, num_recursive_rounds=rounds, latent_steps=m,
                           decode=DecodeConfig(max_new_tokens=tokens))


@pytest.mark.parametrize("name", STYLE_NAMES)
@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_styles_decode_text_only_from_the_final_agent(pools, name, rounds):
    plan, pool = pools[name]
    results = run_batch(pool, plan.style, QUESTIONS, ["math", "math"], cfg(rounds=rounds))
    for res in results:
        texts = [t for t in res.trace if t["text_tokens"] > 0]
        assert [(t["role"], t["round"], t["action"]) for t in texts] == [(plan.style.decoder, rounds, "decode")]
        assert res.num_latent_steps == 4 * sum(1 for t in res.trace if t["action"] == "rollout")
        assert res.num_text_tokens == 6 and res.seconds > 0


def test_baselines_run_and_text_recursion_costs_more_tokens(pools):
    plan, pool = pools["sequential_light"]
    latent = run_batch(pool, plan.style, QUESTIONS, ["math"] * 2, cfg("recursive_mas"))
    text_rec = run_batch(pool, plan.style, QUESTIONS, ["math"] * 2, cfg("recursive_textmas"))
    textmas = run_batch(pool, plan.style, QUESTIONS, ["math"] * 2, cfg("textmas"))
    single = run_batch(pool, plan.style, QUESTIONS, ["math"] * 2, cfg("single_agent"))
    assert [t["role"] for t in single[0].trace] == ["solver"]
    assert len(textmas[0].trace) == 3 and all(t["latent_steps"] == 0 for t in textmas[0].trace)
    assert len(text_rec[0].trace) == 6
    assert text_rec[0].num_text_tokens > textmas[0].num_text_tokens > latent[0].num_text_tokens


def test_latents_reach_the_decoder(pools):
    # Different upstream links must change what the decoder sees: the latent path is live, not decorative.
    plan, pool = pools["distillation"]
    other = plan_system("distillation", preset="tiny", seed=123)
    learner = pool.services["learner"].agent
    msgs = []
    for p in (plan, other):
        expert = AgentService(*p.service_args("expert"))
        *m, _ = expert.rollout([QUESTIONS[0]], [], 4, ("expert->learner",))
        msgs.append(m[0])
    slot = "<<DISTILL_EXPERT_SLOT>>"
    users = ["Expert plan: " + slot + " Question: " + QUESTIONS[0]]
    logits = [learner.logits(learner.forward_hidden(*learner.embed_batch(users, {slot: m})))[0, -1] for m in msgs]
    assert not torch.allclose(logits[0], logits[1], atol=1e-4)


def test_mixture_decode_every_round_counts_discarded_text(pools):
    plan, pool = pools["mixture"]
    c = cfg(rounds=3)
    c.decode_every_round = True
    res = run_batch(pool, plan.style, QUESTIONS[:1], ["math"], c)[0]
    assert [t["action"] for t in res.trace if t["role"] == "summarizer"].count("discarded_decode") == 2
    assert res.num_text_tokens == 18


def test_a_new_style_is_one_declaration(tiny_cache):
    echo = StyleSpec(
        name="echo", stages=(("a",), ("b",)), forward_edges=("a->b",), feedback_edges=("b->a",), decoder="b",
        slots={"a": {"<<ECHO_FEEDBACK_SLOT>>": "b->a"}, "b": {"<<ECHO_SLOT>>": "a->b"}},
        prompts={"a": RolePrompts(base={"math": "Think: {question}"},
                                  feedback={"math": "Again <<ECHO_FEEDBACK_SLOT>> {question}"}),
                 "b": RolePrompts(base={"math": "Use <<ECHO_SLOT>> to answer {question} {final}"})},
        target_fields={"a": ("plan",), "b": ("answer",)})
    STYLES["echo"] = echo
    try:
        plan = plan_system("echo", preset="tiny", role_models={"a": "tiny:mistral", "b": "tiny:qwen3"})
        pool = local_pool(plan)
        res = run_batch(pool, echo, QUESTIONS, ["math"] * 2, cfg(rounds=3))
        assert [t["role"] for t in res[0].trace] == ["a", "b", "a", "b", "a", "b"]
    finally:
        del STYLES["echo"]


@pytest.mark.parametrize("bad,match", [
    (dict(method="telepathy"), "method 'telepathy': expected one of"),
    (dict(num_recursive_rounds=0), r"num_recursive_rounds 0: expected an integer in \[1, "),
    (dict(latent_steps=-1), r"latent_steps -1: expected an integer in \[0, "),
])
def test_bad_recursion_config(pools, bad, match):
    plan, pool = pools["sequential_light"]
    with pytest.raises(ValueError, match=match):
        run_batch(pool, plan.style, QUESTIONS, ["math"] * 2, RecursionConfig(**bad))


def test_base_models_untouched_by_runs(pools):
    plan, pool = pools["mixture"]
    before = {r: {k: v.clone() for k, v in s.agent.model.state_dict().items()} for r, s in pool.services.items()}
    run_batch(pool, plan.style, QUESTIONS, ["math"] * 2, cfg(rounds=2))
    for r, s in pool.services.items():
        assert all(torch.equal(v, before[r][k]) for k, v in s.agent.model.state_dict().items())
