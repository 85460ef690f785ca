"""How the HTTP API answers an error: the JSON body ``{"error": {"code", "message", ...}}``, the
status for each runtime error (the table in docs/http-api.md), and the wording of a bad request.
"""

from __future__ import annotations

import base64
import builtins
import errno
import json
from collections.abc import Mapping
from typing import Any

from ..error_names import error_name
from ..errors import CommandTimeout, FileOperationError, SandboxError

__all__ = ["ENCODINGS", "HttpError", "encode_output", "error_for", "json_type"]

ENCODINGS = ("utf-8", "base64")  # how command output is given back: text, or the exact bytes


class HttpError(Exception):
    """An error answered with ``status`` and the JSON body ``{"error": {"code", "message", ...}}``.
    ``close``: the connection is closed after it (its request was not, or not fully, read)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})
        self.close = close

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.extra}}

    def encoded(self) -> bytes:
        return json.dumps(self.body(), ensure_ascii=False).encode("utf-8") + b"\n"

    def head(self, length: int | None = None) -> list[tuple[bytes, bytes]]:
        """The ASGI response headers of this answer (its body: :meth:`encoded`, or ``length`` bytes
        of another rendering)."""
        headers = {
            "content-type": "application/json",
            "content-length": str(len(self.encoded()) if length is None else length),
            **{k.lower(): v for k, v in self.headers.items()},
        }
        if self.close:
            headers["connection"] = "close"
        return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


_FILE_ERRNO: dict[int, tuple[int, str]] = {
    errno.ENOENT: (404, "file_not_found"),
    errno.EACCES: (403, "file_permission_denied"),
    errno.EPERM: (403, "file_permission_denied"),
    errno.EROFS: (403, "file_permission_denied"),  # a read-only mount (a read_only volume, /sys)
    errno.EISDIR: (409, "file_conflict"),
    errno.ENOTDIR: (409, "file_conflict"),
    errno.EEXIST: (409, "file_conflict"),
    errno.ENOSPC: (507, "insufficient_storage"),
    errno.EDQUOT: (507, "insufficient_storage"),
    errno.EFBIG: (413, "file_too_large"),
    errno.EINVAL: (409, "file_conflict"),  # not a regular file (a device, FIFO or socket)
    errno.ENOTEMPTY: (409, "file_conflict"),  # a directory removed without recursive
    errno.EXDEV: (409, "file_conflict"),  # a rename from one mount to another
    errno.EBUSY: (409, "file_conflict"),  # a mount point (or /) moved, replaced or removed
    errno.EILSEQ: (409, "file_conflict"),  # a name in the sandbox that is not UTF-8
    errno.E2BIG: (413, "too_many_entries"),  # a listing past its bound
    errno.ENAMETOOLONG: (400, "file_name_too_long"),  # a name over 255 bytes: the request's fault
    errno.ETIMEDOUT: (504, "file_timeout"),  # the sandbox did not answer (a FIFO planted at the path)
}


def encode_output(data: bytes, encoding: str) -> str:
    """Command output as the request asked: UTF-8 text (bad bytes become U+FFFD) or base64."""
    return base64.b64encode(data).decode("ascii") if encoding == "base64" else data.decode("utf-8", "replace")


def error_for(exc: SandboxError, encoding: str = "utf-8") -> HttpError:
    """The HTTP answer for a runtime error: its status and code as :mod:`sandbox_rt.error_names`
    declares them (the table in docs/http-api.md), a file error's by its errno, and what a command
    printed until its timeout."""
    name = error_name(exc)
    status, code = name.status, name.http_code
    extra: dict[str, Any] = {"type": type(exc).__name__}
    if isinstance(exc, CommandTimeout):
        extra.update(
            timeout_s=exc.timeout,
            encoding=encoding,
            stdout=encode_output(exc.stdout, encoding),
            stderr=encode_output(exc.stderr, encoding),
        )
    elif isinstance(exc, FileOperationError):
        status, code = _FILE_ERRNO.get(exc.errno or 0, (status, code))
        if exc.filename is not None:
            extra["path"] = exc.filename
    return HttpError(status, code, str(exc), extra=extra)


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, builtins.list):
        return "array"
    return "object"
