"""The HTTP transport (sandbox_rt.web.transport): uvicorn's h11 protocol with the limits of
HttpLimits, and the service that runs one or more sites on one event loop.

A tiny ASGI app of this module stands in for the API; raw sockets send what a client library would
not. Timeouts are short (0.4 s) so the tests stay fast: a client that trickles bytes pauses between
them, every other wait polls a condition. Where cheap, the same attack on plain uvicorn shows the
test can fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from raw_http import WAIT, RawClient, head, poll
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from sandbox_rt.errors import ConfigError
from sandbox_rt.web.limits import HttpLimits
from sandbox_rt.web.transport import HEAD_STARTED, HttpService, Site

SHORT = 0.4  # seconds: the head, idle and I/O timeouts below
HEAD_LIMIT = 1024
LIMITS = HttpLimits(
    header_timeout_s=SHORT, idle_timeout_s=SHORT, io_timeout_s=SHORT, max_head_bytes=HEAD_LIMIT
)


# -- the app under the transport -----------------------------------------------------------------------------
class Seen:
    """One request as the app saw it."""

    def __init__(self, path: str, started: float) -> None:
        self.path, self.started = path, started
        self.events: list[str] = []
        self.answered = False


class App:
    """Routes by path: /echo (the body back), /info (JSON), /refuse (401 without reading), /stream
    (an event, silence until ``release``, an event), /hang (an event, then never more), /big
    (256 MiB). A lifespan that puts ``name`` into the state, or fails when ``fail_startup``."""

    def __init__(self, name: str = "a", *, fail_startup: bool = False) -> None:
        self.name = name
        self.fail_startup = fail_startup
        self.seen: list[Seen] = []
        self.lifespan: list[str] = []
        self.release = threading.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        seen = Seen(scope["path"], scope.get("extensions", {}).get(HEAD_STARTED, 0.0))  # none: plain uvicorn
        self.seen.append(seen)
        route = scope["path"].strip("/")
        if route == "echo":
            body = await self._body(receive, seen)
            if body is not None:
                await self._answer(send, seen, 200, body)
        elif route == "info":
            info = {"app": self.name, "state": scope["state"].get("app"), "started": seen.started}
            await self._answer(send, seen, 200, json.dumps(info).encode(), b"application/json")
        elif route == "refuse":
            await self._answer(send, seen, 401, b"no\n")
        elif route in ("stream", "hang"):
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")],
                }
            )
            await send({"type": "http.response.body", "body": b"data: first\n\n", "more_body": True})
            if route == "hang":
                await asyncio.Event().wait()  # never set: only stop() ends it
            while not self.release.is_set():
                await asyncio.sleep(0.01)
            await send({"type": "http.response.body", "body": b"data: second\n\n"})
        elif route == "big":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for _ in range(256):
                await send({"type": "http.response.body", "body": b"x" * (1 << 20), "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            await self._answer(send, seen, 404, b"")

    async def _lifespan(self, scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.lifespan.append("startup")
                if self.fail_startup:
                    await send({"type": "lifespan.startup.failed", "message": "no"})
                    return
                scope["state"]["app"] = self.name
                await send({"type": "lifespan.startup.complete"})
            else:
                self.lifespan.append("shutdown")
                await send({"type": "lifespan.shutdown.complete"})
                return

    @staticmethod
    async def _body(receive: Any, seen: Seen) -> bytes | None:
        body = b""
        while True:
            message = await receive()
            seen.events.append(message["type"])
            if message["type"] == "http.disconnect":
                return None
            body += bytes(message.get("body", b""))
            if not message.get("more_body"):
                return body

    @staticmethod
    async def _answer(send: Any, seen: Seen, status: int, body: bytes, kind: bytes = b"text/plain") -> None:
        seen.answered = True
        headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
def app() -> App:
    return App()


@contextlib.contextmanager
def serving(*sites: Site, limits: HttpLimits = LIMITS) -> Iterator[HttpService]:
    with HttpService(sites, limits=limits) as svc:
        yield svc


@pytest.fixture
def svc(app: App) -> Iterator[HttpService]:
    with serving(Site(app, "127.0.0.1", 0)) as service:
        yield service


@pytest.fixture
def client(svc: HttpService) -> Iterator[RawClient]:
    with RawClient(svc.addresses[0]) as c:
        yield c


def assert_error(raw: bytes | None, status: int, code: str) -> dict[str, Any]:
    """``raw`` is exactly one JSON error answer of the transport (and nothing after it)."""
    assert raw is not None, "the connection was not closed"
    raw_head, sep, body = raw.partition(b"\r\n\r\n")
    assert sep, raw
    status_line, *lines = raw_head.decode("ascii").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    assert status_line.startswith(f"HTTP/1.1 {status} "), raw
    assert headers["content-type"] == "application/json"
    assert headers["cache-control"] == "no-store" and headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body) and body.endswith(b"\n"), raw
    error: dict[str, Any] = json.loads(body)["error"]
    assert error["code"] == code and isinstance(error["message"], str), error
    return error


# -- 1. the head's size --------------------------------------------------------------------------------------
def filled_head(size: int) -> bytes:
    """A GET /info head of exactly ``size`` bytes."""
    bare = head("GET", "/info", {"X-Fill": ""})
    return head("GET", "/info", {"X-Fill": "f" * (size - len(bare))})


def test_a_head_at_the_limit_is_served_one_byte_more_is_431(svc: HttpService, app: App) -> None:
    with RawClient(svc.addresses[0]) as c:
        c.send(filled_head(HEAD_LIMIT))
        assert c.read_answer().status == 200
    with RawClient(svc.addresses[0]) as c:
        c.send(filled_head(HEAD_LIMIT + 1))  # whole, in one write: h11 alone would parse it
        error = assert_error(c.read_until_closed(), 431, "request_header_fields_too_large")
        assert f"the request head is larger than {HEAD_LIMIT} bytes" in error["message"]
    assert [s.path for s in app.seen] == ["/info"]


def test_an_unfinished_head_over_the_limit_is_431_at_once(client: RawClient, app: App) -> None:
    client.send(head("GET", "/info")[:-2] + b"X-Fill: " + b"f" * HEAD_LIMIT)  # no end of head
    error = assert_error(client.read_until_closed(), 431, "request_header_fields_too_large")
    assert str(HEAD_LIMIT) in error["message"] and not app.seen


@pytest.mark.parametrize("whole", [True, False])
def test_a_request_line_over_the_limit_is_414(client: RawClient, whole: bool) -> None:
    request = head("GET", "/info?q=" + "a" * HEAD_LIMIT)
    client.send(request if whole else request[: HEAD_LIMIT + 1])
    error = assert_error(client.read_until_closed(), 414, "uri_too_long")
    assert f"longer than {HEAD_LIMIT} bytes" in error["message"]


# -- 2. the head's deadline ----------------------------------------------------------------------------------
def test_a_connection_that_sends_nothing_is_closed_without_an_answer(client: RawClient) -> None:
    t0 = time.monotonic()
    assert client.read_until_closed() == b""
    assert SHORT * 0.9 < time.monotonic() - t0 < WAIT


def trickle(client: RawClient, request: bytes) -> tuple[bool, float]:
    """Send ``request`` a byte every 50 ms until the server answers or cuts; (answered, seconds)."""
    t0 = time.monotonic()
    client.sock.setblocking(False)
    try:
        for byte in request:
            with contextlib.suppress(BlockingIOError):
                if client.sock.recv(1, socket.MSG_PEEK):
                    return True, time.monotonic() - t0
            client.sock.send(bytes([byte]))
            time.sleep(SHORT / 8)  # the slow client itself: far below the I/O timeout
    except (ConnectionResetError, BrokenPipeError):
        return False, time.monotonic() - t0
    finally:
        client.sock.setblocking(True)
    raise AssertionError(f"the trickling client was never cut off ({len(request)} bytes)")


def test_a_head_sent_one_byte_at_a_time_is_cut_off_with_408(client: RawClient, app: App) -> None:
    answered, elapsed = trickle(client, head("GET", "/info", {f"X-Slow-{i}": "1" for i in range(40)}))
    assert SHORT * 0.9 < elapsed < WAIT, "cut off before the head timeout, or long after"
    assert answered, "cut off before its answer could be read"
    error = assert_error(client.read_until_closed(), 408, "request_timeout")
    assert f"{SHORT:g} s" in error["message"] and not app.seen


def test_an_idle_keep_alive_connection_is_closed_silently(app: App) -> None:
    limits = HttpLimits(idle_timeout_s=SHORT, header_timeout_s=60, io_timeout_s=60)
    with serving(Site(app, "127.0.0.1", 0), limits=limits) as svc, RawClient(svc.addresses[0]) as c:
        for _ in range(2):  # kept while in use
            c.send(head("GET", "/info"))
            assert c.read_answer().status == 200
        t0 = time.monotonic()  # a little after the server's idle clock started: the answer came first
        assert c.read_until_closed() == b""
        assert SHORT * 0.75 < time.monotonic() - t0 < WAIT


def test_idle_after_a_body_the_app_did_not_read_is_closed(app: App) -> None:
    """The app answered before the body came: uvicorn arms no keep-alive timer once it has."""
    limits = HttpLimits(idle_timeout_s=SHORT, header_timeout_s=60, io_timeout_s=60)
    with serving(Site(app, "127.0.0.1", 0), limits=limits) as svc, RawClient(svc.addresses[0]) as c:
        c.send(head("POST", "/refuse", {"Content-Length": "3"}))
        assert c.read_answer().status == 401
        t0 = time.monotonic()
        c.send(b"abc")
        assert c.read_until_closed() == b""
        assert SHORT * 0.9 < time.monotonic() - t0 < WAIT


def test_a_kept_alive_requests_head_deadline_starts_at_its_first_byte(app: App) -> None:
    limits = HttpLimits(idle_timeout_s=60, header_timeout_s=SHORT, io_timeout_s=60)
    with serving(Site(app, "127.0.0.1", 0), limits=limits) as svc, RawClient(svc.addresses[0]) as c:
        c.send(head("GET", "/info"))
        assert c.read_answer().status == 200
        assert c.still_open(2 * SHORT), "idle for longer than the head timeout, within the idle timeout"
        answered, elapsed = trickle(c, head("GET", "/info", {f"X-Slow-{i}": "1" for i in range(40)}))
        assert answered and SHORT * 0.9 < elapsed < WAIT
        assert_error(c.read_until_closed(), 408, "request_timeout")


# -- 3. framing that could be read two ways ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "status", "message"),
    [
        (b"Transfer-Encoding: chunked\r\n", 411, "no Transfer-Encoding"),
        (b"Transfer-Encoding: identity\r\nContent-Length: 3\r\n", 411, "no Transfer-Encoding"),
        (b"Content-Length: 3\r\nContent-Length: 3\r\n", 400, "more than one Content-Length header"),
        (b"Content-Length: 3\r\ncontent-length: 40\r\n", 400, "more than one Content-Length header"),
        (b"Content-Length: +3\r\n", 400, "Content-Length '+3' is not a number"),
        (b"Content-Length: \xb3\r\n", 400, "Content-Length '\u00b3' is not a number"),  # "³" in latin-1
        (b"Content-Length: 3, 3\r\n", 400, "Content-Length '3, 3' is not a number"),
        (b"Content-Length: 1234567890123456789\r\n", 400, "is not a number"),  # 19 digits
        # before h11's own error for the same head (an illegal header line)
        (b"Bad Line: 1\r\nTransfer-Encoding: chunked\r\n", 411, "no Transfer-Encoding"),
    ],
)
def test_framing_that_can_be_read_two_ways_is_refused_before_the_app(
    client: RawClient, app: App, fields: bytes, status: int, message: str
) -> None:
    client.send(b"POST /echo HTTP/1.1\r\nHost: t\r\n" + fields + b"\r\nabc\r\n0\r\n\r\n")
    error = assert_error(
        client.read_until_closed(), status, "length_required" if status == 411 else "invalid_argument"
    )
    assert message in error["message"] and not app.seen


def test_a_pipelined_request_is_checked_too(client: RawClient, app: App) -> None:
    second = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc"
    client.send(head("GET", "/info") + second)  # one write: the second head waits in h11's buffer
    assert client.read_answer().status == 200
    assert_error(client.read_until_closed(), 400, "invalid_argument")
    assert [s.path for s in app.seen] == ["/info"]


def test_a_content_length_with_spaces_around_is_fine(client: RawClient) -> None:
    client.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length:  3 \r\n\r\nabc")
    answer = client.read_answer()
    assert (answer.status, answer.body) == (200, b"abc")


# -- 4. other protocol errors, a body cut short --------------------------------------------------------------
def test_what_h11_refuses_is_a_json_400_with_its_message(
    client: RawClient, app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client.send(b"GET /info HTTP/1.1\r\nHost: t\r\nAuthorization : Bearer s3cret-token-value\r\n\r\n")
    error = assert_error(client.read_until_closed(), 400, "invalid_argument")
    assert "illegal header line" in error["message"] and not app.seen
    assert "s3cret" not in caplog.text  # never a header in the log


def test_a_body_that_ends_early_is_400_and_the_app_sees_a_disconnect(client: RawClient, app: App) -> None:
    client.send(head("POST", "/echo", {"Content-Length": "10"}) + b"abc")
    poll(lambda: app.seen and app.seen[0].events, "the app reads the body")
    client.shut_write()
    error = assert_error(client.read_until_closed(), 400, "invalid_argument")  # one answer, nothing after
    assert "the request body ended early" in error["message"] and "3 of 10 bytes" in error["message"]
    poll(lambda: app.seen[0].events[-1:] == ["http.disconnect"], "the app sees the client leave")
    assert not app.seen[0].answered


def test_a_body_that_ends_early_after_the_answer_gets_no_second_answer(client: RawClient) -> None:
    client.send(head("POST", "/refuse", {"Content-Length": "10"}) + b"abc")
    assert client.read_answer().status == 401
    client.shut_write()
    assert client.read_until_closed() == b""


def test_a_head_that_ends_early_is_400(client: RawClient, app: App) -> None:
    client.send(b"GET /info HTTP/1.1\r\nHost: t\r\n")
    client.shut_write()
    assert_error(client.read_until_closed(), 400, "invalid_argument")
    assert not app.seen


def test_a_whole_request_then_a_half_close_still_gets_its_answer(client: RawClient) -> None:
    client.send(head("POST", "/echo", {"Content-Length": "3"}) + b"abc")
    client.shut_write()
    answer = client.read_answer()
    assert (answer.status, answer.body) == (200, b"abc")
    assert client.read_until_closed() == b""


# -- 5. the connection cap -----------------------------------------------------------------------------------
def old_busy_answer(limit: int) -> bytes:
    """sandbox_rt.http_api._busy_answer before the move to ASGI, verbatim: the bytes to keep."""
    body = (
        json.dumps(
            {
                "error": {
                    "code": "server_busy",
                    "message": f"the server has {limit} connections open, its limit; retry later",
                    "limit": limit,
                }
            }
        ).encode()
        + b"\n"
    )
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Retry-After: 1\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def test_connections_beyond_the_cap_get_503_and_open_ones_keep_working(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    limits = HttpLimits(max_connections=2)
    with serving(Site(app, "127.0.0.1", 0), limits=limits) as svc:
        held = [RawClient(svc.addresses[0]), RawClient(svc.addresses[0])]
        try:
            for c in held:
                c.send(head("GET", "/info"))
                assert c.read_answer().status == 200
            assert svc.connections == 2
            with RawClient(svc.addresses[0]) as silent:  # answered without sending anything
                assert silent.read_until_closed() == old_busy_answer(2)
            with RawClient(svc.addresses[0]) as eager:  # its request already sent: a 503, not a reset
                eager.send(head("GET", "/info"))
                assert eager.read_until_closed() == old_busy_answer(2)
            with RawClient(svc.addresses[0]) as stubborn:  # half-closed, then cut after about a second
                t0 = time.monotonic()
                assert stubborn.read_until(b"}}\n").startswith(b"HTTP/1.1 503 ")

                def cut() -> bool:
                    try:
                        stubborn.send(b"x")
                    except (BrokenPipeError, ConnectionResetError):
                        return True
                    time.sleep(0.05)  # the client's own pace
                    return False

                poll(cut, "the refused connection is closed")
                assert 0.5 < time.monotonic() - t0 < WAIT
            for c in held:  # the open ones keep working
                c.send(head("GET", "/info"))
                assert c.read_answer().status == 200
            assert svc.refused == 3 and svc.connections == 2
            busy = [r for r in caplog.records if "connections open, the limit" in r.getMessage()]
            assert len(busy) == 1, "one warning per episode"
        finally:
            held.pop().close()

        def served() -> bool:  # a closed connection frees its place
            with RawClient(svc.addresses[0]) as c:
                c.send(head("GET", "/info"))
                return c.read_answer().status == 200

        poll(served, "a new connection is served")
        held[0].close()
        poll(lambda: svc.connections == 0, "every connection is counted out")


# -- 6. writes that stall, streams that are silent -----------------------------------------------------------
def test_a_client_that_stops_reading_is_cut_after_the_io_timeout(svc: HttpService, app: App) -> None:
    with RawClient(svc.addresses[0], rcvbuf=4096) as c:
        c.send(head("GET", "/big"))
        poll(lambda: app.seen, "the app answers")
        poll(lambda: svc.connections == 0, "the stalled connection is closed")


def test_a_silent_stream_outlives_every_timeout(client: RawClient, app: App) -> None:
    client.send(head("GET", "/stream"))
    assert b"data: first" in client.read_until(b"data: first\n\n")
    assert client.still_open(3 * SHORT), "a silent stream was cut"
    app.release.set()
    assert b"data: second" in client.read_until(b"data: second\n\n")


# -- 8. when the request started; 9. Expect: 100-continue; 10. headers ---------------------------------------
def test_the_app_learns_when_each_request_started(app: App) -> None:
    limits = HttpLimits(header_timeout_s=60, idle_timeout_s=60, io_timeout_s=60)
    with serving(Site(app, "127.0.0.1", 0), limits=limits) as svc:
        t0 = time.monotonic()
        with RawClient(svc.addresses[0]) as c:
            assert c.still_open(0.3)
            t1 = time.monotonic()
            c.send(head("GET", "/info"))
            first = c.read_answer().json()["started"]
            assert t0 <= first < t1, "the first request starts at the accept"
            assert c.still_open(0.3)
            request = head("GET", "/info")
            t2 = time.monotonic()
            c.send(request[:1])
            assert c.still_open(0.3)
            t3 = time.monotonic()
            c.send(request[1:])
            second = c.read_answer().json()["started"]
            assert t2 <= second < t3, "a later request starts at its first byte, not at its last"


def test_expect_100_continue_only_when_the_app_reads(client: RawClient) -> None:
    client.send(head("POST", "/refuse", {"Content-Length": "3", "Expect": "100-continue"}))
    assert client.read_answer().status == 401  # no 100 first: the client need not send its body
    client.send(b"abc")
    client.send(head("POST", "/echo", {"Content-Length": "3", "Expect": "100-continue"}))
    assert client.read_answer().status == 100
    client.send(b"xyz")
    answer = client.read_answer()
    assert (answer.status, answer.body) == (200, b"xyz")


def test_no_server_header_and_no_access_log(client: RawClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client.send(head("GET", "/info"))
    answer = client.read_answer()
    assert answer.status == 200 and "server" not in answer.headers and "date" in answer.headers
    assert not [r for r in caplog.records if r.name.startswith("uvicorn.access")]
    assert "/info" not in caplog.text


# -- plain uvicorn: the same attacks succeed -----------------------------------------------------------------
def test_plain_uvicorn_keeps_none_of_these_limits(app: App) -> None:
    """What the tests above would see without the transport's protocol (proof they can fail)."""
    config = uvicorn.Config(
        app, http="h11", ws="none", interface="asgi3", lifespan="off", log_config=None,
        h11_max_incomplete_event_size=HEAD_LIMIT, timeout_keep_alive=1,
    )  # fmt: skip
    server = uvicorn.Server(config)
    sock = socket.create_server(("127.0.0.1", 0))
    address = sock.getsockname()[:2]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        poll(lambda: server.started, "uvicorn serves")
        with RawClient(address) as c:  # an oversized head: a bare 400, no limit named
            c.send(head("GET", "/info")[:-2] + b"X-Fill: " + b"f" * HEAD_LIMIT)
            answer = c.read_answer()
            assert answer.status == 400 and answer.headers["content-type"].startswith("text/plain")
        with RawClient(address) as c:  # two Content-Length headers: merged, the app runs
            c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc")
            assert c.read_answer().status == 200
        with RawClient(address) as c:  # a body cut short: no answer at all
            c.send(head("POST", "/echo", {"Content-Length": "10"}) + b"abc")
            c.shut_write()
            assert c.read_until_closed() == b""
        with RawClient(address) as c:  # a silent new connection: no head deadline
            assert c.still_open(2 * SHORT)
    finally:
        server.should_exit = True
        thread.join(WAIT)


