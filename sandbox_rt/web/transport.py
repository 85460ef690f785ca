"""The HTTP transport under the ASGI apps: uvicorn's h11 protocol with the limits of
:class:`~sandbox_rt.limits.HttpLimits` kept per connection, and :class:`HttpService`, which serves
one or more :class:`Site` (an address and its app) on one event loop in one thread.

uvicorn alone keeps none of these limits the way the API promises them: a new connection has no
head deadline at all, a connection over ``limit_concurrency`` gets plain text, an oversized head a
bare 400, duplicate Content-Length headers are merged, and a body cut short by the client's EOF
ends the connection without an answer. :class:`_Protocol` adds, before any app sees a request:

- a head of at most ``max_head_bytes``, whole or still arriving (414 if the request line alone is
  longer, else 431);
- a head deadline: ``header_timeout_s`` from the accept (the first request) or from the request's
  first byte (later ones); between requests ``idle_timeout_s``. Expiry with part of a head sent is
  a 408, with nothing sent a silent close;
- framing that could be read two ways is refused from the raw head bytes (411 for any
  Transfer-Encoding, 400 for several or non-numeric Content-Length headers), before h11 normalizes it;
- any other h11 error, and a body ended early by the client's EOF, as a JSON 400;
- at most ``max_connections`` open connections: the next one gets the 503 of :func:`_busy_answer`
  at once, then a half-close, so a client that already sent its request reads the 503, not a reset;
- a write stalled (the client stopped reading) for ``io_timeout_s`` closes the connection; a stream
  that merely sends nothing for a long time is never cut.

Every answer the transport writes itself is JSON (``{"error": {"code", "message"}}``) with
``Connection: close``; after it the connection is half-closed and what the client still sends is
dropped for up to :data:`_LINGER_S`. The app learns when the request began: ``time.monotonic()`` of
its first byte (the accept, for a connection's first request) is
``scope["extensions"][HEAD_STARTED]``. Nothing here logs a request or a header.

What the subclass relies on in uvicorn (0.54; tests/unit/test_web_transport.py fails if an upgrade
changes any of it):

- ``H11Protocol(config, server_state, app_state, _loop)`` and its attributes ``conn`` (replaced by
  an ``h11.Connection`` subclass before any data arrives), ``app`` (wrapped), ``access_log`` (set
  off: uvicorn logs access whenever the ``uvicorn.access`` logger has a handler), ``transport``,
  ``loop`` and ``cycle`` with the cycle's ``disconnected``, ``response_started``,
  ``response_complete`` and ``message_event``;
- ``handle_events()`` parses only through ``conn.next_event()``, hands each request to
  ``self.app`` and the cycle ``self.access_log``, and answers an ``h11.RemoteProtocolError`` from
  ``next_event()`` by calling ``send_400_response()`` (overridden here);
- ``uvicorn.server.ServerState`` (``connections``, ``tasks``, ``default_headers`` for the Date
  header) and ``Config.load()`` / ``Config.lifespan_class`` (with the lifespan's ``startup()``,
  ``shutdown()``, ``should_exit`` and ``state``), which the runner uses in place of
  ``uvicorn.Server``: that one serves one app, and cannot cut open streams at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import http
import ipaddress
import json
import logging
import re
import signal
import socket
import threading
import time
import types
from collections.abc import Sequence
from email.utils import formatdate
from typing import Any

import h11
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from ..errors import ConfigError
from ..limits import HTTP_LIMITS, HttpLimits

__all__ = ["HEAD_STARTED", "HttpService", "Site"]

log = logging.getLogger(__name__)

HEAD_STARTED = "sandbox_rt.head_started"  # scope["extensions"] key: time.monotonic() of the request's start
_BACKLOG = 128  # a burst of connections waits for accept() instead of a SYN retry
_LINGER_S = 1.0  # after the transport's own answer: how long the client's leftovers are read and dropped
_STOP_GRACE_S = 0.5  # at stop(): for the apps to notice their cut connections, then for a lifespan shutdown
_STOP_WAIT_S = 10.0  # stop() waits this long at most for the serving thread
_HEAD_END = re.compile(rb"\n\r?\n")  # where h11 ends a head
_CONTENT_LENGTH = re.compile(rb"[0-9]{1,18}")  # ASCII digits only ("³" is a digit to str.isdigit)
_H11_SHORT_BODY = re.compile(r"received (\d+) bytes, expected (\d+)")  # h11's message for a cut body


@dataclasses.dataclass(frozen=True)
class Site:
    """One listening address and the ASGI app served there (``port=0``: a free port).
    ``chunked``: a body may come as ``Transfer-Encoding: chunked`` alone (h11 decodes it; the app
    bounds it as it reads); else any Transfer-Encoding is a 411."""

    app: ASGIApp
    host: str
    port: int
    chunked: bool = False


# -- the answers the transport writes itself ------------------------------------------------------------
def _answer(
    status: int,
    code: str,
    message: str,
    *,
    extra: dict[str, Any] | None = None,
    headers: Sequence[tuple[str, str]] = (),
) -> bytes:
    """A complete JSON error response that closes the connection."""
    body = json.dumps({"error": {"code": code, "message": message, **(extra or {})}}).encode() + b"\n"
    lines = [
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *(f"{name}: {value}" for name, value in headers),
        "Cache-Control: no-store",
        "Connection: close",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body


def _busy_answer(limit: int) -> bytes:
    return _answer(
        503,
        "server_busy",
        f"the server has {limit} connections open, its limit; retry later",
        extra={"limit": limit},
        headers=[("Retry-After", "1")],
    )


class _Refused(h11.RemoteProtocolError):
    """A request the transport refuses itself; raised where h11 raises, so uvicorn answers it
    through :meth:`_Protocol.send_400_response` like any other protocol error."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message, error_status_hint=status)
        self.code = code


