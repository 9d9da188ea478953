"""The categories of bad input a new user's 85 tries left unclear (issue 47), one test each, with cases of our own:
each gets one line naming the value and what was expected, exit status 2, before any model loads, Ray starts or a
file is written (`nothing_heavy`, `snapshot`)."""

from __future__ import annotations

import json
import os

import pytest

import jobs.run as run_job
import jobs.train_inner as inner_job
from tests.conftest import snapshot, write_jsonl

RUN = ["--style", "sequential_light", "--preset", "tiny", "--backend", "local"]


def _refused(main, argv, tmp_path, capsys) -> str:
    """Run a job's main on bad input: exit 2, one stderr line, no file written; returns the line."""
    before = snapshot(tmp_path)
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert snapshot(tmp_path) == before
    return lines[0]


def _run(tmp_path, capsys, *args, dataset=None):
    data = dataset or os.path.join(os.path.dirname(__file__), "..", "..", "jobs", "examples", "questions.jsonl")
    return _refused(run_job.main, [*RUN, "--dataset", str(data), "--output_path", str(tmp_path / "out"), *args],
                    tmp_path, capsys)


def _inner(tmp_path, capsys, *args):
    return _refused(inner_job.main, ["--style", "sequential", "--mas_role", "planner", "--preset", "tiny",
                                     "--save_dir", str(tmp_path / "out"), "--num_workers", "0", *args], tmp_path, capsys)


ROWS = [{"question": "What is 1 + 1?", "answer": "2", "plan": "add"}, {"question": "What is 2 + 2?", "answer": "4",
                                                                        "plan": "add"}]


@pytest.mark.parametrize("layout", ["pretty_array", "one_line_array", "pretty_object"])
def test_a_json_array_given_as_json_lines_is_named_as_such(layout, tmp_path, capsys, nothing_heavy, tiny_cache):
    path = tmp_path / "rows.jsonl"
    text = {"pretty_array": json.dumps(ROWS, indent=2), "one_line_array": json.dumps(ROWS),
            "pretty_object": json.dumps(ROWS[0], indent=2)}[layout]
    path.write_text(text)
    want = "holds one JSON object over" if layout == "pretty_object" else "holds one JSON array of 2 records"
    for line in (_run(tmp_path, capsys, dataset=path), _inner(tmp_path, capsys, "--dataset_name", str(path))):
        assert f"{path} {want}" in line and "not JSON Lines (one JSON object per line)" in line, line
        assert "name the file .json" in line
    path.write_text(json.dumps(ROWS[0]) + "\n{broken\n")  # real JSON Lines with a broken line: that line is named
    line = _run(tmp_path, capsys, dataset=path)
    assert "line 2 is not valid JSON" in line and "one JSON object per line" in line


@pytest.mark.parametrize("value,shown", [(None, "null"), ("", '""'), ("   ", '" "')])  # (one line: spaces folded)
def test_a_field_that_is_there_but_empty_is_never_reported_missing(value, shown, tmp_path, capsys, nothing_heavy,
                                                                    tiny_cache):
    data = write_jsonl(tmp_path / "q.jsonl", [{"question": "What is 1 + 1?", "answer": value}])
    line = _run(tmp_path, capsys, dataset=data)
    assert f"row 0 field 'answer' is {shown}; expected a non-empty value" in line, line
    assert "has no" not in line and "fields present" not in line
    rows = write_jsonl(tmp_path / "t.jsonl", [{"question": value, "plan": "add"}])
    line = _inner(tmp_path, capsys, "--dataset_name", str(rows))
    assert "row 0: field 'question' is " + ("null" if value is None else "empty") in line, line
    rows.write_text(json.dumps({"question": "q", "plan": None}) + "\n")
    line = _inner(tmp_path, capsys, "--dataset_name", str(rows))
    assert "no target text for role planner" in line and "'plan' null" in line, line
    assert "missing" not in line.split("(style")[1], line  # the field that is there is not called missing


@pytest.mark.parametrize("data,key,section,written", [
    ({"latent_steps": 8}, "latent_steps", "recursion", "recursion: {latent_steps: ...}"),
    ({"style": "mixture"}, "style", "system", "system: {style: ...}"),
    ({"models": {"planner": "tiny:qwen3"}}, "models", "system", "system: {role_models: ...}"),  # a flag alias
    ({"max_new_tokens": 4}, "max_new_tokens", "recursion.decode", "recursion: {decode: {max_new_tokens: ...}}"),
])
def test_a_flat_key_for_a_nested_setting_points_to_its_nested_name(data, key, section, written, tmp_path, capsys,
                                                                    nothing_heavy, tiny_cache):
    conf = tmp_path / "c.json"
    conf.write_text(json.dumps(data))
    line = _run(tmp_path, capsys, "--config", str(conf))
    assert f"unknown setting(s) ['{key}'] at the top level: '{key}' belongs in section '{section}'" in line, line
    assert f"(write {written})" in line


