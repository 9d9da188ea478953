"""The bubblewrap command line of one sandboxed call, and the one-off probe that refuses to run without it.

Mount namespace (nothing of the host is visible except what is listed here, all read-only):
  /usr, the /bin /lib /lib64 /sbin links or folders, a few /etc files the dynamic linker and time zone need,
  the interpreter's prefixes and site-packages; a fresh /proc (this PID namespace only) and a minimal /dev;
  /work: a size-limited tmpfs, the only writable place with /dev/shm (16 MiB; /tmp links to /work; HOME and
  TMPDIR point at it); bwrap's own root and /dev are remounted read-only.
Namespaces: PID (the call's processes die with it: --die-with-parent and the namespace's init), network
(empty: only a loopback with nothing listening), IPC, UTS, cgroup. Identity: a non-root parent gets a fresh
user namespace with a random uid per call; a root parent (which would stay host uid 0 inside a user
namespace) instead switches the child to a random unused host uid with ``setpriv``, no capabilities and
no-new-privs. Both load the seccomp filter of `seccomp.py`.
"""
from __future__ import annotations

import os
import secrets
import shutil
import site
import subprocess
import sys

from recmas_ray.sandbox import seccomp

WORK = "/work"
# Random host uids for root parents come from a range no distribution allocates (above 2**20, below 2**31).
_UID_BASE, _UID_SPAN = 1 << 20, 1 << 30
_SHM_BYTES = 16 << 20  # /dev/shm for multiprocessing locks and queues
_ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/mime.types")
_CONTAINER_HINT = ("or run the grader in a container that allows it, e.g. "
                   "`docker run --security-opt seccomp=unconfined --security-opt apparmor=unconfined ...`")


class SandboxUnavailable(RuntimeError):
    """The kernel or the system lacks what the sandbox needs; model code is not run at all."""


def _interpreter_paths() -> list[str]:
    """Folders the interpreter needs, outermost first, without duplicates or paths inside /usr."""
    cands = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), os.path.dirname(sys.executable)]
    cands += [p for p in site.getsitepackages() if os.path.isdir(p)]
    out: list[str] = []
    for p in sorted({os.path.realpath(c) for c in cands} | {os.path.abspath(c) for c in cands}, key=len):
        if p == "/" or p.startswith("/usr/") or p == "/usr" or not os.path.exists(p):
            continue
        if not any(p == q or p.startswith(q + os.sep) for q in out):
            out.append(p)
    return out


