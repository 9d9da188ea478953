"""The console of every job (run, train_inner, train_outer, serve, demo): what the user reads, and where the rest goes.

    job_console(<output>/logs, verbose=False, name="run")
        console streams (the stdout/stderr the job started with): on stderr what the job is doing (phase lines,
                     progress bars, warnings, the error line), on stdout what it produced (tables, JSON, paths)
        <output>/logs/<name>.log: Python logging, warnings, stray prints, fd 2 (C code, child processes),
                                  Ray's driver and forwarded worker output, Ray Train, HF, math-verify

In quiet mode (the default) `distributed.cluster.init_ray` asks this module for its settings (Ray's own
logging at WARNING; its workers' output is still forwarded to the driver, where it lands in the log file
instead of the terminal), and the job shuts down a Ray it started before the streams are restored, so
Ray's goodbye messages (PlacementGroupCleaner, raylet) land there too and none of its processes outlive
the job. `--verbose` leaves everything on the console, as before (Ray still shut down at the end).

Every job talks from its first second: `announce` (called by `config.cli.run_job` before the config is even
parsed, before torch or Ray is imported) opens the first phase line, "checking inputs ...", which the job's console
continues; Ray's start-up (`ray_starting` / `ray_started`) is a phase of its own. On a terminal an open phase
shows its seconds so far, updated in place each second; elsewhere (a pipe, a file, `ray job logs`) each phase
prints its start line at once and its final line (result and seconds) when it ends.

Code deep inside a job writes through `current()`: the active job's console, or a plain one on
sys.stdout / sys.stderr for Python callers, so library use prints exactly what it printed before.
Nothing here imports Ray at module level.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Callable, Iterator, TextIO

from recmas_ray.console.log_file import LogFile, private_copy

QUIET_ENV = {"RAY_DEDUP_LOGS": "0", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
             "TQDM_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false"}
"""Environment set in quiet mode; Ray's processes inherit it. TQDM_DISABLE only changes tqdm's default, so
libraries' bars vanish while the console's own bars (disable given explicitly) still draw."""

_current: "Console | None" = None
_log_handler: logging.Handler | None = None  # the quiet job_console's log file handler
_ray_outlives: bool = False  # the quiet console's Ray runs on after it (the Python API): workers' output stays
                             # in Ray's session logs instead of being forwarded to this process
_moved: list = []  # (logger, its handlers, its propagate) re-pointed at the log file, restored at the end


class Console:
    """Phase lines and progress bars (stderr), results (stdout), on the streams the job started with."""

    def __init__(self, *, stream: TextIO | None = None, err: TextIO | None = None, progress: bool = True,
                 on_work: Callable[[], None] | None = None, job: bool = False):
        global _announced
        self.stream = stream or sys.stdout
        self.err = err or sys.stderr
        self._on_work = on_work
        self.bars = progress
        """Progress bars (evaluation, training steps) drawn at all."""
        self.progress = progress and _isatty(self.err)
        """Phase lines updated in place (a terminal only; elsewhere a start line and a final line per phase)."""
        self._open: str | None = None
        self._t0 = 0.0
        self._lock = threading.Lock()
        self._ticker: threading.Thread | None = None
        self._ray_phase = False  # the open phase is Ray's start-up (`ray_starting`)
        self._below = False  # a bar was drawn below the open phase's line (terminal): it no longer ticks
        self._status = ""  # the open phase's status (`update`), shown before its seconds
        if job and _announced is not None:  # a job's console continues the phase `announce` opened
            (self._open, self._t0), _announced = _announced, None
            self._tick_on()

    def _write(self, text: str, *, err: bool = False) -> None:
        out = self.err if err else self.stream
        with self._lock:
            out.write(text)
            out.flush()

    def settle_logs(self) -> None:
        """The job's real work begins (its inputs are checked): make the log folder (see `job_console`)."""
        if self._on_work is not None:
            self._on_work()

    def start(self, what: str) -> None:
        """Begin a phase line on stderr (a phase still open ends first): on a terminal shown at once with its
        seconds so far, updated in place; elsewhere its start line `what ...` at once."""
        self.settle_logs()
        if self._open is not None:
            self.done()
        self._open, self._t0, self._below, self._status = what, time.perf_counter(), False, ""
        self._write(f"{what} ..." if self.progress else f"{what} ...\n", err=True)
        self._tick_on()

    def update(self, status: str) -> None:
        """Replace the running phase's status (terminal only)."""
        self._status = status
        if self._open is not None and self.progress and not self._below:
            self._write(f"\r\033[K{self._open} ... {status}", err=True)

    def done(self, result: str = "") -> float:
        """End the phase: one final line with its result and duration; returns the seconds it took."""
        if self._open is None:
            return 0.0
        dt = time.perf_counter() - self._t0
        line = f"{self._open}: {result} ({dt:.0f} s)" if result else f"{self._open} ({dt:.0f} s)"
        self._open = None
        self._write(("\r\033[K" if self.progress and not self._below else "") + line + "\n", err=True)
        return dt

    def finish_open(self, error: BaseException | None = None) -> None:
        """Close a phase that never reached `done` (an error or interrupt stopped it)."""
        if isinstance(error, KeyboardInterrupt):
            self.drop_open()  # the job's one line says it was interrupted
        elif self._open is not None:
            self.done("failed" if error is not None else "interrupted")

    def drop_open(self) -> None:
        """Take back an open phase without a final line (bad input: the error line says it all); on a terminal
        its line is erased."""
        if self._open is not None:
            self._open = None
            if self.progress and not self._below:
                self._write("\r\033[K", err=True)

    def _tick_on(self) -> None:
        """On a terminal, a daemon thread rewrites the open phase's line each second with its seconds so far."""
        if not self.progress or (self._ticker is not None and self._ticker.is_alive()):
            return

        def tick():
            while self._open is not None:
                time.sleep(1.0)
                what, t0 = self._open, self._t0
                if what is None:
                    return
                with self._lock:
                    if self._open == what and not self._below:
                        try:
                            status = f"{self._status}, " if self._status else ""
                            self.err.write(f"\r\033[K{what} ... {status}{time.perf_counter() - t0:.0f} s")
                            self.err.flush()
                        except (OSError, ValueError):  # the stream closed (the job ended): stop ticking
                            return

        self._ticker = threading.Thread(target=tick, name="console-phase-ticker", daemon=True)
        self._ticker.start()

    def line(self, text: str = "") -> None:
        """One line of results (a table, JSON, where the outputs went) on the console's stdout."""
        self.finish_open()
        self._write(text + "\n")

    def warn(self, text: str) -> None:
        """`warning: text` on the console's stderr (user-facing, unlike library warnings)."""
        if self._open is not None and self.progress and not self._below:  # not inside the open phase's line
            self._write("\n", err=True)
        self._write(f"warning: {text}\n", err=True)

    def bar(self, total: int | None, desc: str, *, unit: str = "it", initial: int = 0, enabled: bool = True):
        """A tqdm bar (count, rate, ETA) on the console's stderr, below an open phase's line (which ends with
        its own final line); a disabled one without progress bars."""
        from tqdm.auto import tqdm  # lazy: tqdm reads TQDM_* when imported: after job_console has set them

        self.settle_logs()
        if self._open is not None and self.progress and not self._below:
            self._below = True  # the bar goes below the open phase's line, which stops ticking until `done`
            self._write("\n", err=True)
        # smoothing=0: the rate shown is count / seconds since the bar opened (the run's throughput), not a
        # moving average of the last updates
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=self.err, smoothing=0,
                    disable=not (enabled and self.bars), dynamic_ncols=True)


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


