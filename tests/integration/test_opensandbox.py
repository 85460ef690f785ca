"""The OpenSandbox lifecycle API end to end: the published ``opensandbox`` SDK (sync and async),
unchanged, against ``ApiServer(..., opensandbox_port=0)`` driving real LXC sandboxes
(``Manager.from_env()`` on a host prepared by site.yml): create from the ``default`` template with an
entrypoint and env, get and list, renew, metadata, pause (the sandbox really stops running) and
resume, delete; every sandbox made is destroyed in the end, whatever failed."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import secrets
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from opensandbox import Sandbox, SandboxManager
from opensandbox.config import ConnectionConfig
from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.sandboxes import SandboxFilter
from opensandbox.sync.manager import SandboxManagerSync
from opensandbox.sync.sandbox import SandboxSync

import sandbox_rt
from sandbox_rt.web.opensandbox import state
from sandbox_rt.web.server import ApiServer
from tests.integration.prepared import labelled_manager

pytestmark = pytest.mark.slow

TOKEN = secrets.token_urlsafe(32)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TAG = uuid.uuid4().hex[:12]
METADATA = {"test-opensandbox": TAG}
# the entrypoint ticks a file 20 times a second: a paused sandbox's file stands still. Each tick is
# written beside the file and renamed over it, so a reader never sees the file truncated and empty
# (written in place, `cat` caught it empty between truncate and write: a flaky CI failure)
TICKER = [
    "sh",
    "-c",
    'echo "$GREETING" > /tmp/greeting; '
    "while :; do date +%s%N > /tmp/tick.new; mv /tmp/tick.new /tmp/tick; sleep 0.05; done",
]


@pytest.fixture(scope="module")
def manager() -> Iterator[sandbox_rt.Manager]:
    with labelled_manager(METADATA) as mgr:
        yield mgr


@pytest.fixture(scope="module")
def server(manager: sandbox_rt.Manager) -> Iterator[ApiServer]:
    with ApiServer(manager, token=TOKEN, host="127.0.0.1", port=0, opensandbox_port=0) as srv:
        yield srv


@pytest.fixture
def made(manager: sandbox_rt.Manager) -> Iterator[list[str]]:
    """Ids of the sandboxes a test made: destroyed afterwards even if the test fails."""
    ids: list[str] = []
    yield ids
    for sid in ids:
        with contextlib.suppress(sandbox_rt.SandboxNotFound):
            manager.destroy(sid)


def _config(server: ApiServer, cls: Any) -> Any:
    return cls(
        api_key=TOKEN,
        domain=server.opensandbox_url,
        request_timeout=dt.timedelta(seconds=60),
        disable_metrics=True,
    )


def _native_exec(server: ApiServer, sid: str, command: str, timeout: float = 10) -> requests.Response:
    return requests.post(
        f"{server.url}/v1/sandboxes/{sid}/exec",
        json={"command": command, "timeout": timeout},
        headers=AUTH,
        timeout=timeout + 30,
    )


def test_the_sync_sdk_lifecycle_on_lxc(
    server: ApiServer, manager: sandbox_rt.Manager, made: list[str]
) -> None:
    config = _config(server, ConnectionConfigSync)
    t0 = time.monotonic()
    sb = SandboxSync.create(
        "default",
        entrypoint=TICKER,
        env={"GREETING": "hello from the SDK"},
        metadata={**METADATA, "stage": "one"},
        timeout=dt.timedelta(minutes=10),
        resource={"cpu": "500m", "memory": "512Mi"},
        connection_config=config,
        skip_health_check=True,  # /ping is execd's (the other router); this test is the lifecycle's
    )
    made.append(sb.id)
    created_s = time.monotonic() - t0
    sdk = SandboxManagerSync.create(connection_config=config)
    try:
        record = manager.get(sb.id)
        assert record.spec.cpus == 0.5 and record.spec.memory_mb == 512 and record.spec.template == "default"
        assert record.spec.internet is False and record.spec.egress == ()
        assert state.notes(sb.id) is not None and state.default_env(sb.id) == {
            "GREETING": "hello from the SDK"
        }

        info = sb.get_info()
        assert info.status.state == "Running" and info.metadata == {**METADATA, "stage": "one"}
        assert info.entrypoint == TICKER and info.image is not None and info.image.image == "default"
        assert info.expires_at is not None
        assert abs((info.expires_at - dt.datetime.now(dt.UTC)).total_seconds() - 600) < 30
        # the entrypoint runs in the background with the create's env
        r = _native_exec(server, sb.id, "sleep 0.3; cat /tmp/greeting; test -s /tmp/tick && echo ticking")
        assert r.status_code == 200 and r.json()["stdout"] == "hello from the SDK\nticking\n", r.text

        found = sdk.list_sandbox_infos(SandboxFilter(metadata=METADATA, states=["Running"]))
        assert [s.id for s in found.sandbox_infos] == [sb.id]
        assert sdk.list_sandbox_infos(SandboxFilter(metadata=METADATA, states=["Paused"])).sandbox_infos == []

        renewed = sb.renew(dt.timedelta(minutes=25))
        assert abs((renewed.expires_at - dt.datetime.now(dt.UTC)).total_seconds() - 1500) < 30
        assert abs((manager.get(sb.id).expires_at or 0) - renewed.expires_at.timestamp()) < 2
        assert sb.patch_metadata({"stage": None, "phase": "two"}).metadata == {**METADATA, "phase": "two"}
        assert manager.get(sb.id).spec.labels == {**METADATA, "phase": "two"}

        # pause: the engine freezes it; nothing in it runs, and a command is refused at once
        sb.pause()
        assert sb.get_info().status.state == "Paused" and manager.state(sb.id) == "frozen"
        cpu = manager.backend.usage(sb.id).cpu_time_s
        time.sleep(0.5)
        assert manager.backend.usage(sb.id).cpu_time_s == cpu  # not one tick
        t1 = time.monotonic()
        r = _native_exec(server, sb.id, "true")
        assert r.status_code == 409 and "paused" in r.json()["error"]["message"], r.text
        assert time.monotonic() - t1 < 5
        # renewing and patching a paused sandbox work (they touch the record, not the sandbox)
        sb.renew(dt.timedelta(minutes=20))
        assert sdk.get_sandbox_info(sb.id).status.state == "Paused"

        resumed = SandboxSync.resume(sb.id, connection_config=config, skip_health_check=True)
        assert resumed.get_info().status.state == "Running" and manager.state(sb.id) == "running"
        r = _native_exec(
            server, sb.id, "a=$(cat /tmp/tick); sleep 0.3; b=$(cat /tmp/tick); [ $b -gt $a ] && echo on"
        )
        assert r.status_code == 200 and r.json()["stdout"] == "on\n", r.text
        resumed.close()

        with pytest.raises(SandboxApiException) as caught:
            SandboxSync.create("python:3.11", connection_config=config, skip_health_check=True)
        assert caught.value.status_code == 400 and "default" in str(caught.value)

        sb.kill()
        with pytest.raises(sandbox_rt.SandboxNotFound):
            manager.get(sb.id)
        assert state.notes(sb.id) is None
        with pytest.raises(SandboxApiException) as caught:
            sdk.get_sandbox_info(sb.id)
        assert caught.value.status_code == 404
    finally:
        sb.close()
        sdk.close()
    assert created_s < 20, f"create took {created_s:.1f} s"


def test_the_async_sdk_and_deleting_a_paused_sandbox(
    server: ApiServer, manager: sandbox_rt.Manager, made: list[str]
) -> None:
    async def run() -> str:
        config = _config(server, ConnectionConfig)
        sb = await Sandbox.create(
            "default",
            metadata={**METADATA, "flavour": "async"},
            timeout=dt.timedelta(minutes=5),
            resource={"cpu": "1", "memory": "256Mi"},
            connection_config=config,
            skip_health_check=True,
        )
        made.append(sb.id)
        sdk = await SandboxManager.create(connection_config=config)
        try:
            assert (await sb.get_info()).status.state == "Running"
            found = await sdk.list_sandbox_infos(SandboxFilter(metadata={"flavour": "async"}))
            assert [s.id for s in found.sandbox_infos] == [sb.id]
            await sdk.pause_sandbox(sb.id)
            assert (await sdk.get_sandbox_info(sb.id)).status.state == "Paused"
            await sb.kill()  # straight from Paused: the engine thaws it as it stops it
            return sb.id
        finally:
            await sb.close()
            await sdk.close()

    t0 = time.monotonic()
    sid = asyncio.run(run())
    assert time.monotonic() - t0 < 20
    with pytest.raises(sandbox_rt.SandboxNotFound):
        manager.get(sid)
    assert not (manager.settings.lxc_path / sid).exists()
