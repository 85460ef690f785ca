"""Host-side directory trees of the LXC backend: copy an overlay delta, measure it, sweep leftovers.

The trees are written by sandboxes (untrusted): nothing here follows a symlink found in them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

from ...errors import BackendError
from ..owner import process_start_time

__all__ = ["copy_tree", "rewrite_file_beneath", "sweep_stale", "tree_bytes"]

# What one usage() walk may cost at most: beyond either bound the size is unknown (None).
MAX_ENTRIES = 500_000
BUDGET_S = 2.0


def tree_bytes(root: Path, *, max_entries: int = MAX_ENTRIES, budget_s: float = BUDGET_S) -> int | None:
    """Bytes a directory tree occupies on disk (``st_blocks * 512``, so sparse files count what
    they allocate), symlinks not followed, hard-linked files counted once.

    None if ``root`` is missing or the walk would visit more than ``max_entries`` entries or take
    longer than ``budget_s`` seconds (a bounded cost for ``status()``).
    """
    try:
        total = os.lstat(root).st_blocks * 512
    except OSError:
        return None
    seen: set[tuple[int, int]] = set()
    stack = [str(root)]
    count = 0
    deadline = time.monotonic() + budget_s
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    count += 1
                    if count > max_entries or (count % 1024 == 0 and time.monotonic() > deadline):
                        return None
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # removed while we walk
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
                    elif st.st_nlink > 1:
                        key = (st.st_dev, st.st_ino)
                        if key in seen:
                            continue
                        seen.add(key)
                    total += st.st_blocks * 512
        except OSError:
            continue  # a directory removed or unreadable while we walk
    return total


def copy_tree(src: Path, dst: Path, *, step: str, timeout: float = 3600) -> None:
    """``cp -a`` ``src`` onto ``dst`` (created, or merged into when it exists): owners, modes,
    times, xattrs (overlayfs's opaque/redirect ``trusted.overlay.*``), hard links, whiteouts (0:0
    character devices) and symlinks as symlinks. Reflinks where the filesystem has them.
    """
    cmd = ["cp", "-a", "--reflink=auto", "--no-target-directory", "--", str(src), str(dst)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise BackendError(f"copying {src} took longer than {timeout:g} s", step=step) from exc
    if proc.returncode != 0:
        raise BackendError(f"cannot copy {src} to {dst}", step=step, detail=proc.stderr + proc.stdout)


def sweep_stale(directory: Path, prefix: str) -> None:
    """Remove ``<prefix><pid>-<anything>`` entries of ``directory`` whose process is gone
    (the scratch copies of a snapshot or a delete that a crash interrupted)."""
    with contextlib.suppress(OSError):
        for entry in directory.iterdir():
            if not entry.name.startswith(prefix):
                continue
            pid = entry.name[len(prefix) :].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and process_start_time(int(pid)) is None:
                shutil.rmtree(entry, ignore_errors=True)


def rewrite_file_beneath(root: str | os.PathLike[str], rel: str, data: bytes) -> None:
    """Replace the content of the regular file ``root/rel`` with ``data``.

    ``root`` is followed (e.g. ``/proc/<pid>/root``, a container's ``/``); below it, nothing is:
    each component of ``rel`` is opened with ``O_NOFOLLOW`` relative to its parent, so a symlink
    the sandbox planted there raises OSError (ELOOP/ENOTDIR) instead of being followed (through
    ``/proc/<pid>/root`` an absolute symlink would resolve against the host's ``/``). The file is
    opened without blocking (a FIFO does not hang the host) and must be a regular file (else
    OSError EINVAL). The host cannot create files in a running unprivileged container's root (its
    uid is not mapped there: EOVERFLOW), so the file must exist; owner and mode stay as they are.
    """
    *dirs, name = rel.strip("/").split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in dirs:
            sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = sub
        out = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        try:
            if not stat.S_ISREG(os.fstat(out).st_mode):
                raise OSError(errno.EINVAL, "not a regular file", rel)
            os.ftruncate(out, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(out, view) :]
        finally:
            os.close(out)
    finally:
        os.close(fd)
