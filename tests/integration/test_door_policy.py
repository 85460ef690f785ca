"""Agent-facing doors cannot widen what the operator set (issue 35, attack 5), end to end: the attack
``create_sandbox(root=True, disk_mbps=0, disk_iops=0, net_mbps=0)`` replayed through a real
``sandbox-rt serve`` (native API, the remote client, the OpenSandbox port) and a real ``sandbox-rt
mcp`` (stdio and streamable HTTP) is refused and makes nothing; started with ``--allow-root`` they
make a real root sandbox (``id -u`` as root is 0) and still refuse the caps off.

The servers are the command line in subprocesses (``python -m sandbox_rt``, this tree, started by
tests/integration/server_process.py), the sandboxes real LXC ones labelled for this module (swept
afterwards whatever happens)."""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import requests
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

import sandbox_rt
from sandbox_rt import remote
from tests.integration.prepared import labelled_manager
from tests.integration.server_process import Served, served

pytestmark = pytest.mark.slow

LABEL = {"test-door-policy": uuid.uuid4().hex[:12]}
TOKEN = secrets.token_urlsafe(32)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CLI = [sys.executable, "-m", "sandbox_rt"]
# the attack as it was made through MCP, and the same caps off without root
ATTACK: dict[str, Any] = {"root": True, "disk_mbps": 0, "disk_iops": 0, "net_mbps": 0}
UNCAPPED: dict[str, Any] = {"disk_mbps": 0, "disk_iops": 0, "net_mbps": 0}
SMALL: dict[str, Any] = {"memory_mb": 512, "labels": LABEL, "ttl_s": 600}


@pytest.fixture(scope="module")
def manager() -> Iterator[sandbox_rt.Manager]:
    with labelled_manager(LABEL) as mgr:
        yield mgr


def labelled(manager: sandbox_rt.Manager) -> list[str]:
    return [r.id for r in manager.list(labels=LABEL)]


def serve(tmp: Path, *flags: str) -> contextlib.AbstractContextManager[Served]:
    """``sandbox-rt serve`` with the OpenSandbox port: urls [native, OpenSandbox]."""
    command = [*CLI, "serve", "--port", "0", "--opensandbox-port", "0", *flags]
    return served(command, TOKEN, tmp, r"listening on (http://127\.0\.0\.1:\d+)", count=2)


def refusal(r: requests.Response, option: str) -> str:
    assert r.status_code == 403, f"{r.status_code}: {r.text}"
    err = r.json()["error"]
    assert err["code"] == "policy_denied" and err["type"] == "PolicyDenied", err
    assert option in err["message"], err
    return str(err["message"])


# -- sandbox-rt serve ----------------------------------------------------------------------------------
def test_serve_refuses_root_and_caps_off(tmp_path: Path, manager: sandbox_rt.Manager) -> None:
    """The attack through the native API and the remote client of a plain ``serve``: 403
    ``policy_denied`` naming the option, and no sandbox made."""
    with serve(tmp_path) as server, requests.Session() as http:
        url = server.urls[0]
        http.headers.update(AUTH)
        create = f"{url}/v1/sandboxes"
        message = refusal(http.post(create, json={**SMALL, **ATTACK}, timeout=120), "--allow-root")
        assert "root=true is refused: sandbox-rt serve" in message
        refusal(http.post(create, json={**SMALL, **UNCAPPED}, timeout=120), "--allow-uncapped")
        refusal(http.post(create, json={**SMALL, "disk_mbps": 100_000}, timeout=120), "--allow-uncapped")
        with remote.Client(url, token_file=server.token_file) as client:
            with pytest.raises(sandbox_rt.PolicyDenied, match="--allow-root"):
                client.create(root=True, **SMALL)
            with pytest.raises(sandbox_rt.PolicyDenied, match="disk_iops=0"):
                client.create(disk_iops=0, **SMALL)
    assert labelled(manager) == []


