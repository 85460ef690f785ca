"""execd's FileInfo (path, type, size, times, owner and group names, mode) for ``/files/info``,
``/directories/list`` and ``/files/search``: one ``find -printf`` in the sandbox, as its user, whose
NUL-separated records are parsed on the host strictly and bounded. Everything in them is the
sandbox's word: a record that is not exactly what ``find`` prints, or a path outside the directory
asked about, is dropped; names that are not UTF-8 are skipped (they could not be named back).
"""

from __future__ import annotations

import datetime
import errno
import posixpath
import re
from typing import Any

from ...errors import ConfigError, FileOperationError
from ...files import LIST_MAX_ENTRIES, MAX_LIST_DEPTH
from ...output_limits import MAX_NAME_BYTES
from ...validation import check_remote_path
from .execd_runtime import ExecdSandbox, file_error

__all__ = [
    "MAX_SEARCH_RESULTS",
    "check_pattern",
    "file_infos",
    "list_directory",
    "normal_path",
    "search_files",
]

MAX_SEARCH_RESULTS = LIST_MAX_ENTRIES
MAX_PATH_BYTES = 4096
MAX_PATTERN = 255
_FIELDS = 10
_FORMAT = r"%y\0%s\0%T@\0%C@\0%U\0%G\0%u\0%g\0%m\0%p\0"
_RECORD_MAX = MAX_PATH_BYTES + 256  # one record's bytes, its path included
_OUTPUT_MAX = 32 << 20  # what one listing or search may send back
_TYPES = {b"f": "file", b"d": "directory", b"l": "symlink"}
_SIZE = re.compile(rb"[0-9]{1,19}")
_TIME = re.compile(rb"[0-9]{1,12}(?:\.[0-9]{1,10})?")
_ID = re.compile(rb"[0-9]{1,10}")
_NAME = re.compile(rb"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_MODE = re.compile(rb"[0-7]{1,4}")
_LATEST = 253402300799.0  # 9999-12-31T23:59:59Z

# exit statuses of the checks before a listing or a search
_NOT_FOUND, _NOT_DIR, _SYMLINK, _DENIED = 71, 72, 73, 74
_PRECHECK = (
    'p=$1; [ -L "$p" ] && [ "$2" = list ] && exit 73; [ -e "$p" ] || exit 71; [ -d "$p" ] || exit 72; '
    '[ -r "$p" ] && [ -x "$p" ] || exit 74; '
)
_LIST = (
    _PRECHECK + f'find -P "$p" -mindepth 1 -maxdepth "$3" -printf \'{_FORMAT}\' 2>/dev/null | head -z -n "$4"'
)
_SEARCH = _PRECHECK + (
    f'find -H "$p" -mindepth 1 ! -type d -name "$3" -printf \'{_FORMAT}\' 2>/dev/null | head -z -n "$4"'
)


def normal_path(path: str, name: str = "path") -> str:
    """An absolute path, ``.`` and ``..`` resolved as text and repeated ``/`` folded."""
    check_remote_path(path, name)
    return "/" + posixpath.normpath(path).lstrip("/")


def _iso(raw: bytes) -> str:
    seconds = min(float(raw), _LATEST) if _TIME.fullmatch(raw) else 0.0
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _who(name: bytes, number: bytes) -> str:
    if _NAME.fullmatch(name):
        return name.decode("ascii")
    return number.decode("ascii") if _ID.fullmatch(number) else "unknown"


def _record(fields: list[bytes]) -> dict[str, Any] | None:
    """One FileInfo from ``find``'s ten fields, or None if they are not what it prints."""
    kind, size, mtime, ctime, uid, gid, user, group, mode, path = fields
    if not _SIZE.fullmatch(size) or not _MODE.fullmatch(mode) or len(path) > MAX_PATH_BYTES:
        return None
    try:
        text = path.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return {
        "path": text,
        "type": _TYPES.get(kind, "other"),
        "size": int(size),
        "modified_at": _iso(mtime),
        "created_at": _iso(ctime),
        "owner": _who(user, uid),
        "group": _who(group, gid),
        "mode": int(mode.decode("ascii")),  # octal digits read as a decimal number: execd's 644
    }


def _records(raw: bytes) -> list[dict[str, Any]]:
    parts = raw.split(b"\0")
    parts.pop()  # what follows the last NUL: nothing, or a cut record
    out = []
    for start in range(0, len(parts) - len(parts) % _FIELDS, _FIELDS):
        fields = parts[start : start + _FIELDS]
        if sum(len(f) for f in fields) <= _RECORD_MAX:
            found = _record(fields)
            if found is not None:
                out.append(found)
    return out


def _below(root: str, path: str, depth: int) -> bool:
    """Is ``path`` (as the sandbox printed it) a proper descendant of ``root``, at most ``depth``
    levels down, every component a plain name?"""
    prefix = root.rstrip("/") + "/"
    if not path.startswith(prefix):
        return False
    parts = path[len(prefix) :].split("/")
    return len(parts) <= depth and all(
        p not in ("", ".", "..") and len(p.encode("utf-8")) <= MAX_NAME_BYTES for p in parts
    )


def _checked(sb: ExecdSandbox, script: str, args: list[str], what: str, path: str, limit: int) -> bytes:
    result = sb.exec(["bash", "-c", script, "bash", *args], timeout=120, max_output=_OUTPUT_MAX)
    if result.stdout_dropped:
        raise FileOperationError(errno.E2BIG, f"{what}: the listing is larger than {_OUTPUT_MAX} bytes", path)
    code = result.exit_code
    if code == _NOT_FOUND:
        raise FileOperationError(errno.ENOENT, f"{what}: no such directory in the sandbox", path)
    if code == _NOT_DIR:
        raise FileOperationError(errno.ENOTDIR, f"{what}: not a directory", path)
    if code == _SYMLINK:
        raise ConfigError(f"{what}: {path!r} is a symbolic link: name the directory it points to")
    if code == _DENIED:
        raise FileOperationError(errno.EACCES, f"{what}: permission denied in the sandbox", path)
    if code != 0:
        raise file_error(what, path, result)
    return result.stdout


def _bounded(found: list[dict[str, Any]], limit: int, what: str, path: str) -> list[dict[str, Any]]:
    if len(found) > limit:
        raise FileOperationError(errno.E2BIG, f"{what}: more than {limit} entries: narrow it down", path)
    return found


def _order(entry: dict[str, Any]) -> tuple[str, ...]:
    return tuple(str(entry["path"]).split("/"))


def list_directory(sb: ExecdSandbox, path: str, depth: int) -> list[dict[str, Any]]:
    """The entries below directory ``path`` (not itself), ``depth`` levels deep, symlinks reported
    and not followed, each directory's entries in name order followed by their own."""
    root = normal_path(path)
    if not 0 <= depth <= MAX_LIST_DEPTH:
        raise ConfigError(f"depth={depth} must be from 0 to {MAX_LIST_DEPTH}")
    if depth == 0:
        return []
    limit = LIST_MAX_ENTRIES
    raw = _checked(sb, _LIST, [root, "list", str(depth), str((limit + 1) * _FIELDS)], "list", root, limit)
    found = [e for e in _records(raw) if _below(root, e["path"], depth)]
    return sorted(_bounded(found, limit, "list", root), key=_order)


def check_pattern(pattern: str | None) -> str:
    """A glob matched against file names (``*``, ``?``, ``[...]``; ``**`` is ``*``); leading ``**/``
    (any directories) is allowed, any other ``/`` is not: the search matches names, not paths."""
    if pattern is None or pattern == "":
        return "*"
    while pattern.startswith("**/"):
        pattern = pattern[3:]
    if not pattern or "/" in pattern or "\x00" in pattern or len(pattern.encode("utf-8")) > MAX_PATTERN:
        raise ConfigError(
            f"pattern {pattern!r:.80} must match file names (e.g. '*.py' or '**/*.py'), without other '/'"
        )
    return pattern


def search_files(sb: ExecdSandbox, path: str, pattern: str | None) -> list[dict[str, Any]]:
    """Files (anything but directories) anywhere below ``path`` whose name matches ``pattern``."""
    root = normal_path(path)
    glob = check_pattern(pattern)
    limit = MAX_SEARCH_RESULTS
    raw = _checked(sb, _SEARCH, [root, "search", glob, str((limit + 1) * _FIELDS)], "search", root, limit)
    found = [e for e in _records(raw) if _below(root, e["path"], MAX_PATH_BYTES)]
    return sorted(_bounded(found, limit, "search", root), key=_order)


def file_infos(sb: ExecdSandbox, paths: list[str]) -> dict[str, dict[str, Any]]:
    """The FileInfo of each path (symlinks not followed), keyed by the path as asked; the first
    missing one is FileOperationError(ENOENT)."""
    wanted = {normal_path(p): p for p in paths}
    result = sb.exec(
        ["find", "-P", *wanted, "-maxdepth", "0", "-printf", _FORMAT],
        timeout=60,
        max_output=(len(wanted) + 1) * _RECORD_MAX,
    )
    if result.stdout_dropped:
        raise FileOperationError(errno.E2BIG, "info: the sandbox sent more than it was asked", paths[0])
    found: dict[str, dict[str, Any]] = {}
    for entry in _records(result.stdout):
        asked = wanted.get(entry["path"])
        if asked is not None:
            found[asked] = entry
    for asked in paths:
        if asked not in found:
            if result.exit_code == 0:
                raise FileOperationError(errno.EIO, "info: the sandbox did not report it", asked)
            error = file_error("info", asked, result)
            if error.errno != errno.ENOENT:
                raise error
            raise FileOperationError(errno.ENOENT, "info: no such file in the sandbox", asked)
    return found
