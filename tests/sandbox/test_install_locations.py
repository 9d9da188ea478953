"""The sandbox starts, and still contains, from interpreters installed anywhere: venvs under /tmp, /work, $HOME,
/opt, /var/tmp and one reached through a symlink, each calling ``run_python`` from that venv's own interpreter.

Each case makes a throw-away folder in that place holding the venv and a host file next to it, and checks from
inside the sandbox that the venv is the interpreter, that nothing else of the folder (or of its parents) shows,
and that only the work folder and /tmp are writable. Venvs are made with ``--without-pip`` (no network, well under
a second) and removed afterwards; a root test run creates a missing place (e.g. /work on a CI machine) and removes
it again.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sandbox_parents import IS_ROOT, NOBODY, ROOT, SYSTEM_PYTHON

pytestmark = pytest.mark.sandbox  # every test here runs code in the bubblewrap sandbox

# Run by the venv's interpreter: one sandbox call that reports what it sees, plus a grading call.
_DRIVER = r'''
import dataclasses, json, sys
from recmas_ray.sandbox import SandboxConfig, bwrap, run_python
folder, base = sys.argv[1], sys.argv[2]
lay = bwrap.layout()
code = """
import json, os, sys
def can_write(path):
    try:
        with open(path, 'w') as f:
            f.write('x')
        return True
    except OSError:
        return False
folder, base = %r, %r
print(json.dumps({"prefix": sys.prefix, "folder": sorted(os.listdir(folder)), "base": sorted(os.listdir(base)),
                  "sibling": os.path.exists(os.path.join(folder, 'sibling.txt')),
                  "writes": {p: can_write(p) for p in (os.path.join(folder, 'venv', 'x'), os.path.join(folder, 'x'),
                             '/tmp/x', os.path.join(os.getcwd(), 'x'))},
                  "cwd": os.getcwd(), "import_json": json.dumps([1])}))
""" % (folder, base)
res = run_python(code, config=SandboxConfig(timeout_s=30))
graded = run_python("def add(a, b):\n    return a + b\n", tests="assert add(2, 3) == 5\n",
                    config=SandboxConfig(timeout_s=30))
print(json.dumps({"layout": dataclasses.asdict(lay), "res": dataclasses.asdict(res), "graded": graded.tests_passed}))
'''

# (case id, place the venv's folder goes, reached through a symlink from /tmp, parent uid: None = this process)
CASES = [("tmp", "/tmp", False, None), ("work", "/work", False, None), ("home", "~", False, None),
         ("opt", "/opt", False, None), ("var_tmp", "/var/tmp", False, None), ("symlink", "/opt", True, None)]
if IS_ROOT and os.path.exists(SYSTEM_PYTHON) and shutil.which("setpriv"):
    CASES.append(("tmp_unprivileged", "/tmp", False, NOBODY))  # user namespace path, system interpreter's venv


def _place(base: str) -> tuple[Path, bool]:
    """The place as a path, created when missing (root only); True when the test made it."""
    path = Path(os.path.expanduser(base))
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            pytest.skip(f"{path} is not writable by this test run")
        return path, False
    if not IS_ROOT:
        pytest.skip(f"{path} does not exist and only a root test run creates it")
    path.mkdir(parents=True)
    return path, True


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_sandbox_starts_and_contains_from_a_venv(case) -> None:
    name, base, via_symlink, uid = case
    place, made = _place(base)
    folder = Path(tempfile.mkdtemp(prefix="recmas_venv_", dir=place))
    link = None
    try:
        folder.chmod(0o755)
        (folder / "sibling.txt").write_text("a host file next to the venv")
        named = folder
        if via_symlink:  # the venv is made through a link: sys.prefix names the link, the files are elsewhere
            link = Path(tempfile.mkdtemp(prefix="recmas_link_", dir="/tmp")) / "via"
            link.symlink_to(folder)
            named = link
        python = SYSTEM_PYTHON if uid is not None else sys.executable
        subprocess.run([python, "-m", "venv", "--without-pip", "--system-site-packages", str(named / "venv")],
                       check=True, timeout=120, capture_output=True)
        prefix = [shutil.which("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if uid else []
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "PYTHONPATH": ROOT}
        proc = subprocess.run([*prefix, str(named / "venv" / "bin" / "python"), "-c", _DRIVER, str(named),
                               str(named.parent)], capture_output=True, text=True, timeout=180, env=env, cwd="/")
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        res, lay = out["res"], out["layout"]
        assert res["exit_code"] == 0 and res["error"] is None, res
        seen = json.loads(res["stdout"])
        assert seen["prefix"] == str(named / "venv")
        assert seen["folder"] == ["venv"] and not seen["sibling"], seen  # only the interpreter of that folder
        # nor anything else of the place it is in (but the way to other interpreter folders, e.g. ~/.pyenv)
        ways = {b[len(str(named.parent)) + 1:].split("/")[0] for b in lay["bound"] if b.startswith(f"{named.parent}/")}
        assert set(seen["base"]) == {named.name} | ways, seen
        expected = {str(named / "venv" / "x"): False, "/tmp/x": True, os.path.join(lay["work"], "x"): True}
        if not str(named).startswith("/tmp/"):  # under /tmp it is the sandbox's own /tmp tmpfs: not the host's
            expected[str(named / "x")] = False
        assert {k: seen["writes"][k] for k in expected} == expected, seen
        assert seen["cwd"] == lay["work"] and not any(
            b == lay["work"] or b.startswith(lay["work"] + "/") or lay["work"].startswith(b + "/")
            for b in lay["bound"])
        assert lay["tmp_is_work"] == (not str(named).startswith("/tmp/") and not str(folder).startswith("/tmp/"))
        assert out["graded"] is True
        assert sorted(p.name for p in folder.iterdir()) == ["sibling.txt", "venv"]  # the host folder is untouched
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if link is not None:
            shutil.rmtree(link.parent, ignore_errors=True)
        if made:
            shutil.rmtree(place, ignore_errors=True)
