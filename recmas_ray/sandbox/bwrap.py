"""The bubblewrap command line of one sandboxed call, and the one-off probe that refuses to run without it.

Mount namespace (nothing of the host is visible except what is listed here, all read-only):
  /usr, the /bin /lib /lib64 /sbin links or folders, a few /etc files the dynamic linker and time zone need,
  the interpreter's folders (prefixes, stdlib, site-packages, the executable's real folder) at their own
  paths, wherever they live (/tmp, $HOME, /opt, ...); a fresh /proc (this PID namespace only) and a minimal /dev;
  the work folder (``layout().work``, /sandbox unless the interpreter lives there): a size-limited tmpfs, the
  only writable place with /dev/shm (16 MiB) and /tmp, which links to it (or, when the interpreter lives
  under /tmp, is a size-limited tmpfs of its own holding only the interpreter's folders); HOME and TMPDIR point
  at the work folder; bwrap's own root and /dev are remounted read-only.
Namespaces: PID (the call's processes die with it: --die-with-parent and the namespace's init), network
(empty: only a loopback with nothing listening), IPC, UTS, cgroup. Identity: a non-root parent gets a fresh
user namespace with a random uid per call; a root parent (which would stay host uid 0 inside a user
namespace) instead switches the child to a random unused host uid with ``setpriv``, no capabilities and
no-new-privs. Both load the seccomp filter of `seccomp.py`.
"""
from __future__ import annotations

import functools
import os
import secrets
import shutil
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass

from recmas_ray.sandbox import seccomp

# The work folder's preferred path: unusual enough that no interpreter lives there; `layout` moves it when one does.
WORK_PREFERRED = "/sandbox"
# Random host uids for root parents come from a range no distribution allocates (above 2**20, below 2**31).
_UID_BASE, _UID_SPAN = 1 << 20, 1 << 30
_SHM_BYTES = 16 << 20  # /dev/shm for multiprocessing locks and queues
_ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/mime.types")
# Shown through `_root_layout` already (merged-/usr links or folders).
_SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_CONTAINER_HINT = ("or run the grader in a container that allows it, e.g. "
                   "`docker run --security-opt seccomp=unconfined --security-opt apparmor=unconfined ...`")


class SandboxUnavailable(RuntimeError):
    """The kernel or the system lacks what the sandbox needs; model code is not run at all."""


