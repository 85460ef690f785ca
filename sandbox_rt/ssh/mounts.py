"""The mounts a sandbox's SFTP server sees (its ``/proc/self/mountinfo``), to name why a file
operation failed where OpenSSH's sftp-server only says FAILURE: a rename across two mounts (EXDEV),
a mount point moved or removed, or ``/`` itself (EBUSY), a write on a read-only mount (EROFS: a
``read_only`` volume, ``/sys``).

The table is read only after such a failure, never on the way to a success. It comes from the
sandbox, so it is bounded (:data:`MOUNTINFO_MAX` bytes, :data:`MOUNTS_MAX` lines) and parsed
strictly; a lying sandbox can make the cause it names wrong, never the error untyped.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["MOUNTINFO", "MOUNTINFO_MAX", "MOUNTS_MAX", "Mount", "mount_of", "mount_points", "parse_mountinfo"]

MOUNTINFO = "/proc/self/mountinfo"
MOUNTINFO_MAX = 1 << 20  # bytes of the table read at most
MOUNTS_MAX = 10_000  # lines of it parsed at most
_ESCAPE = re.compile(r"\\([0-7]{3})")  # the kernel writes space, tab, newline and \ as \ooo


@dataclass(frozen=True)
class Mount:
    """One mount: where it is (an absolute, normalised path) and whether it refuses writes."""

    point: str
    read_only: bool


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a ``mountinfo`` text in its order (a later one at the same point is on top);
    lines that do not parse are skipped."""
    mounts: list[Mount] = []
    for line in text.splitlines()[:MOUNTS_MAX]:
        head, sep, tail = line.partition(" - ")
        fields, super_fields = head.split(" "), tail.split(" ")
        if not sep or len(fields) < 6 or len(super_fields) < 3:
            continue
        point = _unescape(fields[4])
        if not point.startswith("/"):
            continue
        read_only = "ro" in fields[5].split(",") or "ro" in super_fields[2].split(",")
        mounts.append(Mount(posixpath.normpath(point).replace("//", "/"), read_only))
    return mounts


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def mount_of(mounts: Sequence[Mount], path: str) -> Mount | None:
    """The mount that holds ``path`` (absolute, normalised; its symlinks resolved by the caller):
    the deepest mount point at or above it, the last listed of those at one point."""
    best: Mount | None = None
    for m in mounts:
        if _under(path, m.point) and (best is None or len(m.point) >= len(best.point)):
            best = m
    return best


def mount_points(mounts: Iterable[Mount]) -> set[str]:
    return {m.point for m in mounts}
