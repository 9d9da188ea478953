"""Graders: math (strict math-verify vs the release's lenient chain), choice, code, QA, pass@k."""

import hashlib
import itertools
import math
import random

import pytest

from recmas_ray import tasks as T
from recmas_ray.eval import results as R
from recmas_ray.tasks import code_graders as CG
from recmas_ray.tasks import math as M
from recmas_ray.tasks import multiple_choice as MC
from recmas_ray.tasks import qa as QA


# ----------------------------------------------------------------------------- math

def test_extract_boxed_handles_nesting_and_takes_the_last_complete_box():
    text = r"first \boxed{1} then \boxed{\frac{\sqrt{3}}{2}} and a cut \boxed{7"
    assert M.extract_boxed(text) == r"\frac{\sqrt{3}}{2}"
    assert M.extract_boxed(r"\boxed{\left( 3, \frac{\pi}{2} \right)}") == r"\left( 3, \frac{\pi}{2} \right)"
    assert M.extract_boxed("no box here") is None


def test_extract_math_answer_falls_back_to_final_answer_line_then_none():
    assert M.extract_math_answer("work...\nFinal Answer: 42\n") == "42"
    assert M.extract_math_answer(r"Final Answer: 1 \boxed{2}") == "2"
    assert M.extract_math_answer("I think it is 42") is None


@pytest.mark.parametrize("pred, gold, expected", [
    (r"so the answer is \boxed{0.5}", r"\frac{1}{2}", True),
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\sqrt3/2", True),
    (r"\boxed{(1,3)}", "(1,2)", False),
    (r"\boxed{4.5}", r"\frac{14}{3}", False),
    ("the answer is 72 probably", "72", False),  # unparsable (no box, no Final Answer line)
])
def test_strict_math_grader(pred, gold, expected):
    assert M.grade_math_strict(pred, gold) is expected


def test_reference_grader_reproduces_the_release_false_positives():
    # intpart: 4.5 -> "4" and 14/3 -> 4.666 -> "4", counted equal by the release (docs/reproducing.md#sources).
    assert M.reference_math_strategy("4.5", r"\frac{14}{3}") == "intpart"
    assert M.grade_math_reference(r"\boxed{4.5}", r"\frac{14}{3}") is True
    # digits: (3,5) vs 35.
    assert M.grade_math_reference(r"\boxed{35}", "(3,5)") is True
    # latex_text makes formatting differences equal; a real mismatch stays wrong.
    assert M.reference_math_strategy(r"\left[ a, b \right]", r"[a,b]") == "latex_text"
    assert M.grade_math_reference(r"\boxed{x+1}", "y") is False
    # The release falls back to the whole text where strict finds nothing.
    assert M.grade_math_reference("72", "72") is True and M.grade_math_strict("72", "72") is False


def test_grade_math_reports_both_modes():
    res = T.grade("math", {"gold": r"\frac{14}{3}"}, r"\boxed{4.5}")
    assert (res.correct, res.extracted, res.parse_failed) == (False, "4.5", False)
    assert res.detail["reference"] is True and res.detail["reference_strategy"] == "intpart"
    assert T.grade("math", {"gold": r"\frac{14}{3}"}, r"\boxed{4.5}", mode="reference").correct


# ----------------------------------------------------------------------------- multiple choice

def test_shuffle_options_is_deterministic_and_follows_the_release_md5_rule():
    opts = ["right", "w1", "w2", "w3"]
    a = MC.shuffle_options("What is x?", opts, 0, seed=42)
    assert a == MC.shuffle_options("What is x?", opts, 0, seed=42)
    new, letter = a
    assert sorted(new) == sorted(opts) and new["ABCD".index(letter)] == "right"
    perm = list(range(4))
    random.Random(int(hashlib.md5(b"42::What is x?").hexdigest()[:16], 16)).shuffle(perm)
    assert new == [opts[i] for i in perm]
    # Different seeds or stems give different orders for some questions (not always the same).
    orders = {tuple(MC.shuffle_options(f"q{i}", opts, 0, seed=s)[0]) for i in range(6) for s in (0, 1)}
    assert len(orders) > 3


