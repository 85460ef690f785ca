"""OpenSandbox volumes end to end (issue 25 item 4): the published ``opensandbox`` SDK, unchanged,
creates sandboxes with a ``pvc`` volume (a named volume made on first use, outliving the sandbox,
shared with the next as its own user, ``subPath`` and ``readOnly`` honoured) and a ``host`` volume
under a directory the server allows; what the server does not allow is a 400 and leaves nothing.
Every sandbox and volume made is removed, whatever failed."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import secrets
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.sandboxes import PVC, Host, Volume
from opensandbox.sync.sandbox import SandboxSync

import sandbox_rt
from sandbox_rt.web.server import ApiServer
from tests.integration.prepared import labelled_manager

pytestmark = pytest.mark.slow

TOKEN = secrets.token_urlsafe(32)
TAG = uuid.uuid4().hex[:10]
METADATA = {"test-opensandbox-volumes": TAG}
CLAIM = f"sdk-{TAG}"


@pytest.fixture(scope="module")
def allowed() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sandbox-rt-allowed-"))
    (path / "in").mkdir()
    (path / "in" / "hello.txt").write_text("from the host\n")
    (path / "link").symlink_to("/etc")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def manager(allowed: Path) -> Iterator[sandbox_rt.Manager]:
    # what `sandbox-rt serve --allow-host-path DIR` does to the server's settings
    with labelled_manager(METADATA, volume_host_dirs=[str(allowed)]) as mgr:
        yield mgr
    with contextlib.suppress(sandbox_rt.SandboxError):  # its sandboxes are gone by now
        mgr.volumes.remove(CLAIM)


@pytest.fixture(scope="module")
def config(manager: sandbox_rt.Manager) -> Iterator[ConnectionConfigSync]:
    with ApiServer(manager, token=TOKEN, host="127.0.0.1", port=0, opensandbox_port=0) as srv:
        assert srv.opensandbox_url is not None
        yield ConnectionConfigSync(
            api_key=TOKEN,
            domain=srv.opensandbox_url,
            request_timeout=dt.timedelta(seconds=60),
            disable_metrics=True,
        )


def _create(config: ConnectionConfigSync, volumes: list[Volume]) -> SandboxSync:
    return SandboxSync.create(
        "default",
        metadata=METADATA,
        timeout=dt.timedelta(minutes=10),
        volumes=volumes,
        connection_config=config,
    )


def test_a_pvc_volume_is_made_on_first_use_and_outlives_the_sandbox(
    config: ConnectionConfigSync, manager: sandbox_rt.Manager
) -> None:
    assert not any(v.name == CLAIM for v in manager.volumes.list())
    first = _create(config, [Volume(name="work", pvc=PVC(claim_name=CLAIM), mount_path="/workspace")])
    try:
        ex = first.commands.run(
            "echo kept > /workspace/notes.txt && mkdir /workspace/sub && stat -c %U /workspace"
        )
        assert ex.exit_code == 0 and "".join(m.text for m in ex.logs.stdout).strip() == "sandbox"
        assert manager.volumes.get(CLAIM).used_by == (first.id,)
    finally:
        first.kill()
        first.close()
    data = Path(manager.volumes.get(CLAIM).path)
    assert (data / "notes.txt").read_text() == "kept\n"  # the sandbox went, the volume stayed
    second = _create(
        config,
        [
            Volume(
                name="all",
                pvc=PVC(claim_name=CLAIM, create_if_not_exists=False),
                mount_path="/ro",
                read_only=True,
            ),
            Volume(name="part", pvc=PVC(claim_name=CLAIM), mount_path="/mnt/sub", sub_path="sub"),
        ],
    )
    try:
        ex = second.commands.run("cat /ro/notes.txt && touch /mnt/sub/made && ls /ro/sub")
        assert ex.exit_code == 0, ex.logs.stderr
        assert "".join(m.text for m in ex.logs.stdout).split() == ["kept", "made"]
        ex = second.commands.run("echo changed > /ro/notes.txt")
        assert ex.exit_code != 0
        assert (data / "notes.txt").read_text() == "kept\n"
    finally:
        second.kill()
        second.close()


def test_a_host_volume_under_an_allowed_dir_and_nothing_else(
    config: ConnectionConfigSync, manager: sandbox_rt.Manager, allowed: Path
) -> None:
    sb = _create(
        config,
        [Volume(name="h", host=Host(path=str(allowed)), mount_path="/host", sub_path="in", read_only=True)],
    )
    try:
        ex = sb.commands.run("cat /host/hello.txt")
        assert "".join(m.text for m in ex.logs.stdout) == "from the host\n"
    finally:
        sb.kill()
        sb.close()
    before = {r.id for r in manager.list()}
    for volume, status, message in (
        (
            Volume(name="h", host=Host(path="/etc"), mount_path="/x"),
            403,
            "not under a directory this host allows",
        ),
        (Volume(name="h", host=Host(path=str(allowed / "link")), mount_path="/x"), 403, "symbolic link"),
        (Volume(name="h", host=Host(path=str(allowed)), mount_path="/etc/ssh"), 400, "system directory"),
        (
            Volume(name="v", pvc=PVC(claim_name=f"none-{TAG}", create_if_not_exists=False), mount_path="/x"),
            404,
            "no volume named",
        ),
    ):
        with pytest.raises(SandboxApiException) as err:
            _create(config, [volume])
        assert err.value.status_code == status and message in str(err.value), str(err.value)
    # issue 35 attack 6: a volume inside a read-only host volume would have its mount point made there
    nested = [
        Volume(name="h", host=Host(path=str(allowed)), mount_path="/h", read_only=True),
        Volume(name="v", pvc=PVC(claim_name=f"nest-{TAG}"), mount_path="/h/made/by/api"),
    ]
    with pytest.raises(SandboxApiException) as err:
        _create(config, nested)
    assert err.value.status_code == 400 and "inside the read-only mount at '/h'" in str(err.value), str(
        err.value
    )
    assert sorted(os.listdir(allowed)) == ["in", "link"]
    assert {r.id for r in manager.list()} == before
    for claim in ("none", "nest"):  # not even the volume made on first use
        assert not os.path.exists(f"{manager.settings.volume_dir}/{claim}-{TAG}")
