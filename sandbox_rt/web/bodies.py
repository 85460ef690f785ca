"""What a request carries, read and checked: its JSON body against a model of :mod:`.schemas`, its
query string (no unknown or repeated parameters, strict percent-decoding), and pydantic's complaints
turned into one ConfigError whose message names the field, as the runtime's own errors do.
"""

from __future__ import annotations

import json
import typing
import urllib.parse
from collections.abc import Sequence
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from ..errors import ConfigError
from .errors import HttpError, json_type
from .kinds import KindError

__all__ = ["describe_errors", "parse_body", "strict_query"]

M = TypeVar("M", bound=BaseModel)

# what a required field or parameter holds, said when it is missing
_REQUIRED_HINTS = {
    "command": "a string run by bash, or an argv array",
    "enabled": "true or false",
    "egress": "an array; [] closes the list",
    "name": "the snapshot's name",
    "ttl_s": "seconds from now",
    "path": "an absolute path in the sandbox",
    "src": "an absolute path in the sandbox",
    "dst": "an absolute path in the sandbox",
}
_WHERE = {"query": "query parameter", "path": "path parameter", "header": "header", "body": "field"}


def _subject(loc: Sequence[Any]) -> str:
    """``('query', 'mode')`` -> "query parameter 'mode'"; a body field's loc is its name alone."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in _WHERE and len(parts) > 1:
        return f"{_WHERE[parts[0]]} {'.'.join(parts[1:])!r}"
    return f"field {'.'.join(parts)!r}"


def describe_errors(errors: Sequence[Any], what: str = "request") -> str:
    """One message for pydantic's list of errors: unknown fields first, then the first error."""
    unknown = sorted(str(e["loc"][-1]) for e in errors if e.get("type") == "extra_forbidden")
    if unknown:
        return f"unknown field(s) in the {what} body: {', '.join(unknown)}"
    order = {"path": 0, "query": 1}
    first = min(errors, key=lambda e: order.get(str(e["loc"][0]) if e["loc"] else "", 2))
    loc, cause = first.get("loc", ()), first.get("ctx", {}).get("error")
    if isinstance(cause, ConfigError):  # the runtime's own check: its message is complete
        return str(cause)
    if isinstance(cause, KindError):
        return f"{_subject(loc)} {cause}"
    if first.get("type") == "missing":
        name = str(loc[-1]) if loc else ""
        hint = _REQUIRED_HINTS.get(name)
        return f"{_subject(loc)} is required" + (f" ({hint})" if hint else "")
    return f"{_subject(loc)}: {first.get('msg', 'invalid')}"


def parse_body(raw: bytes, model: type[M], what: str, *, required: bool = True) -> M:
    """The request's JSON object body as ``model``; ConfigError naming what is wrong.

    Strict JSON: UTF-8 only, no lone surrogates (``"\\ud800"`` decodes in Python but is not text);
    the Content-Type is not consulted (``curl -d`` sends a form type with a JSON body)."""
    if not raw.strip():
        if required:
            raise ConfigError(f"the {what} request needs a JSON object body")
        return model()
    try:
        data = json.loads(raw)
        json.dumps(data, ensure_ascii=False).encode("utf-8")  # lone surrogates fail here
    except (ValueError, UnicodeError) as exc:
        raise ConfigError(f"the {what} body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"the {what} body must be a JSON object, not {json_type(data)}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc.errors(), what)) from None


def check_json_media_type(content_type: str | None) -> None:
    """A JSON body comes as ``application/json`` (or a ``+json`` type), or without a Content-Type;
    any other media type is a 415 (``curl -d`` sends a form type: add ``-H 'Content-Type:
    application/json'``)."""
    if content_type is None:
        return
    mime = content_type.partition(";")[0].strip().lower()
    if mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json")):
        return
    raise HttpError(
        415,
        "unsupported_media_type",
        f"the body must be JSON: send Content-Type: application/json, not {content_type!r:.80}",
    )


def _repeatable(annotation: Any) -> bool:
    """A list-typed parameter may be given more than once (``?label=a=1&label=b=2``)."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    args = typing.get_args(annotation) if typing.get_origin(annotation) is not list else ()
    return typing.get_origin(annotation) is list or any(_repeatable(a) for a in args if a is not type(None))


def _query_params(dependant: Any) -> list[Any]:
    """The query parameters a route declares, its dependencies' included (FastAPI's Dependant)."""
    if dependant is None:
        return []
    found = list(dependant.query_params)
    for sub in dependant.dependencies:
        found += _query_params(sub)
    return found


async def strict_query(request: Request) -> None:
    """Every route's first check: the query string decodes strictly, names only the route's own
    parameters, and gives each single-valued one at most once (FastAPI would take the last)."""
    raw = request.scope.get("query_string", b"").decode("latin-1")
    try:
        pairs = urllib.parse.parse_qsl(raw, keep_blank_values=True, strict_parsing=bool(raw), errors="strict")
    except (ValueError, UnicodeError) as exc:
        raise ConfigError(f"malformed query string: {exc}") from exc
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    params = {p.alias: p for p in _query_params(dependant)}
    seen: set[str] = set()
    for key, _ in pairs:
        param = params.get(key)
        if param is None:
            allowed = ", ".join(sorted(params)) or "none"
            raise ConfigError(f"unknown query parameter {key!r} (allowed: {allowed})")
        if key in seen and not _repeatable(param.field_info.annotation):
            raise ConfigError(f"query parameter {key!r} is given more than once")
        seen.add(key)