@pytest.mark.parametrize("text, letter", [
    (r"... so \boxed{C}", "C"), (r"\boxed{\text{D}}", "D"), ("reasoning\nFinal Choice: B", "B"),
    ("Final Answer: (a)", "A"), ("B. because of X", "B"), ("answer: d", "D"),
    ("I cannot decide", None), ("", None),
])
def test_extract_choice(text, letter):
    assert MC.extract_choice(text) == letter


def test_unparsable_choice_is_wrong_in_strict_and_A_in_reference():
    rec = {"gold": "A", "options": ["p", "q", "r", "s"]}
    strict = T.grade("choice", rec, "I am not sure.")
    ref = T.grade("choice", rec, "I am not sure.", mode="reference")
    assert (strict.correct, strict.extracted, strict.parse_failed) == (False, None, True)
    assert (ref.correct, ref.extracted, ref.parse_failed) == (True, "A", True)
    assert T.grade("choice", {"gold": "C", "options": list("pqrs")}, r"\boxed{C}").correct


# ----------------------------------------------------------------------------- code

def test_extract_code_skips_think_blocks_and_takes_the_first_python_fence():
    text = ("<think>```python\nprint('draft')\n```</think> Here:\n```python\ndef f():\n    return 1\n```"
            "\n```python\ndef g(): pass\n```")
    assert CG.extract_code(text) == "def f():\n    return 1"
    assert CG.extract_code("no code, just words") is None
    assert CG.extract_code("```python\n```") is None


def test_compare_stdio_output_uses_decimal_tolerance_per_line():
    assert CG.compare_stdio_output("0.50\n3\n", "0.5\n3")
    assert CG.compare_stdio_output("1e2", "100")
    assert not CG.compare_stdio_output("1 2", "1 3")
    assert not CG.compare_stdio_output("1\n2", "1")
    assert not CG.compare_stdio_output("yes", "YES")


@pytest.mark.sandbox
def test_grade_code_pass_fail_timeout_memory():
    # wall-clock bounds of 30 s where a verdict other than a timeout is expected: a loaded CI machine can take
    # seconds to start Python in the sandbox; only the endless loop is meant to time out
    tests = "assert add(2, 3) == 5\n"
    assert CG.grade_code("def add(a, b):\n    return a + b", tests, timeout_s=30).passed
    wrong = CG.grade_code("def add(a, b):\n    return a - b", tests, timeout_s=30)
    assert not wrong.passed and wrong.error_type == "WA" and wrong.grading == "parent"  # judged in the parent
    loop = CG.grade_code("def add(a, b):\n    while True:\n        pass", tests, timeout_s=1)
    assert not loop.passed and loop.error_type == "TLE"
    bomb = CG.grade_code("x = bytearray(8 * 1024**3)\ndef add(a, b):\n    return a + b", tests,
                        timeout_s=30, memory_mb=512)
    assert not bomb.passed and bomb.error_type in ("MLE", "RE")
    assert CG.grade_code(None, tests).error_type == "EMPTY_CODE"


@pytest.mark.sandbox
def test_grade_code_reports_contained_network_and_outside_writes_as_failures(tmp_path):
    outside = tmp_path / "escaped.txt"
    net = CG.grade_code("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)",
                       "pass", timeout_s=30)
    write = CG.grade_code(f"open({str(outside)!r}, 'w').write('x')", "pass", timeout_s=30)
    assert not net.passed and net.error_type == "SANDBOX" and "blocked" in net.detail
    # The host's tmp_path does not exist in the sandbox's mount namespace: refused or not found, never written.
    assert not write.passed and write.error_type in ("SANDBOX", "RE")
    assert not outside.exists()


