"""Benchmark loaders: each parses a small fixture in its published record format; bad data fails
early with a clear message. Fixtures are written here, never read from shared data."""

import csv
import json

import pytest

from recmas_ray.tasks import benchmarks as B
from recmas_ray.tasks import grade


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    """Any attempt to reach the Hugging Face hub fails the test."""
    def _fail(*a, **k):
        raise AssertionError("tests must not fall back to the hub")
    monkeypatch.setattr(B, "_from_hub", _fail)
    for name in B.BENCHMARKS:
        monkeypatch.delenv(B.env_var_for(name), raising=False)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_math500_and_env_var(tmp_path, monkeypatch):
    rows = [{"problem": "Convert $(0,3)$ to polar.", "solution": r"... $\boxed{\left( 3, \frac{\pi}{2} \right)}$",
             "answer": r"\left( 3, \frac{\pi}{2} \right)", "subject": "Precalculus", "level": 2,
             "unique_id": "test/precalculus/807.json"},
            {"problem": "1+1?", "solution": r"$\boxed{2}$", "answer": "2", "subject": "Algebra",
             "level": 1, "unique_id": "test/algebra/1.json"}]
    path = write_jsonl(tmp_path / "m.jsonl", rows)
    monkeypatch.setenv("RECMAS_MATH500_PATH", str(path))
    items = B.load_benchmark("math500")
    assert [it["doc_id"] for it in items] == ["test/precalculus/807.json", "test/algebra/1.json"]
    assert items[0]["gold"] == r"\left( 3, \frac{\pi}{2} \right)" and items[0]["task_type"] == "math"
    assert items[0]["question"] == rows[0]["problem"] and items[0]["level"] == "2"
    assert grade("math", items[1], r"\boxed{2}").correct


def test_aime_layouts_and_gsm8k(tmp_path):
    aime25 = write_jsonl(tmp_path / "a25.jsonl", [{"problem": "Find b.", "answer": "070", "id": "0"}])
    aime26 = write_jsonl(tmp_path / "a26.jsonl", [{"problem_idx": 1, "problem": "Find n.", "answer": 588}])
    (it25,), (it26,) = B.load_benchmark("aime2025", path=aime25), B.load_benchmark("aime2026", path=aime26)
    assert (it25["gold"], it25["doc_id"]) == ("70", "0")
    assert (it26["gold"], it26["doc_id"], it26["question"]) == ("588", "1", "Find n.")
    gsm = write_jsonl(tmp_path / "g.jsonl", [{"question": "Eggs?", "answer": "16 - 3 = <<16-3=13>>13\n#### 1,300"}])
    (g,) = B.load_benchmark("gsm8k", path=gsm)
    assert (g["gold"], g["doc_id"]) == ("1300", "0") and "####" in g["solution"]
    assert B.BENCHMARKS["aime2026"].metric == "pass@10"


def test_gpqa_csv_shuffles_options_deterministically(tmp_path):
    path = tmp_path / "gpqa_diamond.csv"
    fields = ["Record ID", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
              "Incorrect Answer 3", "High-level domain"]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for i in range(4):
            w.writerow({"Record ID": f"rec{i}", "Question": f"Question {i}?", "Correct Answer": f"right{i} ",
                        "Incorrect Answer 1": "w1", "Incorrect Answer 2": "w2", "Incorrect Answer 3": "w3",
                        "High-level domain": "Physics"})
    items = B.load_benchmark("gpqa_diamond", path=path, seed=7)
    assert items == B.load_benchmark("gpqa_diamond", path=path, seed=7)
    for i, it in enumerate(items):
        assert it["options"]["ABCD".index(it["gold"])] == f"right{i}"
        assert f"{it['gold']}. right{i}" in it["question"]
        assert it["question"].endswith("Choose the correct option (A/B/C/D).")
    assert len({it["gold"] for it in items}) > 1 or len({it["gold"] for it in B.load_benchmark(
        "gpqa_diamond", path=path, seed=8)}) > 1
    plain = B.load_benchmark("gpqa_diamond", path=path, gpqa_shuffle_options=False)
    assert {it["gold"] for it in plain} == {"A"} and plain[0]["doc_id"] == "rec0"


