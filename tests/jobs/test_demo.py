"""The demo: held-out split, the engine's NLL, latent ablation and scoring on tiny models (the job itself:
test_demo_job.py)."""

import json
import math

import pytest

from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from jobs.experiments.demo.config import DemoConfig
from recmas_ray.train.synthetic import check_disjoint, make_arithmetic_dataset

QUESTIONS = ["Mia has 3 apples and gets 4 more. How many apples does Mia have now?",
             "Leo has 9 pens and gives away 2. How many pens does Leo have left?",
             "Ava has 2 bags with 5 cards in each bag. How many cards does Ava have?"]
TARGETS = ["3 + 4 = 7.\nThe answer is \\boxed{7}.", "9 - 2 = 7.\nThe answer is \\boxed{7}.",
           "2 * 5 = 10.\nThe answer is \\boxed{10}."]


# ----------------------------------------------------------------------------- data
def test_heldout_split_has_no_training_question(tmp_path):
    from jobs.experiments.demo.pipeline import make_data

    cfg = DemoConfig(num_train=200, num_eval=64, output_path=str(tmp_path))
    train_file, eval_file, heldout = make_data(cfg, tmp_path)
    train = [json.loads(line) for line in train_file.read_text().splitlines()]
    assert len(heldout) == 64 and len(train) == 200
    assert not {r["question"] for r in train} & {r["question"] for r in heldout}
    with pytest.raises(ValueError, match="held-out question"):
        check_disjoint(train, [dict(heldout[0], question="  " + train[3]["question"].upper())])


def test_heldout_items_grade_against_the_final_number(tmp_path):
    # the held-out rows carry a worked solution in `answer` and the number in `gold`: the grader must get
    # the number (a regression once graded every prediction against the whole solution: 0% for everyone)
    from jobs.experiments.demo.pipeline import make_data
    from recmas_ray.tasks.benchmarks import load_benchmark
    from recmas_ray.tasks import grade

    cfg = DemoConfig(num_train=8, num_eval=16, output_path=str(tmp_path))
    _, eval_file, heldout = make_data(cfg, tmp_path)
    items = load_benchmark(str(eval_file), task_type=cfg.task)
    assert [i["gold"] for i in items] == [r["gold"] for r in heldout]
    for item, row in zip(items, heldout):
        assert grade(cfg.task, item, f"{row['question']} = \\boxed{{{row['gold']}}}").correct
        assert not grade(cfg.task, item, f"\\boxed{{{int(row['gold']) + 1}}}").correct


def test_one_step_family_is_distinct_checked_and_short():
    rows = make_arithmetic_dataset(300, seed=1, difficulty="one_step")
    assert len({r["question"] for r in rows}) == 300
    assert {r["template"] for r in rows} == {"more", "fewer", "groups"}
    for r in rows:
        assert r["answer"].endswith(f"\\boxed{{{r['gold']}}}.") and len(r["plan"].splitlines()) == 1
    check_disjoint(rows, make_arithmetic_dataset(64, seed=1, difficulty="one_step", split="test"))
    with pytest.raises(ValueError, match="difficulty"):
        make_arithmetic_dataset(3, difficulty="hard")


def test_arith_family_the_demo_default():
    from jobs.experiments.demo.config import full

    rows = (make_arithmetic_dataset(full().num_train, seed=0, difficulty="arith") +
            make_arithmetic_dataset(full().num_eval, seed=0, difficulty="arith", split="test"))
    assert len({r["question"] for r in rows}) == len(rows)
    for r in rows:
        a, op, b = r["question"].removeprefix("What is ").removesuffix("?").split()
        assert int(r["gold"]) == (int(a) + int(b) if op == "+" else int(a) - int(b)) > 0
        assert int(a) <= 20 and int(b) <= 9


# ----------------------------------------------------------------------------- engine additions
@pytest.fixture(scope="module")
def seq_pool(tiny_cache):
    from recmas_ray.system.launch import local_pool
    from recmas_ray.system.plan import plan_system

    plan = plan_system("sequential_light", preset="tiny", seed=0)
    return plan, local_pool(plan)


def _rc(method, ablation="none"):
    return RecursionConfig(method=method, num_recursive_rounds=2, latent_steps=3, latent_ablation=ablation,
                           decode=DecodeConfig(max_new_tokens=5))


@pytest.mark.parametrize("method", ["recursive_mas", "recursive_textmas", "textmas", "single_agent"])
def test_scoring_leaves_the_run_unchanged_and_gives_finite_nll(seq_pool, method):
    from recmas_ray.engine.runner import run_batch

    plan, pool = seq_pool
    plain = run_batch(pool, plan.style, QUESTIONS, ["math"] * 3, _rc(method))
    scored = run_batch(pool, plan.style, QUESTIONS, ["math"] * 3, _rc(method), targets=TARGETS)
    strip = [[{k: v for k, v in t.items() if k != "seconds"} for t in r.trace] for r in plain]
    assert [r.prediction for r in scored] == [r.prediction for r in plain]
    assert [r.num_text_tokens for r in scored] == [r.num_text_tokens for r in plain]
    assert [[{k: v for k, v in t.items() if k != "seconds"} for t in r.trace] for r in scored] == strip
    assert all(r.nll is None for r in plain)
    assert all(r.nll is not None and math.isfinite(r.nll) and r.nll > 0 for r in scored)