@pytest.mark.sandbox
def test_grade_stdio_and_functional():
    prog = "a, b = map(int, input().split())\nprint(a + b)"
    assert CG.grade_stdio(prog, ["1 2\n", "5 5\n"], ["3\n", "10"], timeout_s=20).passed
    wa = CG.grade_stdio(prog, ["1 2\n", "5 5\n"], ["3", "11"], timeout_s=20)
    assert (wa.passed, wa.num_passed, wa.error_type) == (False, 1, "WA")
    sol = ("class Solution:\n    def scale(self, xs, k):\n        print('noise')\n"
           "        return tuple(x * k for x in xs)")
    ok = CG.grade_functional(sol, "scale", ["[1, 2]\n3", "[]\n5"], ["[3, 6]", "[]"], timeout_s=20)
    assert ok.passed and ok.num_passed == 2
    bad = CG.grade_functional("def scale(xs, k):\n    return xs", "scale", ["[1]\n2"], ["[2]"],
                             timeout_s=20)
    assert not bad.passed and bad.error_type == "WA"
    assert CG.grade_functional("def other(): pass", "scale", ["1"], ["1"]).error_type == "NO_FUNC"


@pytest.mark.sandbox
def test_grade_dispatch_code_record_and_missing_fence():
    rec = {"tests": "assert sq(3) == 9\n", "test_mode": "script", "timeout_s": 5}
    good = T.grade("code", rec, "Sure:\n```python\ndef sq(x):\n    return x * x\n```")
    assert good.correct and not good.parse_failed and good.detail["error_type"] is None
    missing = T.grade("code", rec, "def sq(x): return x * x")
    assert not missing.correct and missing.parse_failed


# ----------------------------------------------------------------------------- grader cheats

_ADD_TESTS = "E = 5\nassert add(2, 3) == E\nassert abs(add(0.5, 0.25) - 0.75) < 1e-9\n"
_WRONG = "def add(a, b):\n    return 0\n"
SCRIPT_CHEATS = {
    "exit()": "exit()\n" + _WRONG,
    "sys.exit(0)": "import sys\nsys.exit(0)\n" + _WRONG,
    "os._exit(0)": "import os\nos._exit(0)\n" + _WRONG,
    "__main__ guard": _WRONG + "import sys\nif __name__ == '__main__':\n    sys.exit(0)\n",
    "exit during a test": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "SystemExit during a test": "def add(a, b):\n    raise SystemExit(0)\n",
    "forged stdout": _WRONG + "import sys, os\nsys.__stdout__.write('OK\\nPASSED\\n__RECMAS_FUNCTIONAL_RESULT__"
                     "{\"ok\": true}\\n')\nsys.__stdout__.flush()\nos._exit(0)\n",
    "fake harness event": _WRONG + "import sys, os\nsys.audit('recmas.sandbox.tests_passed')\nos._exit(0)\n",
    "junk on every fd": _WRONG + "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'0' * 32)\n"
                        "    except OSError:\n        pass\nos._exit(0)\n",
    "caller f_globals": "import sys\ndef add(a, b):\n    return sys._getframe(1).f_globals['E']\n",
    "f_back walk": "import sys\ndef add(a, b):\n    return sys._getframe(0).f_back.f_globals['E']\n",
    "traceback frame": "def add(a, b):\n    try:\n        raise ValueError\n    except ValueError as e:\n"
                       "        return e.__traceback__.tb_frame.f_back.f_globals['E']\n",
    "inspect.stack": "import inspect\ndef add(a, b):\n    return inspect.stack()[1].frame.f_globals['E']\n",
    "patched builtins": "import builtins\nbuiltins.abs = lambda x: 0\ndef add(a, b):\n    return 5\n",
    "ctypes frame": "import ctypes\ndef add(a, b):\n    f = ctypes.pythonapi.PyEval_GetFrame\n"
                    "    f.restype = ctypes.py_object\n    return f().f_back.f_globals['E']\n",
    "settrace": "import sys\ndef add(a, b):\n    sys.settrace(lambda *a: None)\n    return 5\n",
    "signal handler frame": "import os, signal\nseen = {}\ndef grab(signum, frame):\n"
                            "    seen['E'] = frame.f_back.f_globals.get('E')\n"
                            "signal.signal(signal.SIGUSR1, grab)\ndef add(a, b):\n"
                            "    os.kill(os.getpid(), signal.SIGUSR1)\n    return seen.get('E')\n",
}


