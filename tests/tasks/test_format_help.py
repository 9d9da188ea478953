"""Format help reaches every method's prompt in the same words: the single agent's, each role's in a
multi-agent style, and the per-role views of a hidden-fact question."""

import pytest

from recmas_ray.styles import get_style, render_prompt, render_single_agent_prompt
from recmas_ray.styles.role_context import question_for_role, with_role_context
from recmas_ray.tasks.math import FORMAT_HELP_MODES, apply_format_help, format_help_text, with_format_help


@pytest.mark.parametrize("mode", FORMAT_HELP_MODES)
def test_every_role_and_the_single_agent_read_the_same_help(mode):
    style = get_style("sequential_light")
    question = with_format_help(with_role_context("What is x?", {"planner": "x = 65."}), mode)
    help_text = format_help_text(mode)
    prompts = [render_single_agent_prompt(style, "qa", question)]
    prompts += [render_prompt(style, role, "first", "qa", question) for role in ("planner",)]
    assert all(help_text in p for p in prompts)
    assert question_for_role(question, "planner").startswith("x = 65. What is x?")  # the fact stays first
    assert "x = 65" not in question_for_role(question, "solver")  # and stays the planner's alone
    assert (help_text == "") == (mode == "none")


def test_apply_format_help_covers_items_and_views_without_touching_inputs():
    items = [{"doc_id": "a", "question": "What is x?"}]
    views = {"a": {"planner": "x = 3. What is x?"}}
    got_items, got_views = apply_format_help(items, "few_shot", views)
    assert items[0]["question"] == "What is x?" and views["a"]["planner"] == "x = 3. What is x?"
    assert got_items[0]["question"].endswith(format_help_text("few_shot"))
    assert got_views["a"]["planner"].startswith("x = 3. What is x?\n\n") and "\\boxed{12}" in got_views["a"]["planner"]
    with pytest.raises(ValueError, match="format help 'always'"):
        apply_format_help(items, "always")
