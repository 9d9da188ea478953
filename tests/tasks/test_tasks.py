"""Task families are found by name in one registry, and each family's parts fit together."""

import pytest

from recmas_ray.styles import get_style, render_prompt
from recmas_ray.tasks import BENCHMARKS, TASK_TYPES, TASKS, BenchmarkSpec, GradeResult, Task, get_task, register_task
from recmas_ray.tasks.benchmarks import canonical_name, load_benchmark

COMPLETIONS = {"math": "42}", "qa": "Paris}", "choice": "C}", "code": "def f():\n    return 1\n"}


def test_every_family_by_name_and_unknown_names_refused():
    assert TASK_TYPES == ("math", "choice", "code", "qa")
    assert all(get_task(n).name == n for n in TASK_TYPES)
    with pytest.raises(ValueError, match=r"unknown task type 'essay'; expected one of"):
        get_task("essay")


@pytest.mark.parametrize("name", TASK_TYPES)
def test_a_format_retry_completes_the_familys_answer_format(name):
    """The retry suffix plus a short continuation (and the closer) is an answer the family's format finds."""
    task = get_task(name)
    item = {"task_type": name, "options": ["a", "b", "c", "d"]}
    assert not task.answer_found(item, "I am not sure yet")
    assert task.answer_found(item, "I am not sure yet" + task.retry_suffix + COMPLETIONS[name] + task.retry_closer)


def test_benchmarks_and_prompts_read_the_registry():
    declared = {b for t in TASKS.values() for b in t.benchmarks}
    assert declared == set(BENCHMARKS) == {"math500", "aime2025", "aime2026", "gsm8k", "gpqa_diamond", "medqa",
                                           "livecodebench_v6", "mbppplus", "humaneval", "hotpotqa", "bamboogle"}
    assert all(BENCHMARKS[b].task_type in TASKS for b in BENCHMARKS)
    style = get_style("sequential_light")
    for name, task in TASKS.items():
        assert task.instruction in render_prompt(style, style.decoder, "base", name, "What is 2 + 2?")


def test_each_benchmark_is_declared_by_its_family_with_its_source():
    """A benchmark's source (hub id, split, files, bundled data), loader and aliases live in its family's module."""
    for task in TASKS.values():
        for name, spec in task.benchmarks.items():
            assert BENCHMARKS[name].task_type == task.name and BENCHMARKS[name].loader is spec.loader
    assert (BENCHMARKS["gsm8k"].hf_id, BENCHMARKS["gsm8k"].hf_config, BENCHMARKS["gsm8k"].split) == (
        "openai/gsm8k", "main", "test")
    assert len(BENCHMARKS["livecodebench_v6"].hub_files) == 6 and BENCHMARKS["humaneval"].bundled is not None
    assert [canonical_name(a) for a in ("MATH-500", "aime25", "gpqa", "lcb", "mbpp+")] == [
        "math500", "aime2025", "gpqa_diamond", "livecodebench_v6", "mbppplus"]


@pytest.fixture
def echo_family():
    """A family added from outside the package (as a user's file would): registered, then taken out again."""
    def load(rows, name, **_):
        return [{"doc_id": i, "question": r["text"], "gold": r["text"][::-1], "task_type": "echo", "benchmark": name,
                 "raw_question": r["text"]} for i, r in enumerate(rows)]

    def grade(record, response, mode):
        ok = response.strip() == record["gold"]
        return GradeResult(ok, response.strip(), False, {"strict": ok, "reference": ok})

    task = Task("echo", instruction="Write the question backwards.", answer_found=lambda item, text: bool(text),
                grade=grade, retry_suffix="\n", benchmarks={"echo_bench": BenchmarkSpec(None, None, "test", load)})
    yield register_task(task)
    TASKS.pop("echo")
    BENCHMARKS.pop("echo_bench")


def test_a_family_registered_from_outside_loads_and_grades_by_name(echo_family, tmp_path, monkeypatch):
    from recmas_ray.tasks import grade

    path = tmp_path / "echo.jsonl"
    path.write_text('{"text": "abc"}\n{"text": "xy"}\n')
    monkeypatch.setenv("RECMAS_ECHO_BENCH_PATH", str(path))
    items = load_benchmark("echo_bench")
    assert [i["gold"] for i in items] == ["cba", "yx"] and BENCHMARKS["echo_bench"].task_type == "echo"
    assert grade("echo", items[0], " cba ").correct and not grade("echo", items[1], "xy").correct
    with pytest.raises(ValueError, match="already registered"):
        register_task(Task("echo", instruction="", answer_found=bool, grade=echo_family.grade, retry_suffix=""))
    with pytest.raises(ValueError, match=r"benchmark\(s\) \['math500'\] already belong"):
        register_task(Task("echo2", instruction="", answer_found=bool, grade=echo_family.grade, retry_suffix="",
                           benchmarks={"math500": BENCHMARKS["math500"]}))
