"""Chunked bodies on the OpenSandbox port (the SDK uploads files that way) and only there: bounded
as they are read, refused without a valid token before a byte is read, never with a Content-Length."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest
from test_http_api import TOKEN, FakeManager
from test_http_limits import closed_by_server, connect, read_answer

from sandbox_rt.web.limits import HttpLimits
from sandbox_rt.web.server import ApiServer

KEY = {"OPEN-SANDBOX-API-KEY": TOKEN}


@pytest.fixture
def srv() -> Iterator[ApiServer]:
    with ApiServer(
        FakeManager(), token=TOKEN, port=0, opensandbox_port=0, limits=HttpLimits(max_body_bytes=64)
    ) as s:
        yield s


def _dialect(srv: ApiServer) -> socket.socket:
    assert srv.opensandbox_url is not None
    host, port = srv.opensandbox_url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _chunked(path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: t",
        "Transfer-Encoding: chunked",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 16]), body[i : i + 16]) for i in range(0, len(body), 16)
    )
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + chunks + b"0\r\n\r\n"


def test_a_chunked_body_within_the_limit_reaches_the_route(srv: ApiServer) -> None:
    with contextlib.closing(_dialect(srv)) as s:
        s.sendall(_chunked("/v1/sandboxes", b"{}", KEY))
        answer = read_answer(s)
        # the route ran and answered for itself (this fake runtime has no lifecycle: 501), past the
        # transport (which would refuse chunked with 411) and the gate (413 past the limit)
        assert answer.status == 501 and b"lifecycle" in answer.body, answer.body


def test_a_chunked_body_past_the_limit_is_413_and_closed(srv: ApiServer) -> None:
    with contextlib.closing(_dialect(srv)) as s:
        s.sendall(_chunked("/v1/sandboxes", b"x" * 200, KEY))
        answer = read_answer(s)
        assert answer.status == 413 and answer.headers["connection"] == "close"
        assert closed_by_server(s)


def test_a_chunked_body_without_the_token_is_refused_unread(srv: ApiServer) -> None:
    with contextlib.closing(_dialect(srv)) as s:
        s.sendall(_chunked("/v1/sandboxes", b"x" * 32, {}))
        answer = read_answer(s)
        assert answer.status == 401 and answer.headers["connection"] == "close"


def test_chunked_with_a_content_length_is_still_refused(srv: ApiServer) -> None:
    with contextlib.closing(_dialect(srv)) as s:
        s.sendall(_chunked("/v1/sandboxes", b"{}", {**KEY, "Content-Length": "2"}))
        assert read_answer(s).status == 411 and closed_by_server(s)


def test_the_native_port_keeps_refusing_chunked(srv: ApiServer) -> None:
    with contextlib.closing(connect(srv)) as s:
        s.sendall(_chunked("/v1/sandboxes", b"{}", {"Authorization": f"Bearer {TOKEN}"}))
        assert read_answer(s).status == 411
