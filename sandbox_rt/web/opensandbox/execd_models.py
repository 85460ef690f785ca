"""The bodies execd's routes take, read and checked like the native API's (strict JSON, every field's
JSON kind checked, unknown fields refused, a message naming the bad field), and the checks of what
they carry: octal modes written as decimal digits (``755``), user and group names, path maps."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, Field, ValidationError

from ...errors import ConfigError
from ...validation import check_remote_path
from ..bodies import check_json_media_type, describe_errors
from ..errors import json_type
from ..kinds import Kind
from ..schemas import RequestBody

__all__ = [
    "MAX_ITEMS",
    "FileMetadata",
    "NetworkRuleBody",
    "Permission",
    "RenameItem",
    "ReplaceItem",
    "RunCommandRequest",
    "RunInSessionRequest",
    "SessionRequest",
    "check_owner",
    "model_of",
    "octal_mode",
    "parse_json",
    "path_list",
    "path_map",
    "read_json",
]

M = TypeVar("M", bound=BaseModel)

MAX_ITEMS = 1000  # paths, moves, rules one request may name
_OWNER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10}")


class RunCommandRequest(RequestBody):
    command: Annotated[Any, Kind("string", nullable=True)] = Field(default=None, description="Run by bash.")
    argv: Annotated[Any, Kind("string_list", nullable=True)] = Field(
        default=None, description="An exact argv (instead of command)."
    )
    cwd: Annotated[Any, Kind("string", nullable=True)] = None
    background: Annotated[Any, Kind("boolean", nullable=True)] = None
    timeout: Annotated[Any, Kind("integer", nullable=True, minimum=0)] = Field(
        default=None, description="Milliseconds; 0 or null: the host's default command timeout."
    )
    uid: Annotated[Any, Kind("integer", nullable=True, minimum=0)] = None
    gid: Annotated[Any, Kind("integer", nullable=True, minimum=0)] = None
    envs: Annotated[Any, Kind("string_map", nullable=True)] = None


class SessionRequest(RequestBody):
    cwd: Annotated[Any, Kind("string", nullable=True)] = None


class RunInSessionRequest(RequestBody):
    command: Annotated[Any, Kind("string")]
    cwd: Annotated[Any, Kind("string", nullable=True)] = None
    timeout: Annotated[Any, Kind("integer", nullable=True, minimum=0)] = None


class Permission(RequestBody):
    mode: Annotated[Any, Kind("integer", nullable=True)] = None
    owner: Annotated[Any, Kind("string", nullable=True)] = None
    group: Annotated[Any, Kind("string", nullable=True)] = None


class FileMetadata(RequestBody):
    path: Annotated[Any, Kind("string")]
    mode: Annotated[Any, Kind("integer", nullable=True)] = None
    owner: Annotated[Any, Kind("string", nullable=True)] = None
    group: Annotated[Any, Kind("string", nullable=True)] = None


class RenameItem(RequestBody):
    src: Annotated[Any, Kind("string")]
    dest: Annotated[Any, Kind("string")]


class ReplaceItem(RequestBody):
    old: Annotated[Any, Kind("string", minLength=1)]
    new: Annotated[Any, Kind("string")]


class NetworkRuleBody(RequestBody):
    action: Annotated[Any, Kind("string", enum=["allow", "deny"])]
    target: Annotated[Any, Kind("string")]


# -- values ------------------------------------------------------------------------------------------
def octal_mode(value: int | None, name: str = "mode") -> int | None:
    """``755`` (octal digits written as a decimal number, execd's convention) -> ``0o755``."""
    if value is None:
        return None
    digits = str(value)
    if value < 0 or not re.fullmatch(r"[0-7]{1,4}", digits):
        raise ConfigError(f"{name}={value!r} must be permissions in octal digits, e.g. 644 or 755")
    return int(digits, 8)


def check_owner(value: str | None, name: str) -> str | None:
    """A user or group name (or number) for chown; None: unchanged."""
    if value is None or value == "":
        return None
    if not _OWNER.fullmatch(value):
        raise ConfigError(f"{name}={value!r:.60} is not a user or group name")
    return value


# -- bodies ------------------------------------------------------------------------------------------
def parse_json(raw: bytes, what: str) -> Any:
    """A strict JSON body (UTF-8, no lone surrogates), any JSON value; ConfigError if none."""
    if not raw.strip():
        raise ConfigError(f"the {what} request needs a JSON body")
    try:
        data = json.loads(raw)
        json.dumps(data, ensure_ascii=False).encode("utf-8")  # lone surrogates fail here
    except (ValueError, UnicodeError) as exc:
        raise ConfigError(f"the {what} body is not valid JSON: {exc}") from exc
    return data


def read_json(what: str) -> Callable[[Request], Any]:
    """A dependency: the request's JSON body (its media type JSON or none)."""

    async def read(request: Request) -> Any:
        raw = await request.body()  # read by the gate already
        if raw.strip():
            check_json_media_type(request.headers.get("content-type"))
        return parse_json(raw, what)

    return read


def model_of(model: type[M], data: Any, what: str) -> M:
    if not isinstance(data, dict):
        raise ConfigError(f"{what} must be a JSON object, not {json_type(data)}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{what}: {describe_errors(exc.errors(), what)}") from None


def path_map(data: Any, model: type[M], what: str) -> dict[str, M]:
    """A JSON object of absolute paths to ``model`` objects (at most :data:`MAX_ITEMS`)."""
    if not isinstance(data, dict):
        raise ConfigError(f"the {what} body must be a JSON object of paths, not {json_type(data)}")
    if not data:
        raise ConfigError(f"the {what} body names no path")
    if len(data) > MAX_ITEMS:
        raise ConfigError(f"the {what} body names {len(data)} paths; at most {MAX_ITEMS} are allowed")
    return {
        check_remote_path(path): model_of(model, value, f"entry {path!r:.80}") for path, value in data.items()
    }


def path_list(paths: list[str] | None, what: str) -> list[str]:
    """Query paths (``?path=a&path=b``): at least one, at most :data:`MAX_ITEMS`, all absolute."""
    if not paths:
        raise ConfigError(f"query parameter 'path' is required ({what}: an absolute path, repeatable)")
    if len(paths) > MAX_ITEMS:
        raise ConfigError(f"{len(paths)} paths given; at most {MAX_ITEMS} are allowed")
    return [check_remote_path(p) for p in paths]