CHECKING = "checking inputs"
"""The first phase of every command-line job (`announce`): its config, files and models' configs are read."""

_announced: tuple[str, float] | None = None  # (phase, its start) printed by `announce`, before any Console


def announce(what: str = CHECKING, argv: list[str] | None = None) -> None:
    """A command-line job's first line, on stderr at once (before its config is parsed, before torch or Ray is
    imported): the phase `what`, which the job's console continues (or `retract` takes back). Once per job;
    nothing for --help and --print_config (`argv`: the job's arguments, default sys.argv's)."""
    global _announced
    if _announced is not None or {"-h", "--help", "--print_config"} & set(sys.argv[1:] if argv is None else argv):
        return
    tty = _isatty(sys.stderr)
    sys.stderr.write(f"{what} ..." if tty else f"{what} ...\n")
    sys.stderr.flush()
    _announced = (what, time.perf_counter())


def end_announced(result: str = "") -> None:
    """End the phase `announce` opened with its final line, for a job that runs without a console (a dry run,
    a quick tool)."""
    global _announced
    if _announced is not None:
        what, t0 = _announced
        _announced = None
        sys.stderr.write(("\r\033[K" if _isatty(sys.stderr) else "")
                         + (f"{what}: {result}" if result else what) + f" ({time.perf_counter() - t0:.0f} s)\n")
        sys.stderr.flush()


