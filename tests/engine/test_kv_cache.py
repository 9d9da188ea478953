"""Static KV cache, prefix KV reuse and the fewer-sync decode loop give the same outputs as the
growing-cache path and a full recompute, on a tiny model of every family (Gemma 3's sliding layers
included: prompts and prefixes here are longer than its 64-token window)."""

import dataclasses

import pytest
import torch

from tests.conftest import tiny_planner_agents

from recmas_ray.config.engine import EngineConfig
from recmas_ray.config.recursion import DecodeConfig
from recmas_ray.engine.kv_cache import BLOCK, PrefixStore
from recmas_ray.models.tiny import TINY_FAMILIES

SLOT = "<<LATENT_PLANNER_SLOT>>"
LONG = ("a longer question about apples, oranges and pears, long enough to pass the sliding window of the tiny "
        "Gemma model so both attention kinds are used, and then some more words about fruit baskets")
USERS = ["Question: what is 2 + 2?\nPlan: " + SLOT + "\nSolve it.",
         f"Question: {LONG}?\nPlan: " + SLOT + "\nSolve it carefully."]
ATOL = 1e-5


@pytest.fixture(scope="module")
def agents(tiny_cache):
    return tiny_planner_agents()


def _with(agent, **engine):
    """The agent with other engine settings and an empty prefix store (restored by the caller's fixture)."""
    agent.engine = dataclasses.replace(EngineConfig(), **engine)
    agent.prefix_store = PrefixStore(int(agent.engine.prefix_cache_mib * 2**20))
    return agent


@pytest.fixture(autouse=True)
def fresh_engine(agents):
    yield
    for agent in agents.values():
        _with(agent)


@pytest.mark.parametrize("family", list(TINY_FAMILIES))
def test_static_rollout_equals_growing_cache_and_full_recompute(agents, family):
    agent = agents[family]
    e, mask = agent.embed_batch(USERS, {SLOT: torch.randn(2, 5, agent.hidden_size)})
    static = _with(agent, prefix_cache_mib=0).latent_rollout(e, mask, 12)
    full = agent.latent_rollout(e, mask, 12, use_cache=False)
    growing = _with(agent, static_cache=False).latent_rollout(e, mask, 12)
    assert static.shape == (2, 12, agent.hidden_size)
    assert (static - growing).abs().max() <= ATOL and (static - full).abs().max() <= ATOL


@pytest.mark.parametrize("family", list(TINY_FAMILIES))
def test_prefix_reuse_skips_the_prefix_and_keeps_latents(agents, family):
    agent = _with(agents[family])
    lat = torch.randn(3, 2, 5, agent.hidden_size)  # three "rounds": same prompts, new latents each time
    reference = [_with(agents[family], prefix_cache_mib=0).latent_rollout(
        *agent.embed_batch(USERS, {SLOT: lat[r]}), 8) for r in range(3)]
    agent = _with(agent)
    counts = []
    for r in range(3):
        e, mask, prefix = agent.embed_batch_with_prefix(USERS, {SLOT: lat[r]})
        got = agent.latent_rollout(e, mask, 8, prefix_ids=prefix)
        assert (got - reference[r]).abs().max() <= ATOL, r
        counts.append(dict(agent.last_prefill))
    total = int(mask.sum())
    assert counts[0] == {"tokens_prefilled": total, "tokens_reused": 0}
    # later rounds run only what follows the stored prefix (plus the columns where rows' prefixes end unevenly)
    longest_prefix = max(len(p) for p in prefix)
    assert counts[1] == counts[2] and counts[1]["tokens_prefilled"] + counts[1]["tokens_reused"] == total
    assert counts[1]["tokens_reused"] >= min(len(p) for p in prefix) * 2 and longest_prefix > 64
    assert counts[1]["tokens_prefilled"] <= total - longest_prefix