def test_nll_matches_a_direct_teacher_forced_forward(seq_pool):
    import torch

    from recmas_ray.engine.runner import run_batch
    from recmas_ray.styles import render_single_agent_prompt

    plan, pool = seq_pool
    agent = pool.services["solver"].agent
    res = run_batch(pool, plan.style, QUESTIONS[:1], ["math"], _rc("single_agent"), targets=TARGETS[:1])
    e_LD, ids_L, asst_L = agent.embed_teacher_forced(render_single_agent_prompt(plan.style, "math", QUESTIONS[0]),
                                                     None, TARGETS[0])
    with torch.no_grad():
        logits = agent.logits(agent.forward_hidden(e_LD[None], torch.ones(1, len(ids_L), dtype=torch.long)))[0]
    pos = asst_L.nonzero()[:, 0]
    expect = torch.nn.functional.cross_entropy(logits[pos - 1].float(), ids_L[pos]).item()
    assert res[0].nll == pytest.approx(expect, rel=1e-4, abs=1e-4)


def test_latent_ablation_changes_what_the_decoder_sees(seq_pool):
    from recmas_ray.engine.runner import run_batch

    plan, pool = seq_pool
    nll = {a: [r.nll for r in run_batch(pool, plan.style, QUESTIONS, ["math"] * 3, _rc("recursive_mas", a),
                                        targets=TARGETS)] for a in ("none", "shuffle", "zero")}
    assert nll["shuffle"] != nll["none"] and nll["zero"] != nll["none"]
    # text methods receive no latents: the ablation setting cannot change them
    text = [run_batch(pool, plan.style, QUESTIONS, ["math"] * 3, _rc("textmas", a), targets=TARGETS)[0].nll
            for a in ("none", "zero")]
    assert text[0] == text[1]
    with pytest.raises(ValueError, match="latent_ablation"):
        run_batch(pool, plan.style, QUESTIONS, ["math"] * 3, _rc("recursive_mas", "reverse"))


def test_set_links_swaps_weights_in_place(seq_pool):
    from recmas_ray.system.plan import plan_system

    plan, pool = seq_pool
    svc = pool.services["planner"]
    other = plan_system("sequential_light", preset="tiny", seed=7)
    model = svc.agent.model
    before = {k: v.clone() for k, v in svc.agent.inner_link.state_dict().items()}
    svc.set_links(*other.service_args("planner")[1:])
    after = svc.agent.inner_link.state_dict()
    assert svc.agent.model is model and any((before[k] != after[k]).any() for k in before)
    assert set(svc.agent.outer_links) == {"planner->critic"}
    svc.set_links(*plan.service_args("planner")[1:])  # back, for the other tests of this module
    assert all((before[k] == v).all() for k, v in svc.agent.inner_link.state_dict().items())


def test_capture_hook_sees_messages_and_the_decoders_input(seq_pool):
    import torch

    from recmas_ray.engine.runner import run_batch

    plan, pool = seq_pool
    events = {a: [] for a in ("none", "shuffle")}
    for a in events:
        run_batch(pool, plan.style, QUESTIONS, ["math"] * 3, _rc("recursive_mas", a), capture=events[a].append)
    msgs = [(e["edge"], e["round"]) for e in events["none"] if e["kind"] == "message"]
    assert msgs == [("planner->critic", 1), ("critic->solver", 1), ("solver->planner", 1), ("planner->critic", 2),
                    ("critic->solver", 2)]
    last = [e for e in events["none"] if e["kind"] == "message"][-1]["message"]
    (inp,) = [e for e in events["none"] if e["kind"] == "decoder_input"]
    assert inp["role"] == "solver" and torch.equal(inp["latents"][0], last.to(inp["latents"][0].dtype))
    (shuffled,) = [e for e in events["shuffle"] if e["kind"] == "decoder_input"]
    shuffled_last = [e for e in events["shuffle"] if e["kind"] == "message"][-1]["message"]
    assert torch.equal(shuffled["latents"][0], torch.roll(shuffled_last, -1, 0))  # what the decoder received


def test_role_questions_reach_only_the_named_role(seq_pool):
    from recmas_ray.engine.runner import run_batch

    plan, pool = seq_pool
    views = [{"planner": f"x = {7 + i}. {q}"} for i, q in enumerate(QUESTIONS)]
    got = []
    run_batch(pool, plan.style, QUESTIONS, ["math"] * 3, _rc("recursive_mas"), role_questions=views, capture=got.append)
    plain = []
    run_batch(pool, plan.style, QUESTIONS, ["math"] * 3, _rc("recursive_mas"), capture=plain.append)
    first = [e["message"] for e in got if e["kind"] == "message"][0]
    assert not (first == [e["message"] for e in plain if e["kind"] == "message"][0]).all()  # the planner saw more
    (inp,) = [e for e in got if e["kind"] == "decoder_input"]
    assert all("x = " not in u for u in inp["users"])  # the solver did not
    with pytest.raises(ValueError, match="role_questions"):
        run_batch(pool, plan.style, QUESTIONS, ["math"] * 3, _rc("recursive_mas"), role_questions=views[:1])


def test_per_token_nll_averages_to_the_rows_nll(seq_pool):
    from recmas_ray.styles import render_single_agent_prompt

    plan, pool = seq_pool
    agent = pool.services["solver"].agent
    users = [render_single_agent_prompt(plan.style, "math", q) for q in QUESTIONS]
    means = agent.target_nll(users, None, TARGETS)
    tokens = agent.target_nll(users, None, TARGETS, per_token=True)
    for mean, tok, target in zip(means, tokens, TARGETS):
        assert sum(tok) / len(tok) == pytest.approx(mean, rel=1e-5)
        offsets = agent.target_token_offsets(target)
        assert len(offsets) == len(tok) and "".join(target[a:b] for a, b in offsets if b <= len(target)) == target


# ----------------------------------------------------------------------------- the report's figures
