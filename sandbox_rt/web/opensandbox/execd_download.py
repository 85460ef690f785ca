"""execd's ``GET /files/download``: a regular file's bytes, whole (200) or one byte range (``Range:
bytes=a-b``, ``a-``, ``-n``: 206 with Content-Range; 416 when it cannot be satisfied), or, with
``offset``/``limit``, lines of it as text (``offset`` 1-based).

The file is sent in chunks of at most 4 MiB, each read by a command in the sandbox (``tail -c
+N | head -c 4M``, as its user), so the server holds one chunk at a time whatever the file's size;
the size comes from the sandbox's stat and a download is at most 8 GiB (413 beyond). A file that
shrinks while it is sent ends the answer early (the client sees a body shorter than its
Content-Length); one that grows is sent as long as it was.
"""

from __future__ import annotations

import errno
import posixpath
import re
import urllib.parse
from collections.abc import Iterator
from typing import Annotated

from fastapi import Query, Request, Response
from fastapi.responses import StreamingResponse

from ...errors import ConfigError, FileOperationError
from ...output_limits import DEFAULT_DOWNLOAD_MAX_BYTES
from ...validation import check_remote_path
from ..errors import HttpError
from ..params import Ctx, SandboxId
from .execd_runtime import ExecdSandbox, execd_router, file_error, sandbox_of

__all__ = ["CHUNK_BYTES", "LINES_MAX_BYTES", "byte_range", "router"]

CHUNK_BYTES = 4 << 20
LINES_MAX_BYTES = 16 << 20  # what a line-based read may return
_RANGE = re.compile(r"bytes=([0-9]{0,19})-([0-9]{0,19})")
_READ = 'tail -c +"$2" -- "$1" | head -c "$3"'
_LINES = 'tail -n +"$2" -- "$1" | if [ -n "$3" ]; then head -n "$3"; else cat; fi'
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")

router = execd_router()


def byte_range(header: str, size: int) -> tuple[int, int]:
    """(first, last) byte of one ``Range: bytes=...`` of a file of ``size`` bytes; 416 (HttpError)
    if it cannot be satisfied, ConfigError if it is not one byte range."""
    m = _RANGE.fullmatch(header.strip())
    if m is None:
        if header.strip().startswith("bytes=") and "," in header:
            raise _unsatisfiable(size, "one byte range at a time")
        raise ConfigError(f"Range {header[:80]!r} must be bytes=first-last, bytes=first- or bytes=-suffix")
    first, last = m.group(1), m.group(2)
    if not first and not last:
        raise ConfigError(f"Range {header[:80]!r} names no byte")
    if not first:  # the last n bytes
        n = int(last)
        if n == 0 or size == 0:
            raise _unsatisfiable(size, "an empty suffix")
        return max(0, size - n), size - 1
    start = int(first)
    end = size - 1 if not last else min(int(last), size - 1)
    if start >= size or (last and int(last) < start):
        raise _unsatisfiable(size, f"bytes {first}-{last}")
    return start, end


def _unsatisfiable(size: int, what: str) -> HttpError:
    return HttpError(
        416,
        "range_not_satisfiable",
        f"range not satisfiable: {what} of a file of {size} bytes",
        headers={"Content-Range": f"bytes */{size}"},
    )


def _chunks(sb: ExecdSandbox, path: str, start: int, length: int) -> Iterator[bytes]:
    pos, left = start, length
    while left > 0:
        n = min(CHUNK_BYTES, left)
        result = sb.exec(["bash", "-c", _READ, "bash", path, str(pos + 1), str(n)], timeout=120, max_output=n)
        data = result.stdout[:n]
        if not data and result.exit_code != 0:
            raise file_error("download", path, result)
        if data:
            yield data
        if len(data) < n:
            return  # the file shrank (or the sandbox stopped sending): the answer ends short
        pos, left = pos + n, left - n


def _disposition(path: str) -> str:
    name = posixpath.basename(path) or "download"
    ascii_name = _SAFE_NAME.sub("_", name)[:200] or "download"
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{urllib.parse.quote(name, safe='')}"


def _lines(sb: ExecdSandbox, path: str, offset: int | None, limit: int | None) -> Response:
    result = sb.exec(
        ["bash", "-c", _LINES, "bash", path, str(offset or 1), "" if limit is None else str(limit)],
        timeout=120,
        max_output=LINES_MAX_BYTES,
    )
    if result.exit_code != 0:
        raise file_error("download", path, result)
    if result.stdout_dropped:
        raise FileOperationError(errno.EFBIG, f"download: more than {LINES_MAX_BYTES} bytes of lines", path)
    return Response(result.stdout, media_type="text/plain; charset=utf-8")


@router.get("/files/download", summary="A file's bytes (Range: one byte range), or lines of it")
def download_file(
    ctx: Ctx,
    request: Request,
    id: SandboxId,
    path: Annotated[str, Query(description="Absolute path of a regular file (a symlink is followed).")],
    offset: Annotated[int | None, Query(ge=1, le=1 << 62, description="First line (1-based).")] = None,
    limit: Annotated[int | None, Query(ge=0, le=1 << 62, description="Lines at most.")] = None,
) -> Response:
    p = check_remote_path(path)
    range_header = request.headers.get("range")
    if range_header is not None and (offset is not None or limit is not None):
        raise ConfigError("give a Range header or offset/limit (lines), not both")
    sb = sandbox_of(ctx, id)
    entry = sb.files.stat(p)
    if entry.type == "dir":
        raise FileOperationError(errno.EISDIR, "download: a directory", p)
    if entry.type != "file":
        raise FileOperationError(errno.EINVAL, "download: not a regular file", p)
    if offset is not None or limit is not None:
        return _lines(sb, p, offset, limit)
    size = entry.size
    if size > DEFAULT_DOWNLOAD_MAX_BYTES:
        raise FileOperationError(errno.EFBIG, f"download: larger than {DEFAULT_DOWNLOAD_MAX_BYTES} bytes", p)
    headers = {"Accept-Ranges": "bytes", "Content-Disposition": _disposition(p)}
    status = 200
    start, end = 0, size - 1
    if range_header is not None:
        start, end = byte_range(range_header, size)
        status = 206
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    length = end - start + 1
    headers["Content-Length"] = str(length)
    chunks = _chunks(sb, p, start, length)
    first = next(chunks, b"")  # read before answering: a file that cannot be read is its error

    def body() -> Iterator[bytes]:
        if first:
            yield first
        yield from chunks

    return StreamingResponse(
        body(),
        status_code=status,
        media_type="application/octet-stream",
        headers=headers,
    )