def retract() -> None:
    """The job ends before its console took the announced phase (bad input, --help, --print_config): on a
    terminal the phase line is erased, so the error is the one line left; elsewhere the start line stays."""
    global _announced
    if _announced is not None and _isatty(sys.stderr):
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()
    _announced = None


def current() -> Console:
    """The running job's console, else a plain one on the present sys.stdout / sys.stderr."""
    return _current if _current is not None else Console()


@contextlib.contextmanager
def job_console(log_dir: str | Path, *, verbose: bool, name: str, progress: bool = True,
                keep_ray: bool = False) -> Iterator[Console]:
    """The job's console; unless `verbose`, everything else goes to `log_dir/<name>.log` (see the module doc).

    `keep_ray` (the Python API, whose agents outlive each call): a Ray started inside stays up, and in quiet
    mode it is started without forwarding its workers' output (which would reach the terminal between
    calls); Ray keeps that output in its session folder, whose path the log file names.

    The log folder is made when the job starts real work (`Console.settle_logs`: Ray starts, a phase or a
    progress bar begins); a job that stops on bad input before that (ValueError, TypeError) writes no log.
    On exit everything is restored (an error printed after the job returns reaches the real stderr), and a
    Ray this job started is shut down first.
    """
    global _current, _log_handler, _ray_outlives
    ray_before = _ray_running() or keep_ray
    saved_current = _current
    if verbose:
        _current = Console(progress=progress, job=True)
        try:
            yield _current
        except (ValueError, TypeError):
            _current.drop_open()
            raise
        except BaseException as e:
            _current.finish_open(e)
            raise
        finally:
            _current = saved_current
            if not ray_before and _ray_running():
                _shutdown_ray()
        return
    saved_env = {k: os.environ.get(k) for k in QUIET_ENV}
    os.environ.update(QUIET_ENV)
    log = LogFile(Path(log_dir), name)
    stdout, stderr = sys.stdout, sys.stderr
    err, close_err = private_copy(stderr, 2)
    try:
        fd2 = os.dup(2)
    except OSError:
        fd2 = None
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    handler = logging.StreamHandler(log.file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved_moved, saved_handler, saved_outlives = list(_moved), _log_handler, _ray_outlives
    _ray_outlives = keep_ray
    _current, _log_handler = Console(stream=stdout, err=err, progress=progress, on_work=log.settle,
                                                  job=not keep_ray), handler
    keep = True
    try:
        if fd2 is not None:
            stderr.flush()
            os.dup2(log.file.fileno(), 2)
            log.redirect_fd2 = True
        sys.stdout = sys.stderr = log.file  # stray prints (Ray Train's driver, libraries) go to the log
        # handlers that print to the console go; others (a file, a test's capture) keep their records
        shown = {id(stdout), id(stderr), id(sys.__stdout__), id(sys.__stderr__)}
        root.handlers = [h for h in saved_handlers if not (type(h) is logging.StreamHandler
                                                           and id(h.stream) in shown)] + [handler]
        root.setLevel(logging.INFO)
        route_loggers(handler)
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            logging.captureWarnings(True)
            try:
                yield _current
            except (ValueError, TypeError) as e:
                keep = log.settled  # bad input found before any work: the output folder stays untouched
                if not keep:
                    _current.drop_open()  # the error line is the one line (no "checking inputs: failed")
                _current.finish_open(e)
                raise
            except BaseException as e:
                _current.finish_open(e)
                raise
            finally:
                _current.finish_open()
                if not ray_before and _ray_running():
                    _shutdown_ray()
                logging.captureWarnings(False)
    finally:
        _current, _log_handler, _ray_outlives = saved_current, saved_handler, saved_outlives
        sys.stdout, sys.stderr = stdout, stderr
        if fd2 is not None:
            os.dup2(fd2, 2)
            os.close(fd2)
        log.redirect_fd2 = False
        root.handlers, root.level = saved_handlers, saved_level
        for lg, handlers, propagate in reversed(_moved[len(saved_moved):]):
            lg.handlers, lg.propagate = handlers, propagate
        _moved[:] = saved_moved
        log.close(keep=keep)
        if close_err:
            err.close()
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def default_log_dir() -> Path:
    """Where the Python API's log goes unless `log_dir` names a folder: a private folder under the temp dir."""
    return Path(tempfile.gettempdir()) / f"recmas_ray-{os.getuid()}" / "logs"


@contextlib.contextmanager
def quiet_calls(verbose: bool, log_file: Path):
    """The Python API's calls: what Ray, Ray Data, HF, math-verify and C code print goes to `log_file` (appended),
    as in the jobs (`job_console`), unless `verbose`; the caller's own console (bars, tables) stays on the terminal.
    A Ray started inside runs on (the System's agents live in it). Nested calls and calls inside a job (whose
    console already routes everything) change nothing."""
    if _current is not None:  # a job's console, or an outer API call, is already in charge
        yield
        return
    if not verbose:
        log_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with job_console(log_file.parent, verbose=verbose, name=log_file.stem, keep_ray=True):
        yield


def ray_starting(what: str = "starting Ray") -> dict:
    """Called by `init_ray` before it starts or joins Ray: the job's real work begins (its log folder is made),
    and a job's console shows the phase `what` (unless another phase than the checks is open: it stays);
    returns the `ray.init` settings of the console: Ray's own logging at WARNING in a quiet job (its workers'
    output still reaches this driver, whose streams go to the log), nothing otherwise."""
    if _current is not None:
        _current.settle_logs()
        if not _ray_outlives and _current._open in (None, CHECKING):
            _current.start(what)
            _current._ray_phase = True
        elif not _ray_outlives:  # inside a phase of the job's (training): its line says what it waits for
            _current.update(what)
    if _log_handler is None:
        return {}
    return {"logging_level": logging.WARNING, **({"log_to_driver": False} if _ray_outlives else {})}


def ray_started(result: str = "") -> None:
    """Called by `init_ray` once Ray runs: the Ray phase ends with `result`; in a quiet job the loggers Ray made
    go to the log as well, and the log names Ray's session folder (the daemons' own logs)."""
    if _current is not None and getattr(_current, "_ray_phase", False):
        _current._ray_phase = False
        _current.done(result)
    elif _current is not None and not _ray_outlives and _current._open is not None:
        _current._status = ""  # the training phase's line no longer says "starting Ray"
    if _log_handler is None:
        return
    route_loggers(_log_handler)
    try:
        import ray  # lazy: the console (ground floor) touches Ray only once Ray has started

        logging.getLogger(__name__).warning("Ray session logs: %s",
                                            ray._private.worker._global_node.get_session_dir_path())
    except Exception:  # noqa: BLE001 - only informational (a joined cluster has no local node object)
        pass


def route_loggers(handler: logging.Handler) -> None:
    """Point every existing logger with its own handlers (ray.*, transformers, math_verify, ...) at `handler`,
    recording what each had (job_console restores it). Called again after Ray starts: Ray Train and Ray Data
    make their loggers late."""
    for name in list(logging.Logger.manager.loggerDict):
        lg = logging.getLogger(name)
        if isinstance(lg, logging.Logger) and (lg.handlers or not lg.propagate) and lg.handlers != [handler]:
            _moved.append((lg, list(lg.handlers), lg.propagate))
            lg.handlers, lg.propagate = [handler], False


def _ray_running() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and getattr(ray, "is_initialized", lambda: False)())


def _shutdown_ray() -> None:
    import ray  # lazy: ray must not load with --help or before a job's first line

    try:
        ray.shutdown()
    except Exception:  # noqa: BLE001 - the job's own result is already out; the log has the reason
        logging.getLogger(__name__).exception("ray.shutdown failed")