def _too_large(pending: bytes, limit: int) -> _Refused:
    if pending.find(b"\n", 0, limit) < 0:
        return _Refused(414, "uri_too_long", f"the request line is longer than {limit} bytes")
    return _Refused(431, "request_header_fields_too_large", f"the request head is larger than {limit} bytes")


def _head_refusal(pending: bytes, limit: int, *, chunked: bool = False) -> _Refused | None:
    """What is wrong with a request whose bytes so far are ``pending``: a head over ``limit`` bytes
    (whole or not), or a complete head whose framing could be read two ways. Read from the raw
    bytes, because h11 normalizes them (it merges "Content-Length: 3" sent twice, and "3, 3").
    ``chunked``: one ``Transfer-Encoding: chunked`` without any Content-Length is the framing."""
    end = _HEAD_END.search(pending, 0, limit + 1)
    if end is None:
        return None if len(pending) <= limit else _too_large(pending, limit)
    if end.end() > limit:
        return _too_large(pending, limit)
    lengths: list[bytes] = []
    encodings: list[bytes] = []
    for line in pending[: end.start()].split(b"\n")[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            continue  # h11 refuses it
        name = name.strip(b" \t").lower()
        if name == b"transfer-encoding":
            encodings.append(value.strip(b" \t\r").lower())
        if name == b"content-length":
            lengths.append(value.strip(b" \t\r"))
    if encodings and not (chunked and encodings == [b"chunked"] and not lengths):
        return _Refused(
            411,
            "length_required",
            "send the body with a Content-Length (no chunked uploads, no Transfer-Encoding)"
            if not chunked
            else "send the body with a Content-Length or as Transfer-Encoding: chunked alone",
        )
    if len(lengths) > 1:
        return _Refused(400, "invalid_argument", "more than one Content-Length header")
    if lengths and _CONTENT_LENGTH.fullmatch(lengths[0]) is None:
        shown = lengths[0].decode("latin-1")
        return _Refused(400, "invalid_argument", f"Content-Length {shown!r:.40} is not a number")
    return None


# -- one connection -----------------------------------------------------------------------------------------
class _Parser(h11.Connection):
    """h11's server side with two hooks: ``on_head(pending)`` before each attempt to parse a request
    head (it may raise :class:`_Refused`) and ``on_request()`` once one is parsed. The last protocol
    error is kept in :attr:`error`, for the answer."""

    def __init__(self, max_head: int, protocol: _Protocol) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_head)
        self._protocol = protocol
        self.error: h11.RemoteProtocolError | None = None

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        try:
            if self.their_state is h11.IDLE:
                pending = self.trailing_data[0]  # a copy: at most max_head bytes and one read
                if pending:
                    self._protocol.on_head(pending)
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            self.error = exc
            raise
        if isinstance(event, h11.Request):
            self._protocol.on_request()
        return event