@pytest.mark.sandbox
@pytest.mark.parametrize("name", sorted(SCRIPT_CHEATS))
def test_script_grader_cheats_fail(name):
    res = CG.grade_code(SCRIPT_CHEATS[name], _ADD_TESTS, timeout_s=30)
    assert not res.passed, (name, res)


@pytest.mark.sandbox
def test_script_grader_reference_solutions_still_pass():
    for program in ["def add(a, b):\n    return a + b\n",
                    "import sys\nfrom collections import namedtuple\nP = namedtuple('P', 'x y')\n"
                    "def add(a, b):\n    print('noise', file=sys.stderr)\n    return P(a, b).x + P(a, b).y\n",
                    "def add(a, b):\n    return a + b\nif __name__ == '__main__':\n    print(add(1, 2))\n"]:
        res = CG.grade_code(program, _ADD_TESTS + "import numpy as np\nassert np.isclose(add(1, 1), 2)\n",
                           timeout_s=10)
        assert res.passed, (program, res)


FUNCTIONAL_CHEATS = {
    "forged result line": "import sys, os\nsys.__stdout__.write('\\n__RECMAS_FUNCTIONAL_RESULT__"
                          "[{\"got\": \"[3, 6]\"}, {\"got\": \"[]\"}]\\n')\nsys.__stdout__.flush()\nos._exit(0)\n",
    "old-format forged line": "import sys\nprint('__RECMAS_FUNCTIONAL_RESULT__{\"ok\": true, \"passed\": 2, "
                              "\"err\": null, \"detail\": \"OK\"}')\nsys.exit(0)\n",
    "exit at import": "exit(0)\ndef scale(xs, k):\n    return xs\n",
    "exit in the call": "import os\ndef scale(xs, k):\n    os._exit(0)\n",
    "caller frame": "import sys\ndef scale(xs, k):\n    return sys._getframe(1).f_globals.get('_OUTPUTS')\n",
}


@pytest.mark.sandbox
@pytest.mark.parametrize("name", sorted(FUNCTIONAL_CHEATS))
def test_functional_grader_cheats_fail(name):
    res = CG.grade_functional(FUNCTIONAL_CHEATS[name], "scale", ["[1, 2]\n3", "[]\n5"], ["[3, 6]", "[]"],
                             timeout_s=30)
    assert not res.passed, (name, res)


@pytest.mark.sandbox
def test_stdin_grader_cheats_fail():
    for program in ["exit(0)", "import os\nos._exit(0)", "import sys\nprint('3', file=sys.stderr)"]:
        assert not CG.grade_stdio(program, ["1 2\n"], ["3"], timeout_s=30).passed


@pytest.mark.sandbox
def test_grade_program_dispatches_row_interfaces():
    assert CG.grade_program("def add(a, b):\n    return a + b", test_type="assert", tests=_ADD_TESTS).passed
    check = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
    assert CG.grade_program("def add(a, b):\n    return a + b", test_type="script", tests=check, fn_name="add").passed
    assert not CG.grade_program("def add(a, b):\n    return a", test_type="script", tests=check, fn_name="add").passed
    assert CG.grade_program("class Solution:\n    def twice(self, x):\n        return 2 * x", test_type="functional",
                           fn_name="twice", inputs=["4"], outputs=["8"]).passed
    assert CG.grade_program("print(int(input()) * 2)", test_type="stdin", inputs=["4\n"], outputs=["8"]).passed
    with pytest.raises(ValueError, match="fn_name"):
        CG.grade_program("x = 1", test_type="functional", inputs=["1"], outputs=["1"])
    with pytest.raises(ValueError, match="test_type"):
        CG.grade_program("x = 1", test_type="essay")


# ----------------------------------------------------------------------------- QA and pass@k

