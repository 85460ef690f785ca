"""The native HTTP API's routes (``/v1``), on FastAPI: each validates with the models of
:mod:`.schemas`, calls the runtime through the shared :class:`~.runtime.SandboxCache`, and answers
JSON (or server-sent events for a streamed exec). Errors are raised, and answered by
:mod:`.app`'s handlers; the body was read by the :class:`~.gate.Gate` already.

Routes are plain ``def`` functions: they block on SSH and the engine, so FastAPI runs them on its
thread pool (as many threads as the server allows connections).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from .. import __version__
from ..errors import ConfigError, SandboxError
from ..files import MAX_LIST_DEPTH
from ..models import (
    EntryInfo,
    ExecResult,
    SandboxRecord,
    SandboxStatus,
    SnapshotInfo,
    VolumeInfo,
)
from ..options import CREATE_NOTES, all_options
from ..protocols import VolumeRuntime, VolumesLike
from . import schemas as s
from .bodies import strict_query
from .errors import ENCODINGS, HttpError, encode_output
from .kinds import exact
from .openapi import errors
from .params import (
    RAW_REQUEST,
    Ctx,
    FilePath,
    SandboxId,
    SnapshotName,
    VolumeName,
    json_body,
    json_request,
)
from .runtime import quiet_close
from .sse import SSE_SCHEMA, exec_events

__all__ = ["PUBLIC_PATHS", "router"]

PUBLIC_PATHS = ("/healthz", "/openapi.json")


def _octal_mode(value: str | None) -> int | None:
    if value is None:
        return None
    if not re.fullmatch(r"0?[0-7]{3,4}", value):
        raise ConfigError(f"query parameter mode={value!r} must be octal permissions, e.g. 644 or 0755")
    return int(value, 8)


Flag = Literal["true", "false"]


router = APIRouter(dependencies=[Depends(strict_query)])


# -- public ------------------------------------------------------------------------------------------
@router.get(
    "/healthz",
    operation_id="health",
    summary="Liveness probe (no authentication)",
    response_model=s.Health,
    responses=errors(public=True),
)
def health() -> dict[str, Any]:
    return {"status": "ok", "version": __version__}


@router.get(
    "/openapi.json",
    operation_id="openapi",
    summary="This OpenAPI document (no authentication)",
    responses={
        200: {
            "description": "The OpenAPI 3.1 document.",
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        **errors(public=True),
    },
)
def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.state.document)


# -- sandboxes ---------------------------------------------------------------------------------------
@router.get(
    "/v1/templates",
    operation_id="listTemplates",
    summary="The template names a create may use (the host contract's; default first)",
    response_model=s.TemplateList,
    responses=errors("401"),
)
def list_templates(ctx: Ctx) -> dict[str, Any]:
    return {"templates": ctx.manager.templates()}


@router.post(
    "/v1/sandboxes",
    operation_id="createSandbox",
    summary="Create a sandbox (clone, limits, start, SSH-ready; all or nothing)",
    status_code=201,
    response_model=SandboxStatus,
    responses={
        201: {
            "description": "Created and running.",
            "headers": {"Location": {"schema": {"type": "string"}, "description": "/v1/sandboxes/{id}"}},
        },
        **errors("400", "401", "403", "404", "409", "413", "500", "502", "503", notes=CREATE_NOTES),
    },
    openapi_extra=json_request(s.CreateSandboxRequest, required=False),
)
def create_sandbox(
    ctx: Ctx,
    response: Response,
    body: Annotated[s.RequestBody, Depends(json_body(s.CreateSandboxRequest, "create", required=False))],
) -> SandboxStatus:
    # the API's defaults added (detached: it lives by its TTL, not by this server process), and what
    # the operator allows this server's clients (root, the caps) checked before anything is made
    kwargs = ctx.policy.admit({name: getattr(body, name) for name in body.model_fields_set}, "http")
    sb = ctx.manager.create(**kwargs)
    try:
        status = sb.status()
    except BaseException:  # all or nothing, like create(): the caller never learnt the id
        quiet_close(sb)
        with contextlib.suppress(SandboxError):
            ctx.manager.destroy(sb.id)
        raise
    ctx.cache.put(sb)
    response.headers["Location"] = f"/v1/sandboxes/{sb.id}"
    return status


def _record(r: SandboxRecord) -> BaseModel:
    """A list entry: what the backend knows without connecting (no host key, no live state)."""
    listed = {o.name: getattr(r.spec, o.name) for o in all_options() if o.listed}
    return s.SandboxInfo(
        id=r.id,
        hostname=r.hostname,
        ip=r.ip,
        backend=r.backend,
        created_at=r.created_at,
        expires_at=r.expires_at,
        **listed,
    )


@router.get(
    "/v1/sandboxes",
    operation_id="listSandboxes",
    summary="List sandboxes, optionally only those with all the given labels",
    response_model=s.SandboxList,
    responses=errors("400", "401", "502"),
)
def list_sandboxes(
    ctx: Ctx,
    label: Annotated[
        list[str] | None,
        Query(
            description="KEY=VALUE; repeat for several (all must match).",
            json_schema_extra={"items": {"type": "string", "pattern": "^[^=]+="}},
        ),
    ] = None,
) -> BaseModel:
    labels: dict[str, str] = {}
    for item in label or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"query parameter label={item!r} must be KEY=VALUE")
        labels[key] = value
    return s.SandboxList(sandboxes=[_record(r) for r in ctx.manager.list(labels=labels)])


@router.get(
    "/v1/sandboxes/{id}",
    operation_id="getSandbox",
    summary="State, limits, address, uptime, resource usage and internet access",
    response_model=SandboxStatus,
    responses=errors("400", "401", "404", "409", "502", "503"),
)
def get_sandbox(ctx: Ctx, id: SandboxId) -> SandboxStatus:
    return ctx.cache.get(id).status()


@router.delete(
    "/v1/sandboxes/{id}",
    operation_id="deleteSandbox",
    summary="Destroy the sandbox and everything it holds",
    status_code=204,
    response_class=Response,
    responses={204: {"description": "Destroyed."}, **errors("400", "401", "404", "502")},
)
def delete_sandbox(ctx: Ctx, id: SandboxId) -> Response:
    ctx.cache.drop(id)
    ctx.manager.destroy(id)
    return Response(status_code=204)


@router.post(
    "/v1/sandboxes/{id}/internet",
    operation_id="setInternet",
    summary="Allow or forbid the sandbox's HTTP/HTTPS traffic to the internet",
    response_model=s.InternetState,
    responses=errors("400", "401", "404", "409", "502"),
    openapi_extra=json_request(s.InternetRequest),
)
def set_internet(
    ctx: Ctx,
    id: SandboxId,
    body: Annotated[s.InternetRequest, Depends(json_body(s.InternetRequest, "internet"))],
) -> s.InternetState:
    ctx.cache.get(id).set_internet(body.enabled)
    return s.InternetState(id=id, internet=body.enabled)


@router.put(
    "/v1/sandboxes/{id}/egress",
    operation_id="setEgress",
    summary="Replace the egress allow-list (reachable while internet is off); [] closes it",
    response_model=s.EgressState,
    responses=errors("400", "401", "404", "409", "502"),
    openapi_extra=json_request(s.EgressRequest),
)
def set_egress(
    ctx: Ctx, id: SandboxId, body: Annotated[s.EgressRequest, Depends(json_body(s.EgressRequest, "egress"))]
) -> s.EgressState:
    return s.EgressState(id=id, egress=list(ctx.cache.get(id).set_egress(body.egress)))


@router.post(
    "/v1/sandboxes/{id}/extend",
    operation_id="extendSandbox",
    summary="Let the sandbox live ttl_s seconds from now",
    response_model=SandboxStatus,
    responses=errors("400", "401", "404", "409", "502"),
    openapi_extra=json_request(s.ExtendRequest),
)
def extend_sandbox(
    ctx: Ctx, id: SandboxId, body: Annotated[s.ExtendRequest, Depends(json_body(s.ExtendRequest, "extend"))]
) -> SandboxStatus:
    sb = ctx.cache.get(id)
    sb.extend(body.ttl_s)
    return sb.status()


# -- snapshots ---------------------------------------------------------------------------------------
@router.post(
    "/v1/sandboxes/{id}/snapshots",
    operation_id="snapshotSandbox",
    summary="Save the sandbox's files as a named snapshot; create with from_snapshot forks it",
    status_code=201,
    response_model=SnapshotInfo,
    responses={201: {"description": "Saved."}, **errors("400", "401", "404", "409", "502")},
    openapi_extra=json_request(s.SnapshotRequest),
)
def snapshot_sandbox(
    ctx: Ctx,
    id: SandboxId,
    body: Annotated[s.SnapshotRequest, Depends(json_body(s.SnapshotRequest, "snapshot"))],
) -> SnapshotInfo:
    return ctx.manager.snapshot(id, body.name)


@router.get(
    "/v1/snapshots",
    operation_id="listSnapshots",
    summary="The host's snapshots (LXC: they outlive their source; PVE: they go with it)",
    response_model=s.SnapshotList,
    responses=errors("401", "502"),
)
def list_snapshots(ctx: Ctx) -> dict[str, Any]:
    return {"snapshots": ctx.manager.list_snapshots()}


@router.delete(
    "/v1/snapshots/{name}",
    operation_id="deleteSnapshot",
    summary="Delete a snapshot (forks made from it are not affected)",
    status_code=204,
    response_class=Response,
    responses={204: {"description": "Deleted."}, **errors("400", "401", "404", "502")},
)
def delete_snapshot(ctx: Ctx, name: SnapshotName) -> Response:
    ctx.manager.delete_snapshot(name)
    return Response(status_code=204)


# -- volumes -----------------------------------------------------------------------------------------
def _volumes(ctx: Ctx) -> VolumesLike:
    manager = ctx.manager
    if not isinstance(manager, VolumeRuntime):
        raise HttpError(501, "not_implemented", "this server's runtime has no volumes")
    return manager.volumes


@router.get(
    "/v1/volumes",
    operation_id="listVolumes",
    summary="The host's named volumes (lxc backend): directories that outlive sandboxes",
    response_model=s.VolumeList,
    responses=errors("400", "401"),
)
def list_volumes(ctx: Ctx) -> dict[str, Any]:
    return {"volumes": _volumes(ctx).list(size=True)}


@router.post(
    "/v1/volumes",
    operation_id="createVolume",
    summary="Make an empty named volume; create mounts it with volumes: {path: {volume: name}}",
    status_code=201,
    response_model=VolumeInfo,
    responses={201: {"description": "Made."}, **errors("400", "401", "409", "413")},
    openapi_extra=json_request(s.CreateVolumeRequest),
)
def create_volume(
    ctx: Ctx, body: Annotated[s.CreateVolumeRequest, Depends(json_body(s.CreateVolumeRequest, "volume"))]
) -> VolumeInfo:
    return _volumes(ctx).create(body.name)


@router.get(
    "/v1/volumes/{name}",
    operation_id="getVolume",
    summary="One volume: its host path, size and the sandboxes that mount it",
    response_model=VolumeInfo,
    responses=errors("400", "401", "404"),
)
def get_volume(ctx: Ctx, name: VolumeName) -> VolumeInfo:
    return _volumes(ctx).get(name)


@router.delete(
    "/v1/volumes/{name}",
    operation_id="deleteVolume",
    summary="Delete a volume and its files (409 while a sandbox mounts it)",
    status_code=204,
    response_class=Response,
    responses={204: {"description": "Deleted."}, **errors("400", "401", "404", "409")},
)
def delete_volume(ctx: Ctx, name: VolumeName) -> Response:
    _volumes(ctx).remove(name)
    return Response(status_code=204)


# -- commands ----------------------------------------------------------------------------------------
def _result(r: ExecResult, encoding: str) -> s.ExecResult:
    return s.ExecResult(
        command=r.command,
        exit_code=r.exit_code,
        duration_s=r.duration_s,
        truncated=r.truncated,
        stdout_dropped=r.stdout_dropped,
        stderr_dropped=r.stderr_dropped,
        encoding=encoding,  # type: ignore[arg-type]
        stdout=encode_output(r.stdout, encoding),
        stderr=encode_output(r.stderr, encoding),
    )


@router.post(
    "/v1/sandboxes/{id}/exec",
    operation_id="execCommand",
    summary="Run a command as the sandbox user; JSON result or server-sent events",
    response_model=s.ExecResult,
    responses={
        200: {
            "description": "The command ran (any exit code).",
            "content": {"text/event-stream": {"schema": SSE_SCHEMA}},
        },
        **errors("400", "401", "404", "409", "413", "502", "503", "504"),
    },
    openapi_extra=json_request(s.ExecRequest),
)
def exec_command(
    ctx: Ctx,
    request: Request,
    id: SandboxId,
    body: Annotated[s.ExecRequest, Depends(json_body(s.ExecRequest, "exec"))],
) -> Any:
    encoding = body.encoding
    if encoding not in ENCODINGS:
        raise ConfigError(f"field 'encoding' must be one of {', '.join(ENCODINGS)}, not {encoding!r}")
    request.state.encoding = encoding  # a CommandTimeout's output is given back in it
    if body.stdin is not None and body.stdin_b64 is not None:
        raise ConfigError("give at most one of the fields 'stdin' and 'stdin_b64'")
    stdin: bytes | None = None
    if body.stdin is not None:
        stdin = body.stdin.encode("utf-8")
    elif body.stdin_b64 is not None:
        try:
            stdin = base64.b64decode(body.stdin_b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ConfigError(f"field 'stdin_b64' is not valid base64: {exc}") from exc
    stream = body.stream
    if stream is None:
        stream = "text/event-stream" in request.headers.get("accept", "").lower()
    kwargs: dict[str, Any] = {"timeout": body.timeout, "cwd": body.cwd, "env": body.env, "stdin": stdin}
    if body.max_output is not None:
        kwargs["max_output"] = body.max_output
    if body.user is not None:
        kwargs["user"] = body.user
    sb = ctx.cache.get(id)
    if not stream:
        return _result(sb.exec(body.command, **kwargs), encoding)
    kwargs.pop("max_output", None)  # events carry all output
    events = exec_events(sb.exec_stream(body.command, **kwargs), encoding)
    return StreamingResponse(
        events, media_type="text/event-stream; charset=utf-8", headers={"X-Accel-Buffering": "no"}
    )


# -- files -------------------------------------------------------------------------------------------
@router.get(
    "/v1/sandboxes/{id}/files",
    operation_id="readFile",
    summary="Read a file (raw bytes)",
    response_class=Response,
    responses={
        200: {
            "description": "The file's exact bytes (a regular file of at most 256 MiB; larger is 413, "
            "a device, FIFO or socket 409).",
            "content": {"application/octet-stream": {"schema": {}}},
        },
        **errors("400", "401", "403", "404", "409", "413", "502", "504"),
    },
)
def read_file(ctx: Ctx, id: SandboxId, path: FilePath) -> Response:
    return Response(ctx.cache.get(id).read_file(path), media_type="application/octet-stream")


@router.put(
    "/v1/sandboxes/{id}/files",
    operation_id="writeFile",
    summary="Write a file (raw body; parent directories are created)",
    response_model=s.FileWritten,
    responses=errors("400", "401", "403", "404", "409", "411", "413", "502", "507", "504"),
    openapi_extra=RAW_REQUEST,
)
async def write_file(
    ctx: Ctx,
    request: Request,
    id: SandboxId,
    path: FilePath,
    mode: Annotated[
        str | None,
        Query(
            description="Octal permissions, e.g. 644 or 0755.",
            json_schema_extra={"pattern": exact("0?[0-7]{3,4}")},
        ),
    ] = None,
) -> s.FileWritten:
    bits = _octal_mode(mode)
    data = await request.body()  # read by the gate already: no wait on the client
    await run_in_threadpool(ctx.cache.get(id).write_file, path, data, mode=bits)
    return s.FileWritten(path=path, size=len(data))


@router.delete(
    "/v1/sandboxes/{id}/files",
    operation_id="removeFile",
    summary="Remove a file, a symlink (not its target) or a directory; absent is fine",
    status_code=204,
    response_class=Response,
    responses={204: {"description": "Gone."}, **errors("400", "401", "403", "404", "409", "502", "504")},
)
def remove_file(
    ctx: Ctx,
    id: SandboxId,
    path: FilePath,
    recursive: Annotated[Flag, Query(description="Remove a directory with everything in it.")] = "false",
) -> Response:
    ctx.cache.get(id).files.remove(path, recursive=recursive == "true")
    return Response(status_code=204)


@router.get(
    "/v1/sandboxes/{id}/files/list",
    operation_id="listFiles",
    summary="A directory's entries, depth levels deep, sorted by path (symlinks not followed)",
    response_model=s.EntryList,
    responses=errors("400", "401", "403", "404", "409", "413", "502", "504"),
)
def list_files(
    ctx: Ctx,
    id: SandboxId,
    path: Annotated[
        str,
        Query(
            description="Absolute path of the directory.",
            json_schema_extra={"pattern": s.ABSOLUTE_PATH_PATTERN},
        ),
    ],
    depth: Annotated[int, Query(ge=1, le=MAX_LIST_DEPTH)] = 1,
) -> dict[str, Any]:
    return {"entries": ctx.cache.get(id).files.list(path, depth)}


@router.get(
    "/v1/sandboxes/{id}/files/stat",
    operation_id="statFile",
    summary="One entry",
    response_model=EntryInfo,
    responses=errors("400", "401", "403", "404", "409", "502", "504"),
)
def stat_file(
    ctx: Ctx,
    id: SandboxId,
    path: FilePath,
    follow_symlinks: Annotated[Flag, Query(description="Report a link's target.")] = "true",
) -> EntryInfo:
    return ctx.cache.get(id).files.stat(path, follow_symlinks=follow_symlinks == "true")


@router.post(
    "/v1/sandboxes/{id}/files/mkdir",
    operation_id="makeDirectory",
    summary="Make a directory (and its parents unless parents=false)",
    response_model=s.MkdirResult,
    responses=errors("400", "401", "403", "404", "409", "502", "507", "504"),
    openapi_extra=json_request(s.MkdirRequest),
)
def make_directory(
    ctx: Ctx, id: SandboxId, body: Annotated[s.MkdirRequest, Depends(json_body(s.MkdirRequest, "mkdir"))]
) -> s.MkdirResult:
    created = ctx.cache.get(id).files.mkdir(body.path, parents=body.parents)
    return s.MkdirResult(path=body.path, created=created)


@router.post(
    "/v1/sandboxes/{id}/files/rename",
    operation_id="renameFile",
    summary="Move src to dst (a file at dst is replaced)",
    response_model=EntryInfo,
    responses=errors("400", "401", "403", "404", "409", "502", "504"),
    openapi_extra=json_request(s.RenameRequest),
)
def rename_file(
    ctx: Ctx, id: SandboxId, body: Annotated[s.RenameRequest, Depends(json_body(s.RenameRequest, "rename"))]
) -> EntryInfo:
    return ctx.cache.get(id).files.rename(body.src, body.dst)
