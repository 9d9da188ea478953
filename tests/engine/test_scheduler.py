"""Continuous batching: requests merged into shared steps give the latents and greedy tokens of one request
at a time (the unbatched path: `Agent._rollout_static` / `_decode_static` with continuous batching off), on a
tiny model of every family (Gemma 3's sliding layers included), rows ending at different steps, requests
joining while others run; arrivals are prefilled together and the shared cache is reallocated O(log n) times."""

import contextlib
import dataclasses
import gc
import math
import threading
import weakref

import pytest
import torch

from tests.conftest import tiny_planner_agents

from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.models.tiny import TINY_FAMILIES
from recmas_ray.engine.runner import run_batch
from recmas_ray.engine.scheduler import StepScheduler
from recmas_ray.system.launch import local_pool
from recmas_ray.system.plan import plan_system

SLOT = "<<LATENT_PLANNER_SLOT>>"
LONG = ("a longer question about apples, oranges and pears, long enough to pass the sliding window of the tiny "
        "Gemma model so both attention kinds are used, and then some more words about fruit baskets")
USERS = [["Question: what is 2 + 2?\nPlan: " + SLOT + "\nSolve it."],
         [f"Question: {LONG}?\nPlan: " + SLOT + "\nSolve it carefully.", "Question: 3 * 3?\nPlan: " + SLOT],
         ["Question: name a colour.\nPlan: " + SLOT + "\nAnswer briefly.", f"Q: {LONG[:60]}\nPlan: " + SLOT]]
ATOL = 1e-5


@pytest.fixture(scope="module")
def agents(tiny_cache):
    return tiny_planner_agents()


@contextlib.contextmanager
def _unbatched(agent):
    """The agent with continuous batching off: each call runs alone on its own cache."""
    engine = agent.engine
    agent.engine = dataclasses.replace(engine, continuous_batching=False)
    try:
        yield agent
    finally:
        agent.engine = engine


def _alone_rollout(agent, e, m, k, prefix=None):
    with _unbatched(agent):
        return agent.latent_rollout(e, m, k, prefix_ids=prefix)


def _alone_decode(agent, e, m, cfg, prefix=None):
    with _unbatched(agent):
        return agent._decode_static(e, m, cfg, prefix)