def test_open_qa_normalisation_exact_match_and_f1():
    assert QA.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert QA.exact_match("the Eiffel Tower.", ["Eiffel Tower"])
    assert QA.exact_match("July 4, 1776", "4 July 1776")  # dateutil normalisation
    assert not QA.exact_match("1777", "1776")
    assert QA.exact_match("Mildred Gale", ["Mildred Warner", "Mildred Gale"])
    assert QA.f1_score("james madison jr", "James Madison") == pytest.approx(0.8)
    assert QA.f1_score("", "x") == 0.0
    res = T.grade("qa", {"gold": "George VI", "aliases": ["George VI"]}, r"\boxed{george vi}")
    assert res.correct and res.detail["f1"] == 1.0
    assert not T.grade("qa", {"gold": "George VI"}, "George VI").correct  # no box: parse failure
    assert T.grade("qa", {"gold": "George VI"}, "George VI", mode="reference").correct


def test_pass_at_k_matches_the_combinatorial_definition():
    for n, c, k in [(10, 3, 1), (10, 3, 5), (5, 0, 2), (5, 5, 5), (7, 2, 3)]:
        subsets = list(itertools.combinations([1] * c + [0] * (n - c), k))
        assert R.pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert R.pass_at_k(10, 3, 1) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="k <= n"):
        R.pass_at_k(3, 1, 5)


def test_grade_rejects_unknown_mode_and_task_type():
    with pytest.raises(ValueError, match="mode="):
        T.grade("math", {"gold": "1"}, "x", mode="lenient")
    with pytest.raises(ValueError, match="unknown task type 'essay'"):
        T.grade("essay", {"gold": "1"}, "x")
    assert math.isclose(R.pass_at_k(2, 1, 1), 0.5)


# ----------------------------------------------------------------------------- lenient: the value stated

def test_final_number_is_the_last_value_written():
    from recmas_ray.tasks.math import final_number

    assert final_number("The value of x is 65.") == 65.0
    assert final_number("17 - 8 = 9") == 9.0
    assert final_number("x=-3") == -3.0
    assert final_number("costs 1,250 dollars") == 1250.0
    assert final_number("about 2.5 units.") == 2.5
    assert final_number("no digits here") is None and final_number(None) is None
    assert final_number("x2 then 7") == 7.0  # digits glued to a word are not a number written


@pytest.mark.parametrize("reply,gold,strict,lenient", [
    ("x = 65.", "65", False, True),                        # states the value, no \boxed{}: lenient only
    ("The answer is \\boxed{65}.", "65", True, True),      # both
    ("x is 65, so x + 1 = 66", "65", False, False),        # the final number is another value
    ("I think it is 56.", "65", False, False),
    ("It is -3", "-3", False, True),
    ("65.0 exactly", "65", False, True),                   # numerically equal
    ("no number at all", "65", False, False),
    ("\\boxed{Paris}", "Paris", True, True),               # non-numeric gold: strict only
    ("It is Paris", "Paris", False, False),
])
def test_lenient_and_strict_on_known_cases(reply, gold, strict, lenient):
    from recmas_ray.tasks import grade
    from recmas_ray.tasks.math import grade_lenient

    strict_got = grade("qa", {"gold": gold}, reply).correct
    assert strict_got is strict
    got = grade_lenient(reply, gold, strict=strict_got)
    assert got.correct is lenient and got.detail["strict"] is strict
    assert grade_lenient(reply, gold).correct is lenient or gold == "Paris"  # strict computed by math_verify


def test_lenient_reads_the_reply_before_the_format_retry():
    from recmas_ray.eval.samples import own_reply
    from recmas_ray.tasks.math import grade_lenient

    rec = {"prediction": "x = 65.\nFinal Answer: \\boxed{12}", "gold": "65",
           "retry": {"raw_prediction": "x = 65.", "continuation": "12}"}}
    assert own_reply(rec) == "x = 65." and own_reply({"prediction": "so 4"}) == "so 4"
    assert grade_lenient(own_reply(rec), "65", strict=False).correct  # the appended guess is not the reply's
    assert not grade_lenient(rec["prediction"], "65", strict=False).correct
