"""Styles are declarations; one schedule builder unrolls them all; a new style needs no runner edit."""

import pytest

from recmas_ray.styles import STYLES, build_schedule, get_style, render_prompt
from recmas_ray.styles.base import RolePrompts, StyleSpec


@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_sequential_schedule_counts(rounds):
    steps = build_schedule(get_style("sequential_light"), rounds)
    rollouts = {r: sum(1 for s in steps if s.role == r and s.outputs) for r in ("planner", "critic", "solver")}
    assert rollouts == {"planner": rounds, "critic": rounds, "solver": rounds - 1}
    decodes = [s for s in steps if s.decode]
    assert [(s.role, s.round) for s in decodes] == [("solver", rounds)]
    fb = [s for s in steps if s.role == "planner" and s.round > 1]
    assert all(s.variant == "feedback" and s.inputs == (("<<LATENT_FEEDBACK_SLOT>>", "solver->planner"),) for s in fb)


def test_mixture_fan_in_and_fan_out():
    steps = build_schedule(get_style("mixture"), 2)
    summ = [s for s in steps if s.role == "summarizer"]
    assert len(summ[0].inputs) == 3 and set(summ[0].outputs) == {"summarizer->math", "summarizer->code",
                                                                 "summarizer->science"}
    assert summ[-1].decode and summ[-1].outputs == ()
    discard = build_schedule(get_style("mixture"), 3, decode_every_round=True)
    assert sum(s.discard_decode for s in discard) == 2


def test_every_style_names_edges_by_role_pair_and_prompts_hold_their_slots():
    for name in STYLES:
        style = get_style(name)  # validate() checks each slot appears in its prompts
        assert all("->" in e for e in style.edges)
        for step in build_schedule(style, 3):
            for task in ("math", "choice", "code"):
                text = render_prompt(style, step.role, step.variant, task, "Q?")
                assert all(marker in text for marker, _ in step.inputs)


def test_prompt_missing_its_slot_is_rejected():
    bad = StyleSpec(name="bad", stages=(("a",), ("b",)), forward_edges=("a->b",), feedback_edges=(), decoder="b",
                    slots={"b": {"<<X_SLOT>>": "a->b"}}, prompts={"a": RolePrompts(base={"math": "{question}"}),
                                                                "b": RolePrompts(base={"math": "no slot {question}"})},
                    target_fields={"a": ("plan",), "b": ("answer",)})
    with pytest.raises(ValueError, match="missing its slot <<X_SLOT>>"):
        bad.validate()


def test_unknown_style_and_bad_rounds():
    with pytest.raises(ValueError, match="unknown style 'seq'"):
        get_style("seq")
    with pytest.raises(ValueError, match="num_recursive_rounds must be >= 1"):
        build_schedule(get_style("mixture"), 0)