@dataclass(frozen=True)
class Layout:
    """Where things are inside the sandbox, fixed for the life of the process (the interpreter does not move)."""

    work: str
    """The work folder: cwd, HOME and TMPDIR of the child; never the interpreter's folder, inside or above it."""
    bound: tuple[str, ...]
    """Host folders of the interpreter, bound read-only at the same paths (outermost only, no nesting)."""
    tmp_is_work: bool
    """True: /tmp links to the work folder. False: the interpreter lives under /tmp, so /tmp is a tmpfs of its own."""

    @property
    def writable(self) -> tuple[str, ...]:
        """Folders the child may write into (the audit hook's view; the kernel enforces the same)."""
        return (self.work,) if self.tmp_is_work else (self.work, "/tmp")


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _interpreter_paths() -> list[str]:
    """Folders the interpreter needs, outermost first, without duplicates or paths inside /usr (shown anyway).

    Both the path as named and its real path (a venv's python is a symlink into pyenv, /usr, /opt, ...).
    """
    cands = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), os.path.dirname(sys.executable),
             os.path.dirname(os.__file__)]
    cands += [sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")]
    cands += [p for p in site.getsitepackages() if os.path.isdir(p)]
    out: list[str] = []
    for p in sorted({os.path.realpath(c) for c in cands if c} | {os.path.abspath(c) for c in cands if c}, key=len):
        # a link elsewhere that leads into /usr (/opt/py -> /usr/local/py) is still bound under its own name
        if p == "/" or any(_under(p, q) for q in _SYSTEM_FOLDERS) or not os.path.exists(p):
            continue
        if not any(_under(p, q) for q in out):
            out.append(p)
    return out


def _exposed_folders() -> list[str]:
    """Host folders whose content the sandbox must never show (so an interpreter folder may not be one of them
    or above one): shared temp folders, homes, and this process's home (credentials)."""
    return ["/tmp", "/var/tmp", "/dev/shm", "/home", "/root", "/run", "/var", "/etc", os.path.expanduser("~")]


@functools.lru_cache(maxsize=1)
def layout() -> Layout:
    """The sandbox layout for this interpreter; raises SandboxUnavailable when its folders cannot be shown safely."""
    bound = _interpreter_paths()
    for path in bound:
        for folder in _exposed_folders():
            if _under(folder, path):
                raise SandboxUnavailable(
                    f"the interpreter's folder {path} is (or contains) {folder}: binding it into the sandbox would "
                    f"show the sandboxed code all of {folder}; use an interpreter installed in a folder of its own "
                    f"(e.g. `python3 -m venv {folder.rstrip('/')}/venv`)")
    work = next(w for w in [WORK_PREFERRED] + [f"{WORK_PREFERRED}-{i}" for i in range(1, 100)]
                if not any(_under(b, w) or _under(w, b) for b in bound))
    return Layout(work=work, bound=tuple(bound), tmp_is_work=not any(_under(b, "/tmp") for b in bound))


def _ancestors(path: str) -> list[str]:
    """'/a/b/c' -> ['/a', '/a/b'] (outermost first)."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _root_layout() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _SYSTEM_FOLDERS[1:]:
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
    """Full bwrap command line running ``child_argv`` (the interpreter and its arguments) in the work folder.

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
    lay = layout()
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "01777", "--size", str(_SHM_BYTES), "--tmpfs", "/dev/shm",
             "--remount-ro", "/dev", "--perms", "0777", "--size", str(work_bytes), "--tmpfs", lay.work]
    if lay.tmp_is_work:
        args += ["--symlink", lay.work, "/tmp"]
    else:  # the interpreter's folders are mounted inside /tmp, so it cannot be a link
        args += ["--perms", "01777", "--size", str(work_bytes), "--tmpfs", "/tmp"]
    made = {"/tmp"}
    for path in lay.bound:
        # bwrap would copy the modes of the host's parents (0700 for /root): make them traversable.
        for parent in _ancestors(path):
            if parent not in made and not _under(parent, "/usr"):
                args += ["--perms", "0755", "--dir", parent]
                made.add(parent)
        args += ["--ro-bind", path, path]
    args += ["--remount-ro", "/", "--chdir", lay.work, "--clearenv"]
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
    lay = layout()
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, seccomp.build_filter(allow_fork=False, allow_sockets=False))
        os.close(write_fd)
        write_fd = -1
        code = f"import sys; open({lay.work + '/x'!r}, 'w').write('x'); print(sys.prefix)"
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
        raise SandboxUnavailable(explain_failure(res.stderr.decode(errors="replace"), lay))


# bwrap's messages when the kernel or a container's seccomp/AppArmor profile refuses a namespace or a mount.
_REFUSED_BY_SYSTEM = ("namespace", "uid map", "gid map", "setgroups", "Operation not permitted", "loopback",
                      "make / slave", "pivot_root", "cap_set", "prctl")


def explain_failure(stderr: str, lay: Layout) -> str:
    """One message for a failed probe: bwrap's own words, and the namespace/container advice only when the
    kernel or the container refused something (not when a path of the layout is the problem)."""
    err = " | ".join(line.strip() for line in stderr.strip().splitlines()[-6:]) or "no message"
    bwrap_lines = [line for line in stderr.splitlines() if line.startswith("bwrap:")]
    if not bwrap_lines:  # bwrap set everything up; the interpreter itself failed inside
        return (f"the sandboxed interpreter {sys.executable} failed inside the sandbox (its folders bound: "
                f"{', '.join(lay.bound) or 'none outside /usr'}): {err[-600:]}")
    line = bwrap_lines[-1][:600]
    if any(word in line for word in _REFUSED_BY_SYSTEM):
        hint = _userns_hint() if os.geteuid() != 0 else ""
        return (f"bwrap cannot build the sandbox here ({hint or 'the kernel or the container refused it'}): "
                f"{line}; {_CONTAINER_HINT}")
    return (f"bwrap cannot build the sandbox's file system: {line} (work folder {lay.work}, interpreter folders "
            f"bound read-only: {', '.join(lay.bound) or 'none outside /usr'})")