@pytest.mark.parametrize("data,key,here,home", [
    ({"recursion": {"style": "mixture"}}, "style", "recursion", "in section 'system'"),
    ({"system": {"latent_steps": 4}}, "latent_steps", "system", "in section 'recursion'"),
    ({"system": {"batch_size": 4}}, "batch_size", "system", "at the top level (write batch_size: ...)"),
    ({"recursion": {"decode": {"preset": "tiny"}}}, "preset", "recursion.decode", "in section 'system'"),
])
def test_a_setting_in_the_wrong_section_says_where_it_belongs(data, key, here, home, tmp_path, capsys, nothing_heavy,
                                                             tiny_cache):
    conf = tmp_path / "c.yaml"
    import yaml

    conf.write_text(yaml.safe_dump(data))
    line = _run(tmp_path, capsys, "--config", str(conf))
    assert f"unknown setting(s) ['{key}'] in section '{here}': '{key}' belongs {home}" in line, line
    typo = tmp_path / "typo.json"  # a misspelling of a setting of that section is offered its spelling
    typo.write_text(json.dumps({"recursion": {"latnt_steps": 3}}))
    assert "'latnt_steps': did you mean 'latent_steps'?" in _run(tmp_path, capsys, "--config", str(typo))


@pytest.mark.parametrize("text,setting", [
    ("system:\n  role_models: &m {planner: tiny:qwen3}\nrecursion: {latent_steps: 4}\n", "setting 'system.role_models'"),
    ("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\nb: [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n", "setting 'a'"),
    ("recursion:\n  decode:\n    stop: [x, *s]\n", "setting 'recursion.decode.stop'"),
    ("&top {batch_size: 2}\n", "the top level"),
])
def test_a_yaml_expansion_bomb_is_refused_naming_the_setting(text, setting, tmp_path, capsys, nothing_heavy,
                                                           tiny_cache):
    conf = tmp_path / "bomb.yaml"
    conf.write_text(text)
    line = _run(tmp_path, capsys, "--config", str(conf))
    assert f"--config {str(conf)!r}: {setting} (line " in line and "anchors and aliases are refused" in line, line
    line = _inner(tmp_path, capsys, "--dataset_name", "synthetic:8", "--config", str(conf)) \
        if setting == "setting 'a'" else line  # the same refusal in a training job
    assert setting in line


@pytest.mark.parametrize("tool_args", [
    ["--tavily_keys_file", "{keys}"],  # readable by others: that check would have come first
    ["--tavily_keys_file", "{missing}"],  # no such file: likewise
    ["--python_timeout", "20"],
])
def test_settings_that_do_not_apply_are_reported_before_their_own_checks(tool_args, tmp_path, capsys, nothing_heavy,
                                                                        tiny_cache):
    keys = tmp_path / "keys.txt"
    keys.write_text("tvly-x\n")
    keys.chmod(0o644)
    args = [a.format(keys=keys, missing=tmp_path / "no_such_keys.txt") for a in tool_args]
    line = _run(tmp_path, capsys, *args)
    assert f"{tool_args[0]}" in line and ": tool settings apply to a style with tools" in line, line
    assert "style sequential_light has no tools, so drop them" in line


def test_api_argument_errors_follow_one_rule(tmp_path, tiny_cache, nothing_heavy):
    """docs/usage.md: every bad argument is a ValueError before a model loads; a wrong type is also a TypeError
    (ConfigTypeError subclasses both)."""
    import recmas_ray as rm
    from recmas_ray.api_inputs import check_int, check_questions
    from recmas_ray.config.checks import ConfigTypeError

    wrong_types = [
        lambda: rm.System.build("sequential_light", role_models={"planner": 5}, backend="local"),
        lambda: rm.System.build("sequential_light", backend="local", num_replicas="2"),
        lambda: rm.System.build("sequential_light", backend="local", timeout_s="soon"),
        lambda: rm.train_inner("sequential_light", rows=[1, 2], save_dir=str(tmp_path / "i"), num_workers=0),
        lambda: rm.train_inner("sequential_light", rows="synthetic:4", save_dir=str(tmp_path / "i"), roles="planner"),
        lambda: check_questions(5),
        lambda: check_questions(["ok", {"q": 1}]),
        lambda: check_int("batch_size", 1.5, 1),
        lambda: check_int("n", True, 1, 8),
    ]
    for call in wrong_types:
        with pytest.raises(ConfigTypeError) as info:
            call()
        assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError), info.value
    for call in (lambda: check_int("n", 0, 1, 8), lambda: rm.System.build("sequential_light", backend="local",
                                                                          num_replicas=0)):
        with pytest.raises(ValueError) as info:  # a value out of range: ValueError only
            call()
        assert not isinstance(info.value, TypeError), info.value
    assert not (tmp_path / "i").exists()
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "usage.md"), encoding="utf-8") as f:
        usage = f.read()
    assert "a wrong type is also a `TypeError`" in usage and "is a `TypeError` naming it" not in usage


@pytest.mark.parametrize("field,value", [("num_recursive_rounds", 0), ("num_recursive_rounds", 99),
                                         ("latent_steps", -1), ("max_tokens", 0), ("max_completion_tokens", 10**9),
                                         ("top_p", 7), ("num_recursive_rounds", "3")])
def test_an_openai_request_out_of_range_names_its_param(field, value):
    from recmas_ray.config.recursion import RecursionConfig
    from recmas_ray.serve.openai_api import RequestError, parse_request

    body = {"model": "m", "messages": [{"role": "user", "content": "What is 7 * 8?"}], field: value}
    with pytest.raises(RequestError) as info:
        parse_request(body, kind="chat", served_name="m", defaults=RecursionConfig(), default_task="math",
                      max_input_chars=1000)
    error = info.value.body()["error"]
    assert error["param"] == field and error["type"] == "invalid_request_error", error
    assert field in error["message"] and str(value) in error["message"], error
