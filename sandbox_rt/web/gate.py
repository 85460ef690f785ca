"""The gate every HTTP request passes before its route: the bearer token, the body limits and
deadlines of :class:`~sandbox_rt.web.limits.HttpLimits`, and the request log line.

A request without a valid token (to any route but the public ones) is answered 401 without its body
being read when that body is larger than ``max_unauth_body_bytes`` (the connection is then
closed); a small one is read within the head deadline, so the connection can be kept. A body larger
than the request's limit is a 413 before a byte of it is read. Then the whole body is read (each
read stalls at most ``io_timeout_s``; ``Expect: 100-continue`` is answered only now, by the first
read) and handed to the routes, which therefore never wait on the client. Every answer gets
``Cache-Control: no-store``. The token and the other headers are never logged.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import time
import uuid
from collections.abc import Callable, Collection, Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import HttpError
from .limits import HttpLimits
from .transport import HEAD_STARTED  # when the request's first byte came (the transport sets it)

__all__ = ["HEAD_STARTED", "Gate"]

log = logging.getLogger("sandbox_rt.web")

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_UNAUTHORIZED = "missing or wrong bearer token (Authorization: Bearer <token>)"


class Gate:
    """ASGI middleware in front of an app's routes (see the module's docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str,
        limits: HttpLimits,
        public: Collection[str],
        realm: str,
        api_key_header: str | None = None,
        render: Callable[[HttpError], bytes] | None = None,
        echo_request_id: bool = False,
        chunked: bool = False,
    ) -> None:
        """``api_key_header``: a header that may carry the token as it is (besides ``Authorization:
        Bearer``); ``render``: the body of an error this gate answers (default: the native
        ``{"error": {...}}``); ``echo_request_id``: every answer carries the request's
        ``X-Request-ID`` (or a new one); ``chunked``: a body may come chunked (its transport lets
        ``Transfer-Encoding: chunked`` alone through), bounded as it is read."""
        self.app = app
        self._token = token.encode("ascii")
        self.limits = limits
        self.public = frozenset(public)
        self._challenge = f'Bearer realm="{realm}"'
        self._api_key_header = api_key_header.lower().encode("ascii") if api_key_header else None
        self._render = render or HttpError.encoded
        self._echo_request_id = echo_request_id
        self._chunked = chunked

    def authorized(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether a request's headers (names in lower case) carry the token; the transport asks
        too, for the connection's slot (:class:`~sandbox_rt.web.transport.Site`)."""
        headers = list(headers)
        if self._api_key_header is not None:
            keys = [v for k, v in headers if k == self._api_key_header]
            if len(keys) == 1 and hmac.compare_digest(bytes(keys[0]).strip(), self._token):
                return True
        values = [v for k, v in headers if k == b"authorization"]
        if len(values) != 1:
            return False
        scheme, _, given = bytes(values[0]).partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self._token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: list[int] = []
        request_id = _request_id(scope) if self._echo_request_id else None
        client = (scope.get("client") or ("-", 0))[0]

        async def send_no_store(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
                # logged before the answer leaves: a client that has it finds the line written
                log.info('%s "%s %s" %s', client, scope["method"], scope["path"], status[0])
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"cache-control" for k, _ in headers):
                    headers.append((b"cache-control", b"no-store"))
                if request_id is not None:
                    headers.append((b"x-request-id", request_id))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self._pass(scope, receive, send_no_store)
        except Exception:
            if not status:  # nothing answered yet: say so, the details go to the log only
                log.exception("internal error on %s %s", scope["method"], scope["path"])
                internal = HttpError(500, "internal_error", "internal server error (see the log)")
                await _answer(send_no_store, internal, self._render)
            # else: answered (Starlette answers, then re-raises what it answered for; logged there)
        finally:
            if not status:  # no answer at all (the client left while its body came in)
                log.info('%s "%s %s" -', client, scope["method"], scope["path"])

    async def _pass(self, scope: Scope, receive: Receive, send: Send) -> None:
        limits = self.limits
        started = scope.get("extensions", {}).get(HEAD_STARTED) or time.monotonic()
        head_deadline = started + limits.header_timeout_s
        public = scope["path"] in self.public
        authorized = public or self.authorized(scope.get("headers", []))
        try:
            length = _content_length(scope, chunked=self._chunked)  # None: chunked, length unknown
            if not authorized:
                if length is None or length > limits.max_unauth_body_bytes:  # unread: cannot be reused
                    raise self._refusal(close=True)
                await _read_body(receive, length, deadline=head_deadline, stall_s=limits.io_timeout_s)
                raise self._refusal(close=False)
            limit = limits.max_unauth_body_bytes if public else limits.max_body_bytes
            if length is not None and length > limit:
                raise _too_large(length, limit, public)
            deadline = head_deadline if public else None
            if length is None:
                body = await _read_chunked(
                    receive, limit, public, deadline=deadline, stall_s=limits.io_timeout_s
                )
            else:
                body = await _read_body(receive, length, deadline=deadline, stall_s=limits.io_timeout_s)
            if _CONTROL.search(scope["path"]):
                # a route's regex ends with "$", which Python also finds before a final newline:
                # "/healthz%0A" would be "/healthz". No route has a control character in its path.
                raise HttpError(
                    400, "invalid_argument", f"the path {scope['path']!r:.200} has a control character"
                )
        except HttpError as err:
            await _answer(send, err, self._render)
            return
        except _Disconnected:
            return  # the client left (or the transport answered a broken body itself)
        await self.app(scope, _replay(body, receive), send)

    def _refusal(self, *, close: bool) -> HttpError:
        return HttpError(
            401, "unauthorized", _UNAUTHORIZED, headers={"WWW-Authenticate": self._challenge}, close=close
        )


class _Disconnected(Exception):
    """The client went away while its body was read."""


def _too_large(length: int, limit: int, public: bool) -> HttpError:
    why = " of a request without a valid token" if public else ""
    return HttpError(
        413,
        "payload_too_large",
        f"request body of {length} bytes is larger than the limit{why}, {limit} bytes",
        extra={"limit_bytes": limit},
        close=True,
    )


def _content_length(scope: Scope, *, chunked: bool = False) -> int | None:
    """The declared body length, or None for a chunked body where ``chunked`` allows one (the
    transport has refused other and malformed framing; a server without it gets the same refusals
    here)."""
    headers = scope.get("headers", [])
    values = [v for k, v in headers if k == b"content-length"]
    encodings = [bytes(v).strip().lower() for k, v in headers if k == b"transfer-encoding"]
    if chunked and encodings == [b"chunked"] and not values:
        return None
    if encodings:
        raise HttpError(
            411,
            "length_required",
            "send the body with a Content-Length (no chunked uploads, no Transfer-Encoding)",
            close=True,
        )
    if not values:
        return 0
    if len(values) > 1:
        raise HttpError(400, "invalid_argument", "more than one Content-Length header", close=True)
    raw = bytes(values[0]).strip()
    if not raw.isdigit() or not raw.isascii() or len(raw) > 18:
        raise HttpError(400, "invalid_argument", f"Content-Length {raw!r:.40} is not a number", close=True)
    return int(raw)


async def _read_chunked(
    receive: Receive, limit: int, public: bool, *, deadline: float | None, stall_s: float
) -> bytes:
    """A chunked body of at most ``limit`` bytes (413, connection closed, once it passes it), with
    the deadlines of :func:`_read_body`."""
    chunks: list[bytes] = []
    got = 0
    more = True
    while more:
        message = await _next_message(receive, deadline, stall_s)
        chunk = message.get("body", b"")
        got += len(chunk)
        if got > limit:
            raise _too_large(got, limit, public)
        chunks.append(chunk)
        more = bool(message.get("more_body", False))
    return b"".join(chunks)


async def _next_message(receive: Receive, deadline: float | None, stall_s: float) -> Message:
    wait = stall_s if deadline is None else min(stall_s, deadline - time.monotonic())
    try:
        if wait <= 0:
            raise TimeoutError
        message = await asyncio.wait_for(receive(), wait)
    except TimeoutError:
        raise HttpError(
            408, "request_timeout", "the request body stopped arriving (connection closed)", close=True
        ) from None
    if message["type"] == "http.disconnect":
        raise _Disconnected
    return message


async def _read_body(receive: Receive, length: int, *, deadline: float | None, stall_s: float) -> bytes:
    """Exactly ``length`` bytes of body: each read waits at most ``stall_s`` and never past
    ``deadline`` (a :func:`time.monotonic` time); 408 (connection closed) when one runs out."""
    chunks: list[bytes] = []
    got = 0
    more = length > 0
    while more:
        message = await _next_message(receive, deadline, stall_s)
        chunk = message.get("body", b"")
        got += len(chunk)
        if got > length:  # the server would not pass more than Content-Length: never trust that here
            raise HttpError(
                400, "invalid_argument", "request body longer than its Content-Length", close=True
            )
        chunks.append(chunk)
        more = bool(message.get("more_body", False))
    if got != length:
        raise HttpError(
            400,
            "invalid_argument",
            f"request body ended early: {got} of {length} bytes (connection closed)",
            close=True,
        )
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the body read already, then waits on the client (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _answer(send: Send, err: HttpError, render: Callable[[HttpError], bytes]) -> None:
    body = render(err)
    await send({"type": "http.response.start", "status": err.status, "headers": err.head(len(body))})
    await send({"type": "http.response.body", "body": body})


_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")  # printable ASCII, no spaces: safe to send back


def _request_id(scope: Scope) -> bytes:
    """The request's X-Request-ID if it is a sane one, else a new one."""
    given = [v for k, v in scope.get("headers", []) if k == b"x-request-id"]
    if len(given) == 1 and _REQUEST_ID.fullmatch(bytes(given[0])):
        return bytes(given[0])
    return uuid.uuid4().hex.encode("ascii")
