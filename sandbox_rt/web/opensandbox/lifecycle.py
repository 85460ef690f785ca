"""The OpenSandbox lifecycle API (``/v1/sandboxes...``, ``/v1/snapshots...``), mapped onto the
runtime: what each field becomes is :mod:`.mapping`'s (docs/opensandbox.md has the table), what the
dialect keeps beside the runtime's record is :mod:`.state`'s.

- create is all or nothing, like ``Manager.create``: the sandbox is made, its entrypoint started
  and its notes kept, or it is destroyed before the error is answered; it answers 202 with the
  sandbox already Running (provisioning here takes about a second, so there is no Pending phase);
- get and list read the runtime's record and the engine's state, never the sandbox (a paused one
  answers too); renew and metadata patch rewrite the record by id (running or paused);
- pause freezes the sandbox and closes the server's connection to it: a command sent afterwards is
  refused at once (409, "paused: resume it first") until resume;
- endpoints: 44772 (execd) and 18080 (egress) are routes on this server (:mod:`.state`), whatever
  ``use_server_proxy`` says; other ports have none yet (404).

Routes are plain ``def`` functions: they block on the engine, so FastAPI runs them on its threads.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol, runtime_checkable

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse

from ...errors import BackendError, ConfigError, SandboxError, SandboxNotFound, SnapshotNotFound
from ...models import SandboxRecord
from ...pool import POOL_LABEL
from ...protocols import ManagerLike, VolumeRuntime
from ..bodies import strict_query
from ..errors import HttpError
from ..params import Ctx, SandboxId, SnapshotName, json_body
from ..runtime import quiet_close
from . import state
from .lifecycle_models import (
    CreateSandboxBody,
    CreateSnapshotBody,
    MetadataPatchBody,
    RenewBody,
    TelemetryBody,
    page_of,
    rfc3339,
    sandbox_json,
    snapshot_json,
)
from .mapping import (
    RESERVED_PREFIXES,
    SANDBOX_STATES,
    SNAPSHOT_STATES,
    check_metadata,
    expiry_ttl,
    plan_create,
    sandbox_status,
)

if TYPE_CHECKING:
    from ...manager import Manager

__all__ = ["MAX_PAGE_SIZE", "LifecycleRuntime", "router"]

MAX_PAGE_SIZE = 1000

router = APIRouter(dependencies=[Depends(strict_query)])


@runtime_checkable
class LifecycleRuntime(ManagerLike, Protocol):
    """What the lifecycle API needs of the runtime beyond the native API's ``ManagerLike``
    (``sandbox_rt.Manager`` fits): records and states by id, pause, and record changes by id."""

    def get(self, sandbox_id: str) -> SandboxRecord: ...

    def state(self, sandbox_id: str) -> str: ...

    def pause(self, sandbox_id: str) -> None: ...

    def resume(self, sandbox_id: str) -> None: ...

    def extend(self, sandbox_id: str, ttl_s: int) -> SandboxRecord: ...

    def relabel(self, sandbox_id: str, labels: Mapping[str, str]) -> SandboxRecord: ...


if TYPE_CHECKING:  # mypy proves the real Manager fits

    def _manager_fits(m: Manager) -> LifecycleRuntime:
        return m


def _runtime(ctx: Ctx) -> LifecycleRuntime:
    manager = ctx.manager
    state.bind(manager)
    if not isinstance(manager, LifecycleRuntime):
        raise HttpError(501, "not_implemented", "this server's runtime does not offer the lifecycle API")
    return manager


Runtime = Annotated[LifecycleRuntime, Depends(_runtime)]
Flag = Literal["true", "false"]


def _listed_state(rt: LifecycleRuntime, sandbox_id: str) -> str:
    """The engine's state of a listed sandbox; ``absent`` (Terminated) if it went meanwhile."""
    try:
        return rt.state(sandbox_id)
    except SandboxNotFound:
        return "absent"


def _sandbox(rt: LifecycleRuntime, record: SandboxRecord, engine_state: str | None = None) -> dict[str, Any]:
    notes = state.notes(record.id)
    now = rt.state(record.id) if engine_state is None else engine_state
    return sandbox_json(record, sandbox_status(now, notes.entrypoint_pid if notes else None), notes)


