"""How ``sandbox-rt mcp`` is reached: over stdio (the MCP client starts it, one session per process)
or over streamable HTTP at ``/mcp`` (loopback by default; every request needs the bearer token, by
the same token rules as ``sandbox-rt serve``; the limits of :class:`~sandbox_rt.web.limits.HttpLimits`).

Either way, when the server stops, every sandbox its sessions still hold is destroyed first.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import signal
import threading
import types
from collections.abc import Callable, Iterable
from typing import Any

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

from ..api_token import check_token, is_loopback  # the token rules of `serve`, reused
from ..web.limits import HTTP_LIMITS, HttpLimits
from ..web.server import DEFAULT_HOST
from ..web.transport import HttpService, Site
from .server import SandboxMcp

__all__ = ["DEFAULT_PORT", "MCP_PATH", "BearerToken", "http_app", "serve_http", "serve_stdio"]

log = logging.getLogger(__name__)

DEFAULT_PORT = 8788  # `sandbox-rt serve` has 8787
MCP_PATH = "/mcp"


class BearerToken:
    """ASGI middleware: an HTTP request without ``Authorization: Bearer <token>`` (compared in
    constant time; the scheme in any case) is answered 401 before its body is read."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._token = check_token(token, "the token argument").encode("ascii")

    def authorized(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether a request's headers carry the token (the transport asks too, for the slot)."""
        values = [v for k, v in headers if k.lower() == b"authorization"]
        if len(values) != 1:
            return False
        scheme, _, given = bytes(values[0]).partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self._token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.authorized(scope.get("headers", [])):
            await self.app(scope, receive, send)
            return
        body = (
            json.dumps(
                {
                    "error": {
                        "code": "unauthorized",
                        "message": "missing or wrong bearer token (Authorization: Bearer <token>)",
                    }
                }
            ).encode()
            + b"\n"
        )
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b'Bearer realm="sandbox-rt"'),
            (b"cache-control", b"no-store"),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def http_app(
    mcp: SandboxMcp, token: str, *, host: str = DEFAULT_HOST, limits: HttpLimits = HTTP_LIMITS
) -> BearerToken:
    """The streamable-HTTP app at ``/mcp`` behind the bearer token (the SDK's DNS-rebinding checks
    stay on for a loopback ``host``)."""
    app = mcp.server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        max_request_body_size=limits.max_body_bytes,
        session_idle_timeout=mcp.options.session_idle_s,
        host=host,
    )
    return BearerToken(app, token)


def serve_http(
    mcp: SandboxMcp,
    *,
    token: str,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    limits: HttpLimits = HTTP_LIMITS,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve MCP over streamable HTTP until SIGINT/SIGTERM (blocking); ``on_ready(url)`` once
    listening (``port=0``: a free port, named in the URL). The sessions' sandboxes are destroyed on
    the way out."""
    app = http_app(mcp, token, host=host, limits=limits)
    site = Site(app, host, port, credentials=app.authorized)
    service = HttpService([site], limits=limits, name="sandbox-rt-mcp")
    if not is_loopback(host):
        log.warning("the MCP server listens on %s, not loopback: the token travels in clear text", host)
    # the service stops on SIGINT/SIGTERM (open streams are cut); while the sessions' sandboxes are
    # then destroyed, the same signals are only logged, so the process lives on to finish that
    previous = _quiet_signals() if threading.current_thread() is threading.main_thread() else {}
    try:
        if on_ready is not None:
            on_ready(f"{service.url()}{MCP_PATH}")
        service.serve_forever()
    finally:
        service.stop()
        mcp.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _quiet_signals() -> dict[signal.Signals, Any]:
    def ignore(signum: int, frame: types.FrameType | None) -> None:
        log.info("MCP server stopping (signal %d)", signum)

    return {sig: signal.signal(sig, ignore) for sig in (signal.SIGINT, signal.SIGTERM)}


def serve_stdio(mcp: SandboxMcp) -> None:
    """Serve one MCP session over stdin/stdout until the client closes stdin (blocking).

    Then the session's sandboxes are destroyed. SIGTERM, SIGHUP or SIGINT destroy them too and end
    the process (the SDK's stdin reader is a thread that a signal cannot interrupt).
    """
    if threading.current_thread() is threading.main_thread():

        def on_signal(signum: int, frame: types.FrameType | None) -> None:
            def stop() -> None:
                try:
                    mcp.close()
                finally:
                    os._exit(128 + signum)

            threading.Thread(target=stop, name="mcp-stop").start()

        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, on_signal)
    try:
        anyio.run(mcp.server.run_stdio_async)
    finally:
        mcp.close()
