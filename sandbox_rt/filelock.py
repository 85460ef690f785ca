"""Host-wide locks: an ``flock`` on a file, shared by the threads and processes of one host."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["file_lock"]


@contextlib.contextmanager
def file_lock(path: Path, *, exclusive: bool = True) -> Iterator[None]:
    """Hold an ``flock`` on ``path`` (made 0600, with its directories, if missing), shared if not
    ``exclusive``. Closing the descriptor releases it, so a holder that dies holds nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)
