"""Code-task interfaces: each code loader sets the row's interface (functional + fn_name, or stdin),
the prompts show the matching interface line, and the grader runs the matching harness."""

import json

import pytest

from recmas_ray.styles import get_style, question_with_interface, render_prompt
from recmas_ray.tasks import benchmarks as B
from recmas_ray.tasks import grade
from tests.conftest import write_jsonl


@pytest.fixture
def code_rows(tmp_path):
    mbpp = {"task_id": "Mbpp/2", "prompt": "Write a function to square a number.",
            "code": "def square(x):\n    return x * x", "test_list": ["assert square(3) == 9"],
            "test": "assert square(2) == 4\n", "entry_point": "square"}
    d = tmp_path / "lcb"
    d.mkdir()
    base = {"platform": "leetcode", "contest_date": "2025-01-01", "difficulty": "easy"}
    write_jsonl(d / "test.jsonl", [
        {**base, "question_id": "q1", "question_content": "Double each.",
         "starter_code": "class Solution:\n    def double(self, nums):\n",
         "public_test_cases": json.dumps([{"input": "[1, 2]", "output": "[2, 4]", "testtype": "functional"}]),
         "metadata": json.dumps({"func_name": "double"})},
        {**base, "question_id": "q2", "question_content": "Sum two ints.", "starter_code": "",
         "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
         "metadata": "{}"}])
    (m,) = B.load_benchmark("mbppplus", path=write_jsonl(tmp_path / "mbpp.jsonl", [mbpp]))
    (h,) = B.load_benchmark("humaneval", num_samples=1)
    fn, io = B.load_benchmark("livecodebench_v6", path=d)
    return {"mbppplus": m, "humaneval": h, "lcb_functional": fn, "lcb_stdin": io}


def test_loaders_set_the_interface(code_rows):
    assert code_rows["mbppplus"]["interface"] == {"type": "functional", "fn_name": "square"}
    assert code_rows["humaneval"]["interface"] == {"type": "functional", "fn_name": "has_close_elements"}
    assert code_rows["lcb_functional"]["interface"] == {"type": "functional", "fn_name": "double"}
    assert code_rows["lcb_stdin"]["interface"] == {"type": "stdin", "fn_name": None}


@pytest.mark.parametrize("style_name", ["sequential_light", "distillation"])
def test_code_prompts_render_the_interface_line(code_rows, style_name):
    style = get_style(style_name)
    for name, row in code_rows.items():
        q = question_with_interface(style, row["question"], row["interface"])
        for role in style.roles:
            text = render_prompt(style, role, "base", "code", q)
            if row["interface"]["type"] == "functional":
                assert f"implement and return the function `{row['interface']['fn_name']}` only" in text, name
            else:
                assert "reads from standard input and writes to standard output" in text, name


@pytest.mark.sandbox
def test_rows_grade_with_the_matching_harness(code_rows):
    fn, io = code_rows["lcb_functional"], code_rows["lcb_stdin"]
    sol_fn = "```python\nclass Solution:\n    def double(self, nums):\n        return [2 * x for x in nums]\n```"
    sol_io = "```python\nprint(sum(map(int, input().split())))\n```"
    assert grade("code", fn, sol_fn).correct and grade("code", io, sol_io).correct
    # The interface's fn_name is the function the functional harness calls.
    renamed = {**fn, "fn_name": "other", "interface": {"type": "functional", "fn_name": "double"}}
    assert grade("code", renamed, sol_fn).correct
    with pytest.raises(ValueError, match="interface 'stdin' cannot be graded with test_mode 'functional'"):
        grade("code", {**fn, "interface": {"type": "stdin", "fn_name": None}}, sol_fn)
    with pytest.raises(ValueError, match="interface 'functional' cannot be graded with test_mode 'stdio'"):
        grade("code", {**io, "interface": {"type": "functional", "fn_name": "f"}}, sol_io)


def test_eval_run_shows_the_interface_line_to_the_agents(tmp_path, tiny_cache, monkeypatch):
    import glob

    from jobs import run as run_job
    from recmas_ray.engine import runner

    seen = []
    real = runner.render_prompt
    monkeypatch.setattr(runner, "render_prompt", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    row = {"task_id": "Mbpp/2", "prompt": "Write a function to square a number.", "code": "",
           "test_list": ["assert square(3) == 9"], "test": "assert square(2) == 4\n", "entry_point": "square"}
    out = tmp_path / "out"
    argv = ["--style", "sequential_light", "--preset", "tiny", "--dataset", "mbppplus", "--dataset_path",
            str(write_jsonl(tmp_path / "m.jsonl", [row])), "--backend", "local", "--num_recursive_rounds", "1",
            "--latent_steps", "2", "--max_new_tokens", "3", "--no_format_retry", "--output_path", str(out),
            "--no_progress"]
    assert run_job.main(argv) == 0
    line = "implement and return the function `square` only"
    assert seen and all(line in text for text in seen)
    (samples,) = glob.glob(f"{out}/samples_*.jsonl")
    assert line in json.loads(open(samples).readline())["question"]


def test_function_task_without_a_name_is_bad_data(tmp_path):
    row = {"task_id": "Mbpp/9", "prompt": "Do it.", "code": "", "test_list": [], "test": "print(1)\n"}
    with pytest.raises(ValueError, match="row 0 is a function task but names no function"):
        B.load_benchmark("mbppplus", path=write_jsonl(tmp_path / "m.jsonl", [row]))


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
