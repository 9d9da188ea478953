"""A small seccomp-BPF program for sandboxed children, generated in pure Python (no libseccomp needed).

bubblewrap loads it with ``--seccomp FD`` just before it executes the child, so it covers every process the
child starts. The filter denies (EPERM) the system calls a Python program never needs and that widen the
kernel attack surface or undo the namespaces: ptrace, mount and the new mount API, namespaces (unshare, setns,
clone with CLONE_NEW*), keyrings, bpf, perf, module loading, kexec, io_uring, cross-process memory access,
handle-based opens, terminal injection (TIOCSTI), and memory no limit counts (memfd, SysV shared memory and
message queues: ``NO_SUCH_CALL``, the end of ``ALWAYS_DENIED``). Optionally it also refuses new processes (fork, vfork,
clone without CLONE_THREAD; clone3 answers ENOSYS so glibc falls back to clone) and sockets other than AF_UNIX.

Layout of ``struct seccomp_data``: nr (u32, offset 0), arch (u32, 4), ip (u64, 8), args[6] (u64, 16 + 8 i);
arguments are compared on their low 32 bits (little-endian hosts only: x86_64, aarch64).
"""
from __future__ import annotations

import errno
import platform
import struct

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# Denied everywhere. Names missing on an architecture (fork on aarch64, ...) are skipped.
_NR = {
    "x86_64": {"ptrace": 101, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "swapon": 167,
               "swapoff": 168, "reboot": 169, "acct": 163, "iopl": 172, "ioperm": 173, "init_module": 175,
               "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320,
               "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "setns": 308,
               "perf_event_open": 298, "bpf": 321, "userfaultfd": 323, "process_vm_readv": 310,
               "process_vm_writev": 311, "name_to_handle_at": 303, "open_by_handle_at": 304, "kcmp": 312,
               "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
               "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
               "pidfd_getfd": 438, "mount_setattr": 442, "quotactl": 179, "syslog": 103, "vhangup": 153,
               "lookup_dcookie": 212, "personality": 135, "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67,
               "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "memfd_create": 319, "memfd_secret": 447,
               "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "socket": 41, "ioctl": 16, "rt_sigaction": 13},
    "aarch64": {"ptrace": 117, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "swapon": 224,
                "swapoff": 225, "reboot": 142, "acct": 89, "init_module": 105, "finit_module": 273,
                "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294, "add_key": 217,
                "request_key": 218, "keyctl": 219, "unshare": 97, "setns": 268, "perf_event_open": 241,
                "bpf": 280, "userfaultfd": 282, "process_vm_readv": 270, "process_vm_writev": 271,
                "name_to_handle_at": 264, "open_by_handle_at": 265, "kcmp": 272, "io_uring_setup": 425,
                "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
                "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_getfd": 438,
                "mount_setattr": 442, "quotactl": 60, "syslog": 116, "vhangup": 58, "lookup_dcookie": 18,
                "personality": 92, "shmget": 194, "shmctl": 195, "shmat": 196, "shmdt": 197, "msgget": 186,
                "msgctl": 187, "msgrcv": 188, "msgsnd": 189, "memfd_create": 279, "memfd_secret": 447, "clone": 220, "clone3": 435, "socket": 198, "ioctl": 29, "rt_sigaction": 134},
}
ALWAYS_DENIED = ("ptrace", "mount", "umount2", "pivot_root", "chroot", "swapon", "swapoff", "reboot", "acct",
                 "iopl", "ioperm", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
                 "add_key", "request_key", "keyctl", "unshare", "setns", "perf_event_open", "bpf", "userfaultfd",
                 "process_vm_readv", "process_vm_writev", "name_to_handle_at", "open_by_handle_at", "kcmp",
                 "io_uring_setup", "io_uring_enter", "io_uring_register", "open_tree", "move_mount", "fsopen",
                 "fsconfig", "fsmount", "fspick", "pidfd_getfd", "mount_setattr", "quotactl", "syslog", "vhangup",
                 "lookup_dcookie", "personality",
                 # Memory that RLIMIT_AS does not count once unmapped and no tmpfs size bounds: SysV shared memory
                 # segments and message queues live on in the IPC namespace until the call ends.
                 "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl")
# memfd pages written with write() are counted by no rlimit (up to the host's memory per fd); ENOSYS, as on a
# kernel without memfd, so libraries that try it (libffi, glib) fall back to /dev/shm or the work folder,
# whose tmpfs sizes bound them.
NO_SUCH_CALL = ("memfd_create", "memfd_secret")

_LD_ABS_W, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL_PROCESS = 0x7FFF0000, 0x80000000
_CLONE_THREAD = 0x00010000
_CLONE_NEW_ANY = 0x7E020000  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
_TIOCSTI = 0x5412
_AF_UNIX = 1


def _errno(code: int) -> int:
    return 0x00050000 | code


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)


