"""Run untrusted, model-written Python in a restricted subprocess (deliberation Python tool, code graders).

The reference runs tool code unsandboxed with the user's rights (``recursivemas.md`` section 11). Here each call gets:

* a fresh ``sys.executable -I -B`` child in a throw-away working directory (deleted afterwards; HOME and TMPDIR
  point into it) and an environment from a small allow-list, so API keys and cloud credentials never reach it;
* rlimits (AS memory, CPU, FSIZE, NOFILE, CORE=0; NPROC unless the child is root, which ignores it), set by the
  child's boot code before user code: ``preexec_fn`` would do the same but may deadlock in threaded parents (Ray);
* its own session, whose whole process group is SIGKILLed on wall-clock timeout and after the child exits;
* kernel layers where available: an empty network namespace (``unshare --net``; ``--user --map-root-user`` when
  not root) and, for a root parent, ``setpriv`` to uid/gid 65534 with no-new-privs and no capabilities (only
  CAP_DAC_READ_SEARCH when the interpreter sits in a root-only folder such as ~/.pyenv). The kernel then enforces
  RLIMIT_NPROC and refuses writes outside the working dir, signals to other processes and reading their environs;
* always, an in-child audit hook refusing non-AF_UNIX sockets, connect/bind/send and name resolution,
  fork/exec/subprocess/os.system (the fork-bomb guard), signals to other processes, raising rlimits, ctypes
  lookups of fork/exec/socket/open/syscall, gc object walks, writes/renames/deletes outside the working dir, and
  reads of /proc/<pid>/environ, known credential files and ``deny_read_paths``.

Best effort, not a proven boundary: audit hooks are Python-level (native code can bypass them) and writes through
``os.open(..., dir_fd=...)`` are not resolved; the namespace, uid switch, rlimits and group kill are the kernel
layers, and each is skipped with a log line where the kernel refuses it. Hostile code never makes ``run_python``
raise: stops and refusals come back as a ``SandboxResult`` with ``error`` set.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

NOBODY_ID = 65534
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
    """Extra processes/threads the child's user may start (RLIMIT_NPROC on top of its current count; not for root)."""
    max_file_mb: int = 64
    """RLIMIT_FSIZE in MiB: the largest file the child may write."""
    allow_network: bool = False
    """Skip the network namespace and the socket guard."""
    allow_subprocess: bool = False
    """Allow fork/exec/subprocess in the child (still killed as a group and limited by RLIMIT_NPROC)."""
    drop_privileges: bool = True
    """When the parent is root, run the child as uid/gid 65534 via ``setpriv`` (skipped where that fails)."""
    deny_read_paths: tuple[str, ...] = ()
    """Extra files or folders the child may not open (e.g. the Tavily keys file)."""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_time_s", "memory_mb", "max_output_chars", "max_processes", "max_file_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxConfig.{name}={getattr(self, name)!r}: expected a positive number")


# Boot code of the child, run as ``python -I -B -c _LAUNCH BOOT CONFIG_JSON`` in the working directory. The hook and its
# state live only in the closure created by ``_guard``, whose frame is gone before user code runs, so user code
# finds no handle to them through frames or globals (gc walks are refused as well).
_BOOT = (Path(__file__).parent / "boot.py").read_text()


# The boot code runs under its own file name so tracebacks can leave its frames out.
_LAUNCH = "import sys; exec(compile(sys.argv[1], '<sandbox>', 'exec'))"


def run_python(code: str, *, config: SandboxConfig | None = None, stdin: str = "", prelude: str = "") -> SandboxResult:
    """Run ``code`` in a fresh sandboxed interpreter and return what happened; never raises on hostile code.

    Args:
        code: the untrusted program (saved as ``main.py``; tracebacks name that file).
        config: limits and permissions; ``None`` means ``SandboxConfig()``.
        stdin: text fed to the child's standard input.
        prelude: trusted setup code run in the same namespace just before the guards and ``code``.

    Example:
        >>> run_python("print(6 * 7)").stdout
        '42\\n'
    """
    cfg = config or SandboxConfig()
    start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="recmas_sandbox_")
    try:
        return _run_in(workdir, code, cfg, stdin, prelude, start)
    except Exception as exc:  # infrastructure failure (no fork possible, disk full, ...): still a result
        logger.warning("sandbox failed to run code: %s: %s", type(exc).__name__, exc)
        return SandboxResult("", "", None, False, f"sandbox failure: {type(exc).__name__}",
                             time.monotonic() - start)
    finally:
        _rmtree(workdir)


