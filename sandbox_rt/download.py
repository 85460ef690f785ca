"""Copy a file or a directory tree out of a sandbox onto the host, so that nothing the sandbox says
can place a byte outside the destination.

The sandbox picks the names, types and sizes it lists (it may run a lying SFTP server), so:

- every listed name is one path component (no ``/``, NUL, ``.``, ``..``; bounded length), checked
  before it is used (:func:`~sandbox_rt.ssh.files.check_entry_name`);
- the host walks the destination by directory file descriptors: each level is opened with
  ``O_NOFOLLOW | O_DIRECTORY`` relative to its parent, so a symlink (made by anyone, at any time)
  is never followed;
- each file is written under a random temporary name created with ``O_CREAT | O_EXCL |
  O_NOFOLLOW`` in its directory, then renamed over the final name (a rename replaces a symlink, it
  does not write through it);
- the tree is bounded: entries (``DOWNLOAD_MAX_ENTRIES``), depth (``DOWNLOAD_MAX_DEPTH``) and bytes
  (``max_bytes`` for the whole download, each file refused at once if it would pass it).

A bad name ends the download with a FileOperationError that names it; what was already copied stays
(inside the destination); the temporary file of the failing copy is removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import secrets
import stat
from collections.abc import Iterator, Sequence
from typing import IO, Protocol

from .errors import FileOperationError
from .output_limits import DOWNLOAD_MAX_DEPTH, DOWNLOAD_MAX_ENTRIES
from .ssh.files import check_entry_name

__all__ = ["FileSource", "download_file", "download_tree"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class _Entry(Protocol):
    filename: str
    st_mode: int | None


class FileSource(Protocol):
    """What a download reads from: the sandbox's listing and file bytes (the SSH executor)."""

    def listdir(self, path: str, max_entries: int) -> Sequence[_Entry]: ...

    def get_stream(self, path: str, dst: IO[bytes], max_bytes: int) -> int: ...


class _Budget:
    """What is left of a download's bounds."""

    def __init__(self, max_bytes: int, max_entries: int) -> None:
        self.bytes = max_bytes
        self.entries = max_entries


def download_file(source: FileSource, remote: str, local: str | os.PathLike[str], max_bytes: int) -> int:
    """Copy the regular file ``remote`` to the host path ``local`` (the caller's own path: its parent
    is created, and it is followed like any path the caller names); the bytes written."""
    target = os.path.abspath(os.fspath(local))
    parent, name = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    with _open_dir(parent, None) as dir_fd:
        return _copy_file(source, remote, dir_fd, name, executable=False, budget=_Budget(max_bytes, 1))


def download_tree(
    source: FileSource,
    remote: str,
    local: str | os.PathLike[str],
    max_bytes: int,
    *,
    max_entries: int = DOWNLOAD_MAX_ENTRIES,
    max_depth: int = DOWNLOAD_MAX_DEPTH,
) -> int:
    """Copy the directory ``remote`` (regular files and directories; other types are skipped) into
    the host directory ``local`` (created if missing, merged into if present); the bytes written."""
    top = os.path.abspath(os.fspath(local))
    os.makedirs(top, exist_ok=True)
    budget = _Budget(max_bytes, max_entries)
    with _open_dir(top, None) as top_fd:
        return _copy_dir(source, remote, top_fd, budget, max_depth)


def _copy_dir(source: FileSource, remote: str, dir_fd: int, budget: _Budget, depth_left: int) -> int:
    entries = source.listdir(remote, budget.entries)
    budget.entries -= len(entries)
    total = 0
    for entry in entries:
        name = check_entry_name(entry.filename, remote)
        child = posixpath.join(remote, name)
        mode = entry.st_mode or 0
        if stat.S_ISDIR(mode):
            if depth_left <= 0:
                raise FileOperationError(errno.ELOOP, "download: the tree is deeper than allowed", child)
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=dir_fd)  # mkdir never follows a symlink at `name`
            with _open_dir(name, dir_fd, shown=child) as sub_fd:
                total += _copy_dir(source, child, sub_fd, budget, depth_left - 1)
        elif stat.S_ISREG(mode):
            total += _copy_file(source, child, dir_fd, name, executable=bool(mode & 0o100), budget=budget)
    return total


def _copy_file(
    source: FileSource, remote: str, dir_fd: int, name: str, *, executable: bool, budget: _Budget
) -> int:
    tmp = f".sandbox_rt-{secrets.token_hex(8)}.part"
    try:
        fd = os.open(tmp, _NEW_FILE_FLAGS, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        raise _local_error(exc, remote) from exc
    done = False
    try:
        with os.fdopen(fd, "wb") as fh:
            n = source.get_stream(remote, fh, budget.bytes)
            os.fchmod(fh.fileno(), 0o755 if executable else 0o644)
        budget.bytes -= n
        try:
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as exc:  # e.g. a directory of that name is there
            raise _local_error(exc, remote) from exc
        done = True
        return n
    finally:
        if not done:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)


@contextlib.contextmanager
def _open_dir(name: str, dir_fd: int | None, *, shown: str | None = None) -> Iterator[int]:
    """A directory fd: ``name`` relative to ``dir_fd`` never through a symlink; the top (no
    ``dir_fd``) is the caller's own path and is followed as given."""
    flags = _DIR_FLAGS if dir_fd is not None else _DIR_FLAGS & ~os.O_NOFOLLOW
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise _local_error(exc, shown or name) from exc
    try:
        yield fd
    finally:
        os.close(fd)


def _local_error(exc: OSError, path: str) -> FileOperationError:
    code = exc.errno or errno.EIO
    if code in (errno.ELOOP, errno.ENOTDIR):
        why = "the local destination has a symlink or a file where a directory belongs"
    else:
        why = exc.strerror or str(exc)
    return FileOperationError(code, f"download: cannot write {path!r} on the host: {why}", path)
