"""What one client may cost the HTTP API (issue 23, item 8): small bodies before the token is
checked, framing that cannot be read two ways, a head size and deadline (slowloris), an idle
timeout, a connection cap, fullmatch validation, and the token file's mode and owner.

A real server on loopback with the fake manager of test_http_api; raw sockets where a well-behaved
client library would hide the attack. Timeouts are configured small so the tests stay fast; a client
that trickles bytes pauses between them, every other wait polls a condition.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st
from test_http_api import AUTH, TOKEN, FakeManager

from sandbox_rt import ConfigError
from sandbox_rt.web.app import openapi_document
from sandbox_rt.web.limits import HTTP_LIMITS, HttpLimits
from sandbox_rt.web.server import ApiServer, load_token

SHORT = 0.4  # seconds: the head, idle and I/O timeouts of the servers below
WAIT = 10.0  # seconds: the most any answer below may take (a bound, never a pause)


# -- a raw HTTP/1.1 client ------------------------------------------------------------------------------
def connect(srv: ApiServer) -> socket.socket:
    sock = socket.create_connection((srv.host, srv.port), timeout=WAIT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def head(method: str, path: str, headers: dict[str, str] | None = None, *, auth: bool = True) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test"]
    lines += [f"{k}: {v}" for k, v in {**(AUTH if auth else {}), **(headers or {})}.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def error(self) -> dict[str, Any]:
        err: dict[str, Any] = json.loads(self.body)["error"]
        return err


def read_answer(sock: socket.socket) -> Answer:
    """One response (status line, headers, Content-Length body); 1xx answers are returned too."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection before answering (got {buf!r:.200})"
        buf += chunk
    raw_head, _, rest = buf.partition(b"\r\n\r\n")
    status_line, *header_lines = raw_head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection in the middle of the body"
        rest += chunk
    return Answer(int(status_line.split()[1]), headers, rest[:length])


def closed_by_server(sock: socket.socket, within: float = WAIT) -> bool:
    """True once the server has closed the connection (EOF or reset), False if still open after ``within``."""
    sock.settimeout(within)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def still_open(sock: socket.socket, for_s: float) -> bool:
    """Nothing arrives and the connection stays open for ``for_s`` seconds (the thing under test)."""
    readable, _, _ = select.select([sock], [], [], for_s)
    return not readable


# -- fixtures --------------------------------------------------------------------------------------------
@pytest.fixture
def mgr() -> FakeManager:
    return FakeManager()


@pytest.fixture
def short() -> HttpLimits:
    return HttpLimits(header_timeout_s=SHORT, idle_timeout_s=SHORT, io_timeout_s=SHORT)


@pytest.fixture
def srv(mgr: FakeManager, short: HttpLimits) -> Iterator[ApiServer]:
    with ApiServer(mgr, token=TOKEN, port=0, limits=short) as server:
        yield server


@pytest.fixture
def sock(srv: ApiServer) -> Iterator[socket.socket]:
    s = connect(srv)
    yield s
    s.close()


# -- bodies without a valid token ------------------------------------------------------------------------
def test_a_public_route_reads_at_most_a_few_kib(srv: ApiServer, sock: socket.socket) -> None:
    limit = HTTP_LIMITS.max_unauth_body_bytes
    assert limit <= 8 << 10
    sock.sendall(head("GET", "/healthz", {"Content-Length": str(limit)}, auth=False) + b"x" * limit)
    assert read_answer(sock).status == 200  # at the limit: read, and the connection kept
    big = 64 << 10
    sock.sendall(head("GET", "/healthz", {"Content-Length": str(big)}, auth=False) + b"x" * big)
    answer = read_answer(sock)
    assert answer.status == 413 and answer.headers["connection"] == "close"
    assert answer.error()["code"] == "payload_too_large" and answer.error()["limit_bytes"] == limit
    assert "without a valid token" in answer.error()["message"]
    assert closed_by_server(sock)


