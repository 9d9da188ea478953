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


# ----------------------------------------------------------------------------- prompt sets as data

@pytest.mark.parametrize("ext", ["yaml", "json"])
def test_prompt_set_file_round_trips_to_identical_prompts(tmp_path, ext):
    from recmas_ray.styles.prompts import dump_prompt_set, load_prompt_set, prompt_set_hash

    for name in STYLES:
        style = get_style(name)
        back = load_prompt_set(dump_prompt_set(style, tmp_path / f"{name}.{ext}"), style)
        assert prompt_set_hash(back) == prompt_set_hash(style)
        for step in build_schedule(style, 3):
            for task in ("math", "choice", "code", "qa"):
                assert render_prompt(back, step.role, step.variant, task, "Q?") == \
                    render_prompt(style, step.role, step.variant, task, "Q?")
        assert back.system_prompt == style.system_prompt


def _edited(tmp_path, edit):
    import yaml

    from recmas_ray.styles.prompts import dump_prompt_set

    path = dump_prompt_set(get_style("sequential_light"), tmp_path / "p.yaml")
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["roles"]["critic"]["base"].update(
        math=d["roles"]["critic"]["base"]["math"].replace("<<LATENT_PLANNER_SLOT>>", "")),
     "role critic, variant base, task math: missing slot <<LATENT_PLANNER_SLOT>>"),
    (lambda d: d["roles"]["planner"]["base"].update(code="{question} <<LATENT_FEEDBACK_SLOT>>"),
     "role planner, variant base, task code: unexpected slot <<LATENT_FEEDBACK_SLOT>>"),
    (lambda d: d["roles"]["planner"].pop("feedback"), r"role planner: variants \['base'\]"),
    (lambda d: d["roles"].pop("solver"), r"missing \['solver'\]"),
    (lambda d: d["roles"]["solver"]["base"].update(proof="{question}"), "task proof: unknown task type"),
])
def test_bad_prompt_set_names_role_variant_and_task(tmp_path, edit, message):
    from recmas_ray.styles.prompts import load_prompt_set

    with pytest.raises(ValueError, match=message):
        load_prompt_set(_edited(tmp_path, edit), get_style("sequential_light"))


def test_edited_prompt_set_changes_prompts_and_hash(tmp_path):
    from recmas_ray.styles.prompts import load_prompt_set, prompt_set_hash

    style = get_style("sequential_light")
    path = _edited(tmp_path, lambda d: d["roles"]["solver"]["base"].update(math="Solve: <<LATENT_REFINED_SLOT>> {question}"))
    back = load_prompt_set(path, style)
    assert render_prompt(back, "solver", "base", "math", "Q?") == "Solve: <<LATENT_REFINED_SLOT>> Q?"
    assert prompt_set_hash(back) != prompt_set_hash(style)


def test_interface_line_follows_the_question():
    from recmas_ray.styles import question_with_interface

    style = get_style("sequential_light")
    q = question_with_interface(style, "Square x.", {"type": "functional", "fn_name": "square"})
    assert q == "Square x.\n\nInterface: implement and return the function `square` only."
    assert "standard input" in question_with_interface(style, "Sum.", {"type": "stdin", "fn_name": None})
    assert question_with_interface(style, "2+2?", None) == "2+2?"
    assert "`square`" in render_prompt(style, "solver", "base", "code", q)
    with pytest.raises(ValueError, match="needs its fn_name"):
        question_with_interface(style, "x", {"type": "functional"})


def test_prompt_set_round_trip_gives_identical_greedy_predictions(tmp_path, tiny_cache, question_file):
    """Default prompts written to a file and loaded back: same predictions on the tiny models (local backend)."""
    import glob
    import json

    from jobs import run as run_job
    from recmas_ray.styles.prompts import dump_prompt_set

    path = dump_prompt_set(get_style("sequential_light"), tmp_path / "default.yaml")
    preds = {}
    for name, extra in (("builtin", []), ("file", ["--prompt_set", str(path)])):
        out = tmp_path / name
        argv = ["--style", "sequential_light", "--preset", "tiny", "--dataset", str(question_file), "--backend",
                "local", "--num_recursive_rounds", "2", "--latent_steps", "3", "--max_new_tokens", "6",
                "--num_samples", "2", "--output_path", str(out), "--no_progress", *extra]
        assert run_job.main(argv) == 0
        (samples,) = glob.glob(f"{out}/samples_*.jsonl")
        preds[name] = [json.loads(line)["prediction"] for line in open(samples)]
        (results,) = glob.glob(f"{out}/results_*.json")
        preds[name + "_hash"] = json.load(open(results))["prompt_set"]["sha256"]
    assert preds["builtin"] == preds["file"] and preds["builtin_hash"] == preds["file_hash"]
    from recmas_ray.styles.prompts import prompt_set_hash_for

    assert prompt_set_hash_for("sequential_light", path) == prompt_set_hash_for("sequential_light") == preds["file_hash"]


