"""The HTTP transport under the ASGI apps: :class:`HttpService` serves one or more :class:`Site`
(an address and its app) on one event loop in one thread, each connection through the hardened
uvicorn h11 protocol of :mod:`sandbox_rt.web.connection` (the limits of
:class:`~sandbox_rt.web.limits.HttpLimits`), all sites sharing one table of connection slots
(:mod:`sandbox_rt.web.slots`: a connection without the token gives way to a new one).

What the service relies on in uvicorn (0.54; tests/unit/test_web_transport.py fails if an upgrade
changes any of it), besides what the protocol does: ``uvicorn.server.ServerState`` (``connections``,
``tasks``, ``default_headers`` for the Date header) and ``Config.load()`` /
``Config.lifespan_class`` (with the lifespan's ``startup()``, ``shutdown()``, ``should_exit`` and
``state``), which the runner uses in place of ``uvicorn.Server``: that one serves one app, and
cannot cut open streams at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import ipaddress
import logging
import signal
import socket
import threading
import types
from collections.abc import Sequence
from email.utils import formatdate
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.server import ServerState

from ..errors import ConfigError
from .connection import HEAD_STARTED, Census, Credentials, HttpProtocol
from .limits import HTTP_LIMITS, HttpLimits

__all__ = ["HEAD_STARTED", "Credentials", "HttpService", "Site"]

log = logging.getLogger(__name__)

_BACKLOG = 128  # a burst of connections waits for accept() instead of a SYN retry
_STOP_GRACE_S = 0.5  # at stop(): for the apps to notice their cut connections, then for a lifespan shutdown
_STOP_WAIT_S = 10.0  # stop() waits this long at most for the serving thread


@dataclasses.dataclass(frozen=True)
class Site:
    """One listening address and the ASGI app served there (``port=0``: a free port).
    ``chunked``: a body may come as ``Transfer-Encoding: chunked`` alone (h11 decodes it; the app
    bounds it as it reads); else any Transfer-Encoding is a 411. ``credentials``: whether a
    request's headers carry the app's token (the app still checks it); a connection that sent one
    keeps its slot, the others give way to new ones when the table is full. None (an app without
    credentials): any complete head keeps the slot."""

    app: ASGIApp
    host: str
    port: int
    chunked: bool = False
    credentials: Credentials | None = None


# -- the service --------------------------------------------------------------------------------------------
def _listen(host: str, port: int) -> socket.socket:
    if not isinstance(host, str):
        raise ConfigError(f"host={host!r} must be an address or a name")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"port={port!r} must be a TCP port number")
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET  # a name
    try:
        return socket.create_server((host, port), family=family, backlog=_BACKLOG)  # SO_REUSEADDR
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


def _config(app: ASGIApp, limits: HttpLimits) -> uvicorn.Config:
    config = uvicorn.Config(
        app,
        http="h11",
        ws="none",
        interface="asgi3",
        lifespan="auto",
        log_config=None,  # the process's logging stays as it is
        access_log=False,  # the app logs its requests
        server_header=False,
        proxy_headers=False,  # nothing sits in front: X-Forwarded-For is the client's word
        h11_max_incomplete_event_size=limits.max_head_bytes,
        # uvicorn's keep-alive timer: the same as the protocol's own idle timer (a float works: call_later)
        timeout_keep_alive=limits.idle_timeout_s,  # type: ignore[arg-type]
    )
    config.load()
    return config


async def _keep_date(state: ServerState) -> None:
    while True:
        state.default_headers = [(b"date", formatdate(usegmt=True).encode("ascii"))]
        await asyncio.sleep(1)


class HttpService:
    """Serves ``sites`` (their apps' lifespans included) on one event loop in one thread, with the
    limits of the module's docstring; ``limits.max_connections`` counts every site's connections.

    The sockets are bound here (``ConfigError`` if one cannot be). :meth:`start` serves in a daemon
    thread, :meth:`serve_forever` in the calling one; :meth:`stop` cuts every open connection at
    once (a stream too) and returns within about two seconds. A stopped service cannot restart.
    """

    def __init__(
        self, sites: Sequence[Site], *, limits: HttpLimits = HTTP_LIMITS, name: str = "sandbox-rt-http"
    ) -> None:
        if not isinstance(limits, HttpLimits):
            raise ConfigError(f"limits={limits!r} must be a sandbox_rt.web.limits.HttpLimits")
        self._sites = tuple(sites)
        if not self._sites:
            raise ConfigError("an HTTP service needs at least one site")
        self.limits = limits
        self.name = name
        self._sockets: list[socket.socket] = []
        try:
            for site in self._sites:
                self._sockets.append(_listen(site.host, site.port))
        except BaseException:
            self._close_sockets()
            raise
        self._addresses = [(str(a[0]), int(a[1])) for a in (s.getsockname() for s in self._sockets)]
        self._census = Census(limits)
        self._lock = threading.RLock()  # RLock: a signal handler may take it in the thread that holds it
        self._state = "new"  # then "serving", then "stopped"
        self._stop_requested = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._loop_thread: int | None = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._done = threading.Event()

    # -- what it serves -------------------------------------------------------------------------------------
    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The bound ``(host, port)`` of each site, in order."""
        return list(self._addresses)

    def url(self, index: int = 0) -> str:
        host, port = self._addresses[index]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def connections(self) -> int:
        """Connections open now (all sites)."""
        return self._census.slots.open

    @property
    def refused(self) -> int:
        """New connections answered 503: ``limits.max_connections`` were open, every one held."""
        return self._census.slots.refused

    @property
    def evicted(self) -> int:
        """Connections that gave up their slot to a newer one (none had sent an authorized head)."""
        return self._census.slots.evicted

    # -- running ------------------------------------------------------------------------------------------
    def start(self) -> HttpService:
        """Serve in a daemon thread; returns once every site accepts (its app's startup done)."""
        with self._lock:
            if self._state == "serving":
                return self
            self._begin()
        ready = threading.Event()
        thread = threading.Thread(target=self._serve_in_thread, args=(ready,), name=self.name, daemon=True)
        self._thread = thread
        thread.start()
        ready.wait()
        failure = self._failure
        if failure is not None:
            thread.join()
            if isinstance(failure, ConfigError):
                raise failure
            raise ConfigError(f"the HTTP service {self.name} did not start: {failure}") from failure
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until :meth:`stop` (from another thread), a KeyboardInterrupt
        (which then propagates) or, in the main thread, SIGTERM or SIGINT; the signal handlers found
        are restored after."""
        self._begin()
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._run(None)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def stop(self) -> None:
        """Stop accepting, cut every open connection, end the apps' lifespans and wait for the
        serving thread. Idempotent."""
        with self._lock:
            never_served = self._state == "new"
            if never_served:
                self._state = "stopped"
        if never_served:
            self._close_sockets()
            self._done.set()
            return
        self._request_stop()
        if threading.get_ident() == self._loop_thread:
            return  # called by an app: the loop stops once this call returns
        thread = self._thread
        if thread is not None:
            thread.join(_STOP_WAIT_S)
            finished = not thread.is_alive()
        else:
            finished = self._done.wait(_STOP_WAIT_S)
        if not finished:
            log.warning("the HTTP service %s did not stop within %g s", self.name, _STOP_WAIT_S)

    def __enter__(self) -> HttpService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- inside ---------------------------------------------------------------------------------------------
    def _begin(self) -> None:
        with self._lock:
            if self._state == "stopped":
                raise ConfigError(f"the HTTP service {self.name} has stopped; make a new one")
            if self._state == "serving":
                raise ConfigError(f"the HTTP service {self.name} is serving already")
            self._state = "serving"

    def _on_signal(self, signum: int, frame: types.FrameType | None) -> None:
        log.info("the HTTP service %s stops (signal %d)", self.name, signum)
        self._request_stop()

    def _request_stop(self) -> None:
        with self._lock:
            self._stop_requested = True
            loop, event = self._loop, self._stop_event
        if loop is not None and event is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed meanwhile
                loop.call_soon_threadsafe(event.set)

    def _serve_in_thread(self, ready: threading.Event) -> None:
        try:
            self._run(ready)
        except Exception:
            log.exception("the HTTP service %s failed", self.name)

    def _run(self, ready: threading.Event | None) -> None:
        """Run the loop until stopped. A failure before every site accepts is kept for
        :meth:`start` when ``ready`` is given, else raised."""
        self._loop_thread = threading.get_ident()
        try:
            with asyncio.Runner() as runner:
                runner.run(self._serve(ready))
        except BaseException as exc:
            if ready is None or ready.is_set():
                raise
            self._failure = exc
        finally:
            with self._lock:
                self._state, self._loop, self._stop_event = "stopped", None, None
            self._close_sockets()
            self._done.set()
            if ready is not None:
                ready.set()

    async def _serve(self, ready: threading.Event | None) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        with self._lock:
            self._loop, self._stop_event = loop, stop
            if self._stop_requested:
                stop.set()
        state = ServerState()
        servers: list[asyncio.Server] = []
        lifespans: list[Any] = []
        dates = loop.create_task(_keep_date(state))
        try:
            for index, (site, sock) in enumerate(zip(self._sites, self._sockets, strict=True)):
                config = _config(site.app, self.limits)
                lifespan = config.lifespan_class(config)
                lifespans.append(lifespan)
                await lifespan.startup()
                if lifespan.should_exit:
                    raise ConfigError(f"the app at {self.url(index)} did not start (see the log)")
                factory = functools.partial(
                    HttpProtocol,
                    config,
                    state,
                    lifespan.state,
                    loop,
                    census=self._census,
                    chunked=site.chunked,
                    credentials=site.credentials,
                )
                servers.append(await loop.create_server(factory, sock=sock, backlog=_BACKLOG))
            if ready is not None:
                ready.set()
            await stop.wait()
        finally:
            await self._shut_down(servers, state, lifespans)
            dates.cancel()

    async def _shut_down(
        self, servers: list[asyncio.Server], state: ServerState, lifespans: list[Any]
    ) -> None:
        """Stop accepting, cut every connection, give the apps a moment to see it (then cancel
        them), and end the lifespans: about a second in all, however many streams are open."""
        self._census.stopping = True
        for server in servers:
            server.close()
        self._census.cut_all()
        if state.tasks:
            _done, pending = await asyncio.wait(set(state.tasks), timeout=_STOP_GRACE_S)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=_STOP_GRACE_S)
        for lifespan in reversed(lifespans):
            try:
                await asyncio.wait_for(lifespan.shutdown(), _STOP_GRACE_S)
            except TimeoutError:
                log.warning("an app's shutdown did not finish within %g s", _STOP_GRACE_S)
        self._census.cut_all()  # one accepted while the servers closed
        await asyncio.sleep(0)  # their connection_lost

    def _close_sockets(self) -> None:
        for sock in self._sockets:
            sock.close()
