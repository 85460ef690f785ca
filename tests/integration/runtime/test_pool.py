"""The warm pool hands out ready sandboxes with the request's settings, never one twice."""

from __future__ import annotations

import concurrent.futures
import contextlib
from pathlib import Path

import sandbox_rt
from pve_testserver import PVETestServer
from sandbox_rt import Manager, Settings
from sandbox_rt.backends.proxmox import ProxmoxBackend
from sandbox_rt.pool import POOL_LABEL

from .conftest import SESSION_LABEL


def _memory_limit(sandbox_id: str) -> int:
    v1 = Path(f"/sys/fs/cgroup/memory/lxc.payload.{sandbox_id}/memory.limit_in_bytes")
    v2 = Path(f"/sys/fs/cgroup/lxc.payload.{sandbox_id}/memory.max")
    return int((v1 if v1.exists() else v2).read_text())


def test_pool_hands_out_with_the_requests_settings(settings: Settings) -> None:
    with Manager(settings, pool_size=2, pool_spec={"memory_mb": 512, "labels": SESSION_LABEL}) as mgr:
        assert mgr.pool is not None and mgr.pool.wait_ready(timeout=60)
        pooled = {r.id for r in mgr.list(labels=SESSION_LABEL) if POOL_LABEL in r.spec.labels}
        assert len(pooled) == 2
        sb = mgr.create(memory_mb=256, hostname="warm-one", internet=True, labels={**SESSION_LABEL, "x": "1"})
        try:
            assert sb.id in pooled  # it came from the pool
            assert sb.exec("hostname").text.strip() == "warm-one"
            assert "warm-one" in sb.exec("getent hosts warm-one").text
            assert _memory_limit(sb.id) == 256 * 1024 * 1024
            r = sb.exec("python3 -c 'b = bytearray(400 << 20)'", timeout=60)
            assert r.exit_code == 137  # the new, lower limit holds
            st = sb.status()
            assert st.internet and st.memory_mb == 256 and st.labels == {**SESSION_LABEL, "x": "1"}
            again = mgr.attach(sb.id)  # the record on disk has the new settings
            assert again.hostname == "warm-one" and POOL_LABEL not in again.labels
            again.close()
        finally:
            sb.destroy()
    # closing the manager destroyed the idle pool sandboxes
    assert not [r for r in Manager(settings).list(labels=SESSION_LABEL) if POOL_LABEL in r.spec.labels]


def test_pool_never_hands_out_one_sandbox_twice(settings: Settings) -> None:
    with Manager(settings, pool_size=3, pool_spec={"memory_mb": 256, "labels": SESSION_LABEL}) as mgr:
        assert mgr.pool is not None and mgr.pool.wait_ready(timeout=60)
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            sandboxes = list(ex.map(lambda i: mgr.create(memory_mb=256, labels=SESSION_LABEL), range(6)))
        try:
            ids = [sb.id for sb in sandboxes]
            ips = [sb.ip for sb in sandboxes]
            assert len(set(ids)) == 6 and len(set(ips)) == 6
            names = {sb.exec("hostname").text.strip() for sb in sandboxes}
            assert len(names) == 6
        finally:
            for sb in sandboxes:
                sb.destroy()


def test_a_pool_of_100_fills_hands_out_refills_and_cleans_up(settings: Settings) -> None:
    """Issue 19: the warm pool stays correct at pool_size 100 - it fills to 100 started, connected
    sandboxes; 40 takes from 8 threads get 40 distinct sandboxes, each working, with the request's
    settings; it refills; closing it destroys every idle one and the handed-out ones stay."""
    spec = {"memory_mb": 128, "labels": SESSION_LABEL}
    taken: list[sandbox_rt.Sandbox] = []
    try:
        with Manager(settings, pool_size=100, pool_spec=spec) as mgr:
            assert mgr.pool is not None and mgr.pool.wait_ready(timeout=300), mgr.pool.ready
            pooled = {r.id for r in mgr.list(labels=SESSION_LABEL) if POOL_LABEL in r.spec.labels}
            assert len(pooled) == 100
            with concurrent.futures.ThreadPoolExecutor(8) as ex:
                taken = list(ex.map(lambda i: mgr.create(hostname=f"w{i}", labels=SESSION_LABEL), range(40)))
            assert {sb.id for sb in taken} <= pooled and len({sb.id for sb in taken}) == 40
            assert len({sb.ip for sb in taken}) == 40
            with concurrent.futures.ThreadPoolExecutor(8) as ex:
                names = list(ex.map(lambda sb: sb.exec("hostname").text.strip(), taken))
            assert names == [f"w{i}" for i in range(40)]
            assert all(POOL_LABEL not in sb.status().labels for sb in taken[:5])
            assert mgr.pool.wait_ready(timeout=300)  # refilled to 100 again
            idle = {r.id for r in mgr.list(labels=SESSION_LABEL) if POOL_LABEL in r.spec.labels}
            assert len(idle) == 100 and not idle & {sb.id for sb in taken}
        left = {r.id for r in Manager(settings).list(labels=SESSION_LABEL)}
        assert left == {sb.id for sb in taken}  # the idle ones are gone, the handed-out ones stay
    finally:
        for sb in taken:
            with contextlib.suppress(sandbox_rt.SandboxError):
                sb.destroy()
    assert Manager(settings).list(labels=SESSION_LABEL) == []


def test_proxmox_hand_out_grows_the_disk_to_the_request(
    settings: Settings, pve_env: tuple[Settings, PVETestServer | None]
) -> None:
    pve_settings = pve_env[0]
    spec = {"memory_mb": 256, "disk_gb": 8, "labels": SESSION_LABEL}
    with Manager(pve_settings, ssh_key=settings.ssh_key, pool_size=1, pool_spec=spec) as mgr:
        assert mgr.pool is not None and mgr.pool.wait_ready(timeout=120)
        pooled = {r.id for r in mgr.list(labels=SESSION_LABEL)}
        sb = mgr.create(memory_mb=256, disk_gb=12, labels=SESSION_LABEL)
        try:
            assert sb.id in pooled
            backend = mgr.backend
            assert isinstance(backend, ProxmoxBackend)
            node, vmid = backend._find(sb.id)
            rootfs = str(backend._ct(node, vmid).config.get()["rootfs"])
            assert "size=12G" in rootfs, rootfs
            assert mgr.get(sb.id).spec.disk_gb == 12
        finally:
            sb.destroy()
