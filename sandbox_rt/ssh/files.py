"""Reading files out of a sandbox: the read script run in it, and the host's side of the exchange.

The bytes come from ``cat`` on a channel of their own, not SFTP: paramiko's SFTP read (request
bookkeeping per 32 KiB block in Python) reaches about a third of OpenSSH sftp's speed, a plain
channel about all of it.

The script opens the file once and decides on what it opened (``[ -f /dev/fd/3 ]`` and ``stat`` of
the open descriptor): a symlink swapped in after a check cannot make it read ``/dev/zero`` or a
FIFO. It first prints the file's apparent size on a line of its own (a sparse file counts in full),
then the bytes. The host trusts none of it: the size line is parsed strictly, a file larger than
``max_bytes`` is refused at once (EFBIG), and whatever the size said, the host takes at most
``max_bytes`` bytes (files in /proc say 0 and have more; a growing file may have more than it said):
a server that lies about either costs the host at most ``max_bytes``.

Why an SFTP request failed (:func:`explain`): OpenSSH's sftp-server answers most errors with the
generic FAILURE and EINVAL or ENAMETOOLONG with BAD_MESSAGE ("Bad message"); ENOTDIR becomes "no such
file". When it does, the host looks at the entries involved (``lstat``, at most a first READDIR
reply, ``realpath``; only after a failure, never on the way to a success) and names the cause:
EISDIR, ENOTDIR, ENOTEMPTY, EEXIST, EINVAL, ENAMETOOLONG (that one from the path alone); then, for
a FAILURE, the mounts the server sees (:mod:`.mounts`): EBUSY, EXDEV, EROFS; EIO when nothing
explains it. What the sandbox answers to those looks only picks among these errnos (the
messages are ours, the paths the caller's): a lying server can make the cause wrong, never the error
untyped or unbounded.
"""

from __future__ import annotations

import errno
import posixpath
import shlex
import stat
from collections.abc import Callable
from typing import IO, Literal, Protocol

import paramiko

from ..errors import FileOperationError
from ..output_limits import FILE_IDLE_TIMEOUT_S, MAX_NAME_BYTES
from .mounts import Mount, mount_of, mount_points

__all__ = [
    "Looks",
    "check_entry_name",
    "explain",
    "is_directory",
    "name_too_long",
    "read_script",
    "receive_file",
]

_CHUNK = 1 << 20
_SAID_MAX = 16 << 10  # bytes of the read script's stderr looked at
_SIZE_LINE_MAX = 24  # "18446744073709551615\n" and change

# Exit codes of the read script, and cat's (or the shell's) own errors, and what they mean.
_READ_EISDIR, _READ_EINVAL = 67, 68
_READ_ERRORS = {
    _READ_EISDIR: (errno.EISDIR, "is a directory"),
    _READ_EINVAL: (errno.EINVAL, "not a regular file"),
}
_SAID_ERRORS = {
    "No such file or directory": (errno.ENOENT, "no such file in the sandbox"),
    "Permission denied": (errno.EACCES, "permission denied in the sandbox"),
    "Not a directory": (errno.ENOTDIR, "a parent is not a directory"),
    "Is a directory": (errno.EISDIR, "is a directory"),
    "File name too long": (errno.ENAMETOOLONG, "a name is too long"),
}


def read_script(path: str) -> str:
    """The shell text that sends ``path``'s size line, then its bytes (``path`` is quoted);
    FileOperationError(ENAMETOOLONG) for a path Linux refuses (bash would print it all back)."""
    if name_too_long(path):
        raise FileOperationError(errno.ENAMETOOLONG, "read: a name is too long", path)
    return (
        f'f={shlex.quote(path)}; if [ -d "$f" ]; then exit {_READ_EISDIR}; fi; '
        # a FIFO or socket would block the open: refuse by name first, then check what was opened
        f'if [ -p "$f" ] || [ -S "$f" ]; then exit {_READ_EINVAL}; fi; '
        'exec 3<"$f" || exit 66; '
        f"[ -f /dev/fd/3 ] || exit {_READ_EINVAL}; "
        "n=$(LC_ALL=C stat -L -c %s /dev/fd/3) || exit 69; "
        'printf "%s\\n" "$n"; LC_ALL=C exec cat <&3 3<&-'
    )