def test_medqa_both_published_layouts(tmp_path):
    medagents = write_jsonl(tmp_path / "medqa.jsonl", [{
        "realidx": 5, "question": "Which drug?", "answer": "Aspirin",
        "options": {"A": "Heparin", "B": "Aspirin", "C": "Warfarin", "D": "Insulin"},
        "meta_info": "step1", "answer_idx": "B", "metamap_phrases": ["drug"]}])
    (m,) = B.load_benchmark("medqa", path=medagents)
    assert (m["doc_id"], m["gold"], m["options"][1]) == ("5", "B", "Aspirin")
    assert "B. Aspirin" in m["question"] and "Choose the correct option" in m["question"]
    latentmas = tmp_path / "medqa.json"  # a JSON array, options as "A. ..." strings, answer as text
    latentmas.write_text(json.dumps([{
        "idx": 0, "question": "Risk?\nA. Ulcers\nB. Colorectal cancer\nC. Cancer\nD. None",
        "options": ["A. Ulcers", "B. Colorectal cancer", "C. Cancer", "D. None"],
        "answer": "Cancer", "gen_text_store": "", "pid": "0", "query": "Risk?\nA. Ulcers\n"
        "B. Colorectal cancer\nC. Cancer\nD. None\nChoose the correct option.", "image": None}]))
    (lm,) = B.load_benchmark("medqa", path=latentmas)
    assert lm["gold"] == "C"  # exact option text wins over the substring match in B
    assert lm["options"] == ["Ulcers", "Colorectal cancer", "Cancer", "None"]
    assert lm["question"].count("A. Ulcers") == 1


@pytest.mark.sandbox
def test_mbppplus_prompt_shows_three_tests_and_grades(tmp_path):
    tests = ("import numpy as np\ndef assertion(out, exp, atol):\n    assert out == exp\n"
             "inputs = [[2], [3]]\nresults = [4, 9]\nfor inp, exp in zip(inputs, results):\n"
             "    assertion(square(*inp), exp, 0)\n")
    row = {"task_id": "Mbpp/2", "prompt": "Write a function to square a number.",
           "code": "def square(x):\n    return x * x", "source_file": "x.ipynb", "test_imports": [],
           "test_list": [f"assert square({i}) == {i * i}" for i in range(5)], "test": tests,
           "entry_point": "square"}
    (it,) = B.load_benchmark("mbppplus", path=write_jsonl(tmp_path / "mbpp.jsonl", [row]))
    assert it["question"].count("assert square(") == 3 and it["entry_point"] == "square"
    assert (it["doc_id"], it["test_mode"], it["timeout_s"]) == ("Mbpp/2", "script", 10.0)
    good = grade("code", it, "```python\ndef square(x):\n    return x ** 2\n```")
    assert good.correct, good.detail
    bad = grade("code", it, "```python\ndef square(x):\n    return x + x\n```")
    assert not bad.correct and bad.detail["error_type"] == "RE", bad.detail


@pytest.mark.sandbox
def test_livecodebench_directory_functional_and_stdin(tmp_path):
    d = tmp_path / "lcb"
    d.mkdir()
    base = {"question_title": "t", "platform": "leetcode", "contest_id": "c", "contest_date": "2025-01-01",
            "difficulty": "easy", "private_test_cases": "eJx"}
    write_jsonl(d / "test.jsonl", [{**base, "question_id": "q1", "question_content": "Double each.",
                                    "starter_code": "class Solution:\n    def double(self, nums):\n",
                                    "public_test_cases": json.dumps([{"input": "[1, 2]", "output": "[2, 4]",
                                                                      "testtype": "functional"}]),
                                    "metadata": json.dumps({"func_name": "double"})}])
    write_jsonl(d / "test2.jsonl", [{**base, "question_id": "q2", "question_content": "Sum two ints.",
                                     "starter_code": "", "platform": "atcoder",
                                     "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n",
                                                                       "testtype": "stdin"}]),
                                     "metadata": "{}"}])
    fn, io = B.load_benchmark("livecodebench_v6", path=d)
    assert (fn["test_mode"], fn["fn_name"], fn["inputs"]) == ("functional", "double", ["[1, 2]"])
    assert "Starter code:" in fn["question"] and "Starter code" not in io["question"]
    assert (io["test_mode"], io["outputs"], io["timeout_s"]) == ("stdio", ["3\n"], 6.0)
    sol = "```python\nclass Solution:\n    def double(self, nums):\n        return [2 * x for x in nums]\n```"
    res_fn = grade("code", fn, sol)
    res_io = grade("code", io, "```python\nprint(sum(map(int, input().split())))\n```")
    assert res_fn.correct and res_io.correct, (res_fn.detail, res_io.detail)


