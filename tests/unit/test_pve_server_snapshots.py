"""The PVE test server's snapshot API (memory engine): PVE's semantics, locks and privileges."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from proxmoxer import ResourceException
from test_pve_server_api import (
    NODE,
    TEMPLATE_ID,
    _sandbox_user,
    client,
    clone,
    error_of,
    make_template,
    wait,
    wait_ok,
)

from pve_testserver import PVETestServer


@pytest.fixture
def server() -> Iterator[PVETestServer]:
    with PVETestServer() as srv:
        yield srv


@pytest.fixture
def api(server: PVETestServer) -> Any:
    return client(server)


def _ct(api: Any, vmid: int = 200) -> Any:
    make_template(api)
    wait_ok(api, clone(api, vmid))
    return api.nodes(NODE).lxc(vmid)


def test_snapshot_list_clone_delete(server: PVETestServer, api: Any) -> None:
    ct = _ct(api)
    wait_ok(api, ct.status.start.post())
    wait_ok(api, ct.snapshot.post(snapname="base", description="prepared"))
    listed = {s["name"]: s for s in ct.snapshot.get()}
    assert set(listed) == {"base", "current"}
    assert listed["base"]["description"] == "prepared" and listed["base"]["snaptime"] > 0
    assert listed["current"]["parent"] == "base" and listed["current"]["running"] == 1
    assert "lock" not in ct.config.get()
    assert ct.snapshot("base").get() == [{"cmd": "rollback"}, {"cmd": "config"}]
    assert ct.snapshot("base").config.get()["hostname"] == "sbx-200"
    assert ct.config.get(snapshot="base")["hostname"] == "sbx-200"

    wait_ok(api, ct.snapshot.post(snapname="second"))
    assert {s["name"]: s.get("parent") for s in ct.snapshot.get()} == {
        "base": None,
        "second": "base",
        "current": "second",
    }
    # a full clone of a running CT is fine from a snapshot
    wait_ok(api, ct.clone.post(newid=201, snapname="base", full=1, hostname="fork"))
    fork = api.nodes(NODE).lxc(201).config.get()
    assert fork["hostname"] == "fork" and "parent" not in fork
    assert fork["rootfs"].startswith("local-lvm:vm-201-disk-0")  # a full copy, no base volume
    assert [s["name"] for s in api.nodes(NODE).lxc(201).snapshot.get()] == ["current"]
    with pytest.raises(ResourceException) as exc:
        ct.clone.post(newid=202, full=1)  # without a snapshot: refused while running
    assert "only possible from a snapshot" in error_of(exc)[1]

    wait_ok(api, ct.snapshot("base").delete())
    assert {s["name"]: s.get("parent") for s in ct.snapshot.get()} == {"second": None, "current": "second"}
    status = wait(api, ct.snapshot("base").delete())
    assert status["exitstatus"] == "snapshot 'base' does not exist"
    with pytest.raises(ResourceException) as exc:
        ct.clone.post(newid=203, snapname="base", full=1)
    assert error_of(exc)[1] == "snapshot 'base' does not exist"


def test_snapshot_errors_as_pve(server: PVETestServer, api: Any) -> None:
    ct = _ct(api)
    wait_ok(api, ct.snapshot.post(snapname="base"))
    assert wait(api, ct.snapshot.post(snapname="base"))["exitstatus"] == "snapshot name 'base' already used"
    for reserved in ("current", "vzdump"):
        with pytest.raises(ResourceException) as exc:
            ct.snapshot.post(snapname=reserved)
        assert error_of(exc)[1] == f"unable to use snapshot name '{reserved}' (reserved name)"
    wait_ok(api, ct.snapshot.post(snapname="with-dash"))  # pve-configid: a letter, then [a-z0-9_-]
    with pytest.raises(ResourceException) as exc:
        ct.snapshot.post(snapname="1st")
    assert error_of(exc)[0] == 400 and "snapname" in error_of(exc)[2]
    template = api.nodes(NODE).lxc(TEMPLATE_ID)
    status = wait(api, template.snapshot.post(snapname="nope"))
    assert status["exitstatus"] == "you can't take a snapshot if it's a template"
    with pytest.raises(ResourceException) as exc:
        ct.snapshot("nope").config.get()
    assert error_of(exc)[1] == "snapshot 'nope' does not exist"


def test_snapshot_takes_the_lock(server: PVETestServer, api: Any) -> None:
    ct = _ct(api)
    server.faults.slow_tasks(10.0, types=["vzsnapshot"], count=1)
    upid = ct.snapshot.post(snapname="base")
    try:
        assert api.nodes(NODE).tasks(upid).status.get()["status"] == "running"
    finally:
        server.faults.release_tasks()
    wait_ok(api, upid)
    # a failed snapshot task leaves neither the snapshot nor the lock
    server.faults.fail_tasks("injected", types=["vzsnapshot"], count=1)
    assert wait(api, ct.snapshot.post(snapname="broken"))["exitstatus"] == "injected"
    assert [s["name"] for s in ct.snapshot.get()] == ["base", "current"]
    assert "lock" not in ct.config.get()


def test_destroy_takes_the_snapshots(server: PVETestServer, api: Any) -> None:
    ct = _ct(api)
    wait_ok(api, ct.snapshot.post(snapname="base"))
    wait_ok(api, ct.clone.post(newid=201, snapname="base", full=1))
    wait_ok(api, ct.delete(force=1, purge=1))
    assert 200 not in {int(r["vmid"]) for r in api.cluster.resources.get(type="vm")}
    assert [s["name"] for s in api.nodes(NODE).lxc(201).snapshot.get()] == ["current"]  # the fork stays


def test_snapshot_needs_vm_snapshot(server: PVETestServer, api: Any) -> None:
    ct = _ct(api)
    tokenid, secret = _sandbox_user(server, api)
    api.access.roles.post(roleid="NoSnap", privs="VM.Audit,VM.PowerMgmt")
    api.access.acl.put(path="/vms", roles="NoSnap", tokens=tokenid)
    sbx = client(server, tokenid, secret)
    assert [s["name"] for s in sbx.nodes(NODE).lxc(200).snapshot.get()] == ["current"]  # VM.Audit
    with pytest.raises(ResourceException) as exc:
        sbx.nodes(NODE).lxc(200).snapshot.post(snapname="base")
    assert error_of(exc)[:2] == (403, "Permission check failed (/vms/200, VM.Snapshot)")
    wait_ok(api, ct.snapshot.post(snapname="base"))
    with pytest.raises(ResourceException) as exc:
        sbx.nodes(NODE).lxc(200).snapshot("base").delete()
    assert error_of(exc)[:2] == (403, "Permission check failed (/vms/200, VM.Snapshot)")
    api.access.roles("NoSnap").put(privs="VM.Audit,VM.PowerMgmt,VM.Snapshot")
    wait_ok(sbx, sbx.nodes(NODE).lxc(200).snapshot("base").delete())


def test_status_reports_disk_of_a_running_ct(server: PVETestServer, api: Any) -> None:
    ct = _ct(api)
    assert ct.status.current.get()["disk"] == 0
    wait_ok(api, ct.status.start.post())
    assert ct.status.current.get()["disk"] > 0
