"""Open a directory inside another without following any link: ``openat2(RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS)``.

Volumes hold what sandboxes wrote, so any component of a path inside one may be a link a sandbox
planted (``sub -> /etc``). The kernel resolves the whole path relative to a directory fd and fails
with ELOOP on a link and EXDEV on an escape, and the mount is made from the fd it returns: nothing
can swap a component between the check and the mount. An allowed host directory is opened the same
way from ``/`` (:func:`open_no_links`): it may lie inside another one that sandboxes write.
"""

from __future__ import annotations

import ctypes
import errno
import os

__all__ = ["mkdirs_beneath", "open_beneath", "open_dir", "open_no_links"]

_NR_OPENAT2 = 437  # the same on every architecture
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_O_PATH_DIR = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC

_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


def open_dir(path: str) -> int:
    """An ``O_PATH`` fd of the directory ``path`` (a path the operator chose: links allowed)."""
    return os.open(path, _O_PATH_DIR)


def open_no_links(path: str) -> int:
    """An ``O_PATH`` fd of the directory at the absolute ``path``, reached from ``/`` without
    following a link at any component; OSError ELOOP if one is a link."""
    root = os.open("/", _O_PATH_DIR)
    try:
        return open_beneath(root, path.lstrip("/"))
    finally:
        os.close(root)


def open_beneath(dir_fd: int, rel: str | None) -> int:
    """An ``O_PATH`` fd of directory ``rel`` beneath ``dir_fd`` (None or "": a copy of ``dir_fd``).

    OSError ELOOP if a component is a link, EXDEV if it leads out, ENOENT/ENOTDIR as usual."""
    how = _OpenHow(_O_PATH_DIR, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    path = os.fsencode(rel or ".")
    fd = int(_libc.syscall(_NR_OPENAT2, dir_fd, path, ctypes.byref(how), ctypes.sizeof(how)))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), rel or ".")
    return fd


def mkdirs_beneath(dir_fd: int, rel: str, *, owner: int | None, mode: int = 0o755) -> None:
    """Make each missing directory of ``rel`` beneath ``dir_fd`` (owned by ``owner``; None: by the
    owner of the directory it is made in), never through a link: each component is opened with
    ``O_NOFOLLOW`` relative to its parent."""
    fd = os.dup(dir_fd)
    try:
        for part in rel.split("/"):
            try:
                os.mkdir(part, mode, dir_fd=fd)
            except FileExistsError:
                pass
            else:
                st = os.fstat(fd)
                uid, gid = (st.st_uid, st.st_gid) if owner is None else (owner, owner)
                os.chown(part, uid, gid, dir_fd=fd, follow_symlinks=False)
            try:
                sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise OSError(errno.ELOOP, "a component is a link or not a directory", rel) from exc
                raise
            os.close(fd)
            fd = sub
    finally:
        os.close(fd)