@pytest.mark.parametrize("family", list(TINY_FAMILIES))
def test_decode_with_static_cache_and_reuse_gives_identical_tokens(agents, family):
    agent = agents[family]
    lat = torch.randn(2, 4, agent.hidden_size)
    e, mask, prefix = agent.embed_batch_with_prefix(USERS, {SLOT: lat})
    greedy = DecodeConfig(max_new_tokens=16)
    sampled = DecodeConfig(max_new_tokens=16, do_sample=True, temperature=1.0, seed=7)
    want = [_with(agent, static_cache=False).decode(e, mask, cfg) for cfg in (greedy, sampled)]
    for sync_every in (1, 8):
        agent = _with(agent, decode_sync_every=sync_every)
        for cfg, ref in zip((greedy, sampled), want):
            assert agent.decode(e, mask, cfg, prefix_ids=prefix) == ref  # first call fills the store
            assert agent.decode(e, mask, cfg, prefix_ids=prefix) == ref  # second reuses it
            assert agent.last_prefill["tokens_reused"] > 0
    one = DecodeConfig(max_new_tokens=1)
    assert agent.decode(e, mask, one) == _with(agent, static_cache=False).decode(e, mask, one)


def test_decode_stops_at_eos_exactly_as_before(agents):
    """A head biased to EOS after a few tokens: rows stop at different steps, EOS kept, counts equal."""
    agent = agents["llama"]
    e, mask = agent.embed_batch([u.replace(SLOT, "(none)") for u in USERS])
    head = agent.model.get_output_embeddings()
    eos = agent.tokenizer.eos_token_id
    calls = {"n": 0}

    def push_eos(mod, inp, out):
        calls["n"] += 1
        out = out.clone()
        out[1, :, eos] += 1e4 * (calls["n"] % 5 == 3)  # row 1 ends early, row 0 runs to the budget
        return out

    hook = head.register_forward_hook(push_eos)
    try:
        cfg = DecodeConfig(max_new_tokens=11)
        calls["n"] = 0
        want = _with(agent, static_cache=False).decode(e, mask, cfg)
        calls["n"] = 0
        got = _with(agent, decode_sync_every=4, continuous_batching=False).decode(e, mask, cfg)  # the decode loop
    finally:
        hook.remove()
    assert got == want and want[1].num_tokens < want[0].num_tokens == 11


def test_reused_prefix_is_padding_invariant(agents):
    """A row decoded alone reuses the KV stored from a batch where it was padded (different columns)."""
    agent = _with(agents["gemma3"])
    lat = torch.randn(2, 3, agent.hidden_size)
    e, mask, prefix = agent.embed_batch_with_prefix(USERS, {SLOT: lat})
    batch_h = agent.latent_rollout(e, mask, 6, prefix_ids=prefix)
    for b in range(2):
        e1, m1, p1 = agent.embed_batch_with_prefix(USERS[b:b + 1], {SLOT: lat[b:b + 1]})
        alone = agent.latent_rollout(e1, m1, 6, prefix_ids=p1)
        assert agent.last_prefill["tokens_reused"] == len(p1[0])
        assert (alone[0] - batch_h[b]).abs().max() <= ATOL


def test_a_longer_prompt_reuses_the_shared_blocks_of_a_stored_one(agents):
    """Round 1's prompt has no slot; round 2's adds a feedback slot after the same text: whole blocks are reused."""
    agent = _with(agents["qwen3"])
    first = [f"Question: {LONG}?\nMake a plan."]
    later = [f"Question: {LONG}?\nMake a plan.\nFeedback: " + SLOT]
    agent.latent_rollout(*agent.embed_batch(first), 4, prefix_ids=agent.embed_batch_with_prefix(first)[2])
    lat = torch.randn(1, 3, agent.hidden_size)
    e, mask, prefix = agent.embed_batch_with_prefix(later, {SLOT: lat})
    got = agent.latent_rollout(e, mask, 4, prefix_ids=prefix)
    reused = agent.last_prefill["tokens_reused"]
    assert reused > 0 and reused % BLOCK == 0
    assert (got - _with(agent, prefix_cache_mib=0).latent_rollout(e, mask, 4)).abs().max() <= ATOL


def test_prefix_store_matches_longest_prefix_and_stays_in_budget():
    kv = [(torch.zeros(2, 40, 4), torch.zeros(2, 40, 4))]
    per_entry = 2 * 2 * 40 * 4 * 4
    store = PrefixStore(max_bytes=2 * per_entry)
    a, b = list(range(40)), list(range(20)) + list(range(100, 120))
    store.add(a, kv)
    assert store.lookup(a)[1] == 40 and store.lookup(a + [7])[1] == 32 and store.lookup([5, 6])[1] == 0
    store.add(b, kv)
    assert store.lookup(list(range(20)) + [0])[1] == 16  # a shared block answers for either entry
    store.lookup(a)  # a is now the most recently used
    store.add(list(range(200, 240)), kv)  # third entry: the least recently used (b) goes
    assert len(store) == 2 and store.num_bytes == 2 * per_entry
    assert store.lookup(b)[1] == 16 and store.lookup(a)[1] == 40  # b's first block is still a's
    store.add(list(range(1000)), [(torch.zeros(2, 1000, 4), torch.zeros(2, 1000, 4))])  # over budget: ignored
    assert len(store) == 2



