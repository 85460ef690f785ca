"""The OpenSandbox SDK, unchanged, on PVE-backed sandboxes (issue 25): ``sandbox-rt serve
--opensandbox-port`` over the proxmox backend, against the PVE API test server whose clones are real
LXC containers (or a real PVE when SANDBOX_RT_PVE_URL is set). Create with env and metadata, run and
stream commands, files both ways, get, list, renew, and kill; pause and volumes are answered with
the reason PVE cannot (docs/opensandbox.md). Nothing is left behind."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import secrets
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig
from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.filesystem import WriteEntry
from opensandbox.models.sandboxes import PVC, SandboxFilter, Volume
from opensandbox.sync.manager import SandboxManagerSync
from opensandbox.sync.sandbox import SandboxSync

import sandbox_rt
from sandbox_rt.web.server import ApiServer
from tests.integration.prepared import check_prepared
from tests.integration.provision_helpers import destroy_labelled
from tests.pve_env import pve_test_server, real_pve_settings

pytestmark = pytest.mark.slow

TOKEN = secrets.token_urlsafe(32)
METADATA = {"test-opensandbox-pve": uuid.uuid4().hex[:12]}


@pytest.fixture(scope="module")
def manager() -> Iterator[sandbox_rt.Manager]:
    check_prepared()
    base = sandbox_rt.Settings.load()
    with contextlib.ExitStack() as stack:
        settings = real_pve_settings(base)
        if settings is None:
            state_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sandbox-rt-os-pve-")))
            settings = stack.enter_context(pve_test_server(base, state_dir))[0]
        mgr = sandbox_rt.Manager(settings, ssh_key=base.ssh_key)
        try:
            yield mgr
        finally:
            destroy_labelled(mgr, METADATA)
        assert not mgr.list(labels=METADATA)


@pytest.fixture(scope="module")
def server(manager: sandbox_rt.Manager) -> Iterator[ApiServer]:
    with ApiServer(manager, token=TOKEN, host="127.0.0.1", port=0, opensandbox_port=0) as srv:
        yield srv


def _config(server: ApiServer) -> ConnectionConfigSync:
    assert server.opensandbox_url is not None
    return ConnectionConfigSync(
        api_key=TOKEN,
        domain=server.opensandbox_url.removeprefix("http://"),
        use_server_proxy=True,
        request_timeout=dt.timedelta(seconds=90),
        disable_metrics=True,
    )


def test_the_sync_sdk_on_a_pve_backed_sandbox(server: ApiServer, manager: sandbox_rt.Manager) -> None:
    config = _config(server)
    sb = SandboxSync.create(
        "default",
        env={"GREETING": "hello from PVE"},
        metadata=METADATA,
        timeout=dt.timedelta(minutes=10),
        resource={"cpu": "1", "memory": "512Mi"},
        connection_config=config,
    )
    sdk = SandboxManagerSync.create(connection_config=config)
    try:
        assert manager.get(sb.id).backend == "proxmox"
        ex = sb.commands.run('echo "$GREETING"; id -un; exit 3')
        assert ex.exit_code == 3
        assert "".join(m.text for m in ex.logs.stdout) == "hello from PVE\nsandbox\n"
        ex = sb.commands.run("pwd", opts=RunCommandOpts(working_directory="/tmp"))
        assert "".join(m.text for m in ex.logs.stdout) == "/tmp\n"
        blob = secrets.token_bytes(100_000)
        sb.files.write_files([WriteEntry(path="/tmp/pve/data.bin", data=blob)])
        assert sb.files.read_bytes("/tmp/pve/data.bin") == blob
        info = sb.get_info()
        assert info.status.state == "Running" and info.metadata == METADATA
        found = sdk.list_sandbox_infos(SandboxFilter(metadata=METADATA))
        assert [s.id for s in found.sandbox_infos] == [sb.id]
        renewed = sb.renew(dt.timedelta(minutes=20))
        assert abs((renewed.expires_at - dt.datetime.now(dt.UTC)).total_seconds() - 1200) < 30
        with pytest.raises(SandboxApiException) as err:  # PVE's CT suspend is not a freeze
            sb.pause()
        assert err.value.status_code == 400 and "cannot pause" in str(err.value)
        assert sb.get_info().status.state == "Running"
    finally:
        sb.kill()
        sb.close()
        sdk.close()
    with pytest.raises(sandbox_rt.SandboxNotFound):
        manager.get(sb.id)


def test_volumes_are_refused_on_pve_with_the_reason(server: ApiServer, manager: sandbox_rt.Manager) -> None:
    before = {r.id for r in manager.list()}
    with pytest.raises(SandboxApiException) as err:
        SandboxSync.create(
            "default",
            metadata=METADATA,
            volumes=[Volume(name="v", pvc=PVC(claim_name="anything"), mount_path="/data")],
            connection_config=_config(server),
        )
    assert err.value.status_code == 400 and "root@pam" in str(err.value)
    assert {r.id for r in manager.list()} == before


def test_the_async_sdk_on_a_pve_backed_sandbox(server: ApiServer, manager: sandbox_rt.Manager) -> None:
    assert server.opensandbox_url is not None

    async def run() -> str:
        config = ConnectionConfig(
            api_key=TOKEN,
            domain=server.opensandbox_url or "",
            request_timeout=dt.timedelta(seconds=90),
            disable_metrics=True,
        )
        sb = await Sandbox.create("default", metadata=METADATA, connection_config=config)
        try:
            ex = await sb.commands.run("echo async-pve")
            assert "".join(m.text for m in ex.logs.stdout) == "async-pve\n"
            return sb.id
        finally:
            await sb.kill()
            await sb.close()

    sid = asyncio.run(run())
    with pytest.raises(sandbox_rt.SandboxNotFound):
        manager.get(sid)
