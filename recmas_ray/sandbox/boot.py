"""Start-up code of a sandboxed child (see `__init__.py`): limits, then the audit-hook guard, then user code.

This file is not imported: `__init__.py` passes its text to `python -I -B -c` in the child, with the number of a
memfd holding the JSON config; it is read and closed first, so user code finds neither the config nor the nonce.

Probe mode (``grading["calls"]`` set; what the graders use): the program runs as module ``solution``, then the
boot code calls the named functions on the given arguments and writes, on a saved copy of fd 1 (the program's
own prints go to stderr), one line ``PROBE_MARK`` + JSON with each call's value (`encode_value`) or exception
type name. Nothing secret is in the child: the parent alone holds the expected values and judges the values it
gets back, so what the program forges on any fd can only claim values, which pass only if they are right.

Nonce mode (``tests`` set; graders use it only for suites `recmas_ray/tasks/code_suites.py` cannot split): the
program runs as module ``solution``; the tests run afterwards in a namespace of their own (the solution's
names, less those that shadow a builtin unless ``grading["program_names"]`` lists them, e.g. an entry point
called ``sum``; a private copy of the builtins) through the trusted ``_HARNESS`` code object. Only when that
code object reaches its last line does the audit hook, the sole holder of the call's nonce, write it to the
result pipe. SystemExit, os._exit, forged output or a re-run of the harness cannot produce it; frames
(sys._getframe, tracebacks, generators, signal handlers), tracing, ctypes symbol loading, audited memory reads
and gc walks are refused. Not covered: the nonce lives in this interpreter, so a program that reads its own
memory without an audited call (ctypes.cast of an address, /proc/self/mem) or replaces what the guard calls
can find it.
"""

# encode_value, decode_value and PROBE_MARK come from values.py, whose text runs ahead of this one in the child
# (`sandbox/__init__.py` joins the two); the parent imports them from `recmas_ray.sandbox.values`.

_HARNESS = """\
try:
    exec(_solution, _ns)
except BaseException as _e:
    _fail("the program raised " + type(_e).__name__ + " while loading (SystemExit counts as failure)", _e)
_tns = {_k: _v for _k, _v in _ns.items() if _k not in _builtins or _k in _program_names}
_tns.update(__builtins__=_builtins, __name__="__tests__")
try:
    exec(_tests, _tns)
except BaseException as _e:
    _fail("tests failed: " + type(_e).__name__, _e)
_audit("recmas.sandbox.tests_passed")
"""
_HARNESS_LAST_LINE = 11


def _boot():
    import json, os, resource, sys, traceback  # lazy: the sandboxed child's boot text (no module-level imports)
    with os.fdopen(int(sys.argv[2]), "rb") as f:
        c = json.loads(f.read())
    for name, soft, hard in c["limits"]:
        res = getattr(resource, name)
        cur_hard = resource.getrlimit(res)[1]
        if cur_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, cur_hard), min(hard, cur_hard)
        resource.setrlimit(res, (soft, hard))
    src = c["code"]
    with open("main.py", "w", encoding="utf-8") as f:
        f.write(src)
    sys.argv[:] = ["main.py"]
    main_globals = sys.modules["__main__"].__dict__
    guard, grade = _guard, _grade
    probe = _probe
    # No handle on the boot code (encode_value and decode_value stay: they recurse through these globals, and
    # a program that changes them changes only the values it reports).
    for name in ("_boot", "_guard", "_grade", "_probe", "_load_seccomp", "_HARNESS", "_HARNESS_LAST_LINE"):
        main_globals.pop(name, None)
    if (c.get("grading") or {}).get("calls") is not None:
        probe(c, src, guard)
        return
    if c["tests"] is not None:
        grade(c, src, guard)
        return
    ns = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}
    exec(compile(c["prelude"], "<prelude>", "exec"), ns)
    guard(c, None)
    del c
    try:
        exec(compile(src, "main.py", "exec"), ns)
    except SystemExit:
        raise
    except BaseException as exc:
        te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        te.stack = traceback.StackSummary.from_list([f for f in te.stack if f.filename != "<sandbox>"])
        sys.stderr.write("".join(te.format()))  # without the boot and hook frames
        sys.stderr.flush()
        sys.exit(1)