def supported_arch() -> str | None:
    """The machine name when a syscall table exists for it, else None."""
    arch = platform.machine()
    return arch if arch in _NR else None


def build_filter(*, allow_fork: bool, allow_sockets: bool) -> bytes:
    """The BPF program as bytes (``struct sock_filter`` array) for ``bwrap --seccomp``.

    Args:
        allow_fork: keep fork/vfork/clone (new processes); threads are always allowed.
        allow_sockets: keep socket() for every family; otherwise only AF_UNIX.
    """
    arch = supported_arch()
    if arch is None:
        raise RuntimeError(f"no seccomp syscall table for {platform.machine()!r}")
    nr = _NR[arch]
    eperm = _errno(errno.EPERM)
    prog = [_ins(_LD_ABS_W, 4), _ins(_JEQ, _AUDIT_ARCH[arch], 1, 0), _ins(_RET, _RET_KILL_PROCESS),
            _ins(_LD_ABS_W, 0)]
    if arch == "x86_64":  # x32 ABI numbers alias the denied calls: refuse the whole range
        prog += [_ins(_JGE, 0x40000000, 0, 1), _ins(_RET, eperm)]
    for name in ALWAYS_DENIED:
        if name in nr:
            prog += [_ins(_JEQ, nr[name], 0, 1), _ins(_RET, eperm)]
    for name in NO_SUCH_CALL:
        prog += [_ins(_JEQ, nr[name], 0, 1), _ins(_RET, _errno(errno.ENOSYS))]

    def arg_rule(name: str, arg: int, op: int, k: int, allow_when_true: bool) -> list[bytes]:
        # nr == name ? (A = arg; op(A, k) ? allow-path : deny) : skip; A is reloaded with nr afterwards.
        jt, jf = (1, 0) if allow_when_true else (0, 1)
        return [_ins(_JEQ, nr[name], 0, 4), _ins(_LD_ABS_W, 16 + 8 * arg), _ins(op, k, jt, jf),
                _ins(_RET, eperm), _ins(_LD_ABS_W, 0)]

    # New namespaces through clone flags are refused even when fork is allowed.
    prog += arg_rule("clone", 0, _JSET, _CLONE_NEW_ANY, allow_when_true=False)
    prog += arg_rule("ioctl", 1, _JEQ, _TIOCSTI, allow_when_true=False)
    # clone3 keeps its flags in memory that BPF cannot read: ENOSYS makes glibc use clone instead.
    prog += [_ins(_JEQ, nr["clone3"], 0, 1), _ins(_RET, _errno(errno.ENOSYS))]
    if not allow_fork:
        for name in ("fork", "vfork"):
            if name in nr:
                prog += [_ins(_JEQ, nr[name], 0, 1), _ins(_RET, eperm)]
        prog += arg_rule("clone", 0, _JSET, _CLONE_THREAD, allow_when_true=True)
    if not allow_sockets:
        prog += arg_rule("socket", 0, _JEQ, _AF_UNIX, allow_when_true=True)
    prog.append(_ins(_RET, _RET_ALLOW))
    return b"".join(prog)


def build_no_handlers_filter() -> bytes:
    """A second filter for grading: rt_sigaction may read handlers (act == NULL) but never install one.

    A signal handler receives the interrupted frame, and through it the tests' globals; the grading boot code
    loads this filter (prctl, no-new-privs is already set) after installing its own alarm handler.
    """
    arch = supported_arch()
    if arch is None:
        raise RuntimeError(f"no seccomp syscall table for {platform.machine()!r}")
    nr, eperm = _NR[arch]["rt_sigaction"], _errno(errno.EPERM)
    prog = [_ins(_LD_ABS_W, 4), _ins(_JEQ, _AUDIT_ARCH[arch], 1, 0), _ins(_RET, _RET_KILL_PROCESS),
            _ins(_LD_ABS_W, 0), _ins(_JEQ, nr, 0, 5),
            _ins(_LD_ABS_W, 24), _ins(_JEQ, 0, 0, 2),  # args[1] (act), low word
            _ins(_LD_ABS_W, 28), _ins(_JEQ, 0, 1, 0),  # high word
            _ins(_RET, eperm), _ins(_RET, _RET_ALLOW)]
    return b"".join(prog)
