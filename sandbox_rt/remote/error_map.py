"""The HTTP API's error answers mapped back onto :mod:`sandbox_rt.errors`: the one place of the
remote clients that knows the API's error codes (docs/http-api.md)."""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from ..error_names import same_code
from ..errors import (
    BackendError,
    CommandTimeout,
    ConfigError,
    FileOperationError,
    PermissionDenied,
    ProcessNotFound,
    SandboxError,
    SandboxNotFound,
    SnapshotNotFound,
    VolumeNotFound,
)
from ..output_limits import DEFAULT_MAX_OUTPUT
from .answers import MAX_MESSAGE, STEP, read_b64

__all__ = ["ErrorContext", "answer_error", "error_from_answer"]

_ERRNO_PREFIX = re.compile(r"\[Errno (\d{1,4})\]")


@dataclasses.dataclass(frozen=True)
class ErrorContext:
    """What the failed request was about: the exception types need it (an id, a name, a command)."""

    sandbox_id: str | None = None
    snapshot: str | None = None
    path: str | None = None
    command: str | None = None
    max_output: int = DEFAULT_MAX_OUTPUT
    pid: int | None = None  # a background command's (its routes answer ProcessNotFound)
    volume: str | None = None  # a named volume's (its routes answer VolumeNotFound)


# HTTP status -> the code the API documents (docs/http-api.md), for an answer without a usable body
_STATUS_CODES = {
    400: "invalid_argument",
    401: "unauthorized",
    404: "not_found",
    409: "conflict",
    413: "payload_too_large",
    502: "backend_error",
    503: "sandbox_not_ready",
    504: "command_timeout",
}
# file error codes -> the errno they stand for when the message carries none
_FILE_CODES = {
    "file_not_found": errno.ENOENT,
    "file_permission_denied": errno.EACCES,
    "file_conflict": errno.EINVAL,
    "insufficient_storage": errno.ENOSPC,
    "file_too_large": errno.EFBIG,
    "file_error": errno.EIO,
    "too_many_entries": errno.E2BIG,
    "file_name_too_long": errno.ENAMETOOLONG,
    "file_timeout": errno.ETIMEDOUT,
}


def _from_message(cls: type[SandboxError]) -> bool:
    """Whether ``cls(message)`` makes one: no class of the tree on its way takes more (BackendError
    takes the message first)."""
    tree = (k for k in cls.__mro__ if issubclass(k, SandboxError) and k is not BackendError)
    return all("__init__" not in vars(k) for k in tree)


def answer_error(status: int, body: bytes, ctx: ErrorContext) -> SandboxError:
    """The exception for an error answer (any status but the one the call expects)."""
    code: str = _STATUS_CODES.get(status, "http_error")
    message = f"HTTP {status} from the server"
    detail: dict[str, Any] = {}
    try:
        data = json.loads(body) if body else None
    except (ValueError, RecursionError):
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        detail = data["error"]
        if isinstance(detail.get("code"), str) and len(detail["code"]) <= 64:
            code = detail["code"]
        if isinstance(detail.get("message"), str):
            message = detail["message"][:MAX_MESSAGE]
    return error_from_answer(status, code, message, detail, ctx)


def error_from_answer(
    status: int, code: str, message: str, detail: Mapping[str, Any], ctx: ErrorContext
) -> SandboxError:
    """The API's error ``code`` (and the runtime ``type`` it names) as the runtime's own exception.

    The one place that maps the API's error bodies back onto :mod:`sandbox_rt.errors`; the
    server's ``type`` refines a code only into one of that code's own subclasses.
    """
    kind = str(detail["type"]) if isinstance(detail.get("type"), str) else ""
    if code in ("payload_too_large", "uri_too_long"):  # the gate's, before a route ran
        return ConfigError(message)
    if code == "not_found":
        if kind == "SnapshotNotFound" and ctx.snapshot is not None:
            return SnapshotNotFound(ctx.snapshot)
        if kind == "ProcessNotFound" and ctx.pid is not None:
            return ProcessNotFound(ctx.pid)
        if kind == "VolumeNotFound":  # the server's message names the volume or directory
            return VolumeNotFound(ctx.volume or "", message)
        if ctx.sandbox_id is not None and kind in ("", "SandboxNotFound"):
            return SandboxNotFound(ctx.sandbox_id)
        return SandboxError(message)
    if code in _FILE_CODES:
        path = detail.get("path") if isinstance(detail.get("path"), str) else ctx.path
        number, text = _FILE_CODES[code], message
        m = _ERRNO_PREFIX.match(message)  # the server's message is str(OSError): "[Errno 2] why: 'path'"
        if m:
            number, text = int(m.group(1)), message[m.end() :].lstrip()
            if path is not None:
                text = text.removesuffix(f": {path!r}")
        return FileOperationError(number, text, path)
    if code == "command_timeout":
        timeout = detail.get("timeout_s")
        out, err = b"", b""
        if detail.get("encoding") == "base64":
            try:
                out = read_b64(detail.get("stdout", ""), "error.stdout", ctx.max_output)
                err = read_b64(detail.get("stderr", ""), "error.stderr", ctx.max_output)
            except BackendError:
                out, err = b"", b""
        seconds = float(timeout) if isinstance(timeout, int | float) and math.isfinite(timeout) else 0.0
        return CommandTimeout(ctx.command or "", seconds, out, err)
    if code in ("unauthorized", "backend_permission_denied"):
        why = "the server refused the API token" if code == "unauthorized" else message
        return PermissionDenied(why, step=STEP)
    # the others are made from their message: the class error_names gives the code and type (a type
    # that needs more than a message to be made, e.g. ExecError, reads as its code's plainest class)
    cls = same_code(code, kind)
    if cls is not None and not _from_message(cls):
        cls = same_code(code, "")
    if cls is not None:
        return cls(message)
    return BackendError(f"{message} (HTTP {status}, {code})", step=STEP)