def _load_seccomp(prog):
    import ctypes  # lazy: the sandboxed child's boot text (no module-level imports)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = SockFprog(len(prog) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "cannot load the grading seccomp filter")


def _grade(c, src, guard, harness_src=_HARNESS, load_seccomp=_load_seccomp):
    import builtins, os  # lazy: the sandboxed child's boot text (no module-level imports)
    write, exit_now = os.write, os._exit

    def fail(what, exc):  # writes with the functions saved before the program ran: it may replace them
        try:
            text = str(exc)[:600]
        except BaseException:
            text = "?"
        write(2, ("%s: %s\n" % (what, text)).encode("utf-8", "replace"))
        exit_now(1)

    try:
        # lazy: the sandboxed child's boot text (no module-level imports)
        import ctypes  # noqa: F401 (before the guard: its own start-up loads libraries, refused afterwards)
    except ImportError:
        pass
    ns = {"__name__": "solution", "__file__": "main.py", "__builtins__": builtins}
    exec(compile(c["prelude"], "<prelude>", "exec"), ns)
    # A signal handler is handed the interrupted frame (the tests' globals): install the only one the tests
    # need (SIGALRM -> TimeoutError, for per-test time limits), then forbid installing any other.
    import signal  # lazy: the sandboxed child's boot text (no module-level imports)

    def alarm(signum, frame):
        raise TimeoutError("sandbox alarm")

    signal.signal(signal.SIGALRM, alarm)
    load_seccomp(bytes.fromhex(c["no_handlers_filter"]))
    try:
        solution = compile(src, "main.py", "exec")
    except BaseException as exc:
        fail("the program does not compile: " + type(exc).__name__, exc)
    harness = compile(harness_src, "<harness>", "exec")
    env = {"_solution": solution, "_tests": compile(c["tests"], "<tests>", "exec"), "_ns": ns, "_fail": fail,
           "_builtins": dict(builtins.__dict__), "_audit": __import__("sys").audit,
           "_program_names": frozenset((c.get("grading") or {}).get("program_names") or ())}
    env["__builtins__"] = env["_builtins"]
    guard(c, harness)
    del c, src, solution, guard
    exec(harness, env)


def _probe(c, src, guard, encode=encode_value, decode=decode_value, mark=PROBE_MARK):
    import builtins, json, os, signal, sys  # lazy: the sandboxed child's boot text (no module-level imports)
    write, exit_now, dumps, alarm = os.write, os._exit, json.dumps, signal.alarm
    result_fd = os.dup(1)
    os.dup2(2, 1)  # the program's prints (print, os.write(1, ...)) land on stderr, the results on result_fd

    def report(obj):
        data = memoryview(("\n" + mark + dumps(obj, separators=(",", ":"), allow_nan=False) + "\n").encode())
        while data:
            data = data[write(result_fd, data):]
        exit_now(0)  # no atexit handler, thread or finaliser of the program runs after the report

    def name_of(exc):
        try:
            detail = str(exc)[:300]
        except BaseException:
            detail = "?"
        return {"error": type(exc).__name__, "detail": detail}

    spec = c["grading"]
    calls = [(call["fn"], decode(call["args"]), decode(call["kwargs"])) for call in spec["calls"]]
    owner, per_call_s = spec.get("method_of"), int(spec.get("per_call_timeout_s") or 0)

    def on_alarm(signum, frame):
        raise TimeoutError("probe time limit")

    signal.signal(signal.SIGALRM, on_alarm)
    ns = {"__name__": "solution", "__file__": "main.py", "__builtins__": builtins}
    exec(compile(c["prelude"], "<prelude>", "exec"), ns)
    guard(c, None)
    del c
    try:
        exec(compile(src, "main.py", "exec"), ns)
        instance = ns[owner]() if owner and isinstance(ns.get(owner), type) else None
    except BaseException as exc:
        report({"load_error": name_of(exc)})
    outcomes = []
    for name, args, kwargs in calls:
        try:
            alarm(per_call_s)
            fn = getattr(instance, name, None) if instance is not None else ns.get(name)
            if not callable(fn):
                alarm(0)
                outcomes.append({"error": "NO_FUNC", "detail": "no callable %r" % name})
                continue
            value = fn(*args, **kwargs)
            try:  # under the alarm too (numpy item(), huge values)
                outcome = {"value": encode(value)}
            except Exception as exc:
                outcome = {"error": "NotPlainData", "detail": str(exc)[:300]}
            alarm(0)
            outcomes.append(outcome)
        except BaseException as exc:
            alarm(0)
            outcomes.append(name_of(exc))
            if type(exc) is TimeoutError:
                break  # the rest would not be graded
    report({"outcomes": outcomes})