def _requests(agent, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for users in USERS:
        lat = torch.randn(len(users), 3, agent.hidden_size, generator=g)
        out.append(agent.embed_batch_with_prefix(users, {SLOT: lat}))
    return out


def _concurrently(fns):
    results, errors = [None] * len(fns), []

    def run(i):
        try:
            results[i] = fns[i]()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    return results


@pytest.mark.parametrize("family", list(TINY_FAMILIES))
def test_merged_rollouts_and_decodes_equal_one_request_at_a_time(agents, family):
    agent = agents[family]
    reqs = _requests(agent)
    steps = [6, 3, 9]  # requests of different lengths: rows leave at different steps
    want_h = [_alone_rollout(agent, e, m, k) for (e, m, _), k in zip(reqs, steps)]
    cfgs = [DecodeConfig(max_new_tokens=n) for n in (12, 5, 8)]
    want_tok = [_alone_decode(agent, e, m, c) for (e, m, _), c in zip(reqs, cfgs)]
    sched = StepScheduler(agent)
    fns = [lambda r=r, k=k: sched.merged_rollout(r[0], r[1], k) for r, k in zip(reqs, steps)]
    fns += [lambda r=r, c=c: sched.merged_decode(r[0], r[1], c) for r, c in zip(reqs, cfgs)]
    got = _concurrently(fns)
    for g, w in zip(got[:3], want_h):
        assert g.shape == w.shape and (g - w).abs().max() <= ATOL
    assert got[3:] == want_tok
    assert sched.num_steps < sum(steps) + sum(c.max_new_tokens for c in cfgs)  # steps were shared


def test_a_request_joining_mid_flight_and_prefix_reuse_keep_outputs(agents):
    agent = agents["gemma3"]
    reqs = _requests(agent, seed=1)
    long_cfg = DecodeConfig(max_new_tokens=24)
    want = [_alone_decode(agent, reqs[0][0], reqs[0][1], long_cfg),
            _alone_rollout(agent, reqs[1][0], reqs[1][1], 7), _alone_rollout(agent, reqs[2][0], reqs[2][1], 2)]
    sched = StepScheduler(agent, max_rows=3)  # the third request waits for free slots
    started = threading.Event()

    def first():
        started.set()
        return sched.merged_decode(reqs[0][0], reqs[0][1], long_cfg, prefix_ids=reqs[0][2])

    def later(i, k):
        started.wait(10)
        return sched.merged_rollout(reqs[i][0], reqs[i][1], k, prefix_ids=reqs[i][2])

    got = _concurrently([first, lambda: later(1, 7), lambda: later(2, 2)])
    assert got[0] == want[0]
    assert (got[1] - want[1]).abs().max() <= ATOL and (got[2] - want[2]).abs().max() <= ATOL


def test_close_ends_the_step_thread_after_the_requests_in_flight_and_a_later_request_restarts_it(agents):
    """A process that exits while the step thread is still inside a forward can abort in torch's shutdown
    (`jobs.bench.engine` at 64 in flight exited 134 in 3 of 5 runs); `close` waits for that thread to end."""
    agent = agents["llama"]
    reqs = _requests(agent, seed=2)
    want = _alone_rollout(agent, reqs[1][0], reqs[1][1], 5)
    sched = StepScheduler(agent)
    _concurrently([lambda: sched.merged_rollout(reqs[1][0], reqs[1][1], 5, prefix_ids=reqs[1][2]),
                   lambda: sched.merged_decode(reqs[0][0], reqs[0][1], DecodeConfig(max_new_tokens=6), prefix_ids=reqs[0][2])])
    thread = sched._thread
    assert thread is not None and thread.is_alive()  # it idles for 30 s after the last request otherwise
    sched.close(timeout_s=60)
    assert not thread.is_alive() and sched._thread is None
    got = sched.merged_rollout(reqs[1][0], reqs[1][1], 5, prefix_ids=reqs[1][2])  # a new thread serves it
    assert (got - want).abs().max() <= ATOL
    sched.close(timeout_s=60)
    assert sched._thread is None


PROMPTS = ["Question: what is 2 + 2?\nPlan: " + SLOT + "\nSolve it.",
           f"Question: {LONG}?\nPlan: " + SLOT + "\nSolve it carefully.", "Question: 3 * 3?\nPlan: " + SLOT,
           "Q: name a colour.\nPlan: " + SLOT + "\nAnswer briefly.", f"Q: {LONG[:70]}\nPlan: " + SLOT]


def _arrivals(agent, num: int, seed: int):
    """`num` requests of 1-3 rows over prompts of different lengths: rollouts (m 1-9) and decodes (budgets 1-14,
    one in four sampled), half with prefix ids, arriving 0-2 steps after the one before."""
    g = torch.Generator().manual_seed(seed)
    out, at = [], 0
    for i in range(num):
        rows = 1 + i % 3
        users = [PROMPTS[(i + r) % len(PROMPTS)] for r in range(rows)]
        e, m, prefix = agent.embed_batch_with_prefix(users, {SLOT: torch.randn(rows, 2 + i % 3, agent.hidden_size,
                                                                             generator=g)})
        prefix = prefix if i % 2 else None
        if i % 2 == 0:
            out.append(dict(at=at, kind="rollout", e=e, m=m, prefix=prefix, steps=1 + (i * 5) % 9))
        else:
            cfg = DecodeConfig(max_new_tokens=1 + (i * 7) % 14, do_sample=i % 4 == 3, temperature=1.0, seed=i)
            out.append(dict(at=at, kind="decode", e=e, m=m, prefix=prefix, cfg=cfg))
        at += int(torch.randint(0, 3, (1,), generator=g))
    return out


def _drive(sched, arrivals):
    """Submit each request at its step and run the scheduler step by step (no thread): deterministic arrivals."""
    futures, step, todo = [], 0, list(arrivals)
    while todo or sched._rows or sched._pending:
        while todo and todo[0]["at"] <= step:
            a = todo.pop(0)
            futures.append(sched.submit_rollout(a["e"], a["m"], a["steps"], prefix_ids=a["prefix"])
                           if a["kind"] == "rollout" else
                           sched.submit_decode(a["e"], a["m"], a["cfg"], prefix_ids=a["prefix"]))
        sched.run_once()
        step += 1
    return [f.result(timeout=0) for f in futures]


@pytest.mark.parametrize("family", list(TINY_FAMILIES))
def test_staggered_arrivals_mixed_rows_and_early_leavers_equal_the_unbatched_path(agents, family):
    """Requests arriving while others run, several in one step (prefilled together), rollout and decode rows in
    the same steps, rows leaving at EOS, their budget or their m-th step: each request's latents (1e-5) and
    tokens (greedy and sampled, from its own generator) equal its run alone."""
    agent = agents[family]
    arrivals = _arrivals(agent, 16, seed=3)
    want = [_alone_rollout(agent, a["e"], a["m"], a["steps"], a["prefix"]) if a["kind"] == "rollout"
            else _alone_decode(agent, a["e"], a["m"], a["cfg"], a["prefix"]) for a in arrivals]
    sched = StepScheduler(agent, threaded=False)
    got = _drive(sched, arrivals)
    for a, g, w in zip(arrivals, got, want):
        if a["kind"] == "rollout":
            assert g.shape == w.shape and (g - w).abs().max() <= ATOL
        else:
            assert g == w
    assert sched.num_prefills < len(arrivals)  # requests that arrived in the same step were prefilled together
    assert sched.rows_stepped > sched.num_steps  # rows shared steps
    assert not sched._rows and not sched._start


def test_the_shared_cache_is_reallocated_o_log_n_times_for_n_arrivals(agents):
    """One arrival per step, each staying 8-31 steps, prompts of different lengths: the cache grows by doubling
    (slots and columns) and otherwise compacts in place, so n = 96 arrivals cost at most log2(n) + 2
    reallocations (the earlier scheduler rebuilt it for nearly every arrival), and compactions stay rare."""
    agent = agents["qwen3"]
    n = 96
    prompts = [agent.embed_batch_with_prefix([p]) for p in ["Question: what is 2 + 2?", f"Question: {LONG}?",
                                                             "Q: 3 * 3?"]]
    want = {k: _alone_rollout(agent, *prompts[k][:2], 8 + k) for k in range(3)}
    sched = StepScheduler(agent, threaded=False)
    futures = []
    for i in range(n):
        e, m, _ = prompts[i % 3]
        futures.append((i, sched.submit_rollout(e, m, 8 + (i * 7) % 24)))
        sched.run_once()
    while sched.run_once():
        pass
    for i, f in futures:
        got = f.result(timeout=0)
        k = i % 3
        assert (got[:, :8 + k] - want[k][:, :8 + k]).abs().max() <= ATOL
    assert sched.num_prefills == n
    assert sched.num_rebuilds <= math.log2(n) + 2, sched.num_rebuilds
    assert sched.num_compactions <= sched.num_steps / 8, (sched.num_compactions, sched.num_steps)


@pytest.mark.parametrize("style", ["distillation", "sequential_light"])
def test_the_runner_gives_the_same_predictions_and_latents_with_continuous_batching(tiny_cache, style):
    """The main job's styles through in-process agents, batches of 3 questions of different lengths (padding):
    predictions, token counts, target NLLs and every rollout's latents (1e-5) with continuous batching on
    (the default) equal those with it off; then two batches at once (their calls merged) give the same
    predictions."""
    from recmas_ray.config.recursion import RecursionConfig
    from recmas_ray.engine.runner import run_batch
    from recmas_ray.system.launch import local_pool
    from recmas_ray.system.plan import plan_system

    cfg = RecursionConfig(method="recursive_mas", num_recursive_rounds=2, latent_steps=4,
                          decode=DecodeConfig(max_new_tokens=10))
    batches = [[f"Question {k}: what is {k} + {k + 1}?", f"Question {k}b: {LONG[:40 + 20 * k]} * 3?", "Q: 7?"]
               for k in range(2)]
    targets = ["4", "12", "7"]

    def run(on: bool, methods=("recursive_mas", "textmas", "single_agent")):
        plan = plan_system(style, preset="tiny", seed=5, continuous_batching=on)
        pool = local_pool(plan)
        assert all(s.agent.engine.continuous_batching == on for s in pool.services.values())
        latents = []
        for service in pool.services.values():
            rollout = service.agent.latent_rollout
            service.agent.latent_rollout = lambda *a, _r=rollout, **k: latents.append(_r(*a, **k)) or latents[-1]
        out = []
        for method in methods:
            c = dataclasses.replace(cfg, method=method)
            out += [[(r.prediction, r.num_text_tokens, r.nll) for r in run_batch(pool, plan.style, qs, ["math"] * 3,
                                                                               c, targets=targets)]
                    for qs in batches]
        return out, latents, pool, plan

    want, want_latents, _, _ = run(False)
    got, got_latents, pool, plan = run(True)
    assert [[p for p, _, _ in b] for b in got] == [[p for p, _, _ in b] for b in want]
    for g, w in zip(got, want):
        for (gp, gt, gn), (wp, wt, wn) in zip(g, w):
            assert gt == wt and abs(gn - wn) <= 1e-4
    assert len(got_latents) == len(want_latents) > 0
    assert all((g - w).abs().max() <= ATOL for g, w in zip(got_latents, want_latents))
    together = _concurrently([lambda qs=qs: [r.prediction for r in run_batch(pool, plan.style, qs, ["math"] * 3, cfg)]
                              for qs in batches])
    assert together == [[p for p, _, _ in b] for b in want[:2]]


def test_a_long_stream_compacts_the_cache_in_place_and_keeps_every_output(agents):
    """200 short requests, one arriving per step: the write column runs past the cache's width;
    each time the active rows' columns move back in place (compaction, no reallocation) and every request still
    gets its unbatched latents and tokens."""
    agent = agents["gemma3"]  # sliding-window layers: the window must survive the move
    prompts = [agent.embed_batch_with_prefix([p]) for p in ["Q: 3 * 3?", "Q: name a colour.", "Q: 2 + 2?"]]
    cfg = DecodeConfig(max_new_tokens=5)
    want = {k: (_alone_rollout(agent, *prompts[k][:2], 6), _alone_decode(agent, *prompts[k][:2], cfg))
            for k in range(3)}
    sched = StepScheduler(agent, threaded=False)
    futures = []
    for i in range(200):
        e, m, _ = prompts[i % 3]
        futures.append((i, sched.submit_rollout(e, m, 6) if i % 2 else sched.submit_decode(e, m, cfg)))
        sched.run_once()
    while sched.run_once():
        pass
    for i, f in futures:
        w_h, w_tok = want[i % 3]
        got = f.result(timeout=0)
        if i % 2:
            assert (got - w_h).abs().max() <= ATOL
        else:
            assert got == w_tok
    assert sched.num_compactions >= 1 and sched.num_rebuilds <= math.log2(200) + 2
    assert sched.column < sched._keys[0].shape[2] < 8 * 200  # the width stayed bounded by what rows need


def test_a_shut_down_pool_frees_its_models(tiny_cache):
    """After `LocalPool.shutdown` and dropping the services, no agent's model stays alive: the step thread that
    served the last call (and would wait 30 s for more) holds its agent only until shutdown ends it. The main
    job measures with in-process agents between trainings, which need that memory back."""
    plan = plan_system("distillation", preset="tiny", seed=3)
    pool = local_pool(plan)
    rc = RecursionConfig(method="recursive_mas", num_recursive_rounds=1, latent_steps=3,
                         decode=DecodeConfig(max_new_tokens=4))
    run_batch(pool, plan.style, ["What is x?", "What is y?"], ["qa", "qa"], rc)
    threads = [s.agent._scheduler._thread for s in pool.services.values()]
    assert any(t is not None and t.is_alive() for t in threads)  # the step threads wait for more work
    models = [weakref.ref(s.agent.model) for s in pool.services.values()]
    pool.shutdown()
    pool.services.clear()
    del pool, plan
    gc.collect()
    assert all(t is None or not t.is_alive() for t in threads)
    assert [m() for m in models] == [None] * len(models)
