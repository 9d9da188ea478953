"""Hostile-code tests for recmas_ray.sandbox: every attack is stopped or contained, reported, and pytest goes on.

Limits are kept small (short timeouts, bounded process counts) so the tests stay safe on a 2-core CI machine.
"""
from __future__ import annotations

import json
import os
import socket
import time

import pytest

from recmas_ray import sandbox
from recmas_ray.sandbox import SandboxConfig, SandboxResult, run_python

TIGHT = SandboxConfig(timeout_s=5, cpu_time_s=5, memory_mb=512, max_processes=16)


def _alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie (killed children may wait for a reaper in containers)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _processes_in(cwd: str) -> list[int]:
    """Live processes whose working directory is ``cwd`` (or what is left of it after deletion)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                link = os.readlink(f"/proc/{name}/cwd")
            except OSError:
                continue
            if link.split(" (deleted)")[0] == cwd and _alive(int(name)):
                found.append(int(name))
    return found


def test_simple_code_runs_in_a_throwaway_dir() -> None:
    res = run_python("import os, json; print(json.dumps([os.getcwd(), os.environ['HOME'], input()]))",
                     stdin="from stdin\n", config=TIGHT)
    assert res.ok, res
    cwd, home, line = json.loads(res.stdout)
    assert home == cwd and line == "from stdin"
    assert os.path.basename(cwd).startswith("recmas_sandbox_")
    assert not os.path.exists(cwd), "working directory must be deleted afterwards"


def test_plain_exception_is_a_failure_not_a_sandbox_error() -> None:
    res = run_python("x = 1\nraise ValueError('boom')", config=TIGHT)
    assert not res.ok and res.exit_code == 1 and res.error is None
    assert 'File "main.py", line 2' in res.stderr and "ValueError: boom" in res.stderr
    assert "<sandbox>" not in res.stderr, "boot frames must not show in tracebacks"


def test_infinite_loop_times_out() -> None:
    start = time.monotonic()
    res = run_python("while True:\n    pass", config=SandboxConfig(timeout_s=1, cpu_time_s=30))
    assert res.timed_out and res.exit_code is None and not res.ok
    assert res.error == "timeout after 1s"
    assert time.monotonic() - start < 5


def test_cpu_limit_kills_busy_loop() -> None:
    res = run_python("while True:\n    pass", config=SandboxConfig(timeout_s=20, cpu_time_s=1))
    assert not res.timed_out and res.error is not None and "cpu time limit" in res.error
    assert res.seconds < 10


@pytest.mark.parametrize("bomb", [
    "import os\nwhile True:\n    os.fork()",
    "import subprocess, sys\nwhile True:\n    subprocess.Popen([sys.executable, '-c', 'pass'])",
    "import os\nwhile True:\n    os.system('true')",
    "import _posixsubprocess\n_posixsubprocess.fork_exec()",
    "import ctypes\nlibc = ctypes.CDLL(None)\nwhile True:\n    libc.fork()",
    "import multiprocessing\nwhile True:\n    multiprocessing.Process(target=print).start()",
])
def test_fork_bomb_is_refused(bomb: str) -> None:
    res = run_python("import os\nprint(os.getcwd(), flush=True)\n" + bomb, config=TIGHT)
    assert not res.ok and res.error is not None and res.error.startswith("blocked:"), res
    assert res.seconds < 5, "a refused fork bomb must end at once"
    assert _processes_in(res.stdout.strip()) == []


def test_forked_processes_die_with_the_group_on_timeout() -> None:
    # Bounded storm with fork allowed: 30 sleeping children, then the parent hangs; the group kill must reap all.
    code = ("import os, time\npids = []\nfor _ in range(30):\n    pid = os.fork()\n    if pid == 0:\n"
            "        time.sleep(60)\n        os._exit(0)\n    pids.append(pid)\nprint(pids, flush=True)\ntime.sleep(60)")
    res = run_python(code, config=SandboxConfig(timeout_s=2, cpu_time_s=10, max_processes=64,
                                                allow_subprocess=True))
    assert res.timed_out
    pids = json.loads(res.stdout.strip())
    assert len(pids) == 30
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def test_huge_allocation_hits_memory_limit() -> None:
    res = run_python("data = bytearray(10 * 1024 ** 3)\nprint('allocated')", config=TIGHT)
    assert not res.ok and "allocated" not in res.stdout
    assert res.error is not None and res.error.startswith("memory limit")
    assert "MemoryError" in res.stderr


@pytest.mark.parametrize("connect", [
    "s = socket.create_connection(('127.0.0.1', PORT), timeout=3)",
    "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\ns.settimeout(3)\ns.connect(('127.0.0.1', PORT))",
])
def test_cannot_connect_to_localhost(connect: str) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    try:
        port = listener.getsockname()[1]
        code = "import socket\n" + connect.replace("PORT", str(port)) + "\nprint('connected')"
        res = run_python(code, config=TIGHT)
        assert not res.ok and "connected" not in res.stdout
        assert res.error is not None and "network" in res.error
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody ever reached the listener
    finally:
        listener.close()


@pytest.mark.parametrize("code", [
    "import socket\nsocket.create_connection(('203.0.113.1', 80), timeout=3)",
    "import socket\ns = socket.socket()\ns.settimeout(3)\ns.connect(('203.0.113.1', 80))",
    "import urllib.request\nurllib.request.urlopen('http://203.0.113.1/', timeout=3)",
    "import socket\nsocket.gethostbyname('example.com')",
])
def test_outside_address_fails_fast(code: str) -> None:
    res = run_python(code, config=TIGHT)
    assert not res.ok and res.error is not None and "network" in res.error
    assert res.seconds < 2.5, "must be refused, not left to time out"


def test_network_namespace_has_only_loopback() -> None:
    if not sandbox._netns_prefix():
        pytest.skip("this kernel refuses network namespaces; the in-child guard is the only network layer")
    res = run_python("print(sorted(line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]))",
                     config=TIGHT)
    assert res.ok, res
    assert res.stdout.strip() == "['lo']"


def test_environment_secrets_do_not_reach_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {"TAVILY_API_KEY": "tvly-fake-secret-1234", "AWS_SECRET_ACCESS_KEY": "aws-fake-secret-5678",
               "GITHUB_TOKEN": "ghp-fake-secret-9012", "OPENAI_API_KEY": "sk-fake-secret-3456"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    code = ("import os, json\nprint(json.dumps(dict(os.environ)))\n"
            "try:\n    print(open('/proc/%d/environ' % os.getppid()).read())\nexcept PermissionError as e:\n"
            "    print('refused', e)\n")
    res = run_python(code, config=TIGHT)
    assert res.ok, res
    child_env = json.loads(res.stdout.splitlines()[0])
    assert not set(secrets) & set(child_env)
    assert "refused" in res.stdout
    for value in secrets.values():
        assert value not in res.stdout + res.stderr


def test_writes_outside_the_working_dir_are_refused(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    keep = tmp_path / "keep.txt"
    keep.write_text("original")
    attempts = {
        "home file": f"open({str(home / 'pwned.txt')!r}, 'w').write('x')",
        "outside file": f"open({str(tmp_path / 'outside.txt')!r}, 'a').write('x')",
        "os.open": f"import os\nos.open({str(tmp_path / 'os_open.txt')!r}, os.O_WRONLY | os.O_CREAT)",
        "overwrite": f"open({str(keep)!r}, 'w').write('changed')",
        "remove": f"import os\nos.remove({str(keep)!r})",
        "rename": f"import os\nos.rename({str(keep)!r}, 'stolen.txt')",
        "mkdir": f"import os\nos.mkdir({str(tmp_path / 'newdir')!r})",
        "symlink escape": f"import os\nos.symlink({str(keep)!r}, 'link')\nopen('link', 'w').write('changed')",
        "chdir escape": f"import os\nos.chdir({str(tmp_path)!r})\nopen('after_chdir.txt', 'w').write('x')",
        "pathlib": f"import pathlib\npathlib.Path({str(home)!r}, '.bashrc').write_text('x')",
    }
    for name, code in attempts.items():
        res = run_python(code, config=TIGHT)
        assert not res.ok and res.error is not None and res.error.startswith("blocked:"), (name, res)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "keep.txt"]
    assert list(home.iterdir()) == []
    assert keep.read_text() == "original"
    # "~" means the throw-away directory: allowed, and gone afterwards.
    res = run_python("import os\nopen(os.path.expanduser('~/.bashrc'), 'w').write('x')\nprint(os.getcwd())",
                     config=TIGHT)
    assert res.ok, res
    assert not os.path.exists(res.stdout.strip()) and list(home.iterdir()) == []


def test_denied_read_paths_and_escape_hatches(tmp_path) -> None:
    key_file = tmp_path / "keys.txt"
    key_file.write_text("tvly-do-not-read\n")
    cfg = SandboxConfig(timeout_s=5, deny_read_paths=(str(key_file),))
    res = run_python(f"print(open({str(key_file)!r}).read())", config=cfg)
    assert res.error is not None and res.error.startswith("blocked:")
    assert "tvly-do-not-read" not in res.stdout + res.stderr
    for code in ["import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
                 "import gc\ngc.get_objects()", "import os\nos.kill(1, 9)"]:
        res = run_python(code, config=TIGHT)
        assert res.error is not None and res.error.startswith("blocked:"), (code, res)


def test_output_is_truncated() -> None:
    res = run_python("print('x' * 100000)\nimport sys\nsys.stderr.write('e' * 50000)",
                     config=SandboxConfig(max_output_chars=100))
    assert res.ok
    assert res.stdout.startswith("x" * 100) and "...[truncated" in res.stdout and len(res.stdout) < 200
    assert res.stderr.startswith("e" * 100) and "...[truncated" in res.stderr and len(res.stderr) < 200


def test_endless_output_is_bounded() -> None:
    res = run_python("import sys\nwhile True:\n    sys.stdout.write('y' * 65536)",
                     config=SandboxConfig(timeout_s=1, max_output_chars=50))
    assert res.timed_out and "...[truncated" in res.stdout and len(res.stdout) < 150


def test_odd_code_never_raises() -> None:
    for code in ["def f(:\n", "\x00", "import os\nos._exit(3)", "raise SystemExit(7)", "\ud800"]:
        res = run_python(code, config=TIGHT)
        assert isinstance(res, SandboxResult) and not res.ok


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxConfig(timeout_s=0)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v", "-x"]))