def _ancestors(path: str) -> list[str]:
    """'/a/b/c' -> ['/a', '/a/b'] (outermost first)."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _root_layout() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(name):
            args += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            args += ["--ro-bind", name, name]
    for path in _ETC_FILES:
        if os.path.isfile(path):
            args += ["--ro-bind", path, path]
    return args


def command(*, child_argv: list[str], env: dict[str, str], seccomp_fd: int, info_fd: int, work_bytes: int,
            allow_network: bool) -> list[str]:
    """Full bwrap command line running ``child_argv`` (the interpreter and its arguments) in /work.

    bwrap writes {"child-pid": N} on ``info_fd``: N is the namespace's init, whose end means every process
    of the call is gone (the kernel kills the rest of a PID namespace when its init exits).
    """
    return _argv(_probe(), child_argv=child_argv, env=env, seccomp_fd=seccomp_fd,
                 work_bytes=work_bytes, allow_network=allow_network, extra=["--info-fd", str(info_fd)])


def _argv(bwrap: str, *, child_argv: list[str], env: dict[str, str], seccomp_fd: int, work_bytes: int,
          allow_network: bool, extra: list[str] = ()) -> list[str]:
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN)
    ns = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not allow_network:
        ns.append("--unshare-net")
    if os.geteuid() != 0:
        ns += ["--unshare-user", "--uid", str(uid), "--gid", str(uid)]
    args = [bwrap, *extra, *ns, "--die-with-parent", "--new-session", *_root_layout()]
    if allow_network:
        args += [arg for p in ("/etc/resolv.conf", "/etc/hosts", "/etc/ssl", "/etc/nsswitch.conf")
                 if os.path.exists(p) for arg in ("--ro-bind", p, p)]
    # Every writable place is a size-limited tmpfs; the rest (bwrap's own root and /dev tmpfs, which a user
    # namespace would let the child fill) is remounted read-only once set up.
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "01777", "--size", str(_SHM_BYTES), "--tmpfs", "/dev/shm",
             "--remount-ro", "/dev",
             "--perms", "0777", "--size", str(work_bytes), "--tmpfs", WORK, "--symlink", WORK, "/tmp"]
    made: set[str] = set()
    for path in _interpreter_paths():
        # bwrap would copy the modes of the host's parents (0700 for /root): make them traversable.
        parents = [p for p in _ancestors(path) if p not in made and not p.startswith(("/usr", WORK))]
        for parent in parents:
            args += ["--perms", "0755", "--dir", parent]
            made.add(parent)
        args += ["--ro-bind", path, path]
    args += ["--remount-ro", "/", "--chdir", WORK, "--clearenv"]
    for key, value in sorted(env.items()):
        args += ["--setenv", key, value]
    args += ["--seccomp", str(seccomp_fd)]
    if os.geteuid() == 0:
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--", _setpriv(),
                 f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
                 "--inh-caps=-all", "--bounding-set=-all"]
    else:
        args.append("--")
    return args + child_argv


def _setpriv() -> str:
    path = shutil.which("setpriv")
    if path is None or not path.startswith(("/usr/", "/bin/", "/sbin/")):
        raise SandboxUnavailable("setpriv (util-linux) not found under /usr: apt-get install util-linux")
    return path


# (sysctl file, bad value, what it means) for the usual ways a kernel refuses unprivileged user namespaces.
USERNS_SYSCTLS = (
    ("/proc/sys/kernel/unprivileged_userns_clone", "0",
     "unprivileged user namespaces disabled (kernel.unprivileged_userns_clone=0)"),
    ("/proc/sys/user/max_user_namespaces", "0", "user namespaces disabled (user.max_user_namespaces=0)"),
    ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1",
     "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1)"))


def _userns_hint() -> str:
    """Why unprivileged user namespaces fail, from the usual sysctls (empty when none is set)."""
    for path, bad, text in USERNS_SYSCTLS:
        try:
            with open(path) as f:
                if f.read().strip() == bad:
                    return text
        except OSError:
            continue
    return ""


_PROBED: list = []  # [bwrap path] or [SandboxUnavailable]: the probe runs once per process, failures included


def _probe() -> str:
    """Check once per process that bwrap runs a trivial child with every layer; return the bwrap path."""
    if not _PROBED:
        try:
            _PROBED.append(_probe_once())
        except SandboxUnavailable as exc:
            _PROBED.append(exc)
    if isinstance(_PROBED[0], SandboxUnavailable):
        raise _PROBED[0]
    return _PROBED[0]


def _probe_reset() -> None:
    """Forget the probe's result (tests that fake a missing bwrap)."""
    _PROBED.clear()


def _probe_once() -> str:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(f"bwrap not found: apt-get install bubblewrap ({_CONTAINER_HINT})")
    if seccomp.supported_arch() is None:
        raise SandboxUnavailable(f"no seccomp table for this CPU architecture; {_CONTAINER_HINT}")
    _probe_run(bwrap)
    return bwrap


def _probe_run(bwrap: str) -> None:
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, seccomp.build_filter(allow_fork=False, allow_sockets=False))
        os.close(write_fd)
        write_fd = -1
        code = "import sys; open('/work/x', 'w').write('x'); print(sys.prefix)"
        cmd = _argv(bwrap, child_argv=[sys.executable, "-I", "-c", code], env={"PATH": os.defpath},
                    seccomp_fd=read_fd, work_bytes=1 << 20, allow_network=False)
        try:
            res = subprocess.run(cmd, pass_fds=(read_fd,), capture_output=True, timeout=60, env={"PATH": os.defpath},
                                 cwd="/")
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(f"bwrap could not start: {exc}; {_CONTAINER_HINT}") from exc
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    if res.returncode != 0 or res.stdout.decode(errors="replace").strip() != sys.prefix:
        err = res.stderr.decode(errors="replace").strip()[-400:]
        hint = _userns_hint() if os.geteuid() != 0 else ""
        raise SandboxUnavailable(f"bwrap cannot build the sandbox here ({hint or 'kernel refused a namespace'}): "
                                 f"{err}; {_CONTAINER_HINT}")
