"""Volumes through the native HTTP API on real LXC sandboxes: /v1/volumes (make, list, show, delete:
409 while mounted) and ``volumes`` of a create, from raw HTTP and from the remote clients (sync and
async), with the answers a caller can act on (403 outside the allowed dirs, 404 for a missing
volume). Everything made is removed, whatever failed."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

import sandbox_rt
from sandbox_rt import VolumeMount, remote
from sandbox_rt.web.server import ApiServer
from tests.integration.prepared import labelled_manager

pytestmark = pytest.mark.slow

TOKEN = secrets.token_urlsafe(32)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LABELS = {"test-http-volumes": uuid.uuid4().hex[:12]}


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sandbox-rt-http-volumes-"))
    (path / "allowed" / "in").mkdir(parents=True)
    (path / "allowed" / "in" / "seed.txt").write_text("seeded\n")
    (path / "allowed" / "team").mkdir()
    (path / "secret").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def manager(scratch: Path) -> Iterator[sandbox_rt.Manager]:
    # an allowed directory inside another (the shape of issue 35's attack 7)
    allowed = [str(scratch / "allowed"), str(scratch / "allowed" / "team")]
    settings = {"volume_dir": scratch / "volumes", "volume_host_dirs": allowed}
    with labelled_manager(LABELS, **settings) as mgr:
        yield mgr


@pytest.fixture(scope="module")
def server(manager: sandbox_rt.Manager) -> Iterator[ApiServer]:
    with ApiServer(manager, token=TOKEN, host="127.0.0.1", port=0) as srv:
        yield srv


def _api(server: ApiServer, method: str, path: str, **kwargs: object) -> requests.Response:
    return requests.request(method, f"{server.url}{path}", headers=AUTH, timeout=60, **kwargs)  # type: ignore[arg-type]


def test_volumes_over_http_from_raw_requests(server: ApiServer, manager: sandbox_rt.Manager) -> None:
    r = _api(server, "POST", "/v1/volumes", json={"name": "raw-vol"})
    assert r.status_code == 201 and r.json()["name"] == "raw-vol" and r.json()["used_by"] == []
    assert _api(server, "POST", "/v1/volumes", json={"name": "raw-vol"}).status_code == 409
    assert _api(server, "POST", "/v1/volumes", json={"name": "Not_A_Label"}).status_code == 400
    body = {
        "labels": LABELS,
        "memory_mb": 256,
        "volumes": {
            "/data": {"volume": "raw-vol"},
            "/data/seed": {
                "host_path": manager.settings.volume_host_dirs[0],
                "sub_path": "in",
                "read_only": True,
            },
        },
    }
    r = _api(server, "POST", "/v1/sandboxes", json=body)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    try:
        r = _api(
            server,
            "POST",
            f"/v1/sandboxes/{sid}/exec",
            json={"command": "cat /data/seed/seed.txt > /data/copy"},
        )
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
        shown = _api(server, "GET", "/v1/volumes/raw-vol").json()
        assert shown["used_by"] == [sid] and Path(shown["path"], "copy").read_text() == "seeded\n"
        assert [v["name"] for v in _api(server, "GET", "/v1/volumes").json()["volumes"]] == ["raw-vol"]
        r = _api(server, "DELETE", "/v1/volumes/raw-vol")
        assert r.status_code == 409 and sid in r.json()["error"]["message"]
    finally:
        assert _api(server, "DELETE", f"/v1/sandboxes/{sid}").status_code == 204
    assert _api(server, "DELETE", "/v1/volumes/raw-vol").status_code == 204
    assert _api(server, "GET", "/v1/volumes/raw-vol").status_code == 404
    before = {r.id for r in manager.list()}
    for volumes, status in (
        ({"/x": {"host_path": "/etc"}}, 403),
        ({"/x": {"volume": "never-made"}}, 404),
        ({"/etc": {"volume": "never-made"}}, 400),
        ({"/x": {"volume": "a", "host_path": "/srv"}}, 400),
    ):
        r = _api(server, "POST", "/v1/sandboxes", json={"labels": LABELS, "volumes": volumes})
        assert r.status_code == status, (volumes, r.text)
    assert {r.id for r in manager.list()} == before


def test_extend_a_sandbox_with_volumes(server: ApiServer, manager: sandbox_rt.Manager) -> None:
    """Found by fuzzing (issue 35): extend read the spec back with its mounts as dicts and refused
    them (400 ``volume {...} must be a VolumeMount``). Also through a second server, which attaches
    from the stored record."""
    manager.volumes.create("extend-vol")
    body = {"labels": LABELS, "memory_mb": 256, "ttl_s": 300, "volumes": {"/data": {"volume": "extend-vol"}}}
    r = _api(server, "POST", "/v1/sandboxes", json=body)
    assert r.status_code == 201, r.text
    sid, first = r.json()["id"], r.json()["expires_at"]
    try:
        r = _api(server, "POST", f"/v1/sandboxes/{sid}/extend", json={"ttl_s": 3000})
        assert r.status_code == 200, r.text
        assert r.json()["expires_at"] > first + 2000
        fresh = sandbox_rt.Manager(manager.settings)
        with ApiServer(fresh, token=TOKEN, host="127.0.0.1", port=0) as other:
            r = _api(other, "POST", f"/v1/sandboxes/{sid}/extend", json={"ttl_s": 600})
            assert r.status_code == 200, r.text
            assert _api(other, "GET", f"/v1/sandboxes/{sid}").json()["expires_at"] < first + 2000
        assert fresh.get(sid).spec.volumes == (VolumeMount("/data", volume="extend-vol"),)
        r = _api(server, "POST", f"/v1/sandboxes/{sid}/exec", json={"command": "touch /data/still-there"})
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
    finally:
        assert _api(server, "DELETE", f"/v1/sandboxes/{sid}").status_code == 204
        manager.volumes.remove("extend-vol")


def test_the_remote_clients_mount_volumes(server: ApiServer, manager: sandbox_rt.Manager) -> None:
    manager.volumes.create("client-vol")
    try:
        with remote.Client(server.url, token=TOKEN) as client:
            with client.create(
                labels=LABELS, memory_mb=256, volumes=[VolumeMount("/w", volume="client-vol")]
            ) as sb:
                assert sb.exec("echo sync > /w/s && stat -c %U /w/s").stdout == b"sandbox\n"
            with pytest.raises(sandbox_rt.VolumeNotFound):
                client.create(labels=LABELS, volumes=[VolumeMount("/w", volume="absent-vol")])

        async def run_async() -> bytes:
            async with remote.AsyncClient(server.url, token=TOKEN) as aclient:
                mounts = [VolumeMount("/r", volume="client-vol", read_only=True)]
                async with aclient.create(labels=LABELS, memory_mb=256, volumes=mounts) as asb:
                    result = await asb.exec("cat /r/s; touch /r/t 2>/dev/null || echo refused")
                    return result.stdout

        assert asyncio.run(run_async()) == b"sync\nrefused\n"
    finally:
        for record in manager.list(labels=LABELS):
            manager.destroy(record.id)
        manager.volumes.remove("client-vol")


def test_host_paths_over_http_are_never_written_through_or_redirected(
    server: ApiServer, manager: sandbox_rt.Manager, scratch: Path
) -> None:
    """Issue 35's attacks 6 and 7 through the native API (the same Manager.create path as Python):
    a mount inside a read-only host path is a 400 and makes nothing there; an allowed directory
    replaced with a link (as a sandbox writing the outer one could), and the link's target, are
    403s."""
    allowed = scratch / "allowed"
    manager.volumes.create("nest-http")
    before = {r.id for r in manager.list()}
    try:
        volumes = {
            "/h": {"host_path": str(allowed), "read_only": True},
            "/h/made/by/api": {"volume": "nest-http"},
        }
        r = _api(server, "POST", "/v1/sandboxes", json={"labels": LABELS, "volumes": volumes})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_argument"
        assert "inside the read-only mount at '/h'" in r.json()["error"]["message"]
        assert sorted(os.listdir(allowed)) == ["in", "team"]
        (allowed / "team").rmdir()
        (allowed / "team").symlink_to(scratch / "secret")
        for asked, message in ((allowed / "team", "symbolic link"), (scratch / "secret", "not under")):
            body = {"labels": LABELS, "volumes": {"/x": {"host_path": str(asked)}}}
            r = _api(server, "POST", "/v1/sandboxes", json=body)
            assert r.status_code == 403, (asked, r.text)
            assert (
                r.json()["error"]["code"] == "volume_not_allowed" and message in r.json()["error"]["message"]
            )
        assert {r.id for r in manager.list()} == before
    finally:
        for record in manager.list(labels=LABELS):
            manager.destroy(record.id)
        manager.volumes.remove("nest-http")
