"""The hidden-operand task: only the planner's rendered prompt holds the fact, in inference (runner) and in
training (teacher prompts, outer samples) through the one renderer; the gold plan states it early; the rows
are distinct and the train/held-out split sees the fact; the dataset names are accepted by the configs."""

import re

import pytest

from recmas_ray.train.config import OuterTrainConfig
from recmas_ray.styles import build_schedule, get_style, render_prompt, render_single_agent_prompt
from recmas_ray.styles.role_context import question_for_role, split_role_context, with_role_context
from recmas_ray.train.data import load_rows, question_text, teacher_prompt
from recmas_ray.train.synthetic import check_disjoint, make_arithmetic_dataset, make_hidden_operand_dataset
from recmas_ray.train.synthetic_hidden import HIDDEN_MAX_ROWS

STYLE = get_style("sequential_light")


@pytest.fixture(scope="module")
def rows():
    return make_hidden_operand_dataset(64, seed=3)


def fact_of(row):
    return f"{row['question'].split()[2]} = {row['facts']['fact']}."


def test_rows_are_distinct_deterministic_and_consistent(rows):
    assert rows == make_hidden_operand_dataset(64, seed=3)
    assert len({r["full_question"] for r in rows}) == 64
    for r in rows:
        x, b, op = r["facts"]["fact"], r["facts"]["operand"], r["facts"]["operation"]
        value = x + b if op == "+" else x - b
        assert r["gold"] == str(value) and r["answer"] == f"{x} {op} {b} = {value}. \\boxed{{{value}}}"
        assert r["role_context"]["planner"] == fact_of(r) and r["full_question"] == f"{fact_of(r)} {r['question']}"
        for shared in (r["question"], r["refined_plan"]):  # what critic and solver read or are taught: b only
            assert re.findall(r"\d+", shared) == [str(b)], shared
    assert make_arithmetic_dataset(5, seed=1, difficulty="hidden") == make_hidden_operand_dataset(5, seed=1)


def test_recall_rows_ask_for_the_fact_itself_and_only_the_planner_holds_it():
    num_train = HIDDEN_MAX_ROWS["recall"]["train"]  # every training fact (train.splits)
    rows = make_hidden_operand_dataset(num_train, seed=2, question_kind="recall")
    assert len({r["full_question"] for r in rows}) == num_train and rows[:5] == make_hidden_operand_dataset(
        5, seed=2, question_kind="recall")
    for r in rows[:64]:
        var, x = r["question"][len("What is "):-1], r["facts"]["fact"]
        assert r["facts"] == {"fact": x} and 10 <= x <= 99 and r["gold"] == str(x)
        assert r["answer"] == f"{var} = {x}. \\boxed{{{x}}}" and r["role_context"]["planner"] == f"{var} = {x}."
        assert r["plan"].startswith(f"{var} = {x}.")  # the fact within the first K latents
        for shared in (r["question"], r["refined_plan"]):  # what critic and solver read or are taught
            assert not re.findall(r"\d", shared.replace("\\boxed{}", "")), shared
    assert load_rows("synthetic_recall:7") == make_arithmetic_dataset(7, seed=0, difficulty="hidden_recall")
    with pytest.raises(ValueError, match=f"at most {num_train} distinct hidden_recall rows in the train split"):
        make_hidden_operand_dataset(num_train + 1, question_kind="recall")
    with pytest.raises(ValueError, match="question_kind 'sum'"):
        make_hidden_operand_dataset(3, question_kind="sum")


@pytest.mark.parametrize("task", ["qa", "math"])
def test_only_the_planner_prompt_holds_the_fact_at_inference_and_in_training(rows, task):
    for row in rows[:8]:
        q, fact = question_text(row), fact_of(row)
        for step in build_schedule(STYLE, 2):
            text = render_prompt(STYLE, step.role, step.variant, task, q)
            assert (fact in text) == (step.role == "planner"), (step.role, text)
            assert "role_context" not in text and row["question"] in text
            # inner-loop prompts: upstream gold texts fill the slots (the plan states the fact), the question does not
            taught = teacher_prompt(STYLE, step.role, row, task, variant=step.variant).replace(row["plan"], "")
            assert (fact in taught) == (step.role == "planner"), (step.role, taught)
        assert fact not in render_single_agent_prompt(STYLE, task, q)  # the floor: the decoder alone
        assert fact in render_single_agent_prompt(STYLE, task, row["full_question"])  # the ceiling


