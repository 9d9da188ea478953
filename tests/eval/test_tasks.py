"""Task families are found by name in one registry, and each family's parts fit together."""

import pytest

from recmas_ray.eval.benchmarks import BENCHMARKS
from recmas_ray.eval.tasks import TASK_TYPES, TASKS, get_task
from recmas_ray.styles import get_style, render_prompt

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
    loaders = {b for t in TASKS.values() for b in t.loaders}
    assert loaders == set(BENCHMARKS)
    assert all(BENCHMARKS[b].task_type in TASKS for b in BENCHMARKS)
    style = get_style("sequential_light")
    for name, task in TASKS.items():
        assert task.instruction in render_prompt(style, style.decoder, "base", name, "What is 2 + 2?")
