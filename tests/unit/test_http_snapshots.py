"""The HTTP API's snapshot route and ``from_snapshot`` in create (fake manager, real server)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from test_http_api import AUTH, TOKEN, FakeManager

from sandbox_rt import SandboxNotFound, SnapshotInfo, SnapshotNotFound, StateConflict
from sandbox_rt.validation import check_snapshot_name
from sandbox_rt.web.server import ApiServer


class SnapshotManager(FakeManager):
    def __init__(self) -> None:
        super().__init__()
        self.snapshots: dict[str, SnapshotInfo] = {}

    def snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo:
        check_snapshot_name(name)
        if sandbox_id not in self.boxes:
            raise SandboxNotFound(sandbox_id)
        if name in self.snapshots:
            raise StateConflict(f"a snapshot named {name!r} exists already")
        self.snapshots[name] = SnapshotInfo(name, sandbox_id, time.time(), "fake", 4096)
        return self.snapshots[name]

    def create(self, **kwargs: Any) -> Any:
        name = kwargs.get("from_snapshot")
        if name is not None and name not in self.snapshots:
            raise SnapshotNotFound(name)
        return super().create(**kwargs)


@pytest.fixture
def mgr() -> SnapshotManager:
    return SnapshotManager()


@pytest.fixture
def url(mgr: SnapshotManager) -> Iterator[str]:
    with ApiServer(mgr, token=TOKEN, port=0) as srv:  # type: ignore[arg-type]
        yield srv.url


def test_snapshot_then_fork(url: str, mgr: SnapshotManager) -> None:
    sid = requests.post(f"{url}/v1/sandboxes", json={}, headers=AUTH, timeout=10).json()["id"]
    r = requests.post(
        f"{url}/v1/sandboxes/{sid}/snapshots", json={"name": "base_env"}, headers=AUTH, timeout=10
    )
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "base_env" and r.json()["source_id"] == sid and r.json()["size_bytes"] == 4096
    r = requests.post(f"{url}/v1/sandboxes", json={"from_snapshot": "base_env"}, headers=AUTH, timeout=10)
    assert r.status_code == 201 and r.json()["id"] != sid
    assert mgr.created[-1]["from_snapshot"] == "base_env"


def test_snapshot_errors(url: str, mgr: SnapshotManager) -> None:
    sid = requests.post(f"{url}/v1/sandboxes", json={}, headers=AUTH, timeout=10).json()["id"]
    snaps = f"{url}/v1/sandboxes/{sid}/snapshots"
    for body, status in (({}, 400), ({"name": 7}, 400), ({"name": "bad name"}, 400), ({"x": "ab"}, 400)):
        r = requests.post(snaps, json=body, headers=AUTH, timeout=10)
        assert r.status_code == status, (body, r.text)
    r = requests.post(
        f"{url}/v1/sandboxes/sbx-0000000000/snapshots", json={"name": "ab"}, headers=AUTH, timeout=10
    )
    assert r.status_code == 404
    r = requests.post(f"{url}/v1/sandboxes", json={"from_snapshot": "nosuch"}, headers=AUTH, timeout=10)
    assert (r.status_code, r.json()["error"]["type"]) == (404, "SnapshotNotFound"), r.text
    assert requests.post(snaps, json={"name": "ab"}, timeout=10).status_code == 401
    assert mgr.snapshots == {}


def test_a_taken_name_is_a_conflict_not_a_bad_request(url: str, mgr: SnapshotManager) -> None:
    """The request is well-formed; the state refuses it (issue 18: a documented 409, not a 400)."""
    sid = requests.post(f"{url}/v1/sandboxes", json={}, headers=AUTH, timeout=10).json()["id"]
    snaps = f"{url}/v1/sandboxes/{sid}/snapshots"
    assert requests.post(snaps, json={"name": "taken"}, headers=AUTH, timeout=10).status_code == 201
    r = requests.post(snaps, json={"name": "taken"}, headers=AUTH, timeout=10)
    assert r.status_code == 409 and r.json()["error"]["code"] == "conflict"
    assert r.json()["error"]["type"] == "StateConflict" and "exists already" in r.json()["error"]["message"]


class ListingManager(SnapshotManager):
    def list_snapshots(self) -> list[SnapshotInfo]:
        return sorted(self.snapshots.values(), key=lambda i: i.name)

    def delete_snapshot(self, name: str) -> None:
        if self.snapshots.pop(name, None) is None:
            raise SnapshotNotFound(name)


def test_list_and_delete_snapshots() -> None:
    mgr = ListingManager()
    with ApiServer(mgr, token=TOKEN, port=0) as srv:  # type: ignore[arg-type]
        url = srv.url
        sid = requests.post(f"{url}/v1/sandboxes", json={}, headers=AUTH, timeout=10).json()["id"]
        for name in ("one_a", "two_b"):
            body = {"name": name}
            requests.post(f"{url}/v1/sandboxes/{sid}/snapshots", json=body, headers=AUTH, timeout=10)
        r = requests.get(f"{url}/v1/snapshots", headers=AUTH, timeout=10)
        assert r.status_code == 200 and [s["name"] for s in r.json()["snapshots"]] == ["one_a", "two_b"]
        assert r.json()["snapshots"][0]["template"] == "default"
        r = requests.delete(f"{url}/v1/snapshots/one_a", headers=AUTH, timeout=10)
        assert r.status_code == 204 and r.content == b"" and set(mgr.snapshots) == {"two_b"}
        r = requests.delete(f"{url}/v1/snapshots/one_a", headers=AUTH, timeout=10)
        assert (r.status_code, r.json()["error"]["type"]) == (404, "SnapshotNotFound")
        assert requests.delete(f"{url}/v1/snapshots/x", headers=AUTH, timeout=10).status_code == 400
        assert requests.delete(f"{url}/v1/snapshots/two_b", timeout=10).status_code == 401
        assert requests.get(f"{url}/v1/snapshots", timeout=10).status_code == 401
        assert requests.put(f"{url}/v1/snapshots/two_b", headers=AUTH, timeout=10).status_code == 405
        assert set(mgr.snapshots) == {"two_b"}


def test_extend(url: str, mgr: SnapshotManager) -> None:
    sid = requests.post(f"{url}/v1/sandboxes", json={}, headers=AUTH, timeout=10).json()["id"]
    r = requests.post(f"{url}/v1/sandboxes/{sid}/extend", json={"ttl_s": 7200}, headers=AUTH, timeout=10)
    assert r.status_code == 200 and 7100 < r.json()["expires_at"] - time.time() <= 7200, r.text
    assert mgr.boxes[sid].kwargs["ttl_s"] == 7200
    for body in ({}, {"ttl_s": "1"}, {"ttl_s": 1.5}, {"ttl_s": 1, "x": 1}):
        r = requests.post(f"{url}/v1/sandboxes/{sid}/extend", json=body, headers=AUTH, timeout=10)
        assert r.status_code == 400, (body, r.text)
    gone = f"{url}/v1/sandboxes/sbx-0000000000/extend"
    assert requests.post(gone, json={"ttl_s": 5}, headers=AUTH, timeout=10).status_code == 404
