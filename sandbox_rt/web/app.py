"""The native HTTP API as an ASGI app: FastAPI with :mod:`.native`'s routes behind the
:class:`~.gate.Gate`, and the handlers that answer every error as ``{"error": {...}}``.

``build_app(manager, token=..., limits=...)`` is what :class:`sandbox_rt.web.server.ApiServer` serves;
:func:`openapi_document` is its document without a server.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException

from .. import __version__
from ..caps import pid_budget, read_pid_max
from ..config import Settings
from ..errors import ConnectionLost, SandboxError, SandboxNotFound
from ..options import door_options
from ..policy import DoorPolicy
from ..protocols import ManagerLike
from . import native, processes, schemas
from .bodies import describe_errors
from .errors import HttpError, error_for
from .gate import Gate
from .limits import HTTP_LIMITS, HttpLimits
from .native import PUBLIC_PATHS
from .openapi import NATIVE_LINKS, build_document, size_text
from .params import Context
from .runtime import SandboxCache

__all__ = ["build_app", "openapi_document"]

log = logging.getLogger(__name__)

_TITLE = "sandbox_rt control API"
_REQUEST_MODELS = (
    schemas.CreateSandboxRequest,
    schemas.ExecRequest,
    schemas.InternetRequest,
    schemas.EgressRequest,
    schemas.SnapshotRequest,
    schemas.ExtendRequest,
    schemas.CreateVolumeRequest,
    schemas.MkdirRequest,
    schemas.RenameRequest,
    schemas.ExecOutputEvent,
    schemas.ExecExitEvent,
    schemas.ExecErrorEvent,
    *processes.MODELS,
)
ROUTERS = (native.router, processes.router)


def _description(limits: HttpLimits) -> str:
    return (
        "See docs/http-api.md. All /v1 routes need `Authorization: Bearer <token>`. Limits (defaults): "
        f"a request head of at most {size_text(limits.max_head_bytes)} arriving within "
        f"{limits.header_timeout_s:g} s; a body of at most {size_text(limits.max_body_bytes)} with a valid "
        f"token, {size_text(limits.max_unauth_body_bytes)} without; {limits.max_connections} open "
        f"connections; a keep-alive connection idle for {limits.idle_timeout_s:g} s is closed. A running "
        "command (JSON or server-sent events) is bounded by its own timeout only."
    )


@functools.cache
def openapi_document_cached() -> dict[str, Any]:
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    for router in ROUTERS:
        app.include_router(router)
    return build_document(
        app.routes,
        title=_TITLE,
        version=__version__,
        description=_description(HTTP_LIMITS),
        public=PUBLIC_PATHS,
        extra_models=_REQUEST_MODELS,
        links=NATIVE_LINKS,
    )


def openapi_document() -> dict[str, Any]:
    """A fresh copy of the OpenAPI 3.1 document of the native HTTP API."""
    return copy.deepcopy(openapi_document_cached())


def served_document(manager: ManagerLike) -> dict[str, Any]:
    """The document as this server serves it: what only this host knows made exact (the template
    names it has, its cores), so that every request the document allows is one the host accepts."""
    doc = openapi_document()
    create = doc["components"]["schemas"]["CreateSandboxRequest"]["properties"]
    for opt in door_options("http"):  # each option bound by what only this host knows (its declaration)
        prop, null = create[opt.name], [None] if opt.nullable else []
        if opt.host_bound == "cores":
            prop["maximum"] = os.cpu_count() or 1
        elif opt.host_bound == "pids_budget":
            prop["maximum"] = _pids_max(manager, prop["maximum"])
        elif opt.host_bound == "templates":
            prop["enum"] = [*manager.templates(), *null]
        elif opt.host_bound == "nodes":
            prop["enum"] = [*_nodes(manager), *null]
    return doc


def _pids_max(manager: ManagerLike, schema_max: int) -> int:
    """The largest ``pids_max`` this host gives one sandbox: the LXC backend refuses more than its
    pids budget (kernel.pid_max less its reserve) with a 400. A Proxmox VE node's ceiling is the
    node's: the schema's bound stays (its 400 is documented on create)."""
    settings = getattr(manager, "settings", None)
    if not isinstance(settings, Settings) or settings.backend != "lxc":
        return schema_max
    return min(schema_max, pid_budget(read_pid_max()))


def _nodes(manager: ManagerLike) -> list[str]:
    """The nodes ``create(node=...)`` may name on this host: a Proxmox VE cluster's per-node
    templates (and ``pve_node``); none on a backend with one host."""
    settings = getattr(manager, "settings", None)
    if not isinstance(settings, Settings) or settings.backend != "proxmox":
        return []
    return sorted({*settings.pve_node_templates, *([settings.pve_node] if settings.pve_node else [])})


def _error_response(err: HttpError, render: Callable[[HttpError], bytes] = HttpError.encoded) -> Response:
    headers = dict(err.headers)
    if err.close:
        headers["Connection"] = "close"
    return Response(render(err), status_code=err.status, media_type="application/json", headers=headers)


def _allowed_methods(path: str, routers: Sequence[APIRouter]) -> list[str]:
    """The methods the routes declare on ``path`` (FastAPI would name only the first route's)."""
    methods: set[str] = set()
    for route in (r for router in routers for r in router.routes):
        regex, declared = getattr(route, "path_regex", None), getattr(route, "methods", None)
        if regex is not None and declared and regex.match(path):
            methods |= set(declared)
    return sorted(methods - {"HEAD"})


def install_error_handlers(
    app: FastAPI,
    render: Callable[[HttpError], bytes] = HttpError.encoded,
    routers: Sequence[APIRouter] = ROUTERS,
) -> None:
    """Every error as ``render`` writes it (the native ``{"error": {"code", "message", ...}}`` by
    default): the runtime's (its table), bad parameters (400, not FastAPI's 422), unknown routes and
    methods (404, 405 with the Allow of ``routers``), and anything unexpected (500, details only in
    the log)."""
    answer = functools.partial(_error_response, render=render)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HttpError)
        return answer(exc)

    async def on_sandbox_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, SandboxError)
        sid = request.path_params.get("id")
        if sid is not None and isinstance(exc, SandboxNotFound | ConnectionLost):
            request.app.state.ctx.cache.drop(sid)
        return answer(error_for(exc, getattr(request.state, "encoding", "utf-8")))

    async def on_invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return answer(HttpError(400, "invalid_argument", describe_errors(exc.errors())))

    async def on_starlette(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 405:
            allow = ", ".join(_allowed_methods(request.url.path, routers))
            message = f"{request.method} is not allowed on {request.url.path} (allowed: {allow})"
            return answer(HttpError(405, "method_not_allowed", message, headers={"Allow": allow}))
        if exc.status_code == 404:
            return answer(HttpError(404, "route_not_found", f"no route {request.url.path}"))
        return answer(HttpError(exc.status_code, "http_error", str(exc.detail)))

    async def on_internal(request: Request, exc: Exception) -> Response:
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return answer(HttpError(500, "internal_error", "internal server error (see the log)"))

    app.add_exception_handler(HttpError, on_http_error)
    app.add_exception_handler(SandboxError, on_sandbox_error)
    app.add_exception_handler(RequestValidationError, on_invalid)
    app.add_exception_handler(HTTPException, on_starlette)
    app.add_exception_handler(Exception, on_internal)


def thread_lifespan(limits: HttpLimits) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """An app's lifespan that gives the event loop one worker thread per connection the server
    accepts: a route blocked on SSH never waits for a thread another connection holds."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = limits.max_connections
        yield

    return lifespan


def build_app(
    manager: ManagerLike, *, token: str, limits: HttpLimits = HTTP_LIMITS, ctx: Context | None = None
) -> Gate:
    """The native API over ``manager``, behind the bearer ``token`` and ``limits``; ``ctx``: the
    context (attached sandboxes) to share with another app of the same server."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None, lifespan=thread_lifespan(limits))
    app.state.ctx = ctx or Context(manager, SandboxCache(manager), limits, DoorPolicy.of(manager))
    app.state.document = served_document(manager)
    for router in ROUTERS:
        app.include_router(router)
    install_error_handlers(app)
    return Gate(app, token=token, limits=limits, public=PUBLIC_PATHS, realm="sandbox-rt")
