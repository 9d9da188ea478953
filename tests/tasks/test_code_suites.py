"""Splitting assert-style suites into sandbox calls and parent-side checks, and the plain-data value encoding.

Inline problems in the published formats (MBPP asserts, evalplus scripts, HumanEval/HumanEval+ ``check``); no
sandbox runs here except the fall-back rows at the end.
"""
import collections
import math

import pytest

from recmas_ray.sandbox.values import decode_value, encode_value
from recmas_ray.tasks import code_graders as G
from recmas_ray.tasks.code_suites import Probe, Unsplittable, split_suite

_HUMANEVALPLUS = '''
import numpy as np

def is_floats(x) -> bool:
    # check if it is float; List[float]; Tuple[float]
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)):
        return all(isinstance(i, float) for i in x)
    if isinstance(x, np.ndarray):
        return x.dtype == np.float64 or x.dtype == np.float32
    return False


def assertion(out, exp, atol):
    exact_match = out == exp

    if atol == 0 and is_floats(exp):
        atol = 1e-6
    if not exact_match and atol != 0:
        np.testing.assert_allclose(out, exp, atol=atol)
    else:
        assert exact_match


def check(candidate):
    inputs = [[[1.0, 2.0]], [[3.0]]]
    results = [1.5, 3.0]
    for i, (inp, exp) in enumerate(zip(inputs, results)):
        assertion(candidate(*inp), exp, 0)


check(mean)
'''

# (suite, entry point, the probes it must make, values that pass, values that fail)
SPLITS = [
    ("assert f(2) == 12345\n", "f", [Probe("f", (2,))], [12345], [12346]),
    ("import math\nassert math.isclose(f(1), 0.5, rel_tol=0.001)\n", "f", [Probe("f", (1,))], [0.5004], [0.6]),
    ("assert set(f((1, 2))) == set((2, 1))\nassert not f(())\n", "f", [Probe("f", ((1, 2),)), Probe("f", ((),))],
     [(2, 1), []], [(2, 1), [0]]),
    ("assert sum(3, 4) == 7\n", "sum", [Probe("sum", (3, 4))], [7], [8]),
    ("def check(candidate):\n    assert abs(candidate(1.0) - 0.5) < 1e-6, 'msg'\n    assert True\n\ncheck(half)\n",
     "half", [Probe("half", (1.0,))], [0.5], [0.0]),
    (_HUMANEVALPLUS, "mean", [Probe("mean", ([1.0, 2.0],)), Probe("mean", ([3.0],))], [1.5, 3.0000001], [1.5, 3.1]),
    ("for x in range(3):\n    assert f(x) == x * 2\n", "f", [Probe("f", (0,)), Probe("f", (1,)), Probe("f", (2,))],
     [0, 2, 4], [0, 2, 5]),
]


@pytest.mark.parametrize("tests,entry,probes,good,bad", SPLITS)
def test_suite_splits_into_calls_and_parent_checks(tests, entry, probes, good, bad):
    suite = split_suite(tests, entry)
    assert suite.probes == probes  # only calls: no expected value goes to the sandbox
    ok = suite.verdict([{"value": v} for v in good])
    assert ok[1] is None and ok[0] == len(suite.checks), ok
    assert suite.verdict([{"value": v} for v in bad])[1] == "WA"
    assert suite.verdict([{"error": "ValueError", "detail": "x"}] * len(probes))[1] == "RE"
    assert suite.verdict([])[1] == "TLE"  # the run stopped before any value came back


UNSPLITTABLE = {
    "random inputs": "import random\nfor _ in range(3):\n    x = random.random()\n    assert f(x) == 2 * x\n",
    "helper function": "def ref(x):\n    return x\nassert f(1) == ref(1)\n",
    "nested calls": "assert f(f(1)) == 1\n",
    "method of a value": "assert f('a').upper() == 'A'\n",
    "candidate as a value": "def check(candidate):\n    assert candidate.__name__ == 'f'\ncheck(f)\n",
    "different evalplus helper": _HUMANEVALPLUS.replace("exact_match = out == exp", "exact_match = True"),
    "builtin the parent does not evaluate": "assert f(list(map(int, '12'))) == 3\n",
    "no call of the program": "assert 1 == 1\n",
}


@pytest.mark.parametrize("name", sorted(UNSPLITTABLE))
def test_suites_the_parent_cannot_judge_are_unsplittable(name):
    with pytest.raises(Unsplittable):
        split_suite(UNSPLITTABLE[name], "f")


@pytest.mark.sandbox
def test_unsplittable_suite_is_graded_in_the_sandbox_and_says_so():
    tests = "import random\nfor _ in range(3):\n    x = random.randint(0, 9)\n    assert f(x) == 2 * x\n"
    good = G.grade_code("def f(x):\n    return 2 * x\n", tests, timeout_s=10, fn_name="f")
    assert good.passed and good.grading == "in_sandbox" and "import random" in good.grading_note, good
    bad = G.grade_code("def f(x):\n    return x\n", tests, timeout_s=10, fn_name="f")
    assert not bad.passed and bad.grading == "in_sandbox"
    # The in-sandbox tests see the harness's builtins, not the program's (the entry point excepted).
    shadow = G.grade_code("range = lambda *a: iter(())\ndef f(x):\n    return x\n", tests, timeout_s=10, fn_name="f")
    assert not shadow.passed and shadow.grading == "in_sandbox", shadow


Point = collections.namedtuple("Point", "x y")
PLAIN = [None, True, 0, -7, 2 ** 80, -(2 ** 70), 1.5, -0.0, math.inf, "text", b"\x00\xff", bytearray(b"ab"),
         [1, [2, (3, 4)]], (), {1, 2, 3}, frozenset({"a"}), {"k": (1, 2), 3: [None]}, 1 + 2j,
         collections.deque([1, 2])]


@pytest.mark.parametrize("value", PLAIN, ids=repr)
def test_plain_values_round_trip_exactly(value):
    back = decode_value(encode_value(value))
    assert back == value and type(back) is type(value)


def test_library_containers_become_the_builtin_they_compare_as():
    assert decode_value(encode_value(collections.Counter("aab"))) == {"a": 2, "b": 1}
    assert type(decode_value(encode_value(collections.OrderedDict(a=1)))) is dict
    assert decode_value(encode_value(Point(1, 2))) == (1, 2)
    assert math.isnan(decode_value(encode_value(math.nan)))
    assert encode_value({3, 1, 2}) == {"set": [1, 2, 3]}  # deterministic order


class _Always:
    def __eq__(self, other):
        return True


class _Listy(list):
    def __eq__(self, other):
        return True


class _Tuply(tuple):
    _fields = ("a",)

    def __eq__(self, other):
        return True


@pytest.mark.parametrize("value", [_Always(), _Listy([1]), _Tuply((1,)), [1, _Always()], {"k": _Listy()},
                                   object(), len, type], ids=repr)
def test_objects_that_are_not_plain_data_are_refused(value):
    with pytest.raises(TypeError, match="not plain data"):
        encode_value(value)


@pytest.mark.parametrize("obj", [{"tuple": 1}, {"set": [[1]]}, {"x": 1}, {"int": 5}, {"float": "1.0"},
                                 {"dict": [[1]]}, {"tuple": [], "set": []}])
def test_malformed_encodings_are_refused(obj):
    with pytest.raises(ValueError):
        decode_value(obj)