def test_open_qa_hotpotqa_and_bamboogle(tmp_path):
    hp = write_jsonl(tmp_path / "hp.jsonl", [{
        "id": "5a8b57f25542995d1e6f1371", "question": "Which magazine was started first?",
        "answer": "Arthur's Magazine", "type": "comparison", "level": "medium",
        "supporting_facts": {"title": [], "sent_id": []}, "context": {"title": [], "sentences": []}}])
    (h,) = B.load_benchmark("hotpotqa", path=hp)
    assert h["doc_id"] == "5a8b57f25542995d1e6f1371" and h["raw_question"] == "Which magazine was started first?"
    assert "[Question Start]\nWhich magazine was started first?\n[Question End]" in h["question"]
    bam = write_jsonl(tmp_path / "bam.jsonl", [
        {"Question": "Who was president?", "Answer": "james madison", "Answer 2": ""},
        {"Question": "Grandmother?", "Answer": "Mildred Warner", "Answer 2": "Mildred Gale"},
        {"Question": "King?", "Answer": "George VI\r\n", "Answer 2": ""}])
    b = B.load_benchmark("bamboogle", path=bam)
    assert b[0]["question"] == "Who was president?" and b[1]["aliases"] == ["Mildred Warner", "Mildred Gale"]
    assert b[2]["gold"] == "George VI"
    assert grade("qa", b[1], r"\boxed{Mildred Gale}").correct


def test_hub_failure_becomes_a_clear_error(monkeypatch):
    def offline(*a, **k):
        raise ConnectionError("no network")
    monkeypatch.setattr(B, "_from_hub", offline)
    with pytest.raises(ValueError, match="RECMAS_BAMBOOGLE_PATH"):
        B.load_benchmark("bamboogle")


@pytest.mark.sandbox
def test_humaneval_from_package_and_local_question_files(tmp_path):
    items = B.load_benchmark("humaneval", num_samples=2)
    assert [it["doc_id"] for it in items] == ["HumanEval/0", "HumanEval/1"]
    assert items[0]["entry_point"] == "has_close_elements" and "check(has_close_elements)" in items[0]["tests"]
    solution = "```python\n" + items[0]["raw_question"] + items[0]["gold"] + "\n```"
    res = grade("code", items[0], solution)
    assert res.correct, res.detail
    local = write_jsonl(tmp_path / "qs.jsonl", [{"question": "2+2?", "answer": "4"}, {"question": "3+3?", "answer": "6"}])
    assert [it["gold"] for it in B.load_benchmark(str(local))] == ["4", "6"]
    wrapped = tmp_path / "train.json"
    wrapped.write_text(json.dumps({"data": [{"question": "q", "answer": "a"}]}))
    (w,) = B.load_benchmark(str(wrapped), task_type="qa")
    assert (w["task_type"], w["aliases"], w["benchmark"]) == ("qa", ["a"], "train")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": [{"question": "q", "answer": "a"}]}))
    assert len(B.load_benchmark(str(other), json_field="rows")) == 1


def test_num_samples_and_shuffle(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(20)])
    assert [it["gold"] for it in B.load_benchmark(str(path), num_samples=3)] == ["0", "1", "2"]
    a = B.load_benchmark(str(path), num_samples=5, shuffle=True, seed=1)
    assert a == B.load_benchmark(str(path), num_samples=5, shuffle=True, seed=1)
    assert [it["gold"] for it in a] != ["0", "1", "2", "3", "4"]


def test_bad_data_fails_with_clear_messages(tmp_path):
    with pytest.raises(ValueError, match="unknown benchmark 'mmlu'.*math500.*humaneval"):
        B.load_benchmark("mmlu")
    with pytest.raises(ValueError, match="unknown benchmark"):
        B.task_type_for("mmlu")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        B.load_benchmark("math500", path=empty)
    missing = write_jsonl(tmp_path / "m.jsonl", [{"problem": "ok", "answer": "1"}, {"problem": "no answer"}])
    with pytest.raises(ValueError, match="row 1 has no 'answer'"):
        B.load_benchmark("math500", path=missing)
    with pytest.raises(ValueError, match="does not exist"):
        B.load_benchmark("gsm8k", path=tmp_path / "nope.jsonl")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "x", "answer": "1"}\n{"question": \n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        B.load_benchmark(str(broken))
    no_hash = write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "42"}])
    with pytest.raises(ValueError, match="####"):
        B.load_benchmark("gsm8k", path=no_hash)
    med = write_jsonl(tmp_path / "med.jsonl", [{"question": "q", "options": ["A. x", "B. y"], "answer": "z"}])
    with pytest.raises(ValueError, match="matches no option"):
        B.load_benchmark("medqa", path=med)
    dup = write_jsonl(tmp_path / "d.jsonl", [{"id": 1, "question": "a", "answer": "1"},
                                             {"id": 1, "question": "b", "answer": "2"}])
    with pytest.raises(ValueError, match="duplicate doc_id '1'"):
        B.load_benchmark(str(dup))
    with pytest.raises(ValueError, match="unknown loader option"):
        B.load_benchmark(str(dup), gpqa_shufle_options=False)
    with pytest.raises(ValueError, match="task_type='code'"):
        B.load_benchmark(str(dup), task_type="code")
    assert B.task_type_for("gpqa_diamond") == "choice" and B.task_type_for("x.jsonl") == "math"
    assert B.task_type_for("LCB") == "code" and B.canonical_name("aime25") == "aime2025"