def test_a_refused_token_never_waits_for_a_large_body(srv: ApiServer, sock: socket.socket) -> None:
    """401 at once, without reading (or waiting for) a body larger than the small limit: the
    declared 60 KiB never arrive, and the answer must not wait for them."""
    sock.sendall(head("POST", "/v1/sandboxes", {"Content-Length": str(60 << 10)}, auth=False))
    answer = read_answer(sock)
    assert answer.status == 401 and answer.headers["connection"] == "close"
    assert closed_by_server(sock)


def test_a_refused_token_drains_a_small_body_and_keeps_the_connection(
    srv: ApiServer, sock: socket.socket
) -> None:
    sock.sendall(head("POST", "/v1/sandboxes", {"Content-Length": "100"}, auth=False) + b"{" * 100)
    answer = read_answer(sock)
    assert answer.status == 401 and "connection" not in answer.headers
    sock.sendall(head("GET", "/v1/sandboxes"))
    assert read_answer(sock).status == 200


def test_a_large_body_with_the_token_keeps_the_documented_limit(mgr: FakeManager) -> None:
    with ApiServer(mgr, token=TOKEN, port=0) as srv:
        sid = mgr.create().id
        blob = os.urandom(1 << 20)  # far above the unauthenticated limit
        r = requests.put(f"{srv.url}/v1/sandboxes/{sid}/files?path=/a", data=blob, headers=AUTH, timeout=WAIT)
        assert r.status_code == 200 and mgr.boxes[sid].files["/a"] == blob
        r = requests.put(f"{srv.url}/v1/sandboxes/{sid}/files?path=/a", data=blob, timeout=WAIT)
        assert r.status_code == 401 and mgr.boxes[sid].files["/a"] == blob


def test_expect_100_continue_only_after_the_token(srv: ApiServer, mgr: FakeManager) -> None:
    sid = mgr.create().id
    path = f"/v1/sandboxes/{sid}/files?path=/x"
    with contextlib.closing(connect(srv)) as s:  # wrong token: the final answer, no "100 Continue"
        s.sendall(head("PUT", path, {"Content-Length": str(10 << 20), "Expect": "100-continue"}, auth=False))
        answer = read_answer(s)
        assert answer.status == 401 and answer.headers["connection"] == "close"
        assert closed_by_server(s)
    with contextlib.closing(connect(srv)) as s:  # valid token: 100, then the body, then 200
        s.sendall(head("PUT", path, {"Content-Length": "5", "Expect": "100-continue"}))
        assert read_answer(s).status == 100
        s.sendall(b"hello")
        assert read_answer(s).status == 200 and mgr.boxes[sid].files["/x"] == b"hello"


# -- framing ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({"Transfer-Encoding": "chunked"}, 411, "length_required"),
        ({"Transfer-Encoding": "chunked", "Content-Length": "3"}, 411, "length_required"),
        ({"Content-Length": "+3"}, 400, "invalid_argument"),
        ({"Content-Length": "\u00b3"}, 400, "invalid_argument"),  # "³": str.isdigit() says yes
        ({"Content-Length": "3, 3"}, 400, "invalid_argument"),
    ],
)
@pytest.mark.parametrize("auth", [True, False])
def test_framing_that_can_be_read_two_ways_is_refused_and_closed(
    srv: ApiServer, sock: socket.socket, headers: dict[str, str], status: int, code: str, auth: bool
) -> None:
    path = "/v1/sandboxes" if auth else "/healthz"
    sock.sendall(head("POST" if auth else "GET", path, headers, auth=auth) + b"3\r\nabc\r\n0\r\n\r\n")
    answer = read_answer(sock)
    assert (answer.status, answer.error()["code"]) == (status, code), answer.body
    assert answer.headers["connection"] == "close"
    assert closed_by_server(sock)


def test_two_content_lengths_are_refused(srv: ApiServer, sock: socket.socket) -> None:
    """A proxy that reads the second one would see a different request than the server."""
    sock.sendall(
        b"POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "
        + TOKEN.encode()
        + b"\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\n{}"
    )
    answer = read_answer(sock)
    assert answer.status == 400 and "more than one Content-Length" in answer.error()["message"]
    assert answer.headers["connection"] == "close" and closed_by_server(sock)


