"""Errors as the OpenSandbox specifications write them: ``{"code", "message"}``, codes in capitals."""

from __future__ import annotations

import json

from ..errors import HttpError

__all__ = ["dialect_code", "render"]

_CODES = {
    "invalid_argument": "INVALID_REQUEST",
    "unauthorized": "UNAUTHORIZED",
    "not_found": "NOT_FOUND",
    "route_not_found": "NOT_FOUND",
    "file_not_found": "NOT_FOUND",
    "internal_error": "INTERNAL_ERROR",
}


def dialect_code(code: str) -> str:
    """The dialect's code for one of ours (``invalid_argument`` -> ``INVALID_REQUEST``)."""
    return _CODES.get(code, code.upper())


def render(err: HttpError) -> bytes:
    """The ErrorResponse body of an error (OpenSandbox: no other fields)."""
    body = {"code": dialect_code(err.code), "message": err.message}
    return json.dumps(body, ensure_ascii=False).encode("utf-8") + b"\n"