def test_runner_renders_each_role_its_own_question(rows, tiny_cache):
    """run_batch on tiny agents: the planner's prompts hold the fact, the critic's and solver's never do."""
    from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
    from recmas_ray.engine.pool import LocalPool
    from recmas_ray.engine.runner import run_batch
    from recmas_ray.system.launch import local_pool
    from recmas_ray.system.plan import plan_system

    seen = []

    class Recording(LocalPool):
        def rollout(self, role, users, *a):
            seen.extend((role, u) for u in users)
            return super().rollout(role, users, *a)

        def decode(self, role, users, *a):
            seen.extend((role, u) for u in users)
            return super().decode(role, users, *a)

    plan = plan_system("sequential_light", preset="tiny", seed=0, task="qa")
    pool = local_pool(plan, pool_cls=Recording)
    batch = rows[:2]
    for method in ("recursive_mas", "textmas"):
        run_batch(pool, plan.style, [question_text(r) for r in batch], ["qa"] * 2,
                  RecursionConfig(method=method, num_recursive_rounds=2, latent_steps=2,
                                  decode=DecodeConfig(max_new_tokens=2)))
    assert {r for r, _ in seen} == {"planner", "critic", "solver"}
    for role, user in seen:
        assert any(fact_of(r) in user for r in batch) == (role == "planner"), (role, user)


def test_gold_plan_states_the_fact_within_the_first_k_tokens(rows, tiny_cache):
    import torch

    from recmas_ray.models.loader import load_frozen_model

    for family in ("qwen3", "gemma3"):
        _, tok = load_frozen_model(f"tiny:{family}", dtype=torch.float32)
        for r in rows[:16]:
            first8 = tok.decode(tok(r["plan"], add_special_tokens=False).input_ids[:8])
            assert str(r["facts"]["fact"]) in first8, (family, first8)


def test_role_context_round_trip_and_bad_markers():
    q = with_role_context("What is x - 8?", {"planner": "x = 17."})
    assert split_role_context(q) == ({"planner": "x = 17."}, "What is x - 8?")
    assert question_for_role(q, "planner") == "x = 17. What is x - 8?"
    assert question_for_role(q, "solver") == "What is x - 8?"
    assert with_role_context("plain", None) == "plain" and question_for_role("plain", "planner") == "plain"
    with pytest.raises(ValueError, match="malformed role context"):
        question_for_role("[[role_context {oops]]\nWhat?", "planner")
    with pytest.raises(ValueError, match="non-empty text"):
        with_role_context("What?", {"planner": ""})


def test_split_sees_the_fact_and_dataset_names_load(rows):
    a = {"question": "What is x - 8?", "role_context": {"planner": "x = 17."}}
    b = {"question": "What is x - 8?", "role_context": {"planner": "x = 18."}}
    check_disjoint([a], [b])  # the same masked text with another fact is another question
    with pytest.raises(ValueError, match="also appear"):
        check_disjoint([a], [dict(a)])
    got = load_rows("synthetic_hidden:12")
    assert len(got) == 12 and all("role_context" in r for r in got)
    OuterTrainConfig(dataset_name="synthetic_hidden:12", eval_dataset="synthetic_hidden").validate()
    with pytest.raises(ValueError, match="synthetic_hidden:N"):
        OuterTrainConfig(dataset_name="synthetic_hidden:x").validate()


def test_local_question_files_carry_the_role_context(tmp_path, rows):
    from recmas_ray.tasks.benchmarks import load_benchmark
    from recmas_ray.train.synthetic import write_jsonl

    items = load_benchmark(str(write_jsonl(rows[:4], tmp_path / "heldout.jsonl")))
    for item, row in zip(items, rows):
        assert question_for_role(item["question"], "planner") == row["full_question"]
        assert question_for_role(item["question"], "solver") == row["question"]