# -- the service ---------------------------------------------------------------------------------------------
def get_info(address: tuple[str, int]) -> dict[str, Any]:
    with RawClient(address) as c:
        c.send(head("GET", "/info"))
        answer = c.read_answer()
        assert answer.status == 200
        info: dict[str, Any] = answer.json()
        return info


def threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def test_two_sites_each_serve_their_own_app_on_one_thread() -> None:
    a, b = App("a"), App("b")
    with serving(Site(a, "127.0.0.1", 0), Site(b, "127.0.0.1", 0)) as svc:
        (_, port), (_, port_b) = svc.addresses
        assert port != 0 and port_b not in (0, port) and svc.url(0) == f"http://127.0.0.1:{port}"
        assert [get_info(address)["app"] for address in svc.addresses] == ["a", "b"]
        assert [get_info(address)["state"] for address in svc.addresses] == ["a", "b"]  # each lifespan
        assert len(threads_named(svc.name)) == 1
    assert a.lifespan == b.lifespan == ["startup", "shutdown"]


def test_stop_cuts_open_streams_at_once_and_leaves_no_thread(
    svc: HttpService, app: App, caplog: pytest.LogCaptureFixture
) -> None:
    clients = [RawClient(svc.addresses[0]) for _ in range(3)]
    try:
        for c in clients:
            c.send(head("GET", "/hang"))
            c.read_until(b"data: first\n\n")
        idle = RawClient(svc.addresses[0])
        clients.append(idle)
        poll(lambda: svc.connections == 4, "every connection is counted")
        t0 = time.monotonic()
        svc.stop()
        assert time.monotonic() - t0 < 2.0
        assert not threads_named(svc.name)
        for c in clients:
            assert c.closed_by_server(within=1.0)
        assert svc.connections == 0 and app.lifespan == ["startup", "shutdown"]
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # a cut stream is no error
        svc.stop()  # idempotent
        with pytest.raises(ConfigError, match="has stopped"):
            svc.start()
    finally:
        for c in clients:
            c.close()