def receive_file(chan: paramiko.Channel, path: str, dst: IO[bytes], max_bytes: int) -> int:
    """Take the read script's answer from ``chan`` into ``dst``; the number of bytes written.

    Raises FileOperationError (EFBIG past ``max_bytes``, ETIMEDOUT when the sandbox goes quiet for
    ``FILE_IDLE_TIMEOUT_S``, the script's and cat's own errors otherwise). Leaves ``chan`` open.
    """
    chan.settimeout(FILE_IDLE_TIMEOUT_S)
    try:
        head, rest = _size_line(chan)
        if head is None:
            _raise_exit(chan, path)
            raise FileOperationError(errno.EIO, "read: the sandbox sent no size", path)
        size = _parse_size(head, path)
        if size > max_bytes:
            raise FileOperationError(
                errno.EFBIG, f"read: the file has {size} bytes, more than max_bytes={max_bytes}", path
            )
        total = 0
        data = rest or chan.recv(_CHUNK)
        while data:
            total += len(data)
            if total > max_bytes:  # grew past the cap while read, or a lying size
                raise FileOperationError(
                    errno.EFBIG, f"read: the file has more than max_bytes={max_bytes} bytes", path
                )
            _write(dst, data, path)
            data = chan.recv(_CHUNK)
        _raise_exit(chan, path)  # a read that failed half-way says so in its exit status
        return total
    except TimeoutError as exc:
        raise FileOperationError(
            errno.ETIMEDOUT, f"read: the sandbox sent nothing for {FILE_IDLE_TIMEOUT_S:g} s", path
        ) from exc


def _size_line(chan: paramiko.Channel) -> tuple[bytes | None, bytes]:
    """(the size line without its newline or None if the channel ended first, bytes after it)."""
    buf = b""
    while b"\n" not in buf:
        if len(buf) > _SIZE_LINE_MAX:
            return buf, b""  # no newline where a size ends: _parse_size refuses it
        data = chan.recv(_SIZE_LINE_MAX)
        if not data:
            return None, b""
        buf += data
    head, _, rest = buf.partition(b"\n")
    return head, rest


def _parse_size(head: bytes, path: str) -> int:
    """The size line: decimal digits only; more than 20 of them is more than any file can hold."""
    if not head.isdigit() or not head.isascii():
        raise FileOperationError(errno.EIO, f"read: the sandbox sent a bad size {head[:24]!r}", path)
    if len(head) > 20:
        return 1 << 64
    return int(head)


def _write(dst: IO[bytes], data: bytes, path: str) -> None:
    try:
        dst.write(data)
    except OSError as exc:  # the local copy failed (disk full...), not the sandbox
        raise FileOperationError(
            exc.errno or errno.EIO, f"read: writing the copy failed: {exc.strerror or exc}", path
        ) from exc


def _raise_exit(chan: paramiko.Channel, path: str) -> None:
    """Raise the error the script's exit status and last stderr line stand for; return if it was 0."""
    if not chan.status_event.wait(FILE_IDLE_TIMEOUT_S):
        raise FileOperationError(errno.ETIMEDOUT, "read: the sandbox did not say how the read ended", path)
    code = chan.recv_exit_status()
    if code == 0:
        return
    if code == -1:
        raise FileOperationError(errno.EIO, "read: the read ended without an exit status", path)
    known = _READ_ERRORS.get(code)
    if known is not None:
        raise FileOperationError(known[0], f"read: {known[1]}", path)
    err = b""  # bash's "line 1: PATH: REASON": room for a path of PATH_MAX bytes, the reason last
    while chan.recv_stderr_ready() and len(err) < _SAID_MAX:
        err += chan.recv_stderr(4096)
    said = (err[:_SAID_MAX].decode("utf-8", "replace").strip().splitlines() or [f"exited with {code}"])[-1]
    for text, (number, meaning) in _SAID_ERRORS.items():  # the script runs with LC_ALL=C
        if said.endswith(text):
            raise FileOperationError(number, f"read: {meaning}", path)
    raise FileOperationError(errno.EIO, f"read: {said[:200]}", path)


def check_entry_name(name: object, directory: str) -> str:
    """A name a sandbox listed in ``directory``: one path component, or FileOperationError naming it.

    Not empty, ``.`` or ``..``; no ``/`` or NUL; at most ``MAX_NAME_BYTES`` bytes of UTF-8.
    """
    shown = repr(name)[:80]
    if not isinstance(name, str) or name in ("", ".", ".."):
        raise FileOperationError(errno.EINVAL, f"download: the sandbox listed a bad name {shown}", directory)
    if "/" in name or "\x00" in name:
        raise FileOperationError(
            errno.EINVAL, f"download: the sandbox listed a name with '/' or NUL: {shown}", directory
        )
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise FileOperationError(errno.EINVAL, f"download: undecodable name {shown}", directory) from exc
    if size > MAX_NAME_BYTES:
        raise FileOperationError(
            errno.ENAMETOOLONG, f"download: the sandbox listed a {size}-byte name {shown}", directory
        )
    return name