def test_prompt_set_with_a_missing_slot_fails_before_models_load(tmp_path, question_file, capsys, monkeypatch):
    from jobs import run as run_job
    from recmas_ray.system import plan

    def no_models(*a, **k):
        raise AssertionError("a model was looked up")

    monkeypatch.setattr(plan, "model_hidden_size", no_models)
    bad = _edited(tmp_path, lambda d: d["roles"]["solver"]["base"].update(math="{question} {final}"))
    argv = ["--style", "sequential_light", "--preset", "tiny", "--dataset", str(question_file), "--backend", "local",
            "--prompt_set", str(bad), "--output_path", str(tmp_path / "out")]
    assert run_job.main(argv) == 2
    err = capsys.readouterr().err
    assert "role solver, variant base, task math: missing slot <<LATENT_REFINED_SLOT>>" in err
    assert len(err.strip().splitlines()) == 1


# The base models of the released systems and of the offline presets, written out apart from the declarations.
PAPER_LIGHT = {"planner": "Qwen/Qwen3-1.7B", "critic": "meta-llama/Llama-3.2-1B-Instruct",
               "solver": "Qwen/Qwen2.5-Math-1.5B-Instruct"}
PAPER_SCALED = {"planner": "google/gemma-3-4b-it", "critic": "meta-llama/Llama-3.2-3B-Instruct",
                "solver": "Qwen/Qwen3.5-4B"}
TINY_MIXTURE = {"math": "tiny:qwen3", "code": "tiny:llama", "science": "tiny:mistral", "summarizer": "tiny:gemma3"}
DEMO_DISTILLATION = {"expert": "pkg:gemma3-270m", "learner": "pkg:smollm2-135m-instruct"}


def test_presets_first_roles_experts_and_fact_tasks_come_from_the_declarations():
    from recmas_ray.system.presets import role_models
    from recmas_ray.train.synthetic_facts import TASK_STYLES, make_fact_dataset

    assert role_models("sequential_light", "paper") == role_models("sequential", "paper") == PAPER_LIGHT
    assert role_models("sequential_scaled", "paper") == PAPER_SCALED
    assert role_models("hie", "tiny") == TINY_MIXTURE and role_models("distill", "demo") == DEMO_DISTILLATION
    assert {name: get_style(name).first_role for name in ("sequential_scaled", "mixture", "distillation",
                                                          "deliberation")} == {
        "sequential_scaled": "planner", "mixture": "math", "distillation": "expert", "deliberation": "reflector"}
    assert TASK_STYLES["two_fact"] == ("sequential", "sequential_light", "sequential_scaled")
    assert TASK_STYLES["mixture"] == ("mixture",)
    row = make_fact_dataset("mixture", "mixture", 1)[0]
    assert set(row["role_context"]) == {"math", "code", "science"} and row["facts"]["asked_role"] in row["role_context"]
    with pytest.raises(ValueError, match="task two_fact does not apply to style distillation"):
        make_fact_dataset("two_fact", "distillation", 1)


def test_a_new_style_declares_what_the_system_the_facts_and_the_protocol_read():
    from recmas_ray.eval import protocol
    from recmas_ray.styles.base import ReferenceCell
    from recmas_ray.system.presets import role_models
    from recmas_ray.train.synthetic_facts import make_fact_dataset

    relay = StyleSpec(
        name="relay", stages=(("scout",), ("judge",)), forward_edges=("scout->judge",), feedback_edges=(),
        decoder="judge", slots={"judge": {"<<RELAY_SLOT>>": "scout->judge"}},
        prompts={"scout": RolePrompts(base={"math": "Look: {question}"}),
                 "judge": RolePrompts(base={"math": "Given <<RELAY_SLOT>> answer {question} {final}"})},
        target_fields={"scout": ("plan",), "judge": ("answer",)}, fact_tasks=("recall",),
        presets={"tiny": {"scout": "tiny:llama", "judge": "tiny:qwen3"}},
        reference_cells={"math500": ReferenceCell(latent_steps=8, rounds=2, source="toy")},
        reference_max_new_tokens={"math500": 300})
    STYLES["relay"] = relay
    try:
        assert role_models("relay", "tiny") == {"scout": "tiny:llama", "judge": "tiny:qwen3"}
        with pytest.raises(ValueError, match=r"preset 'demo' has no base model for roles \['scout', 'judge'\]"):
            role_models("relay", "demo")
        assert list(make_fact_dataset("recall", "relay", 2)[0]["role_context"]) == ["scout"]
        assert (protocol.recommended("relay", "math500").latent_steps, protocol.max_new_tokens("relay", "math500"),
                protocol.max_new_tokens("relay", "medqa")) == (8, 300, 4000)
        assert protocol.recommended("relay", "medqa") == protocol.RUNNER_DEFAULT
    finally:
        del STYLES["relay"]


def test_a_preset_naming_a_role_the_style_lacks_is_rejected():
    import dataclasses

    bad = dataclasses.replace(get_style("distillation"), presets={"tiny": {"teacher": "tiny:qwen3"}})
    with pytest.raises(ValueError, match="preset 'tiny' names \\['teacher'\\]"):
        bad.validate()
