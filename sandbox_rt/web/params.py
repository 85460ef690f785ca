"""What the routes of :mod:`.native` and :mod:`.processes` declare alike: the shared context, the
path and query parameters, and the JSON body read and checked by :mod:`.bodies`."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Path, Query, Request
from pydantic import AfterValidator, BaseModel

from ..policy import DoorPolicy
from ..protocols import ManagerLike
from ..validation import check_sandbox_id, check_snapshot_name
from ..volumes import check_volume_name
from . import schemas as s
from .bodies import check_json_media_type, parse_body
from .limits import HttpLimits
from .runtime import SandboxCache

__all__ = [
    "Context",
    "Ctx",
    "FilePath",
    "SandboxId",
    "SnapshotName",
    "VolumeName",
    "json_body",
    "json_request",
]

M = TypeVar("M", bound=BaseModel)


@dataclasses.dataclass
class Context:
    """What the routes share: the runtime, its attached sandboxes, the server's limits, and what
    its clients may ask of create (every create route calls ``policy.check_create`` first)."""

    manager: ManagerLike
    cache: SandboxCache
    limits: HttpLimits
    policy: DoorPolicy = dataclasses.field(default_factory=DoorPolicy)


def _context(request: Request) -> Context:
    ctx: Context = request.app.state.ctx
    return ctx


def json_body(model: type[M], what: str, *, required: bool = True) -> Callable[[Request], Awaitable[M]]:
    async def read(request: Request) -> M:
        raw = await request.body()
        if raw.strip():
            check_json_media_type(request.headers.get("content-type"))
        return parse_body(raw, model, what, required=required)

    return read


def json_request(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    """The OpenAPI requestBody of a route whose body ``model`` validates (by hand, not by FastAPI,
    so that the body's framing, JSON and kinds get this API's own error messages)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": ref}}}}


# a route that takes raw bytes (a file, a process's stdin) takes them under any media type; no body
# is no bytes (an empty file): on the wire the two are the same (Content-Length: 0)
RAW_REQUEST: dict[str, Any] = {
    "requestBody": {
        "required": False,
        "content": {
            "*/*": {"schema": {}, "description": "The raw bytes, whatever the media type (none: empty)."}
        },
    }
}


Ctx = Annotated[Context, Depends(_context)]
SandboxId = Annotated[
    str,
    Path(description="The sandbox's id.", json_schema_extra={"pattern": s.SANDBOX_ID_PATTERN}),
    AfterValidator(check_sandbox_id),
]
SnapshotName = Annotated[
    str, Path(json_schema_extra={"pattern": s.SNAPSHOT_NAME_PATTERN}), AfterValidator(check_snapshot_name)
]
VolumeName = Annotated[
    str, Path(json_schema_extra={"pattern": s.VOLUME_NAME_PATTERN}), AfterValidator(check_volume_name)
]
FilePath = Annotated[
    str,
    Query(
        description="Absolute path inside the sandbox.",
        json_schema_extra={"pattern": s.ABSOLUTE_PATH_PATTERN},
    ),
]