@pytest.mark.parametrize("auth", [True, False])
def test_a_content_length_that_lies_is_408_after_a_bounded_time(
    srv: ApiServer, mgr: FakeManager, sock: socket.socket, auth: bool
) -> None:
    sid = mgr.create().id
    method, path = ("PUT", f"/v1/sandboxes/{sid}/files?path=/x") if auth else ("GET", "/healthz")
    sock.sendall(head(method, path, {"Content-Length": "100"}, auth=auth) + b"only ten b")
    t0 = time.monotonic()
    answer = read_answer(sock)
    assert answer.status == 408 and answer.error()["code"] == "request_timeout"
    assert answer.headers["connection"] == "close" and closed_by_server(sock)
    assert time.monotonic() - t0 < WAIT
    assert "/x" not in mgr.boxes[sid].files


def test_a_body_that_ends_early_is_400_and_closed(
    srv: ApiServer, mgr: FakeManager, sock: socket.socket
) -> None:
    sid = mgr.create().id
    sock.sendall(head("PUT", f"/v1/sandboxes/{sid}/files?path=/x", {"Content-Length": "100"}) + b"short")
    sock.shutdown(socket.SHUT_WR)
    answer = read_answer(sock)
    assert answer.status == 400 and "ended early" in answer.error()["message"]
    assert closed_by_server(sock) and "/x" not in mgr.boxes[sid].files