# -- why an SFTP request failed -------------------------------------------------------------------
_PATH_MAX = 4096  # bytes of a path Linux takes, with its NUL

Kind = Literal["dir", "other", "some"]
Op = Literal["write", "remove", "rmdir", "mkdir", "rename"]


class Looks(Protocol):
    """What :func:`explain` asks of the SFTP session (``wire.BoundedSFTPClient`` is one)."""

    def stat(self, path: str) -> paramiko.SFTPAttributes: ...

    def lstat(self, path: str) -> paramiko.SFTPAttributes: ...

    def normalize(self, path: str) -> str: ...

    def has_entries(self, path: str) -> bool: ...

    def mounts(self) -> list[Mount]: ...


def name_too_long(*paths: str) -> bool:
    """Whether a path is longer than Linux takes or has a name longer than ``MAX_NAME_BYTES``."""
    for path in paths:
        raw = path.encode("utf-8", "replace")
        if len(raw) >= _PATH_MAX or any(len(name) > MAX_NAME_BYTES for name in raw.split(b"/")):
            return True
    return False


def _kind(sftp: Looks, path: str, *, follow: bool = False) -> Kind | None:
    """What is at ``path`` as the sandbox says: "dir", "other" (not a directory) or "some" (there, of
    a type it did not say); None if nothing is there or it would not say."""
    try:
        attrs = sftp.stat(path) if follow else sftp.lstat(path)
    except (OSError, EOFError):
        return None
    mode = attrs.st_mode
    if not isinstance(mode, int) or not 0 <= mode < 1 << 32 or not stat.S_IFMT(mode):
        return "some"
    return "dir" if stat.S_ISDIR(mode) else "other"


def is_directory(sftp: Looks, path: str) -> bool:
    """Whether ``path`` is (or leads by symlinks to) a directory, as the sandbox says."""
    return _kind(sftp, path, follow=True) == "dir"


def _not_empty(sftp: Looks, path: str) -> bool:
    try:
        return sftp.has_entries(path)
    except (OSError, EOFError):
        return False


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _into_itself(sftp: Looks, src: str, dst: str) -> bool:
    """Whether the directory ``src`` is ``dst``'s parent or above it, by the names or where their
    symlinks lead (``src`` itself is not followed: a rename moves a link, not its target)."""
    if _under(dst, src):
        return True
    parent, real = _real(sftp, posixpath.dirname(dst)), _real_entry(sftp, src)
    return parent is not None and real is not None and _under(parent, real)


def _real(sftp: Looks, path: str) -> str | None:
    """Where ``path`` leads, its symlinks resolved (the sandbox's realpath); None if it will not say."""
    try:
        real = sftp.normalize(path)
    except (OSError, EOFError, UnicodeError):
        return None
    return real if isinstance(real, str) and real.startswith("/") else None  # bytes: not UTF-8


def _real_entry(sftp: Looks, path: str) -> str | None:
    """The entry ``path`` names, its parent's symlinks resolved (not its own: a link is an entry)."""
    parent = _real(sftp, posixpath.dirname(path))
    return None if parent is None else posixpath.join(parent, posixpath.basename(path))


def _write_failed(sftp: Looks, path: str, exc: OSError) -> tuple[int, str] | None:
    if exc.errno is None and _kind(sftp, path, follow=True) == "dir":  # open follows symlinks
        return errno.EISDIR, "is a directory"
    if exc.errno is None and path.endswith("/"):  # the kernel's answer to a creat of "name/"
        return errno.EISDIR, "a path ending in '/' names a directory"
    if exc.errno == errno.ENOENT and _kind(sftp, posixpath.dirname(path), follow=True) == "other":
        return errno.ENOTDIR, "a parent is not a directory"
    return None


def _remove_failed(sftp: Looks, path: str, exc: OSError) -> tuple[int, str] | None:
    if exc.errno is None and _kind(sftp, path) == "dir":
        return errno.EISDIR, "is a directory"
    return None


