"""``sandbox-rt mcp`` end to end: the MCP SDK's own client (``ClientSession``) over stdio and over
streamable HTTP with a bearer token, against real LXC sandboxes on a host prepared by site.yml.
One server process per transport, few sandboxes; whatever a failed test leaves is swept by label."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

import sandbox_rt
from tests.integration.prepared import labelled_manager
from tests.integration.server_process import served

pytestmark = pytest.mark.slow

SANDBOX_RT = Path(sys.executable).with_name("sandbox-rt")
LABEL = {"test-mcp": uuid.uuid4().hex[:12]}
TOKEN = secrets.token_urlsafe(32)


@pytest.fixture(scope="module")
def manager() -> Iterator[sandbox_rt.Manager]:
    with labelled_manager(LABEL) as mgr:
        yield mgr


def text(r: CallToolResult) -> str:
    return "\n".join(c.text for c in r.content if c.type == "text")


def data(r: CallToolResult) -> dict[str, Any]:
    assert not r.is_error, text(r)
    assert r.structured_content is not None
    return r.structured_content


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def ids(manager: sandbox_rt.Manager) -> set[str]:
    return {r.id for r in manager.list(labels=LABEL)}


# -- stdio -----------------------------------------------------------------------------------------
def test_stdio_session(manager: sandbox_rt.Manager) -> None:
    """What an MCP client does over stdio: list tools, create, run, files, network, snapshot, fork,
    destroy; then end the session, which destroys what it still holds and its snapshot."""
    snapshot = "mcp_" + uuid.uuid4().hex[:8]
    seen: dict[str, Any] = {}

    async def main() -> None:
        params = StdioServerParameters(
            command=str(SANDBOX_RT), args=["mcp", "--ttl", "900"], env=dict(os.environ)
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = {t.name for t in (await session.list_tools()).tools}
            assert {"create_sandbox", "run_command", "read_file", "write_file", "list_files"} <= tools

            made = data(await session.call_tool("create_sandbox", {"memory_mb": 512, "labels": LABEL}))
            sid = seen["first"] = made["id"]
            assert made["state"] == "running" and made["internet"] is False
            record = await anyio.to_thread.run_sync(manager.get, sid)
            seen["record"] = record

            r = await session.call_tool(
                "run_command", {"sandbox_id": sid, "command": "id -un; echo oops >&2; exit 3"}
            )
            out = data(r)
            assert out["exit_code"] == 3 and out["stdout"] == "sandbox\n" and out["stderr"] == "oops\n"
            r = await session.call_tool(
                "run_command",
                {"sandbox_id": sid, "command": "head -c 5000 /dev/zero | tr '\\0' x", "max_output": 100},
            )
            out = data(r)
            assert out["stdout"] == "x" * 100 and out["stdout_dropped"] == 4900 and out["truncated"] is True
            assert "4900 more bytes dropped (max_output=100" in text(r)
            r = await session.call_tool(
                "run_command",
                {"sandbox_id": sid, "command": "echo $X; pwd", "cwd": "/tmp", "env": {"X": "ex"}},
            )
            assert data(r)["stdout"] == "ex\n/tmp\n"
            r = await session.call_tool(
                "run_command", {"sandbox_id": sid, "command": "echo started; sleep 30", "timeout": 1}
            )
            assert r.is_error and text(r).startswith("command_timeout") and "started" in text(r)

            path = "/home/sandbox/work/note.txt"
            written = data(
                await session.call_tool(
                    "write_file", {"sandbox_id": sid, "path": path, "content": "héllo\n", "mode": "640"}
                )
            )
            assert written["size"] == 7 and written["mode"] == "0640"
            assert (
                data(await session.call_tool("read_file", {"sandbox_id": sid, "path": path}))["content"]
                == "héllo\n"
            )
            listing = data(
                await session.call_tool(
                    "list_files", {"sandbox_id": sid, "path": "/home/sandbox", "depth": 2}
                )
            )
            assert path in {e["path"] for e in listing["entries"]}
            r = await session.call_tool("read_file", {"sandbox_id": sid, "path": "/nonexistent"})
            assert r.is_error and text(r).startswith("file_error:ENOENT")

            assert (
                data(await session.call_tool("set_internet", {"sandbox_id": sid, "enabled": True}))[
                    "internet"
                ]
                is True
            )
            assert data(await session.call_tool("sandbox_status", {"sandbox_id": sid}))["internet"] is True
            await session.call_tool("set_internet", {"sandbox_id": sid, "enabled": False})
            egress = data(
                await session.call_tool(
                    "set_egress", {"sandbox_id": sid, "egress": ["Example.ORG", "192.0.2.0/24"]}
                )
            )
            assert egress["egress"] == ["example.org", "192.0.2.0/24"]
            r = await session.call_tool("set_egress", {"sandbox_id": sid, "egress": ["1.2.3"]})
            assert r.is_error and text(r).startswith("invalid_argument")

            assert (
                data(await session.call_tool("snapshot_sandbox", {"sandbox_id": sid, "name": snapshot}))[
                    "name"
                ]
                == snapshot
            )
            fork = data(
                await session.call_tool(
                    "create_sandbox", {"from_snapshot": snapshot, "memory_mb": 512, "labels": LABEL}
                )
            )
            seen["fork"] = fork["id"]
            r = await session.call_tool("read_file", {"sandbox_id": fork["id"], "path": path})
            assert data(r)["content"] == "héllo\n"

            assert data(await session.call_tool("destroy_sandbox", {"sandbox_id": sid}))["destroyed"] is True
            assert sid not in await anyio.to_thread.run_sync(ids, manager)
            r = await session.call_tool("run_command", {"sandbox_id": sid, "command": "true"})
            assert r.is_error and text(r).startswith("not_found")
            assert seen["fork"] in await anyio.to_thread.run_sync(ids, manager)

    anyio.run(main)
    record = seen["record"]
    assert record.spec.labels["mcp-session"] and record.spec.labels["mcp-server"]
    assert record.expires_at is not None and 890 <= record.expires_at - record.created_at <= 910
    assert record.spec.detached is False and record.owner_pid != os.getpid()  # the server owns it
    # the session ended with the client: its fork and its snapshot are gone
    wait_for(lambda: seen["fork"] not in ids(manager), "the session's sandbox to be destroyed")
    assert snapshot not in {s.name for s in manager.list_snapshots()}


def test_stdio_sigterm_destroys_the_sessions_sandboxes(manager: sandbox_rt.Manager) -> None:
    """A client that kills the server instead of closing stdin (the SDK's stdin reader is a thread
    no signal interrupts): SIGTERM still destroys the session's sandbox before the process ends."""
    proc = subprocess.Popen(
        [str(SANDBOX_RT), "-q", "mcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:

        def rpc(message: dict[str, Any]) -> dict[str, Any] | None:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps(message).encode() + b"\n")
            proc.stdin.flush()
            if "id" not in message:
                return None
            answer: dict[str, Any] = json.loads(proc.stdout.readline())
            assert answer.get("id") == message["id"], answer
            return answer

        init = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        }
        rpc({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
        rpc({"jsonrpc": "2.0", "method": "notifications/initialized"})
        args = {"name": "create_sandbox", "arguments": {"memory_mb": 512, "labels": LABEL}}
        made = rpc({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": args})
        assert made is not None and not made["result"].get("isError"), made
        sid = made["result"]["structuredContent"]["id"]
        assert sid in ids(manager)
        proc.send_signal(signal.SIGTERM)  # stdin stays open
        assert proc.wait(60) == 128 + signal.SIGTERM
        assert sid not in ids(manager)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


# -- streamable HTTP -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def http_server(
    tmp_path_factory: pytest.TempPathFactory, manager: sandbox_rt.Manager
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    command = [str(SANDBOX_RT), "mcp", "--transport", "http", "--port", "0"]
    ready = r"MCP on (http://127\.0\.0\.1:\d+/mcp)"
    with served(command, TOKEN, tmp_path_factory.mktemp("mcp"), ready) as server:
        yield server.urls[0], server.proc


def test_http_needs_the_token(http_server: tuple[str, subprocess.Popen[str]]) -> None:
    url = http_server[0]
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    for headers in ({}, {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": f"Basic {TOKEN}"}):
        r = httpx.post(url, json=body, headers=headers, timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", headers


def test_http_session(http_server: tuple[str, subprocess.Popen[str]], manager: sandbox_rt.Manager) -> None:
    """A ClientSession with the token: create and run; ending the session (DELETE) destroys it."""
    url = http_server[0]
    seen: dict[str, str] = {}

    async def main() -> None:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            made = data(
                await session.call_tool("create_sandbox", {"memory_mb": 512, "labels": LABEL, "ttl_s": 600})
            )
            seen["id"] = made["id"]
            assert made["labels"]["mcp-session"] and made["labels"]["test-mcp"] == LABEL["test-mcp"]
            r = data(
                await session.call_tool("run_command", {"sandbox_id": made["id"], "command": "uname -s"})
            )
            assert r["stdout"] == "Linux\n" and r["exit_code"] == 0
            assert made["id"] in await anyio.to_thread.run_sync(ids, manager)

    anyio.run(main)
    wait_for(lambda: seen["id"] not in ids(manager), "the ended session's sandbox to be destroyed")


def test_http_server_stop_destroys_what_sessions_hold(
    http_server: tuple[str, subprocess.Popen[str]], manager: sandbox_rt.Manager
) -> None:
    """Last in this module: a session left open when the server gets SIGTERM loses its sandbox."""
    url, proc = http_server
    seen: dict[str, str] = {}

    async def main() -> None:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120) as http,
            streamable_http_client(url, http_client=http, terminate_on_close=False) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            seen["id"] = data(await session.call_tool("create_sandbox", {"memory_mb": 512, "labels": LABEL}))[
                "id"
            ]

    anyio.run(main)
    assert seen["id"] in ids(manager)  # the session was not ended by the client
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    assert seen["id"] not in ids(manager)
