"""disk_gb on the LXC backend: each sandbox's dir is a btrfs subvolume with a qgroup limit.

The host is prepared with ``lxc_host_storage: btrfs_loop`` (the default), so ``disk_limits`` is on.
Writes are made with ``fallocate`` (allocated at once, no data written): fast, and counted like data.
"""

from __future__ import annotations

import subprocess

import pytest

from sandbox_rt import Manager, Settings
from sandbox_rt.backends.lxc.btrfs import is_subvolume

from .conftest import SESSION_LABEL, Factory

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _needs_disk_limits(settings: Settings) -> None:
    if not settings.disk_limits:
        pytest.fail(
            "host.json has disk_limits false: run site.yml with lxc_host_storage: btrfs_loop", pytrace=False
        )


def _allocate(sb, mib: int, path: str = "/home/sandbox/fill"):  # type: ignore[no-untyped-def]
    return sb.exec(f"fallocate -l {mib}M {path}", timeout=60)


def test_a_sandbox_cannot_write_more_than_disk_gb(make_lxc: Factory, settings: Settings) -> None:
    sb = make_lxc(memory_mb=256, disk_gb=1)
    assert is_subvolume(settings.lxc_path / sb.id)
    assert _allocate(sb, 700).exit_code == 0  # within the limit
    over = _allocate(sb, 500, "/home/sandbox/more")
    assert over.exit_code != 0 and "Disk quota exceeded" in over.stderr_text, over
    # root inside the sandbox is bound as well (qgroups have no root exception)
    as_root = sb.exec("sudo -n true 2>/dev/null || echo no-sudo").stdout
    assert as_root.strip() in (b"", b"no-sudo")
    sb.exec("rm -f /home/sandbox/fill /home/sandbox/more")
    assert _allocate(sb, 900).exit_code == 0  # freed space is usable again
    assert sb.exec("echo still fine").stdout == b"still fine\n"


def test_destroy_removes_the_subvolume(make_lxc: Factory, settings: Settings) -> None:
    sb = make_lxc(memory_mb=256, disk_gb=1)
    _allocate(sb, 100)
    path = settings.lxc_path / sb.id
    sb.destroy()
    assert not path.exists()
    listed = subprocess.run(
        ["btrfs", "subvolume", "list", str(settings.lxc_path)], capture_output=True, text=True, check=True
    ).stdout
    assert sb.id not in listed


def test_warm_pool_hand_out_changes_the_limit_live(settings: Settings) -> None:
    with Manager(
        settings, pool_size=1, pool_spec={"memory_mb": 256, "disk_gb": 1, "labels": SESSION_LABEL}
    ) as mgr:
        assert mgr.pool is not None and mgr.pool.wait_ready(timeout=60)
        pooled = {r.id for r in mgr.list(labels=SESSION_LABEL)}
        sb = mgr.create(memory_mb=256, disk_gb=2, labels=SESSION_LABEL)
        try:
            assert sb.id in pooled  # the pooled sandbox, made with a 1 GiB limit
            assert _allocate(sb, 1500).exit_code == 0
            assert _allocate(sb, 800, "/home/sandbox/more").exit_code != 0
            assert mgr.get(sb.id).spec.disk_gb == 2
        finally:
            sb.destroy()
