"""The Proxmox backend's own promises, against the PVE API test server (issue 5)."""

from __future__ import annotations

import dataclasses
import time

import pytest
from proxmoxer.tools import Tasks

import sandbox_rt
from pve_testserver import PVETestServer
from sandbox_rt import BackendError, Manager, PermissionDenied
from tests.pve_env import (
    NODE,
    POOL,
    PRIVILEGES,
    ROLE,
    TEMPLATE_PRIVILEGES,
    TEMPLATE_VMID,
    create_markers,
    grant_runtime_access,
    world,
)

from .conftest import SESSION_LABEL


def _cts(srv: PVETestServer) -> set[int]:
    return {int(v) for v in srv.state.cts}


def test_survives_an_injected_lock(pve_manager: Manager, srv: PVETestServer) -> None:
    srv.faults.inject_lock(count=3, lock="disk")  # the next config writes answer "CT is locked"
    with pve_manager.create(labels=SESSION_LABEL) as sb:
        assert sb.exec("echo ok").stdout == b"ok\n"


def test_survives_a_nextid_collision(pve_manager: Manager, srv: PVETestServer) -> None:
    with pve_manager.create(labels=SESSION_LABEL) as first:
        srv.faults.repeat_nextid(count=2)  # the next caller gets the id that is already in use
        with pve_manager.create(labels=SESSION_LABEL) as second:
            assert first.ip != second.ip and first.id != second.id
            assert second.exec("hostname").text.strip() == second.hostname


@pytest.mark.parametrize(
    ("task", "step", "message"),
    [
        ("vzclone", "clone", "storage 'local-lvm' is full"),
        ("resize", "resize", "volume resize failed: no space left on volume group"),
        ("vzstart", "start", "startup for container failed"),
    ],
)
def test_failing_task_at_each_create_step_leaves_nothing_and_carries_pves_message(
    pve_manager: Manager, srv: PVETestServer, task: str, step: str, message: str
) -> None:
    """A task ending with an error exit status: BackendError naming the step, PVE's message and
    the task log's tail; what was made is gone (CT, LXC container, firewall config, marker)."""
    before = world(srv)
    srv.faults.fail_tasks(message, types=[task], count=1)
    t0 = time.monotonic()
    with pytest.raises(BackendError) as err:
        pve_manager.create(labels=SESSION_LABEL, disk_gb=8)  # 8 > the template's 4 GiB: a resize runs
    assert time.monotonic() - t0 < 10
    assert err.value.step == step and "task failed: " in str(err.value) and message in str(err.value)
    assert "--- output (tail) ---" in str(err.value) and "TASK ERROR: " in str(err.value)  # the log
    assert world(srv) == before
    assert create_markers(pve_manager.settings) == []


@pytest.mark.parametrize("missing", ["VM.Clone", "VM.PowerMgmt", "VM.Config.Network", "SDN.Use"])
def test_missing_privilege_is_a_clear_permission_error(
    pve_manager: Manager, srv: PVETestServer, missing: str
) -> None:
    root = srv.client()
    role = f"Limited{missing.replace('.', '')}"
    user = f"limited-{missing.replace('.', '').lower()}@pve"
    root.access.users.post(userid=user)
    secret = root.access.users(user).token("tok").post(privsep=0)["value"]
    grant_runtime_access(  # as proxmox_access does, without one privilege (on the pool and the template)
        root,
        user,
        f"{user}!tok",
        "vmbr1",
        [p for p in PRIVILEGES if p != missing],
        role=role,
        template_privileges=[p for p in TEMPLATE_PRIVILEGES if p != missing],
        suffix=role,
    )
    settings = dataclasses.replace(pve_manager.settings, pve_token_id=f"{user}!tok", pve_token_secret=secret)
    limited = Manager(settings, ssh_key=pve_manager.settings.ssh_key)
    before = _cts(srv)
    with pytest.raises(PermissionDenied) as err:
        limited.create(labels=SESSION_LABEL)
    assert missing in str(err.value)
    assert _cts(srv) == before  # whatever it made before the refusal was removed


def test_gc_removes_expired_and_never_touches_untagged(pve_manager: Manager, srv: PVETestServer) -> None:
    root = srv.client()
    foreign = TEMPLATE_VMID + 500  # a CT of someone else in the same pool, without the sandbox-rt tag
    upid = root.nodes(NODE).lxc(TEMPLATE_VMID).clone.post(newid=foreign, hostname="someone-else", pool=POOL)
    assert Tasks.blocking_status(root, upid, timeout=60, polling_interval=0.05)["exitstatus"] == "OK"
    sb = pve_manager.create(labels=SESSION_LABEL, ttl_s=1)
    try:
        ct = root.nodes(NODE).lxc(foreign)
        ct.config.put(tags="sandbox-rt-lookalike;exp-1")  # looks old and expired, but is not ours
        assert sb.expires_at is not None
        while time.time() <= sb.expires_at:  # a 1 s TTL: wait until it has passed
            time.sleep(0.05)
        removed = {r.sandbox_id: r.reason for r in pve_manager.gc()}
        assert removed.get(sb.id) == "expired"
        assert foreign in _cts(srv)
        assert pve_manager.backend.state(sb.id) == "absent"
    finally:
        root.nodes(NODE).lxc(foreign).delete(force=1, purge=1)
        sb.destroy()


def test_sandboxes_are_tagged_pooled_and_limited(pve_manager: Manager, srv: PVETestServer) -> None:
    root = srv.client()
    with pve_manager.create(labels=SESSION_LABEL, cpus=0.5, memory_mb=384, disk_gb=10) as sb:
        res = next(r for r in root.cluster.resources.get(type="vm") if sb.id in str(r.get("tags")))
        tags = set(str(res["tags"]).split(";"))
        assert {"sandbox-rt", sb.id, f"ip-{sb.ip}"} <= tags
        assert any(t.startswith("exp-") for t in tags)
        conf = root.nodes(res["node"]).lxc(res["vmid"]).config.get()
        assert conf["memory"] == 384 and conf["swap"] == 0 and float(conf["cpulimit"]) == 0.5
        assert f"ip={sb.ip}/16" in conf["net0"] and "firewall=1" in conf["net0"]
        assert "size=10G" in conf["rootfs"]
        assert res["vmid"] in {int(m["vmid"]) for m in root.pools(POOL).get()["members"] if "vmid" in m}
        assert isinstance(sb, sandbox_rt.Sandbox) and ROLE in {r["roleid"] for r in root.access.roles.get()}