def _run_in(workdir: str, code: str, cfg: SandboxConfig, stdin: str, prelude: str, start: float) -> SandboxResult:
    with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
        f.write(code)
    stdin_path = os.path.join(workdir, ".stdin")
    with open(stdin_path, "w", encoding="utf-8") as f:
        f.write(stdin)
    priv_prefix = _privilege_prefix(sys.executable) if cfg.drop_privileges and os.geteuid() == 0 else ()
    if priv_prefix:
        for path in (workdir, stdin_path, os.path.join(workdir, "main.py")):
            os.chown(path, NOBODY_ID, NOBODY_ID)
    child_uid = NOBODY_ID if priv_prefix else os.geteuid()
    mib = 1024 * 1024
    limits = [("RLIMIT_AS", cfg.memory_mb * mib, cfg.memory_mb * mib),
              ("RLIMIT_CPU", cfg.cpu_time_s, cfg.cpu_time_s + 1),
              ("RLIMIT_FSIZE", cfg.max_file_mb * mib, cfg.max_file_mb * mib),
              ("RLIMIT_NOFILE", 256, 256), ("RLIMIT_CORE", 0, 0)]
    if child_uid != 0 and os.path.isdir("/proc"):  # root ignores RLIMIT_NPROC; it counts all tasks of the uid
        nproc = _count_tasks(child_uid) + cfg.max_processes
        limits.append(("RLIMIT_NPROC", nproc, nproc))
    boot_cfg = {"limits": limits, "prelude": prelude,
                "allow_network": cfg.allow_network, "allow_subprocess": cfg.allow_subprocess,
                "deny_read": _deny_read_paths(cfg)}
    prefix = ([] if cfg.allow_network else list(_netns_prefix())) + list(priv_prefix)  # unshare needs root first
    cmd = prefix + [sys.executable, "-I", "-B", "-X", "utf8", "-c", _LAUNCH, _BOOT, json.dumps(boot_cfg)]
    with open(stdin_path, "rb") as stdin_file:
        proc = subprocess.Popen(cmd, cwd=workdir, env=_child_env(workdir), stdin=stdin_file,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                close_fds=True)
    try:  # the clock starts at launch: the one-off kernel probes must not eat into the first call's time
        out, err, timed_out = _collect(proc, time.monotonic() + cfg.timeout_s, cfg.max_output_chars * 4 + 4)
    finally:
        _kill_group(proc.pid)
        proc.stdout.close()
        proc.stderr.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            logger.warning("sandbox child %d did not exit after SIGKILL", proc.pid)
    exit_code = None if timed_out else proc.returncode
    stdout, stderr = _decode(out, cfg.max_output_chars), _decode(err, cfg.max_output_chars)
    error = _classify(exit_code, stderr, timed_out, cfg)
    return SandboxResult(stdout, stderr, exit_code, timed_out, error, time.monotonic() - start)


def _collect(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[tuple[bytes, int], tuple[bytes, int], bool]:
    """Drain both pipes until EOF or the deadline, keeping at most ``cap`` bytes of each (the rest is counted)."""
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
    if last.startswith("PermissionError:"):  # refused by the kernel layers (uid 65534, namespaces)
        return "blocked: " + last.split(":", 1)[1].strip()
    if last.startswith("BlockingIOError:") and "[Errno 11]" in last:  # fork/thread refused by RLIMIT_NPROC
        return f"process limit ({cfg.max_processes} more)"
    if "MemoryError" in stderr[-2000:]:
        return f"memory limit ({cfg.memory_mb} MiB)"
    return None


def _child_env(workdir: str) -> dict[str, str]:
    """Allow-listed environment: nothing named *_KEY, *_TOKEN, AWS_* etc. can get through."""
    env = {k: os.environ[k] for k in _ENV_ALLOW if k in os.environ}
    env.setdefault("PATH", os.defpath)
    env.setdefault("LANG", "C.UTF-8")
    env.update(HOME=workdir, TMPDIR=workdir, MPLCONFIGDIR=workdir, MPLBACKEND="Agg",
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


@functools.lru_cache(maxsize=None)
def _netns_prefix() -> tuple[str, ...]:
    """Command prefix that starts the child in an empty network namespace, or () where the kernel refuses."""
    unshare = shutil.which("unshare")
    if unshare is None:
        logger.info("sandbox: unshare not found; relying on the in-child network guard only")
        return ()
    candidates = [(unshare, "--net")] if os.geteuid() == 0 else []
    candidates.append((unshare, "--user", "--map-root-user", "--net"))
    for prefix in candidates:
        try:
            probe = subprocess.run([*prefix, sys.executable, "-I", "-c", "pass"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return prefix
    logger.info("sandbox: network namespaces unavailable; relying on the in-child network guard only")
    return ()


@functools.lru_cache(maxsize=None)
def _privilege_prefix(executable: str) -> tuple[str, ...]:
    """``setpriv`` prefix switching a root parent's child to uid 65534, or () where that cannot run the interpreter.

    The plain variant keeps no capability; the second keeps CAP_DAC_READ_SEARCH (read any file, nothing else) for
    interpreters in root-only folders. Both set no-new-privs, so setuid binaries cannot give root back.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        logger.info("sandbox: setpriv not found; the child runs as root")
        return ()
    base = (setpriv, f"--reuid={NOBODY_ID}", f"--regid={NOBODY_ID}", "--clear-groups", "--no-new-privs")
    keep = "-all,+dac_read_search"
    candidates = [base + ("--inh-caps=-all", "--bounding-set=-all"),
                  base + (f"--inh-caps={keep}", f"--ambient-caps={keep}", f"--bounding-set={keep}")]
    # The interpreter must find its own prefix: one that cannot read it silently falls back to another stdlib.
    probe_code = ("import json, os, site, sys; [os.listdir(p) for p in site.getsitepackages() if os.path.isdir(p)]; "
                  "print(sys.prefix)")
    for prefix in candidates:
        try:
            probe = subprocess.run([*prefix, executable, "-I", "-c", probe_code], capture_output=True, timeout=10,
                                   cwd="/")
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0 and probe.stdout.decode(errors="replace").strip() == sys.prefix:
            return prefix
    logger.info("sandbox: cannot run the interpreter as uid %d; the child runs as root", NOBODY_ID)
    return ()


def _rmtree(path: str) -> None:
    """Delete the working directory even if the child removed permissions inside it."""
    def fix(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass
    shutil.rmtree(path, onerror=fix)