def test_a_port_in_use_is_a_config_error_and_nothing_stays_bound(app: App) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken, socket.create_server(("127.0.0.1", 0)) as probe:
        busy = taken.getsockname()[1]
        free = probe.getsockname()[1]
        probe.close()
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{busy}: "):
            HttpService([Site(app, "127.0.0.1", free), Site(app, "127.0.0.1", busy)])
        socket.create_server(("127.0.0.1", free)).close()  # the first site's socket was closed


@pytest.mark.parametrize(
    ("sites", "limits", "match"),
    [
        ([], LIMITS, "at least one site"),
        ([("127.0.0.1", 70000)], LIMITS, "must be a TCP port number"),
        ([("127.0.0.1", True)], LIMITS, "must be a TCP port number"),
        ([("127.0.0.1", 0)], {"max_connections": 2}, "must be a sandbox_rt.web.limits.HttpLimits"),
    ],
)
def test_arguments_are_checked(app: App, sites: list[tuple[str, Any]], limits: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        HttpService([Site(app, host, port) for host, port in sites], limits=limits)


def test_ipv6_loopback(app: App) -> None:
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:  # a host without IPv6 (a kernel booted with ipv6.disable=1) cannot bind ::1 at all
        pytest.skip("this machine has no ::1")
    with serving(Site(app, "::1", 0)) as svc:
        port = svc.addresses[0][1]
        assert svc.addresses == [("::1", port)] and svc.url() == f"http://[::1]:{port}"
        assert get_info(svc.addresses[0])["app"] == "a"


def test_an_app_that_fails_to_start_fails_start(caplog: pytest.LogCaptureFixture) -> None:
    svc = HttpService([Site(App(fail_startup=True), "127.0.0.1", 0)], limits=LIMITS)
    port = svc.addresses[0][1]
    with pytest.raises(ConfigError, match="did not start"):
        svc.start()
    assert not threads_named(svc.name)
    socket.create_server(("127.0.0.1", port)).close()  # the socket is closed


def test_serve_forever_stops_on_sigterm_and_restores_the_handlers(app: App) -> None:
    if threading.current_thread() is not threading.main_thread():
        # a runner that runs tests in worker threads: Python delivers signals to the main thread only,
        # so what this test proves cannot happen there (pytest's own runner is the main thread: CI runs it)
        pytest.skip("signals reach the main thread only")
    caught: list[int] = []

    def ours(signum: int, frame: object) -> None:
        caught.append(signum)

    previous = signal.signal(signal.SIGTERM, ours)  # if the service did not take SIGTERM, this does
    svc = HttpService([Site(app, "127.0.0.1", 0)], limits=LIMITS)
    watchdog = threading.Timer(WAIT, svc.stop)  # the test ends even if the signal is lost

    def send_sigterm() -> None:
        poll(lambda: app.lifespan == ["startup"], "the service serves")
        get_info(svc.addresses[0])
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=send_sigterm)
    try:
        watchdog.start()
        killer.start()
        svc.serve_forever()
        assert not caught, "SIGTERM reached the previous handler while serving"
        assert signal.getsignal(signal.SIGTERM) is ours
        assert app.lifespan == ["startup", "shutdown"]
    finally:
        watchdog.cancel()
        killer.join(WAIT)
        signal.signal(signal.SIGTERM, previous)


