"""The OpenSandbox dialect as an ASGI app: the lifecycle and execd routers behind the same
:class:`~sandbox_rt.web.gate.Gate` as the native API (its token also accepted as
``OPEN-SANDBOX-API-KEY``), errors as ``{"code", "message"}``, ``X-Request-ID`` echoed."""

from __future__ import annotations

from fastapi import FastAPI

from ..app import install_error_handlers, thread_lifespan
from ..gate import Gate
from ..params import Context
from . import execd, lifecycle, state
from .errors import render

__all__ = ["API_KEY_HEADER", "ROUTERS", "build_opensandbox_app"]

API_KEY_HEADER = "OPEN-SANDBOX-API-KEY"
ROUTERS = (lifecycle.router, execd.router)


def build_opensandbox_app(ctx: Context, *, token: str) -> Gate:
    """The dialect over the runtime of ``ctx`` (shared with the native app of the same server)."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None, lifespan=thread_lifespan(ctx.limits))
    app.state.ctx = ctx
    state.bind(ctx.manager)  # where the notes default_env reads live, before any route runs
    for router in ROUTERS:
        app.include_router(router)
    install_error_handlers(app, render, ROUTERS)
    return Gate(
        app,
        token=token,
        limits=ctx.limits,
        public=(),
        realm="sandbox-rt",
        api_key_header=API_KEY_HEADER,
        render=render,
        echo_request_id=True,
        chunked=True,  # the SDK uploads files chunked (unless use_server_proxy)
    )
