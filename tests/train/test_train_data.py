"""Training data helpers: loading, role aliases, targets, teacher-forced prompts, up-front validation."""

import json

import pytest

from recmas_ray.styles import get_style
from recmas_ray.styles.deliberation import REFLECTOR_SLOT
from recmas_ray.train.synthetic import make_arithmetic_dataset
from recmas_ray.styles import ROLE_ALIASES, canonical_role
from recmas_ray.train.data import load_rows, role_examples, role_target, teacher_prompt, validate_rows

SEQ = get_style("sequential")


@pytest.fixture(scope="module")
def rows():
    return make_arithmetic_dataset(6, seed=3)


def test_load_rows_jsonl_json_field_and_synthetic(tmp_path, rows):
    jl = tmp_path / "rows.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    wrapped = tmp_path / "rows.json"
    wrapped.write_text(json.dumps({"data": rows}))
    assert load_rows(str(jl)) == rows
    assert load_rows(str(wrapped), "data") == rows
    with pytest.raises(ValueError, match="dataset_json_field"):
        load_rows(str(wrapped))
    with pytest.raises(ValueError, match="no field 'rows'"):
        load_rows(str(wrapped), "rows")
    with pytest.raises(ValueError, match="does not exist"):
        load_rows(str(tmp_path / "missing.jsonl"))
    assert load_rows("synthetic:5") == make_arithmetic_dataset(5, seed=0)
    with pytest.raises(ValueError, match="synthetic:N"):
        load_rows("synthetic:many")


def test_role_aliases_of_the_original_tool():
    for alias, role in ROLE_ALIASES.items():
        style = next(get_style(s) for s in ("sequential", "mixture", "distillation", "deliberation")
                     if role in get_style(s).roles)
        assert canonical_role(style, alias) == role
        assert canonical_role(style, role) == role
    with pytest.raises(ValueError, match=r"unknown role 'judge'.*planner"):
        canonical_role(SEQ, "judge")
    with pytest.raises(ValueError, match="unknown role 'hie_math_expert'"):  # an alias of another style
        canonical_role(SEQ, "hie_math_expert")


def test_role_target_first_present_field_wins():
    summ = get_style("mixture")
    assert role_target(summ, "summarizer", {"summary": "S", "answer": "A"}) == "S"
    assert role_target(summ, "summarizer", {"hie_summarizer": " ", "answer": "A"}) == "A"  # empty counts as absent
    with pytest.raises(ValueError, match=r"accepted fields \['refined_plan'\]"):
        role_target(SEQ, "critic", {"plan": "p"})


def test_teacher_prompts_put_upstream_gold_text_in_slots(rows):
    row = rows[0]
    critic = teacher_prompt(SEQ, "critic", row, "math")
    assert row["plan"] in critic and row["question"] in critic and "<<" not in critic
    solver = teacher_prompt(SEQ, "solver", row, "math")
    assert row["refined_plan"] in solver and "\\boxed{}" in solver
    summ = teacher_prompt(get_style("mixture"), "summarizer", row, "math")
    assert all(row[f"hie_{e}_expert"] in summ for e in ("math", "code", "science"))
    learner = teacher_prompt(get_style("distillation"), "learner", row, "math")
    assert row["distill_expert"] in learner
    # Deliberation keeps the literal marker (teacher_text_in_slots is False), as the reference does.
    tool = teacher_prompt(get_style("deliberation"), "toolcaller", row, "math")
    assert REFLECTOR_SLOT in tool and row["deliberation_reflector"] not in tool
    planner = teacher_prompt(SEQ, "planner", row, "code")
    assert "Task:" in planner
    examples = role_examples(rows, SEQ, "solver", "math")
    assert examples[2] == (teacher_prompt(SEQ, "solver", rows[2], "math"), rows[2]["answer"])


def test_validate_rows_names_row_index_and_fields(rows):
    validate_rows(rows, SEQ, SEQ.roles)
    bad = [dict(r) for r in rows]
    del bad[3]["refined_plan"]
    with pytest.raises(ValueError, match=r"row 3: .*role critic.*'refined_plan' missing"):
        validate_rows(bad, SEQ, ["critic"])
    # the solver's prompt needs the critic's gold text as well
    with pytest.raises(ValueError, match=r"row 3: .*role critic"):
        validate_rows(bad, SEQ, ["solver"])
    validate_rows(bad, SEQ, ["planner"])
    bad[1]["question"] = ""
    with pytest.raises(ValueError, match="row 1: field 'question' is empty \\(\"\"\\); expected the question text"):
        validate_rows(bad, SEQ, ["planner"])
    with pytest.raises(ValueError, match="no rows"):
        validate_rows([], SEQ, ["planner"])