# -- sandboxes ---------------------------------------------------------------------------------------
@router.post("/v1/sandboxes", summary="Create a sandbox from a template (image.uri) or a snapshot")
def create_sandbox(
    ctx: Ctx,
    rt: Runtime,
    body: Annotated[CreateSandboxBody, Depends(json_body(CreateSandboxBody, "create"))],
) -> JSONResponse:
    plan = plan_create(body, rt.templates())
    # what the dialect may set (its defaults added: detached); the policy, though it asks neither
    # root nor caps, checked all the same
    kwargs = ctx.policy.admit(plan.kwargs, "opensandbox")
    if plan.new_volumes:
        if not isinstance(rt, VolumeRuntime):
            raise HttpError(501, "not_implemented", "this server's runtime has no volumes")
        for name in plan.new_volumes:
            rt.volumes.ensure(name)  # pvc.createIfNotExists; it outlives the sandbox
    sb = rt.create(**kwargs)
    try:
        pid = None
        if plan.starts_entrypoint:
            pid = sb.commands.run(list(plan.entrypoint), background=True, env=plan.env).pid
        notes = state.SandboxNotes(plan.env, plan.entrypoint, pid, plan.image, plan.snapshot_id)
        state.put_notes(sb.id, notes)
        record = rt.get(sb.id)
    except BaseException:  # all or nothing: the caller never learnt the id
        quiet_close(sb)
        with contextlib.suppress(SandboxError):
            rt.destroy(sb.id)
        with contextlib.suppress(SandboxError):
            state.drop_notes(sb.id)
        raise
    ctx.cache.put(sb)
    answer = sandbox_json(record, sandbox_status("running", pid), notes, full=False)
    return JSONResponse(answer, status_code=202, headers={"Location": f"/v1/sandboxes/{sb.id}"})


def _metadata_filter(raw: str | None) -> dict[str, str]:
    """``k=v&k2=v2`` (each part percent-encoded, as the SDK writes it) as a dict."""
    if not raw:
        return {}
    try:
        pairs = urllib.parse.parse_qsl(raw, keep_blank_values=True, strict_parsing=True, errors="strict")
    except (ValueError, UnicodeError) as exc:
        raise ConfigError(
            f"query parameter 'metadata' {raw!r:.80} must be key=value pairs joined by '&': {exc}"
        ) from None
    out: dict[str, str] = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"query parameter 'metadata' names {key!r} twice")
        out[key] = value
    return out


def _states(given: Sequence[str] | None, known: Sequence[str]) -> set[str]:
    """The spec's state names asked for (any case), or ConfigError naming the known ones."""
    by_lower = {s.lower(): s for s in known}
    out: set[str] = set()
    for name in given or ():
        if name.lower() not in by_lower:
            raise ConfigError(f"query parameter 'state' {name!r:.40} is not one of {', '.join(known)}")
        out.add(by_lower[name.lower()])
    return out


PageNumber = Annotated[int, Query(ge=1, description="1-based page number.")]
PageSize = Annotated[int, Query(alias="pageSize", ge=1, le=MAX_PAGE_SIZE)]
States = Annotated[list[str] | None, Query(alias="state")]


@router.get("/v1/sandboxes", summary="List sandboxes (state and metadata filters, pages)")
def list_sandboxes(
    rt: Runtime,
    states: States = None,
    metadata: Annotated[str | None, Query()] = None,
    page: PageNumber = 1,
    page_size: PageSize = 20,
) -> JSONResponse:
    wanted_states = _states(states, SANDBOX_STATES)
    wanted_labels = _metadata_filter(metadata)
    records = rt.list()
    state.sweep_notes(r.id for r in records)  # notes of sandboxes gone by another way
    found = [
        r
        for r in sorted(records, key=lambda r: (r.created_at, r.id))
        if POOL_LABEL not in r.spec.labels  # a warm pool's idle sandboxes are nobody's yet
        and all(r.spec.labels.get(k) == v for k, v in wanted_labels.items())
    ]
    engine: dict[str, str] = {}
    if wanted_states:  # the engine's state of each candidate only when it filters
        engine = {r.id: _listed_state(rt, r.id) for r in found}
        found = [r for r in found if sandbox_status(engine[r.id]).state in wanted_states]
    items, info = page_of(found, page, page_size)
    answers = [_sandbox(rt, r, engine.get(r.id) or _listed_state(rt, r.id)) for r in items]
    return JSONResponse({"items": answers, "pagination": info})