def _rmdir_failed(sftp: Looks, path: str, exc: OSError) -> tuple[int, str] | None:
    if exc.errno not in (None, errno.ENOENT):
        return None
    kind = _kind(sftp, path)
    if kind == "other":  # OpenSSH says "no such file" for ENOTDIR
        return errno.ENOTDIR, "not a directory"
    if exc.errno is None and kind == "dir" and _not_empty(sftp, path):
        return errno.ENOTEMPTY, "the directory is not empty"
    return None


def _mkdir_failed(sftp: Looks, path: str, exc: OSError) -> tuple[int, str] | None:
    if exc.errno is None:
        kind = _kind(sftp, path)  # a dangling symlink is in the way too
        if kind == "dir":
            return errno.EEXIST, "the directory already exists"
        if kind is not None:
            return errno.EEXIST, "a file is in the way"
    if exc.errno == errno.ENOENT and _kind(sftp, posixpath.dirname(path), follow=True) == "other":
        return errno.ENOTDIR, "a parent is not a directory"
    return None


def _rename_failed(sftp: Looks, src: str, dst: str, exc: OSError) -> tuple[int, str] | None:
    if exc.errno not in (None, errno.ENOENT):
        return None
    kind = _kind(sftp, src)
    if kind is None:  # src is missing (or the sandbox will not say): its own answer stands
        return None
    if exc.errno is None and kind == "dir" and _into_itself(sftp, src, dst):
        return errno.EINVAL, "cannot move a directory into itself"
    there = _kind(sftp, dst)
    if kind == "dir" and there == "other":  # OpenSSH says "no such file" for ENOTDIR
        return errno.ENOTDIR, "the destination is not a directory"
    if exc.errno is None and kind == "dir" and there == "dir" and _not_empty(sftp, dst):
        return errno.ENOTEMPTY, "the destination is a directory that is not empty"
    if exc.errno is None and kind != "dir" and there == "dir":
        return errno.EISDIR, "the destination is a directory"
    parent = posixpath.dirname(dst)
    if exc.errno == errno.ENOENT and there is None and _kind(sftp, parent, follow=True) == "other":
        return errno.ENOTDIR, "a parent of the destination is not a directory"
    return None


def explain(
    sftp: Looks, op: Op, exc: OSError, path: str, dst: str | None = None
) -> FileOperationError | None:
    """The error ``exc`` (an SFTP answer to ``op`` on ``path``, ``dst`` for a rename) stands for, found
    out by looking at the entries involved; None if its own errno stands (or nothing explains it).

    Only a status without errno (FAILURE, BAD_MESSAGE...) or "no such file" (which OpenSSH also says
    for ENOTDIR) is looked into; "permission denied" stands as it is.
    """
    paths = (path,) if dst is None else (path, dst)
    if exc.errno is None and name_too_long(*paths):
        found: tuple[int, str] | None = (errno.ENAMETOOLONG, "a name is too long")
    elif op == "rename":
        found = _rename_failed(sftp, path, dst or path, exc)
    else:
        found = _EXPLAIN[op](sftp, path, exc)
    if found is None and exc.errno is None:
        found = _refused_by_mounts(sftp, op, paths)
    if found is None:
        return None
    number, why = found
    return FileOperationError(number, f"{op}: {why}", path)  # like every rename error, named by src


def _refused_by_mounts(sftp: Looks, op: Op, paths: tuple[str, ...]) -> tuple[int, str] | None:
    """A FAILURE the entries do not explain, by the mounts involved: a mount point (or ``/``)
    removed, moved or replaced (EBUSY), a rename from one mount to another (EXDEV), a change on a
    read-only mount (EROFS)."""
    try:
        mounts = sftp.mounts()
    except (OSError, EOFError, UnicodeError, ValueError):
        return None
    entries = [_real_entry(sftp, p) or p for p in paths]
    points = mount_points(mounts) | {"/"}
    if op in ("remove", "rmdir", "rename"):
        for entry in entries:
            if entry in points:
                return errno.EBUSY, f"{entry} is a mount point"
    holders = [mount_of(mounts, entry) for entry in entries]
    if op == "rename" and holders[0] != holders[1]:
        return errno.EXDEV, "src and dst are on different mounts (copy, then remove)"
    for holder in holders:
        if holder is not None and holder.read_only:
            return errno.EROFS, f"the mount at {holder.point} is read-only"
    return None


_Why = Callable[[Looks, str, OSError], tuple[int, str] | None]
_EXPLAIN: dict[str, _Why] = {
    "write": _write_failed,
    "remove": _remove_failed,
    "rmdir": _rmdir_failed,
    "mkdir": _mkdir_failed,
}
