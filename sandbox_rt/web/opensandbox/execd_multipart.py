"""A strict ``multipart/form-data`` reader for ``/files/upload`` (RFC 7578 / 2046) over a body the
gate has read already (bounded by HttpLimits): parts are sliced out of it, nothing is spooled to the
host's disk. Only what execd's upload sends is taken: a part's headers of at most 8 KiB, a
``Content-Disposition: form-data`` with a ``name``, at most :data:`MAX_PARTS` parts.
"""

from __future__ import annotations

import dataclasses
import re

from ...errors import ConfigError

__all__ = ["MAX_PARTS", "Part", "boundary_of", "parse_multipart"]

MAX_PARTS = 2000  # metadata + file pairs: 1000 files
MAX_PART_HEAD = 8 << 10
_BOUNDARY = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")
_PARAM = re.compile(r';\s*([A-Za-z0-9_*.-]+)\s*=\s*("(?:[^"\\\r\n]|\\.)*"|[^;\s"]*)\s*')
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


@dataclasses.dataclass(frozen=True)
class Part:
    name: str
    filename: str | None
    content_type: str | None
    data: bytes


def _params(text: str) -> tuple[str, dict[str, str]]:
    """``form-data; name="a"; filename="b"`` -> (``form-data``, {name, filename})."""
    head, sep, rest = text.partition(";")
    params: dict[str, str] = {}
    rest = sep + rest
    pos = 0
    while pos < len(rest):
        m = _PARAM.match(rest, pos)
        if m is None:
            raise ConfigError(f"multipart: a malformed header parameter in {text[:120]!r}")
        key, value = m.group(1).lower(), m.group(2)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        if key in params:
            raise ConfigError(f"multipart: parameter {key!r} given twice in {text[:120]!r}")
        params[key] = value
        pos = m.end()
    return head.strip().lower(), params


def boundary_of(content_type: str | None) -> bytes:
    """The boundary of a ``multipart/form-data`` Content-Type; ConfigError for anything else."""
    mime, params = _params(content_type or "")
    if mime != "multipart/form-data":
        raise ConfigError(
            f"the upload must be multipart/form-data, not {content_type or 'no Content-Type'!r:.80}"
        )
    boundary = params.get("boundary")
    if boundary is None or not _BOUNDARY.fullmatch(boundary):
        raise ConfigError("the multipart Content-Type needs a boundary of 1-70 allowed characters")
    return boundary.encode("ascii")


def _headers(raw: bytes) -> dict[str, str]:
    if len(raw) > MAX_PART_HEAD:
        raise ConfigError(f"multipart: a part's headers are longer than {MAX_PART_HEAD} bytes")
    headers: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").split("\r\n") if raw else []:
        name, sep, value = line.partition(":")
        if not sep or not _HEADER_NAME.fullmatch(name):
            raise ConfigError(f"multipart: a malformed part header {line[:80]!r}")
        key = name.lower()
        if key in headers:
            raise ConfigError(f"multipart: header {name!r} given twice in one part")
        headers[key] = value.strip()
    return headers


def _part(headers: dict[str, str], data: bytes) -> Part:
    disposition, params = _params(headers.get("content-disposition", ""))
    if disposition != "form-data" or "name" not in params:
        raise ConfigError('multipart: every part needs Content-Disposition: form-data; name="..."')
    return Part(params["name"], params.get("filename"), headers.get("content-type"), data)


def parse_multipart(body: bytes, boundary: bytes, *, max_parts: int = MAX_PARTS) -> list[Part]:
    """The parts of ``body``, in order; ConfigError naming what is malformed."""
    dash = b"--" + boundary
    delimiter = b"\r\n" + dash
    if body.startswith(dash):
        pos = len(dash)
    else:  # a preamble
        found = body.find(delimiter)
        if found < 0:
            raise ConfigError("multipart: the body does not contain its boundary")
        pos = found + len(delimiter)
    view = memoryview(body)
    parts: list[Part] = []
    while True:
        if body.startswith(b"--", pos):
            return parts  # the close delimiter (an epilogue after it is ignored)
        while pos < len(body) and body[pos] in b" \t":  # transport padding
            pos += 1
        if not body.startswith(b"\r\n", pos):
            raise ConfigError("multipart: a boundary is not followed by a line break")
        pos += 2
        end = body.find(delimiter, pos)
        if end < 0:
            raise ConfigError("multipart: the body ends inside a part (no closing boundary)")
        if body.startswith(b"\r\n", pos):  # a part without headers
            head, start = b"", pos + 2
        else:
            split = body.find(b"\r\n\r\n", pos, min(end, pos + MAX_PART_HEAD + 4))
            if split < 0:
                raise ConfigError("multipart: a part's headers do not end (or are too long)")
            head, start = body[pos:split], split + 4
        if len(parts) >= max_parts:
            raise ConfigError(f"multipart: more than {max_parts} parts")
        parts.append(_part(_headers(head), bytes(view[start:end])))
        pos = end + len(delimiter)
