"""The HTTP control API (``sandbox-rt serve``): create, list, status, exec (with SSE streaming),
files, internet, egress, snapshots and destroy over JSON, for callers that are not Python.

The routes are a FastAPI app (:mod:`sandbox_rt.web.native`, models in :mod:`sandbox_rt.web.schemas`)
served by uvicorn through the hardened transport of :mod:`sandbox_rt.web.transport`. Bound to
loopback by default; every route but ``/healthz`` and ``/openapi.json`` needs
``Authorization: Bearer <token>``. The server keeps one attached :class:`~sandbox_rt.Sandbox` per
id, so consecutive execs reuse its SSH transport. What a client may cost (head and body sizes,
connections, timeouts) is a :class:`~sandbox_rt.web.limits.HttpLimits`: a request without a valid token
never makes the server read more than a small head and a few KiB of body, nor hold a connection past
the head deadline, nor keep a client with the token out (:mod:`sandbox_rt.web.slots`). The routes,
bodies and errors are documented in ``docs/http-api.md`` and served as an OpenAPI 3.1 document
generated from the models (:func:`sandbox_rt.web.app.openapi_document`).

Usage::

    serve(sandbox_rt.Manager.from_env(), token=load_token("/etc/sandbox_rt/api.token"))  # blocks
    with ApiServer(manager, token=token, port=0) as server:  # a thread, a free port
        requests.get(server.url + "/healthz")
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from ..api_token import TOKEN_ENV, check_token, is_loopback, load_token
from ..errors import ConfigError
from ..policy import DoorPolicy
from ..protocols import ManagerLike, SandboxLike
from .app import build_app
from .errors import HttpError
from .limits import HTTP_LIMITS, HttpLimits
from .params import Context
from .runtime import SandboxCache
from .transport import HttpService, Site

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_PORT",
    "TOKEN_ENV",
    "ApiServer",
    "DoorPolicy",
    "HttpError",
    "HttpLimits",
    "ManagerLike",
    "SandboxLike",
    "load_token",
    "serve",
]

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787
DEFAULT_MAX_BODY_BYTES = HTTP_LIMITS.max_body_bytes  # the limits themselves live in web/limits.py


class ApiServer:
    """The HTTP API on ``host:port`` (port 0: a free one; see :attr:`url`).

    The socket is bound on construction; :meth:`start` serves in a background thread (tests),
    :meth:`serve_forever` in the calling one. :meth:`stop` closes the SSH connections of the
    cached sandboxes; it never destroys a sandbox. ``limits`` (default :data:`HTTP_LIMITS`) bound
    what a client may cost; ``max_body_bytes`` overrides its ``max_body_bytes``. ``policy`` says
    what clients may ask of create (default: no root, caps at most the host's defaults;
    :class:`~sandbox_rt.policy.DoorPolicy`), on both APIs.
    """

    def __init__(
        self,
        manager: ManagerLike,
        *,
        token: str,
        host: str = DEFAULT_HOST,
        port: int = 0,
        max_body_bytes: int | None = None,
        limits: HttpLimits = HTTP_LIMITS,
        opensandbox_port: int | None = None,
        policy: DoorPolicy | None = None,
    ) -> None:
        token = check_token(token, "the token argument")  # refuse to start without a usable token
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"port={port!r} must be a TCP port number")
        if not isinstance(limits, HttpLimits):
            raise ConfigError(f"limits={limits!r} must be a sandbox_rt.web.limits.HttpLimits")
        if max_body_bytes is not None:
            limits = dataclasses.replace(limits, max_body_bytes=max_body_bytes)  # validated there
        self.limits = limits
        if policy is None:
            policy = DoorPolicy.of(manager)
        elif not isinstance(policy, DoorPolicy):
            raise ConfigError(f"policy={policy!r} must be a sandbox_rt.policy.DoorPolicy")
        self.policy = policy
        # one runtime, one cache, one policy, for every site
        ctx = Context(manager, SandboxCache(manager), limits, policy)
        self.cache = ctx.cache
        native = build_app(manager, token=token, limits=limits, ctx=ctx)
        sites = [Site(native, host, port, credentials=native.authorized)]
        if opensandbox_port is not None:
            from .opensandbox.app import build_opensandbox_app

            if opensandbox_port == port and port != 0:
                raise ConfigError(f"--opensandbox-port {opensandbox_port} is the native API's port")
            # chunked bodies too: the opensandbox SDK uploads files that way
            dialect = build_opensandbox_app(ctx, token=token)
            sites.append(Site(dialect, host, opensandbox_port, chunked=True, credentials=dialect.authorized))
        self._service = HttpService(sites, limits=limits)
        if not is_loopback(host):
            log.warning("the HTTP API listens on %s, not loopback: the token travels in clear text", host)
        self._stopped = False

    @property
    def host(self) -> str:
        return self._service.addresses[0][0]

    @property
    def port(self) -> int:
        return self._service.addresses[0][1]

    @property
    def url(self) -> str:
        return self._service.url(0)

    @property
    def opensandbox_url(self) -> str | None:
        """The OpenSandbox dialect's base URL (its lifecycle API is under ``/v1``), if served."""
        return self._service.url(1) if len(self._service.addresses) > 1 else None

    @property
    def connections(self) -> int:
        """Connections open now."""
        return self._service.connections

    @property
    def refused(self) -> int:
        """New connections answered 503: ``limits.max_connections`` were open, every one with the token."""
        return self._service.refused

    def start(self) -> ApiServer:
        self._service.start()
        log.info("HTTP API listening on %s", self.url)
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until SIGINT/SIGTERM (main thread) or :meth:`stop`."""
        log.info("HTTP API listening on %s", self.url)
        try:
            self._service.serve_forever()
        finally:
            self._close()

    def stop(self) -> None:
        self._service.stop()
        self._close()

    def _close(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.cache.close_all()

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    manager: ManagerLike,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    token: str,
    max_body_bytes: int | None = None,
    limits: HttpLimits = HTTP_LIMITS,
    opensandbox_port: int | None = None,
    policy: DoorPolicy | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the HTTP API until SIGINT/SIGTERM (blocking). ``on_ready(url)`` is called once listening.

    Refuses to start (ConfigError) without a token of at least 16 characters.
    """
    server = ApiServer(
        manager,
        token=token,
        host=host,
        port=port,
        max_body_bytes=max_body_bytes,
        limits=limits,
        opensandbox_port=opensandbox_port,
        policy=policy,
    )
    try:
        if on_ready is not None:
            on_ready(server.url)
            if server.opensandbox_url is not None:
                on_ready(f"{server.opensandbox_url} (OpenSandbox)")
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("HTTP API stopping")
    finally:
        server.stop()
