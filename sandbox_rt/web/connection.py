"""One connection of the HTTP transport (:mod:`sandbox_rt.web.transport`): uvicorn's h11 protocol
with the limits of :class:`~sandbox_rt.web.limits.HttpLimits` kept per connection.

uvicorn alone keeps none of these limits the way the API promises them: a new connection has no
head deadline at all, a connection over ``limit_concurrency`` gets plain text, an oversized head a
bare 400, duplicate Content-Length headers are merged, and a body cut short by the client's EOF
ends the connection without an answer. :class:`HttpProtocol` adds, before any app sees a request:

- a head of at most ``max_head_bytes``, whole or still arriving (414 if the request line alone is
  longer, else 431);
- a head deadline: ``header_timeout_s`` from the accept (the first request) or from the request's
  first byte (later ones); between requests ``idle_timeout_s``. Expiry with part of a head sent is
  a 408, with nothing sent a silent close;
- framing that could be read two ways is refused from the raw head bytes (411 for any
  Transfer-Encoding, 400 for several or non-numeric Content-Length headers), before h11 normalizes it;
- any other h11 error, and a body ended early by the client's EOF, as a JSON 400;
- a slot in the service's table (:mod:`sandbox_rt.web.slots`): a connection keeps it once it has
  delivered a head with the site's credentials; until then a newer connection may take it when
  the table is full (this one then gets the 503 of :func:`_busy_answer` if it has not started a
  request, else is closed); with every slot held, the new connection gets that 503 at once, then a
  half-close, so a client that already sent its request reads the 503, not a reset;
- a write stalled (the client stopped reading) for ``io_timeout_s`` closes the connection; a stream
  that merely sends nothing for a long time is never cut.

Every answer the transport writes itself is JSON (``{"error": {"code", "message"}}``) with
``Connection: close``; after it the connection is half-closed and what the client still sends is
dropped for up to :data:`_LINGER_S`. The app learns when the request began: ``time.monotonic()`` of
its first byte (the accept, for a connection's first request) is
``scope["extensions"][HEAD_STARTED]``. Nothing here logs a request or a header.

What the subclass relies on in uvicorn (0.54; tests/unit/test_web_transport.py fails if an upgrade
changes any of it): ``H11Protocol(config, server_state, app_state, _loop)`` and its attributes
``conn`` (replaced by an ``h11.Connection`` subclass before any data arrives), ``app`` (wrapped),
``access_log`` (set off: uvicorn logs access whenever the ``uvicorn.access`` logger has a handler),
``transport``, ``loop`` and ``cycle`` with the cycle's ``disconnected``, ``response_started``,
``response_complete`` and ``message_event``; ``handle_events()`` parses only through
``conn.next_event()``, hands each request to ``self.app`` and the cycle ``self.access_log``, and
answers an ``h11.RemoteProtocolError`` from ``next_event()`` by calling ``send_400_response()``
(overridden here).
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import re
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import h11
import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from .limits import HttpLimits
from .slots import Slots

__all__ = ["HEAD_STARTED", "Census", "Credentials", "HttpProtocol"]


HEAD_STARTED = "sandbox_rt.head_started"  # scope["extensions"] key: time.monotonic() of the request's start
_LINGER_S = 1.0  # after the transport's own answer: how long the client's leftovers are read and dropped
_HEAD_END = re.compile(rb"\n\r?\n")  # where h11 ends a head
_CONTENT_LENGTH = re.compile(rb"[0-9]{1,18}")  # ASCII digits only ("³" is a digit to str.isdigit)
_H11_SHORT_BODY = re.compile(r"received (\d+) bytes, expected (\d+)")  # h11's message for a cut body

# whether a request head's headers (names in lower case) carry a site's credentials
Credentials = Callable[[Iterable[tuple[bytes, bytes]]], bool]


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
    through :meth:`HttpProtocol.send_400_response` like any other protocol error."""

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

    def __init__(self, max_head: int, protocol: HttpProtocol) -> None:
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
            self._protocol.on_request(event.headers)
        return event


def _linger(transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> asyncio.TimerHandle:
    """After a final answer: half-close, keep reading (the caller drops what comes), and cut the
    connection if the client has not closed its side within :data:`_LINGER_S`."""
    if transport.can_write_eof():
        transport.write_eof()
    transport.resume_reading()
    return loop.call_later(_LINGER_S, transport.abort)


class Census:
    """The connections of one service, all sites together: their :class:`~.slots.Slots`, and the
    transports the service's ``stop()`` cuts (those that gave up their slot and linger, too)."""

    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self.slots = Slots(limits)
        self.stopping = False
        self.transports: set[asyncio.Transport] = set()
        self.busy = _busy_answer(limits.max_connections)

    def admit(self, transport: asyncio.Transport, protocol: HttpProtocol) -> bool:
        """Give a new connection a slot, or answer it 503 (and hand it to :class:`_Busy`)."""
        self.transports.add(transport)
        if self.slots.admit(protocol, transport.get_extra_info("peername")):
            return True
        busy = _Busy(self, self.busy)
        transport.set_protocol(busy)
        busy.connection_made(transport)
        return False

    def release(self, transport: asyncio.Transport, protocol: HttpProtocol) -> None:
        self.slots.release(protocol)
        self.transports.discard(transport)

    def cut_all(self) -> None:
        for transport in list(self.transports):
            transport.abort()


class _Busy(asyncio.Protocol):
    """A connection over the cap: the 503 at once, then half-closed and drained until it closes."""

    def __init__(self, census: Census, answer: bytes) -> None:
        self._census = census
        self._answer = answer
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
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

    def __init__(self, transport: asyncio.Transport, protocol: HttpProtocol) -> None:
        self._transport = transport
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        self._protocol.close_after_answer()


class HttpProtocol(H11Protocol):
    """uvicorn's h11 protocol with the limits of the module's docstring."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop,
        *,
        census: Census,
        chunked: bool = False,
        credentials: Credentials | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._census = census
        self._chunked = chunked
        self._credentials = credentials
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
        if not self._census.admit(transport, self):
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
        self._census.release(self._raw_transport, self)
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

    def on_request(self, headers: Iterable[tuple[bytes, bytes]]) -> None:
        self._request_started = self._head_started
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._credentials is None or self._credentials(headers):
            self._census.slots.hold(self)

    # -- the slot table's hook ----------------------------------------------------------------------------
    def evict(self) -> None:
        """A newer connection took this one's slot (this one never sent an authorized head): a
        request of it still being answered is cut (uvicorn tells the app); else it gets the 503 of
        a full server, which a client with a head under way reads as the answer to it."""
        if self._lingering or self._raw_transport.is_closing():
            return  # on its way out already
        if self.cycle is not None and not self.cycle.response_complete:
            self._raw_transport.abort()
        else:
            self._send_final(self._census.busy)

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
        self._send_final(_answer(status, code, message))

    def _send_final(self, answer: bytes) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self.transport.write(answer)
        if self._eof:
            self.transport.close()
        else:
            self._lingering = True
            self._linger_timer = _linger(self._raw_transport, self.loop)
