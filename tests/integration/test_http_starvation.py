"""Issue 35, attack 4: one unauthenticated client cannot starve ``sandbox-rt serve`` (both its
ports) nor ``sandbox-rt mcp --transport http``.

The attack, on loopback against the real server processes with their default limits: more
connections than the server's ``max_connections`` (128), each sending the start of a request head
and nothing more, each opened again at once whenever the server closes or answers it. Before the
fix every connection slot was the attacker's, and a request with the right token got 503 each
time. Now a request with the token, each on a new connection (the hard case: it must win a slot),
keeps getting its real answer within the client's timeout, for longer than one head deadline.

The attacker and the real client share 127.0.0.1, so no per-address bound can tell them apart:
what is tested is that connections which never delivered an authorized head give up their slots.
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from sandbox_rt.web.limits import HTTP_LIMITS
from tests.integration.prepared import check_prepared
from tests.integration.server_process import served

pytestmark = pytest.mark.slow

TOKEN = secrets.token_urlsafe(32)
ATTACKERS = HTTP_LIMITS.max_connections + 32  # more than every slot, as the 130
PARTIAL_HEAD = b"GET /v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "  # never finished
CLIENT_TIMEOUT = 5.0  # seconds: an authorized request must be answered within this (a bound, not a pause)
MIN_REQUESTS = 20
WAIT = 60.0
THIS_TREE = [sys.executable, "-m", "sandbox_rt.cli"]  # the code under test, as the console script runs it


class SlowHeads:
    """``count`` connections to ``address`` from one event loop in a thread: each sends
    :data:`PARTIAL_HEAD` and waits; when the server answers or closes it, it is opened again."""

    def __init__(self, address: tuple[str, int], count: int) -> None:
        self.address, self.count = address, count
        self.waiting = 0  # connected, partial head sent, nothing heard back yet
        self.opened = 0
        self.answered_busy = 0  # closed with the server's 503 server_busy
        self.most_waiting = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="slow-heads", daemon=True)
        self._tasks: list[asyncio.Task[None]] = []

    async def _one(self) -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection(*self.address)
            except OSError:
                await asyncio.sleep(0.01)  # the listen backlog overflowed: the attacker's own pace
                continue
            self.opened += 1
            got = b""
            try:
                writer.write(PARTIAL_HEAD)
                self.waiting += 1
                self.most_waiting = max(self.most_waiting, self.waiting)
                try:
                    while chunk := await reader.read(4096):
                        got += chunk
                except OSError:
                    pass  # reset: closed all the same
                finally:
                    self.waiting -= 1
            finally:
                writer.close()
            if b"server_busy" in got:
                self.answered_busy += 1

    def __enter__(self) -> SlowHeads:
        self._thread.start()

        async def spawn() -> None:
            self._tasks = [asyncio.create_task(self._one()) for _ in range(self.count)]

        asyncio.run_coroutine_threadsafe(spawn(), self._loop).result(WAIT)
        return self

    def __exit__(self, *exc: object) -> None:
        async def cancel() -> None:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel(), self._loop).result(WAIT)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(WAIT)
        self._loop.close()

    def wait_until_it_holds_the_table(self) -> None:
        """Until the server has had every slot taken: as many connections of this client are
        waiting (counted here: some may still wait in the listen backlog) as the server keeps,
        and the server has answered one of them 503 server_busy, which it does only with its
        table full (a newcomer refused, or an old one made to give way)."""
        deadline = time.monotonic() + WAIT
        while not (self.most_waiting >= HTTP_LIMITS.max_connections and self.answered_busy):
            assert time.monotonic() < deadline, (
                f"the attack did not fill the table: {self.most_waiting} waiting at most, "
                f"{self.answered_busy} busy answers, {self.opened} connections opened"
            )
            time.sleep(0.05)  # polls the attacker's counters


@pytest.fixture(scope="module")
def serve_urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    check_prepared()
    command = [*THIS_TREE, "serve", "--port", "0", "--opensandbox-port", "0"]
    ready = r"listening on (http://127\.0\.0\.1:\d+)"
    with served(command, TOKEN, tmp_path_factory.mktemp("serve"), ready, count=2) as server:
        yield {"native": server.urls[0], "opensandbox": server.urls[1]}


def address_of(url: str) -> tuple[str, int]:
    host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
    return host, int(port)


def under_attack(url: str, request: Callable[[], requests.Response]) -> None:
    """Run the attack on ``url``'s port and, once it holds the table, make authorized requests
    (``request``: each on a new connection, so each has to win a slot) until :data:`MIN_REQUESTS`
    were made and the attack has run for longer than one head deadline (the old server's only way
    to free a slot has come round). Every one must be answered 200 within :data:`CLIENT_TIMEOUT`."""
    durations: list[float] = []
    with SlowHeads(address_of(url), ATTACKERS) as attack:
        attack.wait_until_it_holds_the_table()
        started = time.monotonic()
        while len(durations) < MIN_REQUESTS or time.monotonic() - started < HTTP_LIMITS.header_timeout_s + 1:
            t0 = time.monotonic()
            try:
                r = request()
            except requests.RequestException as exc:
                pytest.fail(f"request {len(durations) + 1} under attack got no answer: {exc!r}")
            assert r.status_code == 200, f"request {len(durations) + 1}: {r.status_code} {r.text}"
            durations.append(time.monotonic() - t0)
        print(  # for the record (pytest -s): the numbers of docs/http-api.md, "A full server"
            f"\n{url}: {len(durations)} authorized requests under attack, all 200; "
            f"median {statistics.median(durations) * 1000:.0f} ms, max {max(durations) * 1000:.0f} ms; "
            f"attack: {attack.opened} connections opened, {attack.most_waiting} waiting at once at most, "
            f"{attack.answered_busy} answered 503"
        )


@pytest.mark.parametrize(
    ("port", "path", "credentials"),
    [
        ("native", "/v1/templates", {"Authorization": f"Bearer {TOKEN}"}),
        ("opensandbox", "/v1/sandboxes?metadata=issue35%3Dnone", {"OPEN-SANDBOX-API-KEY": TOKEN}),
    ],
)
def test_serve_answers_an_authorized_client_under_a_slow_head_flood(
    serve_urls: dict[str, str], port: str, path: str, credentials: dict[str, str]
) -> None:
    url = serve_urls[port]
    under_attack(url, lambda: requests.get(f"{url}{path}", headers=credentials, timeout=CLIENT_TIMEOUT))


def test_the_mcp_http_server_answers_an_authorized_client_under_a_slow_head_flood(tmp_path: Path) -> None:
    check_prepared()
    command = [*THIS_TREE, "mcp", "--transport", "http", "--port", "0"]
    with served(command, TOKEN, tmp_path, r"MCP on (http://127\.0\.0\.1:\d+/mcp)") as server:
        url = server.urls[0]
        client = {"name": "issue-35", "version": "0"}
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client},
        }
        headers = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream"}
        timeout = CLIENT_TIMEOUT
        under_attack(url, lambda: requests.post(url, json=initialize, headers=headers, timeout=timeout))
