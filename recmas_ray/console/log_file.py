"""The quiet job's log file and the console's private copies of the streams it redirects (`console.job_console`).

No heavy imports: the console uses these from a job's first second.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TextIO


def private_copy(stream: TextIO, fd: int) -> tuple[TextIO, bool]:
    """`stream` itself, or a stream on a duplicate of `fd` when `stream` writes to `fd` (which is about to be
    pointed at the log file); the bool says whether the copy must be closed."""
    try:
        if stream.fileno() == fd:
            return os.fdopen(os.dup(fd), "w", buffering=1, encoding=getattr(stream, "encoding", None) or "utf-8",
                             errors="replace"), True
    except (AttributeError, OSError, ValueError):  # pytest's capture objects, closed streams
        pass
    return stream, False


class LogFile:
    """The quiet job's log: a temporary file until the job's real work starts (`settle`), then
    log_dir/<name>.log, so a run refused for bad input leaves its output folder as it was."""

    def __init__(self, log_dir: Path, name: str):
        fd, self.tmp = tempfile.mkstemp(prefix=f"recmas-{name}-", suffix=".log")
        self.file = os.fdopen(fd, "a", buffering=1, encoding="utf-8", errors="replace")
        self.final = log_dir / f"{name}.log"
        self.settled = False
        self.redirect_fd2 = False

    def settle(self) -> None:
        """Move what was logged so far into the final file and write there from now on (the same file
        object and fd 2 stay in use: their descriptors are re-pointed)."""
        if self.settled:
            return
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.file.flush()
        with open(self.tmp, "rb") as src, open(self.final, "ab") as dst:
            shutil.copyfileobj(src, dst)
        fd = os.open(self.final, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, self.file.fileno())
        os.close(fd)
        if self.redirect_fd2:
            os.dup2(self.file.fileno(), 2)
        self.settled = True
        os.unlink(self.tmp)

    def close(self, *, keep: bool) -> None:
        if keep:
            self.settle()
        self.file.close()
        if not self.settled:
            os.unlink(self.tmp)
