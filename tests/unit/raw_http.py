"""A raw HTTP/1.1 client for tests that send what a well-behaved client library would not (slow,
oversized, ambiguous or cut-short requests) and watch how the server answers and closes.

Every wait is bounded by :data:`WAIT` and ends as soon as its condition holds: none is a pause.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable
from typing import Any

WAIT = 10.0  # seconds: the most any answer may take (a bound, never a pause)


def head(method: str, path: str, headers: dict[str, str] | None = None, *, host: str = "test") -> bytes:
    """A request head (request line, Host, ``headers``, blank line)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Answer:
    """One response: ``headers`` has lower-case names (the last value of a repeated one); ``raw``
    is every byte of it."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes, raw: bytes) -> None:
        self.status, self.headers, self.body, self.raw = status, headers, body, raw

    def json(self) -> Any:
        return json.loads(self.body)

    def error(self) -> dict[str, Any]:
        err: dict[str, Any] = self.json()["error"]
        return err


class RawClient:
    """One TCP connection and the bytes received on it but not consumed yet."""

    def __init__(self, address: tuple[str, int], *, rcvbuf: int | None = None) -> None:
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        if rcvbuf is not None:  # before connect: the TCP window is agreed then
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(WAIT)
        self.sock.connect(address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = b""

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def shut_write(self) -> None:
        """Half-close: the server reads EOF, the client can still read."""
        self.sock.shutdown(socket.SHUT_WR)

    def _recv(self, what: str) -> None:
        self.sock.settimeout(WAIT)
        chunk = self.sock.recv(65536)
        assert chunk, f"the server closed the connection {what} (got {self._buf!r:.300})"
        self._buf += chunk

    def read_until(self, marker: bytes) -> bytes:
        """Everything up to and including ``marker``."""
        while marker not in self._buf:
            self._recv(f"before sending {marker!r}")
        out, _, self._buf = self._buf.partition(marker)
        return out + marker

    def read_answer(self) -> Answer:
        """One response (status line, headers, a Content-Length body); a 1xx answer is returned too."""
        raw_head = self.read_until(b"\r\n\r\n")
        status_line, *header_lines = raw_head[:-4].decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
        status = int(status_line.split()[1])
        length = 0 if status < 200 else int(headers.get("content-length", "0"))
        while len(self._buf) < length:
            self._recv("in the middle of the body")
        body, self._buf = self._buf[:length], self._buf[length:]
        return Answer(status, headers, body, raw_head + body)

    def read_until_closed(self, within: float = WAIT) -> bytes | None:
        """Everything the server still sends until it closes the connection (EOF or reset), or
        None if the connection is still open after ``within`` seconds."""
        deadline = time.monotonic() + within
        try:
            while (left := deadline - time.monotonic()) > 0:
                self.sock.settimeout(left)
                chunk = self.sock.recv(65536)
                if not chunk:
                    data, self._buf = self._buf, b""
                    return data
                self._buf += chunk
        except (ConnectionResetError, BrokenPipeError):
            data, self._buf = self._buf, b""
            return data
        except TimeoutError:
            pass
        return None

    def closed_by_server(self, within: float = WAIT) -> bool:
        """True once the server has closed the connection, False if still open after ``within`` s."""
        return self.read_until_closed(within) is not None

    def still_open(self, for_s: float) -> bool:
        """Nothing more arrives and the connection stays open for ``for_s`` seconds (the thing under
        test); bytes received before and not read yet do not count."""
        readable, _, _ = select.select([self.sock], [], [], for_s)
        return not readable


def poll(condition: Callable[[], object], what: str, within: float = WAIT) -> None:
    """Wait until ``condition()`` is true, checking every 10 ms; AssertionError after ``within`` s."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not so after {within:g} s"
        time.sleep(0.01)
