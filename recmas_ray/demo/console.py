"""The demo's console: one line per phase on stdout, everything else into log files of the output folder.

Quiet mode (the default) sends Python logging, warnings, HF/tqdm bars and whatever writes to stderr
(also from C code and child processes, through file descriptor 2) to `<output>/logs/demo.log`; Ray
is started with `log_to_driver=False`, so its workers' output stays in Ray's session logs (their
folder is written into demo.log). `--verbose` leaves all of it on the console.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from pathlib import Path

QUIET_ENV = {"RAY_DEDUP_LOGS": "0", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
             "TQDM_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false"}
"""Environment set in quiet mode (None: left as it is); workers inherit it."""


class Console:
    """Phase lines on the stream that was stdout when the demo started."""

    def __init__(self, *, stream=None, progress: bool = True):
        self.stream = stream or sys.stdout
        self.progress = progress and getattr(self.stream, "isatty", lambda: False)()
        self._open: str | None = None
        self._t0 = 0.0

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def start(self, what: str) -> None:
        """Begin a phase line (shown at once on a terminal, then updated in place)."""
        self.finish_open()
        self._open, self._t0 = what, time.perf_counter()
        if self.progress:
            self._write(f"{what} ...")

    def update(self, status: str) -> None:
        """Replace the running phase's status (terminal only; elsewhere only the final line is written)."""
        if self._open is not None and self.progress:
            self._write(f"\r\033[K{self._open} ... {status}")

    def done(self, result: str = "") -> float:
        """End the phase: one final line with its result and duration; returns the seconds it took."""
        dt = time.perf_counter() - self._t0
        line = f"{self._open}: {result} ({dt:.0f} s)" if result else f"{self._open} ({dt:.0f} s)"
        self._write(("\r\033[K" if self.progress else "") + line + "\n")
        self._open = None
        return dt

    def finish_open(self) -> None:
        if self._open is not None:
            self.done("interrupted")

    def line(self, text: str = "") -> None:
        self.finish_open()
        self._write(text + "\n")


@contextlib.contextmanager
def quiet_outputs(log_dir: Path, *, verbose: bool):
    """Route logging, warnings and stderr (fd 2 included) to `log_dir/demo.log` unless `verbose`.

    Yields the Console's stream (the original stdout). Everything is restored on exit, so an error
    message printed after the demo returns reaches the real stderr.
    """
    if verbose:
        yield sys.stdout
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "demo.log"
    saved_env = {k: os.environ.get(k) for k in QUIET_ENV}
    for k, v in QUIET_ENV.items():
        if v is not None:
            os.environ[k] = v
    log_file = open(log_path, "a", buffering=1, encoding="utf-8")
    stdout, stderr = sys.stdout, sys.stderr
    try:
        fd2 = os.dup(2)
    except OSError:
        fd2 = None
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    handler = logging.StreamHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    moved: list[tuple[logging.Logger, list, bool]] = []
    try:
        if fd2 is not None:
            sys.stderr.flush()
            os.dup2(log_file.fileno(), 2)
        sys.stdout = sys.stderr = log_file  # stray prints (Ray Train's driver, libraries) go to the log
        root.handlers = [handler]
        root.setLevel(logging.INFO)
        for name in list(logging.Logger.manager.loggerDict):  # ray.*, math_verify, transformers, ...
            lg = logging.getLogger(name)
            if lg.handlers or not lg.propagate:
                moved.append((lg, list(lg.handlers), lg.propagate))
                lg.handlers, lg.propagate = [handler], False
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            logging.captureWarnings(True)
            try:
                yield stdout
            finally:
                logging.captureWarnings(False)
    finally:
        sys.stdout, sys.stderr = stdout, stderr
        if fd2 is not None:
            os.dup2(fd2, 2)
            os.close(fd2)
        root.handlers, root.level = saved_handlers, saved_level
        for lg, handlers, propagate in moved:
            lg.handlers, lg.propagate = handlers, propagate
        log_file.close()
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def quiet_new_loggers(log_dir: Path) -> None:
    """Loggers created after `quiet_outputs` started (Ray Train, math-verify import late) also go to the log."""
    root = logging.getLogger()
    if not root.handlers:
        return
    handler = root.handlers[0]
    for name in list(logging.Logger.manager.loggerDict):
        lg = logging.getLogger(name)
        if isinstance(lg, logging.Logger) and (lg.handlers and handler not in lg.handlers):
            lg.handlers, lg.propagate = [handler], False
