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
"""

from __future__ import annotations

import errno
import shlex
from typing import IO

import paramiko

from ..errors import FileOperationError
from ..limits import FILE_IDLE_TIMEOUT_S, MAX_NAME_BYTES

__all__ = ["check_entry_name", "read_script", "receive_file"]

_CHUNK = 1 << 20
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
}


def read_script(path: str) -> str:
    """The shell text that sends ``path``'s size line, then its bytes (``path`` is quoted)."""
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
    err = b""
    while chan.recv_stderr_ready() and len(err) < 4096:
        err += chan.recv_stderr(4096)
    said = (err[:4096].decode("utf-8", "replace").strip().splitlines() or [f"exited with {code}"])[-1]
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
