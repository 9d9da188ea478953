"""Reading files of an untrusted checkpoint folder: race-free containment, no FIFO hangs, finite weights only.

`contained()` (checkpoints.py) refuses names that leave the folder, but a path checked is not the file
opened: a symlink swapped in between would be followed. `opened_inside` therefore opens first (non-blocking,
so a FIFO cannot hang the loader), then checks the *opened* file: a regular file whose real path, read back
from the descriptor, lies inside the folder; readers get `/proc/self/fd/N`, which names that very file.
"""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch


@contextmanager
def opened_inside(root: str | os.PathLike, file: str | os.PathLike, *, what: str) -> Iterator[str]:
    """A path to the opened `file` (checked: regular, inside `root`) valid for the `with` block."""
    base = Path(root).resolve()
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ValueError(f"{what}: {file} cannot be opened ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else \
                "not a regular file"
            raise ValueError(f"{what}: {file} is {kind}; expected a regular file")
        proc = f"/proc/self/fd/{fd}"
        if os.path.exists(proc):
            real, named = Path(os.readlink(proc)), proc
        else:  # no /proc: the resolved path must still be the opened file (same device and inode)
            real = Path(file).resolve()
            again = os.stat(real)
            if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino):
                raise ValueError(f"{what}: {file} changed while it was opened")
            named = str(real)
        if not real.is_relative_to(base):
            raise ValueError(f"{what}: {file} is a link to {real}, outside the checkpoint folder {base}")
        os.set_blocking(fd, True)
        yield named
    finally:
        os.close(fd)


def read_bytes_inside(root, file, *, what: str) -> bytes:
    """The bytes of `file` opened by `opened_inside`."""
    with opened_inside(root, file, what=what) as p, open(p, "rb") as f:
        return f.read()


def check_finite(tensors: dict, what: str) -> None:
    """Refuse weights holding NaN or Inf: such a link turns every latent into NaN, silently."""
    for key, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ValueError(f"{what}: tensor {key!r} holds {bad} NaN/Inf value(s); the checkpoint is corrupt "
                             "(retrain, or restore an earlier checkpoint)")