def _linger(transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> asyncio.TimerHandle:
    """After a final answer: half-close, keep reading (the caller drops what comes), and cut the
    connection if the client has not closed its side within :data:`_LINGER_S`."""
    if transport.can_write_eof():
        transport.write_eof()
    transport.resume_reading()
    return loop.call_later(_LINGER_S, transport.abort)


class _Census:
    """The connections of one service, all sites together: the cap, the counters, and the
    transports :meth:`HttpService.stop` cuts."""

    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self.open = 0
        self.refused = 0
        self.stopping = False
        self.transports: set[asyncio.Transport] = set()
        self._saturated = False
        self._busy = _busy_answer(limits.max_connections)

    def admit(self, transport: asyncio.Transport) -> bool:
        """Count a new connection in, or answer it 503 (and hand it to :class:`_Busy`)."""
        if self.open < self.limits.max_connections:
            self.open += 1
            self._saturated = False
            self.transports.add(transport)
            return True
        self.refused += 1
        if not self._saturated:  # once per episode, not once per connection
            self._saturated = True
            log.warning(
                "%d connections open, the limit: new connections get 503 until one closes",
                self.limits.max_connections,
            )
        busy = _Busy(self, self._busy)
        transport.set_protocol(busy)
        busy.connection_made(transport)
        return False

    def release(self, transport: asyncio.Transport) -> None:
        self.open -= 1
        self.transports.discard(transport)

    def cut_all(self) -> None:
        for transport in list(self.transports):
            transport.abort()


class _Busy(asyncio.Protocol):
    """A connection over the cap: the 503 at once, then half-closed and drained until it closes."""

    def __init__(self, census: _Census, answer: bytes) -> None:
        self._census = census
        self._answer = answer
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._census.transports.add(transport)
        transport.write(self._answer)
        self._timer = _linger(transport, asyncio.get_running_loop())

    def data_received(self, data: bytes) -> None:
        pass  # dropped: the client's request is not served

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._transport is not None:
            self._census.transports.discard(self._transport)


class _ClosesAfterTheBody:
    """The transport as uvicorn sees it, but for ``close()``: an app that answered (and closed)
    before the client's body came in, e.g. a 401 or 413 that never reads it, gets the half-close
    and linger of the transport's own answers. A plain close with unread input would reset the
    connection, and a reset can destroy the answer before the client has read it."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport = transport
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        self._protocol.close_after_answer()


class _Protocol(H11Protocol):
    """uvicorn's h11 protocol with the limits of the module's docstring."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop,
        *,
        census: _Census,
        chunked: bool = False,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._census = census
        self._chunked = chunked
        self._limits = census.limits
        self._parser = _Parser(self._limits.max_head_bytes, self)
        self.conn = self._parser
        self.access_log = False  # uvicorn logs access whenever its logger has a handler; the app logs
        self._app = self.app
        self.app = self._app_with_start
        self._head_started = 0.0  # time.monotonic() of the current request's first byte
        self._request_started = 0.0  # the same for the request handed to the app last
        self._head_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._stall_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._lingering = False  # the transport has answered: the rest of the input is dropped
        self._eof = False  # the client has closed its side
        self._eof_in_body = False

    # -- asyncio's protocol interface ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if not self._census.admit(transport):
            return
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # the head and the body are separate writes: without this, Nagle + delayed ACK add ~40 ms
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._raw_transport = transport
        self.transport = _ClosesAfterTheBody(transport, self)  # type: ignore[assignment]
        self._arm_head_timer(time.monotonic())

    def close_after_answer(self) -> None:
        """Close, or, while the client is still sending a body nobody will read, half-close and
        drop the rest for up to :data:`_LINGER_S`."""
        transport = self._raw_transport
        if self.conn.their_state is h11.SEND_BODY and not self._eof and not transport.is_closing():
            if not self._lingering:
                self._lingering = True
                self._linger_timer = _linger(transport, self.loop)
            return
        transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._census.release(self._raw_transport)
        for timer in (self._head_timer, self._idle_timer, self._stall_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if not self._lingering:
            super().data_received(data)

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio's signature
        """The client closed its side. h11 is told (uvicorn does not), so a head or a body cut
        short is answered 400; a request already complete still gets its answer."""
        self._eof = True
        if self._lingering:
            return None  # our answer is out: close
        self._eof_in_body = self.conn.their_state is h11.SEND_BODY
        self.conn.receive_data(b"")
        self.handle_events()
        return True  # the transport stays open for writing; whoever answers last closes it

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall_timer is None:  # the client stopped reading
            self._stall_timer = self.loop.call_later(self._limits.io_timeout_s, self.transport.abort)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    # -- uvicorn's hooks ----------------------------------------------------------------------------------
    def handle_events(self) -> None:
        if self._lingering:
            return
        if self._eof and self.conn.their_state is not h11.SEND_BODY and not self.conn.trailing_data[0]:
            # nothing left that h11 could parse (it would report ConnectionClosed, which uvicorn's
            # loop does not expect): between requests the connection is done; during one, the
            # answer still goes out and uvicorn closes the connection after it
            if self.conn.their_state is h11.IDLE:
                self.transport.close()
            return
        super().handle_events()
        if (
            self.conn.their_state is h11.IDLE
            and self.conn.our_state is h11.IDLE
            and self._head_timer is None
            and self._idle_timer is None
            and not self._lingering
            and not self.transport.is_closing()
        ):  # between two requests, nothing of the next one yet (uvicorn's keep-alive timer does the
            # same after a response, but not when the response went out before the request's body)
            self._idle_timer = self.loop.call_later(self._limits.idle_timeout_s, self._idle_expired)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to an h11 protocol error (plain text), as the transport's JSON answer:
        a refusal of :func:`_head_refusal`, a body ended early, or h11's own message."""
        exc, self._parser.error = self._parser.error, None
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:  # this request's app runs: it must not answer
            cycle.disconnected = True
            cycle.message_event.set()
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):  # the request has (part of) an answer
            self.transport.close()
            return
        if isinstance(exc, _Refused):
            self._refuse(exc.error_status_hint, exc.code, str(exc))
        elif exc is not None and exc.error_status_hint == 431:
            refusal = _too_large(self.conn.trailing_data[0], self._limits.max_head_bytes)
            self._refuse(refusal.error_status_hint, refusal.code, str(refusal))
        elif self._eof_in_body:
            counts = _H11_SHORT_BODY.search(str(exc))
            after = f" after {counts[1]} of {counts[2]} bytes" if counts else ""
            why = f"the request body ended early: the client closed the connection{after}"
            self._refuse(400, "invalid_argument", why)
        else:
            self._refuse(400, "invalid_argument", f"{exc or msg}"[:300])

    # -- the parser's hooks -------------------------------------------------------------------------------
    def on_head(self, pending: bytes) -> None:
        """Before h11 parses a head from ``pending``: start its deadline at its first byte (on a
        kept-alive connection), refuse it (raise) if it is too large or ambiguous."""
        if self._head_timer is None:
            self._arm_head_timer(time.monotonic())
        refusal = _head_refusal(pending, self._limits.max_head_bytes, chunked=self._chunked)
        if refusal is not None:
            raise refusal

    def on_request(self) -> None:
        self._request_started = self._head_started
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    # -- helpers ------------------------------------------------------------------------------------------
    async def _app_with_start(self, scope: Scope, receive: Receive, send: Send) -> None:
        # the task starts before another head of this connection can be parsed (that waits for
        # this response), so _request_started is still this request's
        extensions = scope.get("extensions")
        if extensions is None:
            extensions = scope["extensions"] = {}
        extensions[HEAD_STARTED] = self._request_started
        try:
            await self._app(scope, receive, send)
        except asyncio.CancelledError:
            if not self._census.stopping:
                raise  # else: cut by stop(), which is no error of the app

    def _arm_head_timer(self, started: float) -> None:
        self._head_started = started
        delay = started + self._limits.header_timeout_s - time.monotonic()
        self._head_timer = self.loop.call_later(max(delay, 0.0), self._head_expired)

    def _idle_expired(self) -> None:
        self._idle_timer = None
        if self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0] and not self._lingering:
            self.transport.close()  # idle too long: closed without an answer, as keep-alive allows

    def _head_expired(self) -> None:
        self._head_timer = None
        if self._lingering or self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            limit = self._limits.header_timeout_s
            self._refuse(408, "request_timeout", f"the request head did not arrive within {limit:g} s")
        else:
            self.transport.close()  # nothing sent: closed without an answer

    def _refuse(self, status: int, code: str, message: str) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self.transport.write(_answer(status, code, message))
        if self._eof:
            self.transport.close()
        else:
            self._lingering = True
            self._linger_timer = _linger(self._raw_transport, self.loop)


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
            raise ConfigError(f"limits={limits!r} must be a sandbox_rt.limits.HttpLimits")
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
        self._census = _Census(limits)
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
        return self._census.open

    @property
    def refused(self) -> int:
        """Connections answered 503 because ``limits.max_connections`` were open."""
        return self._census.refused

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
                    _Protocol, config, state, lifespan.state, loop, census=self._census, chunked=site.chunked
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