@router.get("/v1/sandboxes/{id}", summary="A sandbox: its status, metadata, expiry and startup source")
def get_sandbox(rt: Runtime, id: SandboxId) -> JSONResponse:
    return JSONResponse(_sandbox(rt, rt.get(id)))


@router.delete("/v1/sandboxes/{id}", status_code=204, response_class=Response, summary="Destroy a sandbox")
def delete_sandbox(ctx: Ctx, rt: Runtime, id: SandboxId) -> Response:
    ctx.cache.drop(id)
    rt.destroy(id)
    state.drop_notes(id)
    return Response(status_code=204)


@router.patch("/v1/sandboxes/{id}/metadata", summary="Patch the metadata (JSON Merge Patch)")
def patch_metadata(
    rt: Runtime,
    id: SandboxId,
    body: Annotated[MetadataPatchBody, Depends(json_body(MetadataPatchBody, "metadata"))],
) -> JSONResponse:
    record = rt.get(id)
    labels = dict(record.spec.labels)
    check_metadata({k: v for k, v in body.root.items() if v is not None})
    for key, value in body.root.items():
        if key.startswith(RESERVED_PREFIXES):
            raise ConfigError(f"metadata key {key!r} is reserved ({' and '.join(RESERVED_PREFIXES)} keys)")
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
    if labels != record.spec.labels:
        record = rt.relabel(id, labels)
    return JSONResponse(_sandbox(rt, record))


@router.post("/v1/sandboxes/{id}/renew-expiration", summary="Set the sandbox's expiry (RFC 3339, UTC)")
def renew_expiration(
    rt: Runtime,
    id: SandboxId,
    body: Annotated[RenewBody, Depends(json_body(RenewBody, "renew-expiration"))],
) -> JSONResponse:
    record = rt.extend(id, expiry_ttl(body.expires_at, time.time()))
    if record.expires_at is None:
        raise BackendError(f"the engine kept no expiry for {id} after a renew", step="renew")
    return JSONResponse({"expiresAt": rfc3339(record.expires_at)})


@router.post("/v1/sandboxes/{id}/pause", status_code=202, response_class=Response, summary="Freeze it")
def pause_sandbox(ctx: Ctx, rt: Runtime, id: SandboxId) -> Response:
    rt.pause(id)
    ctx.cache.drop(id)  # a frozen sshd answers nothing: new commands are refused until resume
    return Response(status_code=202)


@router.post("/v1/sandboxes/{id}/resume", status_code=202, response_class=Response, summary="Thaw it")
def resume_sandbox(rt: Runtime, id: SandboxId) -> Response:
    rt.resume(id)
    return Response(status_code=202)


# -- endpoints ---------------------------------------------------------------------------------------
_HOST = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
)
_AUTHORITY = re.compile(rf"(?:{_HOST.pattern}|\[[0-9A-Fa-f:.]{{2,45}}\])(?::[0-9]{{1,5}})?")


def _authority(request: Request) -> str:
    """How the client reached this server (its Host header), for the endpoint it should use next."""
    given = request.headers.getlist("host")
    if len(given) == 1:
        if len(given[0]) > 300 or not _AUTHORITY.fullmatch(given[0]):
            raise ConfigError(f"the Host header {given[0]!r:.80} is not host[:port]")
        return given[0]
    if given:
        raise ConfigError("the request has more than one Host header")
    server = request.scope.get("server")
    if not server or server[1] is None:
        raise ConfigError("the request has no Host header")
    host, port = server
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _credentials(request: Request) -> dict[str, str]:
    """The credential this request passed the gate with, for the endpoint's requests to carry: the
    SDK sends none to an endpoint unless ``use_server_proxy``, and ours are on this server."""
    out: dict[str, str] = {}
    for name, header in (
        ("open-sandbox-api-key", "OPEN-SANDBOX-API-KEY"),
        ("authorization", "Authorization"),
    ):
        values = request.headers.getlist(name)
        if len(values) == 1:
            out[header] = values[0]
    return out