# -- the request head --------------------------------------------------------------------------------------
def test_a_head_larger_than_the_limit_is_431_and_closed(srv: ApiServer, sock: socket.socket) -> None:
    limit = HTTP_LIMITS.max_head_bytes
    filler = {f"X-Filler-{i}": "f" * 500 for i in range(limit // 500 + 1)}  # many short lines
    sock.sendall(head("GET", "/healthz", filler, auth=False))
    answer = read_answer(sock)
    assert answer.status == 431 and str(limit) in answer.error()["message"]
    assert answer.headers["connection"] == "close" and closed_by_server(sock)


def test_a_request_line_longer_than_the_limit_is_414(srv: ApiServer, sock: socket.socket) -> None:
    sock.sendall(head("GET", "/v1/sandboxes?label=" + "a" * HTTP_LIMITS.max_head_bytes))
    answer = read_answer(sock)
    assert answer.status == 414 and answer.headers["connection"] == "close"
    assert closed_by_server(sock)


def test_a_head_sent_one_byte_at_a_time_is_cut_off(srv: ApiServer, sock: socket.socket) -> None:
    """Slowloris: every byte comes well within the I/O timeout, the whole head never does. The
    server answers 408 and closes once the head timeout has passed since the connection opened."""
    t0 = time.monotonic()
    request = head("GET", "/v1/sandboxes", {f"X-Slow-{i}": "1" for i in range(200)})
    sent, answered, reset = 0, False, False
    sock.setblocking(False)
    try:
        while time.monotonic() - t0 < WAIT and sent < len(request):
            with contextlib.suppress(BlockingIOError):
                if sock.recv(65536, socket.MSG_PEEK):  # the server answered
                    answered = True
                    break
            sock.send(request[sent : sent + 1])
            sent += 1
            time.sleep(SHORT / 8)  # the trickle: a byte every 50 ms, far below the I/O timeout
    except (ConnectionResetError, BrokenPipeError):
        reset = True  # cut off before its answer could be read: also a pass
    elapsed = time.monotonic() - t0
    assert answered or reset, f"the trickling client was never cut off ({sent} bytes in {elapsed:.1f} s)"
    assert elapsed > SHORT * 0.9, "cut off before the head timeout"
    if answered:
        sock.settimeout(WAIT)
        answer = read_answer(sock)
        assert answer.status == 408 and answer.error()["code"] == "request_timeout"
        assert closed_by_server(sock)


def test_a_connection_that_sends_nothing_is_closed_after_the_head_timeout(
    srv: ApiServer, sock: socket.socket
) -> None:
    t0 = time.monotonic()
    assert closed_by_server(sock), "a silent connection was never closed"
    assert SHORT * 0.9 < time.monotonic() - t0 < WAIT


def test_an_idle_keep_alive_connection_is_closed(mgr: FakeManager) -> None:
    limits = HttpLimits(idle_timeout_s=SHORT, header_timeout_s=60, io_timeout_s=60)
    with ApiServer(mgr, token=TOKEN, port=0, limits=limits) as srv, contextlib.closing(connect(srv)) as s:
        for _ in range(2):  # the connection is reused while it is in use
            s.sendall(head("GET", "/v1/sandboxes"))
            assert read_answer(s).status == 200
        t0 = time.monotonic()
        assert closed_by_server(s), "an idle keep-alive connection was never closed"
        assert SHORT * 0.9 < time.monotonic() - t0 < WAIT


def test_a_stream_outlives_every_timeout_while_the_command_runs(
    srv: ApiServer, mgr: FakeManager, sock: socket.socket
) -> None:
    """An SSE exec that prints, goes silent for many times every timeout, then prints again and
    exits: nothing is cut (a silent command sends and reads nothing, so no timeout runs)."""
    sid = mgr.create().id
    release = threading.Event()
    mgr.stream_script = [("stdout", b"first\n"), release, ("stdout", b"second\n")]
    body = json.dumps({"command": "x", "stream": True}).encode()
    sock.sendall(head("POST", f"/v1/sandboxes/{sid}/exec", {"Content-Length": str(len(body))}) + body)
    buf = b""
    while b"first" not in buf:
        chunk = sock.recv(65536)
        assert chunk, "the stream was closed before its first event"
        buf += chunk
    assert still_open(sock, 5 * SHORT), "the stream was cut while the command ran silently"
    release.set()
    while b"event: exit" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"the stream was closed before its exit event: {buf!r}"
        buf += chunk
    assert b"second" in buf


# -- the connection cap ------------------------------------------------------------------------------------
def test_connections_beyond_the_cap_get_503_and_open_ones_keep_working(mgr: FakeManager) -> None:
    limits = HttpLimits(max_connections=2)
    with ApiServer(mgr, token=TOKEN, port=0, limits=limits) as srv:
        held = [connect(srv), connect(srv)]
        try:
            for s in held:  # answered: both are counted
                s.sendall(head("GET", "/v1/sandboxes"))
                assert read_answer(s).status == 200
            t0 = time.monotonic()
            r = requests.get(f"{srv.url}/healthz", timeout=WAIT)
            assert r.status_code == 503 and r.headers["Retry-After"] == "1"
            assert r.json()["error"]["code"] == "server_busy" and r.json()["error"]["limit"] == 2
            assert time.monotonic() - t0 < WAIT / 2
            with contextlib.closing(connect(srv)) as extra:
                assert read_answer(extra).status == 503 and closed_by_server(extra)
            for s in held:  # the open connections keep working
                s.sendall(head("GET", "/v1/sandboxes"))
                assert read_answer(s).status == 200
            assert srv.refused >= 2 and srv.connections == 2
        finally:
            held.pop().close()
        deadline = time.monotonic() + WAIT  # a closed connection frees its place
        while (code := requests.get(f"{srv.url}/healthz", timeout=WAIT).status_code) != 200:
            assert code == 503 and time.monotonic() < deadline
        held[0].close()


def test_limits_are_validated() -> None:
    bad_values: list[dict[str, Any]] = [
        {"max_connections": 0},
        {"header_timeout_s": 0},
        {"max_body_bytes": True},
        {"idle_timeout_s": "1"},
    ]
    for bad in bad_values:
        with pytest.raises(ConfigError, match=next(iter(bad))):
            HttpLimits(**bad)
    with pytest.raises(ConfigError, match="max_body_bytes"):
        ApiServer(FakeManager(), token=TOKEN, port=0, max_body_bytes=0)


# -- fullmatch ---------------------------------------------------------------------------------------------
def test_validation_refuses_a_trailing_newline(mgr: FakeManager, srv: ApiServer) -> None:
    with pytest.raises(ConfigError, match="printable ASCII"):
        ApiServer(mgr, token=TOKEN + "\n", port=0)
    for path in ("/healthz%0A", "/v1/sandboxes%0A", "/v1/sandboxes/sbx-0123456789/exec%0A", "/healthz%00"):
        r = requests.request(
            "GET" if "exec" not in path else "POST", srv.url + path, headers=AUTH, timeout=WAIT
        )
        assert r.status_code == 400 and "control character" in r.json()["error"]["message"], (path, r.text)
    sid = mgr.create().id
    r = requests.get(f"{srv.url}/v1/sandboxes/{sid}%0A", headers=AUTH, timeout=WAIT)
    assert r.status_code == 400 and "sbx-" in r.json()["error"]["message"], r.text
    r = requests.get(f"{srv.url}/v1/sandboxes/{sid}", headers=AUTH, timeout=WAIT)
    assert r.status_code == 200


def _patterns(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "pattern" and isinstance(v, str):
                yield v
            else:
                yield from _patterns(v)
    elif isinstance(node, list):
        for v in node:
            yield from _patterns(v)


WHOLE_STRING_PATTERNS = sorted({p for p in _patterns(openapi_document()) if "$" in p})


def test_the_document_has_whole_string_patterns() -> None:
    assert len(WHOLE_STRING_PATTERNS) >= 5  # sandbox id, label key, snapshot name, hostname, env, mode


@pytest.mark.parametrize("pattern", WHOLE_STRING_PATTERNS)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_openapi_patterns_refuse_a_trailing_newline(pattern: str, data: st.DataObject) -> None:
    """A Python validator of the published document (jsonschema uses re.search) must refuse what
    the server refuses: a valid value followed by a newline."""
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator({"type": "string", "pattern": pattern})
    value = data.draw(st.from_regex(re.compile(pattern), fullmatch=True))
    assert validator.is_valid(value)
    assert not validator.is_valid(value + "\n"), f"{pattern!r} accepts {value + chr(10)!r}"


def test_openapi_documents_the_limit_answers_on_every_route() -> None:
    doc = openapi_document()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method == "parameters":
                continue
            missing = {"400", "408", "411", "413", "414", "431", "503"} - set(op["responses"])
            assert not missing, (method, path, missing)
    responses = doc["components"]["responses"]
    assert "Retry-After" in responses["E503"]["headers"] and "server_busy" in responses["E503"]["description"]
    assert "4 KiB" in responses["E413"]["description"] and "64 MiB" in responses["E413"]["description"]


# -- the token file ----------------------------------------------------------------------------------------
@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    f = tmp_path / "api.token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    return f


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o620, 0o602, 0o610, 0o644, 0o666])
def test_a_token_file_others_may_touch_is_refused(token_file: Path, mode: int) -> None:
    token_file.chmod(mode)
    with pytest.raises(ConfigError) as info:
        load_token(token_file)
    message = str(info.value)
    assert str(token_file) in message and f"{mode:04o}" in message and "chmod 600" in message
    assert TOKEN not in message


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_private_token_file_is_accepted(token_file: Path, mode: int) -> None:
    token_file.chmod(mode)
    assert load_token(token_file) == TOKEN


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_token_file_owned_by_another_user_is_refused(token_file: Path) -> None:
    os.chown(token_file, 12345, 12345)
    with pytest.raises(ConfigError, match=r"owned by uid 12345.*chown") as info:
        load_token(token_file)
    assert str(token_file) in str(info.value) and TOKEN not in str(info.value)


def test_a_token_path_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ConfigError, match="not a regular file"):  # and no hang waiting for a writer
        load_token(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_token(tmp_path)


def test_serve_refuses_an_unsafe_token_file_with_exit_2(token_file: Path) -> None:
    token_file.chmod(0o640)
    r = subprocess.run(
        [sys.executable, "-m", "sandbox_rt.cli", "serve", "--port", "0", "--token-file", str(token_file)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )
    assert r.returncode == 2, r.stderr
    assert str(token_file) in r.stderr and "0640" in r.stderr
    assert TOKEN not in r.stdout + r.stderr


def test_serve_refuses_a_bad_limit_with_exit_2(token_file: Path) -> None:
    r = subprocess.run(
        [
            *(sys.executable, "-m", "sandbox_rt.cli", "serve", "--port", "0"),
            *("--token-file", str(token_file), "--max-connections", "0"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )
    assert r.returncode == 2 and "max_connections" in r.stderr, r.stderr