def test_rounds_through_the_runner_reuse_the_prefix_and_keep_predictions(tiny_cache):
    """The production path (runner -> AgentService -> Agent): later rounds prefill fewer prompt tokens
    with the prefix store, and every prediction is the same as without it."""
    from jobs.bench.perf import prefix_reuse
    from jobs.bench.perf_config import BenchConfig
    from recmas_ray.system.launch import local_pool
    from recmas_ray.system.config import with_system
    from recmas_ray.system.plan import plan_system

    plan = plan_system("sequential_light", preset="tiny", seed=0, device="cpu", dtype="float32")
    pool = local_pool(plan)
    cfg = with_system(BenchConfig, preset="tiny", rounds=[3], latent_steps=3, max_new_tokens=6, repeats=1)
    out = prefix_reuse(pool, plan, ["What is 12 + 30?", "What is 7 * 6?"], cfg)
    assert out["same_predictions"]
    with_reuse, without = out["reuse"]["per_round"], out["no_reuse"]["per_round"]
    assert all(r["tokens_reused"] == 0 for r in without)
    for r in (1, 2):  # rounds 2 and 3 find what rounds 1 and 2 stored
        assert with_reuse[r]["tokens_reused"] > 0
        assert with_reuse[r]["tokens_prefilled"] + with_reuse[r]["tokens_reused"] == without[r]["tokens_prefilled"]
    # round 3 also finds the whole text before round 2's slots (round 2 found round 1's shared blocks)
    assert with_reuse[2]["tokens_reused"] >= with_reuse[1]["tokens_reused"]


@pytest.mark.integration
def test_compiled_step_gives_the_eager_latents(agents):
    """torch.compile of the one-position step (minutes of compilation on CPU, hence integration)."""
    agent = agents["qwen3"]
    e, mask = agent.embed_batch(USERS, {SLOT: torch.randn(2, 3, agent.hidden_size)})
    eager = _with(agent, prefix_cache_mib=0).latent_rollout(e, mask, 6)
    compiled = _with(agent, prefix_cache_mib=0, compile_step=True).latent_rollout(e, mask, 6)
    assert (compiled - eager).abs().max() <= ATOL


@pytest.mark.parametrize("family", list(TINY_FAMILIES))
def test_a_row_without_a_stored_prefix_does_not_make_the_others_recompute_theirs(agents, family):
    """Before: one new (longest, so unpadded) row in the batch set the first column computed to 0 for all."""
    users = [USERS[0], f"Question: {LONG} and one more new question?\nPlan: " + SLOT + "\nThink."]
    lat = torch.randn(2, 5, agents[family].hidden_size)
    agent = _with(agents[family], prefix_cache_mib=0)
    reference = agent.latent_rollout(*agent.embed_batch(users, {SLOT: lat}), 8)
    agent = _with(agents[family])
    e, mask, prefix = agent.embed_batch_with_prefix(users[:1], {SLOT: lat[:1]})
    agent.latent_rollout(e, mask, 4, prefix_ids=prefix)  # stores the short row's prefix only
    e, mask, prefix = agent.embed_batch_with_prefix(users, {SLOT: lat})
    got = agent.latent_rollout(e, mask, 8, prefix_ids=prefix)
    assert (got - reference).abs().max() <= ATOL
    # the short row's whole stored prefix is reused (plus the shared template blocks of the new row)
    assert agent.last_prefill["tokens_reused"] >= len(prefix[0])
    assert agent.last_prefill["tokens_prefilled"] + agent.last_prefill["tokens_reused"] == int(mask.sum())
    tokens = DecodeConfig(max_new_tokens=8)
    assert agent.decode(e, mask, tokens, prefix_ids=prefix) == _with(agent, prefix_cache_mib=0).decode(e, mask, tokens)