@router.get("/v1/sandboxes/{id}/endpoints/{port}", summary="Where to reach a port of the sandbox")
def get_endpoint(
    request: Request,
    rt: Runtime,
    id: SandboxId,
    port: Annotated[int, PathParam(ge=1, le=65535)],
    use_server_proxy: Annotated[Flag, Query()] = "false",
    expires: Annotated[str | None, Query()] = None,
) -> JSONResponse:
    rt.get(id)  # SandboxNotFound first
    if expires is not None:
        raise ConfigError("signed endpoints (query parameter 'expires') are not supported")
    if port == state.EXECD_PORT:
        path = state.execd_base_path(id)
    elif port == state.EGRESS_PORT:
        path = state.egress_base_path(id)
    else:
        raise HttpError(
            404,
            "not_found",
            f"sandbox {id} has no endpoint for port {port}: this server serves only execd "
            f"({state.EXECD_PORT}) and egress ({state.EGRESS_PORT}); other ports are not forwarded yet",
        )
    body = {"endpoint": _authority(request) + path, "headers": _credentials(request)}
    return JSONResponse(body, headers={"Cache-Control": "no-store"})  # it carries the credential


@router.post("/v1/metrics/events", status_code=204, response_class=Response, summary="SDK telemetry: dropped")
def metrics_event(
    body: Annotated[TelemetryBody, Depends(json_body(TelemetryBody, "metrics event"))],
) -> Response:
    """The SDK reports each create's latency here (best effort); this server keeps nothing."""
    return Response(status_code=204)


# -- snapshots ---------------------------------------------------------------------------------------
@router.post("/v1/sandboxes/{id}/snapshots", summary="Save the sandbox's files as a snapshot")
def create_snapshot(
    rt: Runtime,
    id: SandboxId,
    body: Annotated[CreateSnapshotBody, Depends(json_body(CreateSnapshotBody, "snapshot", required=False))],
) -> JSONResponse:
    name = body.name if body.name is not None else "snap-" + secrets.token_hex(5)
    info = rt.snapshot(id, name)
    return JSONResponse(
        snapshot_json(info), status_code=202, headers={"Location": f"/v1/snapshots/{info.name}"}
    )


@router.get("/v1/snapshots", summary="List snapshots (by source sandbox, name, state; pages)")
def list_snapshots(
    rt: Runtime,
    sandbox_id: Annotated[str | None, Query(alias="sandboxId")] = None,
    name: Annotated[str | None, Query()] = None,
    states: States = None,
    page: PageNumber = 1,
    page_size: PageSize = 20,
) -> JSONResponse:
    wanted = _states(states, SNAPSHOT_STATES)
    found = [
        s
        for s in sorted(rt.list_snapshots(), key=lambda s: (s.created_at, s.name))
        if (sandbox_id is None or s.source_id == sandbox_id)
        and (name is None or s.name == name)
        and (not wanted or "Ready" in wanted)
    ]
    items, info = page_of(found, page, page_size)
    return JSONResponse({"items": [snapshot_json(s) for s in items], "pagination": info})


@router.get("/v1/snapshots/{name}", summary="A snapshot")
def get_snapshot(rt: Runtime, name: SnapshotName) -> JSONResponse:
    for info in rt.list_snapshots():
        if info.name == name:
            return JSONResponse(snapshot_json(info))
    raise SnapshotNotFound(name)


@router.delete("/v1/snapshots/{name}", status_code=204, response_class=Response, summary="Delete a snapshot")
def delete_snapshot(rt: Runtime, name: SnapshotName) -> Response:
    rt.delete_snapshot(name)
    return Response(status_code=204)
