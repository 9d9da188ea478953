"""Both graders' verdicts in every results file (whatever --grader picked), and every loader's gold
answer, boxed, graded correct under both graders (fixtures written here, never shared data)."""

import json

import pytest

from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.eval.config import EvalConfig
from recmas_ray.eval.run import finish
from recmas_ray.eval.samples import SampleWriter, with_verdicts
from recmas_ray.eval.stream import sample_record
from recmas_ray.engine.runner import SampleResult
from recmas_ray.system.config import SystemConfig
from recmas_ray.system.plan import plan_system
from recmas_ray.tasks import benchmarks as B
from recmas_ray.tasks import grade
from tests.conftest import write_jsonl


@pytest.mark.parametrize("grader", ["strict", "reference"])
def test_results_report_both_verdicts_whatever_the_headline(tmp_path, tiny_cache, grader):
    # 4.5 vs 14/3: the release's intpart rule says equal ("4" == "4"), math-verify says no.
    items = [{"doc_id": "a", "question": "q", "gold": r"\frac{14}{3}", "task_type": "math", "benchmark": "fx"},
             {"doc_id": "b", "question": "q", "gold": "7", "task_type": "math", "benchmark": "fx"}]
    preds = [r"\boxed{4.5}", r"\boxed{7}"]
    qfile = write_jsonl(tmp_path / "fx.jsonl", [{"question": "q", "answer": "1"}])
    cfg = EvalConfig(system=SystemConfig(style="sequential_light"), dataset=str(qfile), grader=grader,
                     output_path=str(tmp_path / "out"))
    samples = tmp_path / "samples_fx.jsonl"
    with SampleWriter(samples) as w:
        for item, pred in zip(items, preds):
            rec = sample_record(item, "recursive_mas", 0, SampleResult(pred, 3, 0, 0.1), grader, RecursionConfig())
            w.write(with_verdicts(rec))
    rows = [json.loads(line) for line in open(samples)]
    assert [(r["correct_strict"], r["correct_reference"]) for r in rows] == [(False, True), (True, True)]
    assert rows[0]["grade_detail"]["strict"] is False and rows[0]["grade_detail"]["reference"] is True
    plan = plan_system("sequential_light", preset="tiny")
    out = finish(cfg, samples, plan, {}, 0.0)
    entry = out["results"]["fx/recursive_mas"]
    assert entry["accuracy,strict"] == 0.5 and entry["accuracy,reference"] == 1.0
    assert entry["headline"] == f"accuracy,{grader}" and entry["grader"] == grader
    saved = json.load(open(out["results_path"]))["results"]["fx/recursive_mas"]
    assert (saved["accuracy,strict"], saved["accuracy,reference"]) == (0.5, 1.0)


def _fixtures(tmp_path):
    """One small file per benchmark loader, in its published layout."""
    def jl(name, rows):
        return write_jsonl(tmp_path / f"{name}.jsonl", rows)

    return {
        "math500": jl("math500", [
            {"problem": "Cost?", "answer": r"\$18.90", "unique_id": "a"},
            {"problem": "Big?", "answer": r"\$32,\!348", "unique_id": "b"},
            {"problem": "Polar?", "answer": r"\left( 3, \frac{\pi}{2} \right)", "unique_id": "c"},
            {"problem": "Text?", "answer": r"\text{Evelyn}", "unique_id": "d"},
            {"problem": "Frac?", "answer": r"\frac{14}{3}", "unique_id": "e"}]),
        "aime2025": jl("aime25", [{"problem": "Find b.", "answer": "070", "id": "0"}]),
        "aime2026": jl("aime26", [{"problem_idx": 1, "problem": "Find n.", "answer": 588}]),
        "gsm8k": jl("gsm8k", [{"question": "Eggs?", "answer": "16 - 3 = 13\n#### 1,300"}]),
        "gpqa_diamond": jl("gpqa", [{"Record ID": f"r{i}", "Question": f"Q{i}?", "Correct Answer": "yes",
                                     "Incorrect Answer 1": "n1", "Incorrect Answer 2": "n2",
                                     "Incorrect Answer 3": "n3"} for i in range(4)]),
        "medqa": jl("medqa", [{"realidx": 5, "question": "Which drug?", "answer": "Aspirin",
                               "options": {"A": "Heparin", "B": "Aspirin", "C": "Warfarin", "D": "Insulin"},
                               "answer_idx": "B"}]),
        "hotpotqa": jl("hotpotqa", [{"id": "h1", "question": "Which first?", "answer": "Arthur's Magazine"}]),
        "bamboogle": jl("bamboogle", [{"Question": "Grandmother?", "Answer": "Mildred Warner",
                                       "Answer 2": "Mildred Gale"}]),
        "local": jl("questions", [{"question": "2+2?", "answer": "4"}, {"question": "Half?", "answer": "0.5"}]),
    }


def test_every_loaders_gold_boxed_is_correct_under_both_graders(tmp_path):
    checked = 0
    for name, path in _fixtures(tmp_path).items():
        items = B.load_benchmark(str(path)) if name == "local" else B.load_benchmark(name, path=path)
        for it in items:
            res = grade(it["task_type"], it, f"The answer is \\boxed{{{it['gold']}}}.")
            assert res.detail["strict"] and res.detail["reference"], (name, it["gold"], res.detail)
            checked += 1
    assert checked >= 15


@pytest.mark.sandbox
def test_code_golds_pass_under_both_graders(tmp_path):
    row = {"task_id": "Mbpp/2", "prompt": "Write a function to square a number.",
           "code": "def square(x):\n    return x * x", "test_list": ["assert square(3) == 9"],
           "test": "assert square(2) == 4\nassert square(5) == 25\n", "entry_point": "square"}
    (mbpp,) = B.load_benchmark("mbppplus", path=write_jsonl(tmp_path / "mbpp.jsonl", [row]))
    (human,) = B.load_benchmark("humaneval", num_samples=1)
    for it, code in ((mbpp, mbpp["gold"]), (human, human["raw_question"] + human["gold"])):
        res = grade("code", it, f"```python\n{code}\n```")
        assert res.detail["strict"] and res.detail["reference"], res.detail
        assert res.detail["grading"] == "parent", res.detail  # the verdict was computed outside the sandbox


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