def test_serve_allow_root_makes_a_root_sandbox(tmp_path: Path, manager: sandbox_rt.Manager) -> None:
    """``serve --allow-root``: root through the native API (commands run as uid 0), its caps the
    host's defaults; the caps still cannot be switched off; the OpenSandbox dialect, which has no
    root or cap field, makes plain capped sandboxes on the same server."""
    settings = manager.settings
    with serve(tmp_path, "--allow-root") as server, requests.Session() as http:
        url, os_url = server.urls
        http.headers.update(AUTH)
        r = http.post(f"{url}/v1/sandboxes", json={**SMALL, "root": True}, timeout=120)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            assert r.json()["disk_mbps"] == settings.default_disk_mbps
            r = http.post(
                f"{url}/v1/sandboxes/{sid}/exec", json={"command": "id -u", "user": "root"}, timeout=60
            )
            assert r.status_code == 200 and r.json()["stdout"] == "0\n", r.text
            refusal(
                http.post(f"{url}/v1/sandboxes", json={**SMALL, **ATTACK}, timeout=120), "--allow-uncapped"
            )
        finally:
            assert http.delete(f"{url}/v1/sandboxes/{sid}", timeout=120).status_code == 204
        key = {"OPEN-SANDBOX-API-KEY": TOKEN}
        body = {"image": {"uri": "default"}, "metadata": LABEL, "resourceLimits": {"memory": "512Mi"}}
        r = requests.post(f"{os_url}/v1/sandboxes", json={**body, "root": True}, headers=key, timeout=120)
        assert r.status_code == 400, r.text  # no such field in the dialect
        r = requests.post(f"{os_url}/v1/sandboxes", json=body, headers=key, timeout=120)
        assert r.status_code == 202, r.text
        made = r.json()["id"]
        try:
            spec = manager.get(made).spec
            assert spec.root is False
            assert (spec.net_mbps, spec.disk_mbps, spec.disk_iops) == (
                settings.default_net_mbps,
                settings.default_disk_mbps,
                settings.default_disk_iops,
            )
        finally:
            assert (
                requests.delete(f"{os_url}/v1/sandboxes/{made}", headers=key, timeout=120).status_code == 204
            )
    assert labelled(manager) == []


# -- sandbox-rt mcp ------------------------------------------------------------------------------------
def text(r: CallToolResult) -> str:
    return "\n".join(c.text for c in r.content if c.type == "text")


def stdio(*flags: str) -> Any:
    params = StdioServerParameters(command=CLI[0], args=[*CLI[1:], "mcp", *flags], env=dict(os.environ))
    return stdio_client(params)


def test_mcp_stdio_refuses_the_attack(manager: sandbox_rt.Manager) -> None:
    """The call of the attack, as it was made: a tool error ``policy_denied`` naming the option."""

    async def main() -> None:
        async with stdio() as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            r = await session.call_tool("create_sandbox", {**SMALL, **ATTACK})
            assert r.is_error, text(r)
            assert text(r).startswith("policy_denied (PolicyDenied): root=true is refused: sandbox-rt mcp")
            assert "--allow-root" in text(r)
            r = await session.call_tool("create_sandbox", {**SMALL, **UNCAPPED})
            assert r.is_error and "--allow-uncapped" in text(r), text(r)
            assert await anyio.to_thread.run_sync(labelled, manager) == []

    anyio.run(main)


def test_mcp_stdio_allow_root_makes_a_root_sandbox(manager: sandbox_rt.Manager) -> None:
    seen: dict[str, str] = {}

    async def main() -> None:
        async with stdio("--allow-root") as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            r = await session.call_tool("create_sandbox", {**SMALL, "root": True})
            assert not r.is_error, text(r)
            assert r.structured_content is not None
            sid = seen["id"] = r.structured_content["id"]
            r = await session.call_tool(
                "run_command", {"sandbox_id": sid, "command": "id -u", "user": "root"}
            )
            assert not r.is_error and r.structured_content is not None, text(r)
            assert r.structured_content["stdout"] == "0\n"
            r = await session.call_tool("create_sandbox", {**SMALL, **ATTACK})
            assert r.is_error and "--allow-uncapped" in text(r), text(r)

    anyio.run(main)
    deadline = time.monotonic() + 60  # the session's end destroys its sandbox
    while seen["id"] in labelled(manager):
        assert time.monotonic() < deadline, "the ended session's sandbox was not destroyed"
        time.sleep(0.2)


def test_mcp_http_refuses_the_attack(tmp_path: Path, manager: sandbox_rt.Manager) -> None:
    command = [*CLI, "mcp", "--transport", "http", "--port", "0"]
    with served(command, TOKEN, tmp_path, r"MCP on (http://127\.0\.0\.1:\d+/mcp)") as server:
        url = server.urls[0]

        async def main() -> None:
            async with (
                httpx2.AsyncClient(headers=AUTH, timeout=120) as http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                r = await session.call_tool("create_sandbox", {**SMALL, **ATTACK})
                assert r.is_error and text(r).startswith("policy_denied") and "--allow-root" in text(r), text(
                    r
                )

        anyio.run(main)
    assert labelled(manager) == []