def test_serve_forever_stops_when_another_thread_calls_stop(app: App) -> None:
    svc = HttpService([Site(app, "127.0.0.1", 0)], limits=LIMITS)

    def stop_when_serving() -> None:
        poll(lambda: app.lifespan == ["startup"], "the service serves")
        svc.stop()

    stopper = threading.Thread(target=stop_when_serving)
    stopper.start()
    svc.serve_forever()
    stopper.join(WAIT)
    assert not stopper.is_alive() and app.lifespan == ["startup", "shutdown"]


# -- what the transport depends on -----------------------------------------------------------------------
def test_the_uvicorn_internals_the_protocol_relies_on_are_there() -> None:
    """The ones the module's docstring names (the tests above fail too, less legibly)."""
    init = inspect.getsource(H11Protocol.__init__)
    for attribute in ("self.conn =", "self.app =", "self.access_log =", "self.cycle", "self.transport"):
        assert attribute in init, attribute
    events = inspect.getsource(H11Protocol.handle_events)
    assert "self.conn.next_event()" in events and "self.send_400_response(" in events
    assert "app = self.app" in events and "access_log=self.access_log" in events
    cycle = inspect.getsource(RequestResponseCycle.__init__)
    for attribute in ("disconnected", "response_started", "response_complete", "message_event"):
        assert f"self.{attribute} =" in cycle, attribute
