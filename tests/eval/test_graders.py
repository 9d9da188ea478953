"""Graders: math (strict math-verify vs the release's lenient chain), choice, code, QA, pass@k."""

import hashlib
import itertools
import math
import random

import pytest

from recmas_ray.eval import graders as G


# ----------------------------------------------------------------------------- math

def test_extract_boxed_handles_nesting_and_takes_the_last_complete_box():
    text = r"first \boxed{1} then \boxed{\frac{\sqrt{3}}{2}} and a cut \boxed{7"
    assert G.extract_boxed(text) == r"\frac{\sqrt{3}}{2}"
    assert G.extract_boxed(r"\boxed{\left( 3, \frac{\pi}{2} \right)}") == r"\left( 3, \frac{\pi}{2} \right)"
    assert G.extract_boxed("no box here") is None


def test_extract_math_answer_falls_back_to_final_answer_line_then_none():
    assert G.extract_math_answer("work...\nFinal Answer: 42\n") == "42"
    assert G.extract_math_answer(r"Final Answer: 1 \boxed{2}") == "2"
    assert G.extract_math_answer("I think it is 42") is None


@pytest.mark.parametrize("pred, gold, expected", [
    (r"so the answer is \boxed{0.5}", r"\frac{1}{2}", True),
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\sqrt3/2", True),
    (r"\boxed{(1,3)}", "(1,2)", False),
    (r"\boxed{4.5}", r"\frac{14}{3}", False),
    ("the answer is 72 probably", "72", False),  # unparsable (no box, no Final Answer line)
])
def test_strict_math_grader(pred, gold, expected):
    assert G.grade_math_strict(pred, gold) is expected


def test_reference_grader_reproduces_the_release_false_positives():
    # intpart: 4.5 -> "4" and 14/3 -> 4.666 -> "4", counted equal by the release (spec section 11).
    assert G.reference_math_strategy("4.5", r"\frac{14}{3}") == "intpart"
    assert G.grade_math_reference(r"\boxed{4.5}", r"\frac{14}{3}") is True
    # digits: (3,5) vs 35.
    assert G.grade_math_reference(r"\boxed{35}", "(3,5)") is True
    # latex_text makes formatting differences equal; a real mismatch stays wrong.
    assert G.reference_math_strategy(r"\left[ a, b \right]", r"[a,b]") == "latex_text"
    assert G.grade_math_reference(r"\boxed{x+1}", "y") is False
    # The release falls back to the whole text where strict finds nothing.
    assert G.grade_math_reference("72", "72") is True and G.grade_math_strict("72", "72") is False


def test_grade_math_reports_both_modes():
    res = G.grade("math", {"gold": r"\frac{14}{3}"}, r"\boxed{4.5}")
    assert (res.correct, res.extracted, res.parse_failed) == (False, "4.5", False)
    assert res.detail["reference"] is True and res.detail["reference_strategy"] == "intpart"
    assert G.grade("math", {"gold": r"\frac{14}{3}"}, r"\boxed{4.5}", mode="reference").correct


# ----------------------------------------------------------------------------- multiple choice

def test_shuffle_options_is_deterministic_and_follows_the_release_md5_rule():
    opts = ["right", "w1", "w2", "w3"]
    a = G.shuffle_options("What is x?", opts, 0, seed=42)
    assert a == G.shuffle_options("What is x?", opts, 0, seed=42)
    new, letter = a
    assert sorted(new) == sorted(opts) and new["ABCD".index(letter)] == "right"
    perm = list(range(4))
    random.Random(int(hashlib.md5(b"42::What is x?").hexdigest()[:16], 16)).shuffle(perm)
    assert new == [opts[i] for i in perm]
    # Different seeds or stems give different orders for some questions (not always the same).
    orders = {tuple(G.shuffle_options(f"q{i}", opts, 0, seed=s)[0]) for i in range(6) for s in (0, 1)}
    assert len(orders) > 3


@pytest.mark.parametrize("text, letter", [
    (r"... so \boxed{C}", "C"), (r"\boxed{\text{D}}", "D"), ("reasoning\nFinal Choice: B", "B"),
    ("Final Answer: (a)", "A"), ("B. because of X", "B"), ("answer: d", "D"),
    ("I cannot decide", None), ("", None),
])
def test_extract_choice(text, letter):
    assert G.extract_choice(text) == letter


def test_unparsable_choice_is_wrong_in_strict_and_A_in_reference():
    rec = {"gold": "A", "options": ["p", "q", "r", "s"]}
    strict = G.grade("choice", rec, "I am not sure.")
    ref = G.grade("choice", rec, "I am not sure.", mode="reference")
    assert (strict.correct, strict.extracted, strict.parse_failed) == (False, None, True)
    assert (ref.correct, ref.extracted, ref.parse_failed) == (True, "A", True)
    assert G.grade("choice", {"gold": "C", "options": list("pqrs")}, r"\boxed{C}").correct


# ----------------------------------------------------------------------------- code

def test_extract_code_skips_think_blocks_and_takes_the_first_python_fence():
    text = ("<think>```python\nprint('draft')\n```</think> Here:\n```python\ndef f():\n    return 1\n```"
            "\n```python\ndef g(): pass\n```")
    assert G.extract_code(text) == "def f():\n    return 1"
    assert G.extract_code("no code, just words") is None
    assert G.extract_code("```python\n```") is None