def _guard(c, harness, last_line=_HARNESS_LAST_LINE):
    import os, re, sys, _thread  # lazy: the sandboxed child's boot text (no module-level imports)
    # the work folder (cwd), and /tmp where it is a tmpfs of its own (an interpreter installed under /tmp)
    roots = tuple(os.path.realpath(d) for d in c.get("writable", ())) or (os.path.realpath(os.getcwd()),)
    deny = tuple(c["deny_read"])
    secret_proc = re.compile(r"^/proc/[0-9]+/(task/[0-9]+/)?(environ|mem|maps|smaps|pagemap)$")
    wflags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    net_events = frozenset(() if c["allow_network"] else (
        "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
        "socket.gethostbyname", "socket.gethostbyname_ex", "socket.gethostbyaddr", "socket.getnameinfo"))
    proc_events = frozenset(() if c["allow_subprocess"] else (
        "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen"))
    dirfd_arg = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 2, "os.chmod": 2, "os.chown": 3, "os.utime": 3,
                 "os.truncate": None, "os.setxattr": None, "os.removexattr": None, "os.chflags": None,
                 "os.lchflags": None, "os.mkfifo": None, "os.mknod": None}
    dlsym_deny = frozenset(("fork", "vfork", "clone", "clone3", "system", "popen", "execv", "execve", "execvp",
        "execvpe", "execl", "execlp", "execle", "fexecve", "posix_spawn", "posix_spawnp", "syscall", "kill",
        "socket", "connect", "bind", "open", "open64", "openat", "openat64", "fopen", "fopen64", "creat",
        "unlink", "unlinkat", "rename", "renameat", "remove", "rmdir", "chmod", "truncate", "setrlimit",
        "prlimit", "prlimit64", "setuid", "setgid"))

    def real(path, dir_fd=None):
        path = os.fsdecode(path)
        if isinstance(dir_fd, int) and dir_fd >= 0 and not os.path.isabs(path):
            path = os.path.join(os.readlink("/proc/self/fd/%d" % dir_fd), path)
        return os.path.realpath(path)

    def inside(path, dir_fd=None):
        if isinstance(path, int):
            return True  # an already-open descriptor was checked when it was opened
        try:
            p = real(path, dir_fd)
        except Exception:
            return False
        return any(p == r or p.startswith(r + os.sep) for r in roots) or p == os.devnull

    def refuse(what):
        raise PermissionError("sandbox blocked: " + what)

    grading = harness is not None
    nonce, result_fd, write, busy = c["nonce"], c["result_fd"], os.write, set()
    frame_attrs = frozenset(("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code", "gi_code", "cr_code",
                             "ag_code"))
    grading_imports = frozenset(("_testcapi", "_testinternalcapi", "_xxsubinterpreters"))
    # ctypes stays importable (numpy needs it; it is loaded before this hook) but cannot load symbols or read
    # memory through the audited entry points.
    grading_events = frozenset(("sys._current_frames", "sys.settrace", "sys.setprofile", "sys.setasyncgen_hooks",
                                "ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.string_at",
                                "ctypes.wstring_at", "ctypes.cdata", "ctypes.cdata/buffer"))
    if not grading:
        os.close(result_fd)

    def passed():
        # The caller must be the harness code object at its last line: a copied, replayed or stolen frame is not.
        me = _thread.get_ident()
        busy.add(me)
        try:
            f = sys._getframe(3)  # passed <- grading_hook <- hook <- caller of sys.audit
            ok = f.f_code is harness and f.f_lineno == last_line
        finally:
            busy.discard(me)
        if ok:
            write(result_fd, nonce.encode())
            os.close(result_fd)

    def grading_hook(event, args):
        if _thread.get_ident() in busy:
            return
        if event == "recmas.sandbox.tests_passed":
            passed()
        elif event == "sys._getframe":
            raise ValueError("sandbox blocked: frame access while grading")  # stdlib callers expect ValueError
        elif event in grading_events:
            refuse(event + " while grading")
        elif event == "object.__getattr__" and args[1] in frame_attrs:
            refuse("access to %s while grading" % args[1])
        elif event == "import" and args[0] in grading_imports:
            refuse("import of %s while grading" % args[0])

    def hook(event, args):
        if grading:
            grading_hook(event, args)
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int):
                return
            writing = (isinstance(mode, str) and any(ch in mode for ch in "wax+")) or bool(flags & wflags)
            if writing:
                if not inside(path):
                    refuse("write outside the working directory: %s" % os.fsdecode(path))
                return
            try:
                p = real(path)
            except Exception:
                return
            if secret_proc.match(p) or any(p == d or p.startswith(d + os.sep) for d in deny):
                refuse("read of a protected path: %s" % p)
        elif event in dirfd_arg:
            i = dirfd_arg[event]
            if not inside(args[0], args[i] if i is not None else None):
                refuse("%s outside the working directory" % event)
        elif event in ("os.rename", "os.link"):
            if not (inside(args[0], args[2]) and inside(args[1], args[3])):
                refuse("%s outside the working directory" % event)
        elif event == "sqlite3.connect" and str(args[0]) != ":memory:":
            if str(args[0]).startswith("file:") or not inside(args[0]):
                refuse("sqlite3 database outside the working directory")
        elif event == "os.symlink":
            if not inside(args[1], args[2]):
                refuse("os.symlink outside the working directory")
        elif event in net_events:
            refuse("network access is disabled (%s)" % event)
        elif event == "socket.__new__" and net_events and args[1] != 1:  # 1 == AF_UNIX on Linux
            refuse("network access is disabled (socket family %s)" % args[1])
        elif event in proc_events:
            refuse("subprocesses are disabled (%s)" % event)
        elif event == "import" and proc_events and args[0] == "_posixsubprocess":
            refuse("subprocesses are disabled (_posixsubprocess)")
        elif (event == "os.kill" and args[0] != os.getpid()) or event == "os.killpg":
            refuse("signals to other processes (%s)" % event)
        elif event == "resource.setrlimit" or (event == "resource.prlimit" and args[2] is not None):
            refuse("changing resource limits")
        elif event in ("ctypes.dlsym", "ctypes.dlsym/handle") and str(args[1]) in dlsym_deny:
            refuse("ctypes access to %s" % args[1])
        elif event in ("gc.get_objects", "gc.get_referrers", "gc.get_referents"):
            refuse(event)

    if proc_events:
        # subprocess.Popen is audited, but the C helper behind it is not: replace it in the cached module (and in
        # an already imported subprocess) so a direct call fails too; re-importing it is refused by the hook.
        import _posixsubprocess  # lazy: the sandboxed child's boot text (no module-level imports)
        def fork_exec(*args, **kwargs):  # no closure: user code can reach this function
            raise PermissionError("sandbox blocked: subprocesses are disabled (fork_exec)")
        _posixsubprocess.fork_exec = fork_exec
        if "subprocess" in sys.modules:
            sys.modules["subprocess"]._fork_exec = fork_exec
    sys.addaudithook(hook)

if __name__ == "__main__":  # run as `python -c` text in the child; importing it does nothing
    _boot()
