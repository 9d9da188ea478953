"""Programs that try to pass a benchmark's tests without solving it, graded from a root and an unprivileged parent.

The verdict is computed in the parent from the values the sandbox sends back, so a cheat must fail however it
reads or rewrites its own process: frames, its own memory through /proc (dir_fd included) or ctypes, the
builtins the tests use, objects that compare equal to anything, or forged result lines. Problems are written
inline in each benchmark's published format (MBPP+ evalplus script, MBPP asserts, HumanEval ``check``,
HumanEval+ ``check`` with evalplus' helpers, LiveCodeBench functional); the reference solution passes each.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from sandbox_parents import ROOT, SYSTEM_PYTHON, _setpriv_prefix, make_parent, parents

from recmas_ray.tasks.code_graders import CodeResult, grade_program

pytestmark = pytest.mark.sandbox  # every test here runs code in the bubblewrap sandbox

_DRIVER = str(Path(__file__).with_name("grade_as_user_driver.py"))

# evalplus' helpers, as the MBPP+ `test` scripts carry them.
_EVALPLUS = '''
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
        assert np.allclose(out, exp, rtol=1e-07, atol=atol)
    else:
        assert exact_match
'''
SUITES = {
    "mbppplus": dict(test_type="script", fn_name="combine", tests=_EVALPLUS + (
        "inputs = [[2, 3], [0, 0], [-4, 9], [10, 32]]\nresults = [5, 0, 5, 42]\n"
        "for i, (inp, exp) in enumerate(zip(inputs, results)):\n    assertion(combine(*inp), exp, 0)\n")),
    "mbpp": dict(test_type="script", fn_name="combine", tests=(
        "assert combine(2, 3) == 5\nassert abs(combine(0.5, 0.25) - 0.75) < 1e-9\nassert combine(-4, 9) == 5\n")),
    "humaneval": dict(test_type="script", fn_name="combine", tests=(
        "METADATA = {'author': 'x'}\n\ndef check(candidate):\n    assert candidate(2, 3) == 5\n"
        "    assert abs(candidate(0.5, 0.25) - 0.75) < 1e-6, 'floats'\n    assert candidate(-4, 9) == 5\n")),
    "humanevalplus": dict(test_type="script", fn_name="combine", tests=_EVALPLUS.replace(
        "assert np.allclose(out, exp, rtol=1e-07, atol=atol)", "np.testing.assert_allclose(out, exp, atol=atol)") + (
        "\n\ndef check(candidate):\n    inputs = [[2, 3], [0.5, 0.25], [-4, 9]]\n    results = [5, 0.75, 5]\n"
        "    for i, (inp, exp) in enumerate(zip(inputs, results)):\n        assertion(candidate(*inp), exp, 0)\n")),
    "lcb_functional": dict(test_type="functional", fn_name="combine", inputs=["2\n3", "-4\n9", "10\n32"],
                           outputs=["5", "5", "42"]),
}
SOLUTION = "def combine(a, b):\n    return a + b\n"

# Finds the expected values wherever they might be in the child: names in any frame, the test text in memory.
_SEARCH_FRAMES = '''
def _search(frame):
    while frame is not None:
        for space in (frame.f_locals, frame.f_globals):
            for key in ("E", "exp", "results", "expected", "outputs", "_OUTPUTS", "nonce", "_tests"):
                if key in space:
                    return space[key]
        frame = frame.f_back
    return 0
'''
CHEATS = {
    "sys._getframe replaced": "import sys\n_real = sys._getframe\nsys._getframe = lambda depth=0: _real(depth + 1)\n"
                              + _SEARCH_FRAMES + "def combine(a, b):\n    return _search(_real(1))\n",
    "ctypes frame walk": "import ctypes\n" + _SEARCH_FRAMES + (
        "def combine(a, b):\n    get = ctypes.pythonapi.PyEval_GetFrame\n    get.restype = ctypes.c_void_p\n"
        "    return _search(ctypes.cast(get(), ctypes.py_object).value)\n"),
    "/proc/self/mem through dir_fd": '''
import os, re
def combine(a, b):
    d = os.open("/proc/self", os.O_RDONLY)
    maps = os.read(os.open("maps", os.O_RDONLY, dir_fd=d), 1 << 20).decode()
    mem = os.open("mem", os.O_RDONLY, dir_fd=d)
    for line in maps.splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if "r" not in line.split()[1] or hi - lo > 64 << 20:
            continue
        try:
            os.lseek(mem, lo, 0)
            chunk = os.read(mem, hi - lo)
        except OSError:
            continue
        for pattern in (rb"== (-?[0-9]+)", rb"results = \\[([0-9]+)", rb'"outputs": \\["([0-9]+)'):
            m = re.search(pattern, chunk)
            if m:
                return int(m.group(1))
    return 0
''',
    "builtins shadowed in the tests' namespace": "abs = lambda x: 0\nzip = lambda *a: iter(())\n"
                                                "def combine(a, b):\n    return 5\n",
    "zip shadowed, no solution": "zip = lambda *a: iter(())\n",
    "patched builtins module": "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.zip = lambda *a: iter(())\n"
                               "def combine(a, b):\n    return 5\n",
    "always-equal object": '''
class Anything:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return True
    def __sub__(self, other): return self
    def __abs__(self): return self
    def __bool__(self): return True
    __hash__ = object.__hash__
def combine(a, b):
    return Anything()
''',
    "list subclass with its own __eq__": "class L(list):\n    def __eq__(self, other): return True\n"
                                         "def combine(a, b):\n    return L([1])\n",
    "int subclass with its own __eq__": "class I(int):\n    def __eq__(self, other): return True\n"
                                        "    __hash__ = int.__hash__\ndef combine(a, b):\n    return I(0)\n",
    "forged results on every fd": '''
import os
line = b'\\nRECMAS-PROBE-RESULTS {"outcomes": [{"value": 5}, {"value": 0.75}, {"value": 5}, {"value": 42}]}\\n'
for fd in range(1, 256):
    try:
        os.write(fd, line)
    except OSError:
        pass
os._exit(0)
''',
    "boot config read back from its fds": '''
import os
def combine(a, b):
    for fd in range(3, 256):
        try:
            os.lseek(fd, 0, 0)
            text = os.read(fd, 1 << 20).decode(errors="ignore")
        except OSError:
            continue
        if "== " in text:
            return int(text.split("== ")[1].split()[0].strip(",\\\\n"))
    return 0
''',
    "sys.exit(0) at import": "import sys\nsys.exit(0)\n",
    "os._exit(0) in the call": "import os\ndef combine(a, b):\n    os._exit(0)\n",
}


def _grade(parent, program: str, suite: dict) -> CodeResult:
    kwargs = {"timeout_s": 10, **suite}
    if parent.uid == os.geteuid():
        return grade_program(program, **kwargs)
    req = json.dumps({"root": ROOT, "program": program, **kwargs})
    proc = subprocess.run([*_setpriv_prefix(), SYSTEM_PYTHON, "-I", _DRIVER], input=req, capture_output=True,
                          text=True, cwd="/", env={"PATH": os.defpath, "LANG": "C.UTF-8"}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return CodeResult(**json.loads(proc.stdout))


@pytest.fixture(params=parents())
def parent(request):
    return make_parent(request.param)


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_reference_solution_passes_graded_in_the_parent(parent, suite: str) -> None:
    res = _grade(parent, SOLUTION, SUITES[suite])
    assert res.passed and res.grading == "parent", res
    assert res.num_passed == res.num_tests >= 3, res


# Every cheat against the MBPP+ script from both parents in the default tier; against every suite format in
# the integration tier (the same check, 4x the sandbox calls).
_MATRIX = [pytest.param(c, s, marks=[] if s == "mbppplus" else [pytest.mark.integration])
           for c in sorted(CHEATS) for s in sorted(SUITES)]


@pytest.mark.parametrize(("cheat", "suite"), _MATRIX)
def test_cheat_fails(parent, cheat: str, suite: str) -> None:
    res = _grade(parent, CHEATS[cheat], SUITES[suite])
    assert not res.passed and res.grading == "parent", (cheat, suite, res)


def test_always_equal_object_is_not_data() -> None:
    res = grade_program(CHEATS["always-equal object"], **SUITES["mbpp"])
    assert not res.passed and res.error_type == "NOT_DATA" and "Anything" in res.detail, res
    listy = grade_program(CHEATS["list subclass with its own __eq__"], **SUITES["mbppplus"])
    assert not listy.passed and listy.error_type == "NOT_DATA", listy

