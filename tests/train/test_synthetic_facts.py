"""Hidden-fact tasks (`train.synthetic_facts`): who is told what, and a held-out split whose values never occur
in training."""

import pytest

from recmas_ray.train.synthetic_facts import FACT_TASKS, TASK_STYLES, fact_values_of, make_fact_dataset, split_by_value


@pytest.mark.parametrize("task", FACT_TASKS)
def test_only_upstream_roles_are_told_and_the_gold_states_the_asked_fact(task):
    for style in TASK_STYLES[task]:
        rows = make_fact_dataset(task, style, 40, seed=1)
        assert len({r["full_question"] for r in rows}) == 40
        for r in rows:
            told = " ".join(r["role_context"].values())
            assert str(r["facts"]["fact"]) in told
            if task == "choose":  # the decoder sees the fact as one of two different candidates
                assert r["question"].split(" is ")[1].split(".")[0].split(" or ") in (
                    [str(r["facts"]["fact"]), r["question"].split(" or ")[1].split(".")[0]],
                    [r["question"].split(" is ")[1].split(" or ")[0], str(r["facts"]["fact"])])
                assert len(set(r["question"].split(" is ")[1].split(".")[0].split(" or "))) == 2
            else:
                assert str(r["facts"]["fact"]) not in r["question"]
            assert not {"solver", "learner", "summarizer", "toolcaller"} & set(r["role_context"])
            assert r["answer"].endswith(f"\\boxed{{{r['gold']}}}")
            if task != "compare":
                assert r["gold"] == str(r["facts"]["fact"])
            else:
                c = int(r["question"].split("than ")[1].split("?")[0])
                assert r["gold"] == ("yes" if r["facts"]["fact"] > c else "no")


def test_two_fact_and_mixture_tell_different_roles_different_letters():
    for task, style, roles in (("two_fact", "sequential_light", {"planner", "critic"}),
                               ("mixture", "mixture", {"math", "code", "science"})):
        for r in make_fact_dataset(task, style, 30, seed=2):
            assert set(r["role_context"]) == roles
            letters = [t.split(" =")[0] for t in r["role_context"].values()]
            assert len(set(letters)) == len(letters)
            asked = r["question"].split("is ")[1].rstrip("?")
            assert r["role_context"][r["facts"]["asked_role"]].startswith(f"{asked} = {r['facts']['fact']}.")


@pytest.mark.parametrize("task,style", [("recall", "distillation"), ("two_fact", "sequential_light"),
                                        ("mixture", "mixture")])
def test_unseen_values_never_occur_in_training(task, style):
    train, seen, unseen = split_by_value(task, style, num_train=300, num_seen=40, num_unseen=40, seed=3)
    train_values = set().union(*map(fact_values_of, train))
    assert (len(train), len(seen), len(unseen)) == (300, 40, 40)
    assert not train_values & set().union(*map(fact_values_of, unseen))
    assert set().union(*map(fact_values_of, seen)) <= train_values
    assert not {r["full_question"] for r in train} & {r["full_question"] for r in seen + unseen}
    assert split_by_value(task, style, num_train=300, num_seen=40, num_unseen=40, seed=3) == (train, seen, unseen)


def test_a_task_outside_its_styles_is_refused():
    with pytest.raises(ValueError, match="does not apply"):
        make_fact_dataset("two_fact", "distillation", 4)


@pytest.mark.parametrize("style", ["distillation", "sequential_light"])
def test_upstream_gold_texts_state_the_asked_fact_first(style):
    """An agent's latent rollout walks the first tokens of its gold form (the inner link is trained on them):
    the told first stage and the two-hop critic open with "x = 65." so the value lies within a few latent steps."""
    from recmas_ray.train.synthetic_facts import make_fact_dataset

    for row in make_fact_dataset("recall", style, 20, seed=3):
        fact = f"{row['answer'].split('.')[0]}."  # "x = 65."
        upstream = ["distill_expert"] if style == "distillation" else ["plan", "refined_plan"]
        for name in upstream:
            assert row[name].startswith(fact), (name, row[name], fact)


def test_choose_puts_the_fact_first_or_second_and_unseen_rows_show_no_seen_value():
    import re

    train, seen, unseen = split_by_value("choose", "distillation", num_train=200, num_seen=20, num_unseen=40, seed=4)
    first = [r["question"].split(" is ")[1].startswith(f"{r['facts']['fact']} ") for r in train]
    assert 0.3 < sum(first) / len(first) < 0.7  # a decoder that always copies one position gets about half
    train_values = {int(v) for r in train for v in re.findall(r"\d+", r["full_question"])}
    assert not train_values & {int(v) for r in unseen for v in re.findall(r"\d+", r["full_question"])}