def test_compare_stdio_output_uses_decimal_tolerance_per_line():
    assert G.compare_stdio_output("0.50\n3\n", "0.5\n3")
    assert G.compare_stdio_output("1e2", "100")
    assert not G.compare_stdio_output("1 2", "1 3")
    assert not G.compare_stdio_output("1\n2", "1")
    assert not G.compare_stdio_output("yes", "YES")


def test_grade_code_pass_fail_timeout_memory():
    tests = "assert add(2, 3) == 5\n"
    assert G.grade_code("def add(a, b):\n    return a + b", tests, timeout_s=5).passed
    wrong = G.grade_code("def add(a, b):\n    return a - b", tests, timeout_s=5)
    assert not wrong.passed and wrong.error_type == "RE" and "AssertionError" in wrong.detail
    loop = G.grade_code("def add(a, b):\n    while True:\n        pass", tests, timeout_s=1)
    assert not loop.passed and loop.error_type == "TLE"
    bomb = G.grade_code("x = bytearray(8 * 1024**3)\ndef add(a, b):\n    return a + b", tests,
                        timeout_s=5, memory_mb=512)
    assert not bomb.passed and bomb.error_type in ("MLE", "RE")
    assert G.grade_code(None, tests).error_type == "EMPTY_CODE"


def test_grade_code_reports_contained_network_and_outside_writes_as_failures(tmp_path):
    outside = tmp_path / "escaped.txt"
    net = G.grade_code("import socket\nsocket.create_connection(('10.0.0.1', 80), timeout=1)",
                       "pass", timeout_s=5)
    write = G.grade_code(f"open({str(outside)!r}, 'w').write('x')", "pass", timeout_s=5)
    assert not net.passed and net.error_type == "SANDBOX" and "blocked" in net.detail
    # The host's tmp_path does not exist in the sandbox's mount namespace: refused or not found, never written.
    assert not write.passed and write.error_type in ("SANDBOX", "RE")
    assert not outside.exists()


def test_grade_stdio_and_functional():
    prog = "a, b = map(int, input().split())\nprint(a + b)"
    assert G.grade_stdio(prog, ["1 2\n", "5 5\n"], ["3\n", "10"], timeout_s=5).passed
    wa = G.grade_stdio(prog, ["1 2\n", "5 5\n"], ["3", "11"], timeout_s=5)
    assert (wa.passed, wa.num_passed, wa.error_type) == (False, 1, "WA")
    sol = ("class Solution:\n    def scale(self, xs, k):\n        print('noise')\n"
           "        return tuple(x * k for x in xs)")
    ok = G.grade_functional(sol, "scale", ["[1, 2]\n3", "[]\n5"], ["[3, 6]", "[]"], timeout_s=3)
    assert ok.passed and ok.num_passed == 2
    bad = G.grade_functional("def scale(xs, k):\n    return xs", "scale", ["[1]\n2"], ["[2]"],
                             timeout_s=3)
    assert not bad.passed and bad.error_type == "WA"
    assert G.grade_functional("def other(): pass", "scale", ["1"], ["1"]).error_type == "NO_FUNC"


def test_grade_dispatch_code_record_and_missing_fence():
    rec = {"tests": "assert sq(3) == 9\n", "test_mode": "script", "timeout_s": 5}
    good = G.grade("code", rec, "Sure:\n```python\ndef sq(x):\n    return x * x\n```")
    assert good.correct and not good.parse_failed and good.detail["error_type"] is None
    missing = G.grade("code", rec, "def sq(x): return x * x")
    assert not missing.correct and missing.parse_failed


# ----------------------------------------------------------------------------- QA and pass@k

def test_open_qa_normalisation_exact_match_and_f1():
    assert G.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert G.exact_match("the Eiffel Tower.", ["Eiffel Tower"])
    assert G.exact_match("July 4, 1776", "4 July 1776")  # dateutil normalisation
    assert not G.exact_match("1777", "1776")
    assert G.exact_match("Mildred Gale", ["Mildred Warner", "Mildred Gale"])
    assert G.f1_score("james madison jr", "James Madison") == pytest.approx(0.8)
    assert G.f1_score("", "x") == 0.0
    res = G.grade("qa", {"gold": "George VI", "aliases": ["George VI"]}, r"\boxed{george vi}")
    assert res.correct and res.detail["f1"] == 1.0
    assert not G.grade("qa", {"gold": "George VI"}, "George VI").correct  # no box: parse failure
    assert G.grade("qa", {"gold": "George VI"}, "George VI", mode="reference").correct


def test_pass_at_k_matches_the_combinatorial_definition():
    for n, c, k in [(10, 3, 1), (10, 3, 5), (5, 0, 2), (5, 5, 5), (7, 2, 3)]:
        subsets = list(itertools.combinations([1] * c + [0] * (n - c), k))
        assert G.pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert G.pass_at_k(10, 3, 1) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="k <= n"):
        G.pass_at_k(3, 1, 5)


def test_grade_rejects_unknown_mode_and_task_type():
    with pytest.raises(ValueError, match="mode="):
        G.grade("math", {"gold": "1"}, "x", mode="lenient")
    with pytest.raises(ValueError, match="task_type="):
        G.grade("essay", {"gold": "1"}, "x")
    assert math.isclose(G.pass_at_k(2, 1, 1), 0.5)
