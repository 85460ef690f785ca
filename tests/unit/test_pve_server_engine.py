"""The PVE test server's engines, without running containers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for pve_testserver

from pve_testserver.engine_lxc import LxcEngine, cgroup_lines, cgroup_version, net_lines
from pve_testserver.engine_memory import MemoryEngine
from pve_testserver.hostkey import HOSTKEY_PREFIX, hostkey_of, with_hostkey, without_hostkey

NET0 = "name=eth0,bridge=vmbr1,hwaddr=BC:24:11:AA:BB:CC,ip=10.99.1.9/16,gw=10.99.0.1,type=veth"


def test_cgroup_keys_v1_and_v2() -> None:
    conf = {"memory": 1024, "swap": 0, "cores": 2}
    assert cgroup_lines(conf, 1, memsw=True) == [
        "lxc.cgroup.memory.limit_in_bytes = 1073741824",
        "lxc.cgroup.memory.memsw.limit_in_bytes = 1073741824",
        "lxc.cgroup.cpu.cfs_period_us = 100000",
        "lxc.cgroup.cpu.cfs_quota_us = 200000",
    ]
    assert cgroup_lines({"memory": 512, "swap": 512}, 1, memsw=False) == [
        "lxc.cgroup.memory.limit_in_bytes = 536870912"
    ]
    assert cgroup_lines(conf, 2, memsw=True) == [
        "lxc.cgroup2.memory.max = 1073741824",
        "lxc.cgroup2.memory.swap.max = 0",
        "lxc.cgroup2.cpu.max = 200000 100000",
    ]
    assert cgroup_version(Path("/nonexistent")) == 1


def test_net0_becomes_lxc_net_keys() -> None:
    assert net_lines(123, {"net0": NET0}) == [
        "lxc.net.0.veth.pair = veth123i0",
        "lxc.net.0.link = vmbr1",
        "lxc.net.0.name = eth0",
        "lxc.net.0.hwaddr = bc:24:11:aa:bb:cc",
        "lxc.net.0.ipv4.address = 10.99.1.9/16",
        "lxc.net.0.ipv4.gateway = 10.99.0.1",
    ]
    assert "lxc.net.0.ipv4.address" not in "\n".join(net_lines(1, {"net0": "name=eth0,ip=dhcp"}))
    assert net_lines(1, {}) == []


def test_apply_config_rewrites_only_managed_keys(tmp_path: Path) -> None:
    ct = tmp_path / "pve-123"
    ct.mkdir()
    (ct / "config").write_text(
        "lxc.idmap = u 0 100000 65536\nlxc.uts.name = pve-123\n"
        "lxc.net.0.type = veth\nlxc.net.0.link = vmbr1\n"
        "lxc.rootfs.path = overlay:/t/rootfs:/x/delta\n"
    )
    engine = LxcEngine(tmp_path, "tpl")
    for memory in (512, 2048):  # twice: no duplicated keys
        engine.apply_config(123, {"hostname": "sbx-1", "net0": NET0, "memory": memory, "swap": 0, "cores": 1})
    text = (ct / "config").read_text()
    assert text.count("lxc.uts.name") == 1 and "lxc.uts.name = sbx-1" in text
    assert text.count("lxc.net.0.link") == 1 and "lxc.net.0.type = veth" in text
    assert "lxc.idmap = u 0 100000 65536" in text and "lxc.rootfs.path = overlay:" in text
    assert str(2048 * 1024 * 1024) in text and str(512 * 1024 * 1024) not in text


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to the mapped root needs root")
def test_prestart_hook_writes_a_host_key_owned_by_the_mapped_root(tmp_path: Path) -> None:
    lower, upper = tmp_path / "tpl" / "rootfs", tmp_path / "pve-5" / "delta"
    (lower / "etc" / "ssh").mkdir(parents=True)
    os.chown(lower / "etc", 100000, 100000)
    os.chown(lower / "etc" / "ssh", 100000, 100000)
    (lower / "etc" / "ssh").chmod(0o755)
    upper.mkdir(parents=True)
    (tmp_path / "pve-5" / "config").write_text(
        "lxc.idmap = u 0 100000 65536\nlxc.idmap = g 0 100000 65536\n"
        f"lxc.rootfs.path = overlay:{lower}:{upper}\n"
    )
    engine = LxcEngine(tmp_path, "tpl")
    conf = {"hostname": "sbx-5", "net0": NET0}
    public = engine._prepare_rootfs(5, conf)
    key = upper / "etc/ssh/ssh_host_ed25519_key"
    assert (key.stat().st_uid, key.stat().st_mode & 0o777) == (100000, 0o600)
    assert (upper / "etc").stat().st_uid == 100000
    assert public.startswith("ssh-ed25519 ") and public.endswith(" root@sbx-5")
    assert (upper / "etc/ssh/ssh_host_ed25519_key.pub").read_text().strip() == public
    assert "10.99.1.9 sbx-5" in (upper / "etc/hosts").read_text()
    assert len((upper / "etc/machine-id").read_text().strip()) == 32
    assert engine._prepare_rootfs(5, conf) == public  # a restart keeps the key


def test_memory_engine_records() -> None:
    engine = MemoryEngine()
    engine.create(100, {})
    assert not engine.is_running(100) and engine.interfaces(100, {}) is None
    key = engine.start(100, {"hostname": "a"})
    assert engine.start(100, {"hostname": "a"}) == key
    names = [i["name"] for i in engine.interfaces(100, {"net0": NET0}) or []]
    assert names == ["lo", "eth0"]
    engine.destroy(100)
    assert not engine.is_running(100)


def test_hostkey_lines_in_descriptions() -> None:
    desc = with_hostkey("owner: alice\n", "ssh-ed25519 AAAA root@x")
    assert desc == f"owner: alice\n{HOSTKEY_PREFIX}ssh-ed25519 AAAA root@x\n"
    assert hostkey_of(desc) == "ssh-ed25519 AAAA root@x"
    assert hostkey_of(with_hostkey(desc, "ssh-ed25519 BBBB root@x")) == "ssh-ed25519 BBBB root@x"
    assert without_hostkey(desc) == "owner: alice"
    assert hostkey_of(None) is None
