"""``sb.files``: the file system of a sandbox, as E2B users expect it (list, stat, exists, remove,
mkdir, rename, read, write, upload, download).

Every operation runs in the sandbox as its user (SFTP, or a command for a recursive remove), so a
symlink the sandbox planted can only lead to the sandbox's own files; only ``download`` writes on
the host, and it never follows a link (see :mod:`sandbox_rt.download`). What comes back (names,
types, sizes, times, link targets) is checked and bounded on the host: listed names are single path
components, a listing stops at ``max_entries``.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from .errors import ConfigError, FileOperationError
from .models import EntryInfo, EntryType, ExecResult
from .output_limits import DEFAULT_DOWNLOAD_MAX_BYTES, DEFAULT_READ_MAX_BYTES
from .ssh import SSHExecutor
from .ssh.files import check_entry_name
from .validation import check_remote_path

if TYPE_CHECKING:
    import paramiko

__all__ = ["LIST_MAX_ENTRIES", "Files", "HoldsFiles"]


class HoldsFiles(Protocol):
    """What ``sb.files`` needs of its sandbox for content and commands (``Sandbox`` is one)."""

    def exec(
        self, command: Sequence[str], *, timeout: float | None = ..., max_output: int = ...
    ) -> ExecResult: ...

    def read_file(self, path: str, *, max_bytes: int = ...) -> bytes: ...

    def read_text(self, path: str, encoding: str = ..., *, max_bytes: int = ...) -> str: ...

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = ...) -> None: ...

    def upload(self, local: str | os.PathLike[str], remote: str) -> int: ...

    def download(self, remote: str, local: str | os.PathLike[str], *, max_bytes: int = ...) -> int: ...


LIST_MAX_ENTRIES = 10_000  # entries one ``list`` returns at most (all levels together)
MAX_LIST_DEPTH = 64  # levels a listing may go down


def _entry_type(mode: int) -> EntryType:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _number(value: object, cap: int = 1 << 63) -> int:
    """A number the sandbox reported, as a non-negative int below ``cap`` (else 0)."""
    return value if isinstance(value, int) and 0 <= value < cap else 0


class Files:
    """The file operations of one sandbox (``sb.files``)."""

    def __init__(self, sandbox: HoldsFiles, executor: SSHExecutor, alive: Callable[[], None]) -> None:
        self._sb = sandbox
        self._ssh = executor
        self._alive = alive

    def _path(self, path: str, name: str = "path") -> str:
        self._alive()
        return posixpath.normpath(check_remote_path(path, name)).replace("//", "/")

    def _info(self, path: str, attrs: paramiko.SFTPAttributes, *, name: str | None = None) -> EntryInfo:
        mode = _number(attrs.st_mode, 1 << 32)
        kind = _entry_type(mode)
        target = self._ssh.readlink(path) if kind == "symlink" else None
        return EntryInfo(
            name=name if name is not None else (posixpath.basename(path) or "/"),
            path=path,
            type=kind,
            size=_number(attrs.st_size),
            mode=stat.S_IMODE(mode),
            mtime=float(_number(attrs.st_mtime)),
            symlink_target=target,
        )

    # -- queries ---------------------------------------------------------------------------------
    def list(self, path: str, depth: int = 1, *, max_entries: int = LIST_MAX_ENTRIES) -> list[EntryInfo]:
        """The entries of directory ``path`` (not following symlinks), ``depth`` levels deep
        (1: its own entries), sorted by path. FileOperationError(E2BIG) past ``max_entries``."""
        top = self._path(path)
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_LIST_DEPTH:
            raise ConfigError(f"depth={depth!r} must be a whole number from 1 to {MAX_LIST_DEPTH}")
        out: list[EntryInfo] = []
        level = [top]
        for _ in range(depth):
            below: list[str] = []
            for directory in level:
                for attrs in self._ssh.listdir(directory, max_entries - len(out)):
                    name = check_entry_name(attrs.filename, directory)
                    info = self._info(posixpath.join(directory, name), attrs, name=name)
                    out.append(info)
                    if info.type == "dir":
                        below.append(info.path)
            level = below
        return sorted(out, key=lambda e: e.path)

    def stat(self, path: str, *, follow_symlinks: bool = True) -> EntryInfo:
        """The entry at ``path``; FileOperationError(ENOENT) if there is none."""
        p = self._path(path)
        attrs = self._ssh.stat(p, follow_symlinks=follow_symlinks)
        if attrs is None:
            raise FileOperationError(errno.ENOENT, "stat: no such file in the sandbox", p)
        return self._info(p, attrs)

    def exists(self, path: str) -> bool:
        """Is there an entry at ``path`` (a dangling symlink counts)?"""
        p = self._path(path)
        return self._ssh.stat(p, follow_symlinks=False) is not None

    # -- changes ---------------------------------------------------------------------------------
    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, a symlink (not its target), or a directory (empty unless ``recursive``).
        Absent is fine. ``/`` is never removed."""
        p = self._path(path)
        if p == "/":
            raise FileOperationError(errno.EPERM, "remove: refusing to remove /", "/")
        attrs = self._ssh.stat(p, follow_symlinks=False)
        if attrs is None:
            return
        if not stat.S_ISDIR(attrs.st_mode or 0):
            self._ssh.remove(p)
        elif not recursive:
            self._ssh.rmdir(p)
        else:
            r = self._sb.exec(["rm", "-rf", "--one-file-system", "--", p], timeout=600, max_output=64 << 10)
            if r.exit_code != 0:
                why = r.stderr_text.strip().splitlines()[-1:] or [f"rm exited {r.exit_code}"]
                raise FileOperationError(errno.EACCES, f"remove: {why[0][:200]}", p)

    def mkdir(self, path: str, *, parents: bool = True, mode: int = 0o755) -> bool:
        """Make directory ``path`` (and its parents); False if it was already there."""
        p = self._path(path)
        attrs = self._ssh.stat(p)
        if attrs is not None:
            if stat.S_ISDIR(attrs.st_mode or 0):
                return False
            raise FileOperationError(errno.EEXIST, "mkdir: a file is in the way", p)
        if parents:
            self._ssh.makedirs(p)
        else:
            self._ssh.mkdir(p, mode)
        return True

    def rename(self, src: str, dst: str) -> EntryInfo:
        """Move ``src`` to ``dst`` (a file there is replaced); the entry at ``dst``."""
        s, d = self._path(src, "src"), self._path(dst, "dst")
        self._ssh.rename(s, d)
        return self.stat(d, follow_symlinks=False)

    # -- content (today's Sandbox methods, here as well) ------------------------------------------
    def read(self, path: str, *, max_bytes: int = DEFAULT_READ_MAX_BYTES) -> bytes:
        return self._sb.read_file(path, max_bytes=max_bytes)

    def read_text(
        self, path: str, encoding: str = "utf-8", *, max_bytes: int = DEFAULT_READ_MAX_BYTES
    ) -> str:
        return self._sb.read_text(path, encoding, max_bytes=max_bytes)

    def write(self, path: str, data: bytes | str, *, mode: int | None = None) -> EntryInfo:
        self._sb.write_file(path, data, mode=mode)
        return self.stat(path)

    def upload(self, local: str | os.PathLike[str], remote: str) -> int:
        return self._sb.upload(local, remote)

    def download(
        self, remote: str, local: str | os.PathLike[str], *, max_bytes: int = DEFAULT_DOWNLOAD_MAX_BYTES
    ) -> int:
        return self._sb.download(remote, local, max_bytes=max_bytes)
