"""The per-sandbox caps on what sandboxes share (issue 26), without a host: option validation, the
cgroup lines, CPU placement, the pids budget, the storage device and the port binding's nft script."""

from __future__ import annotations

import dataclasses
import os
import types
from pathlib import Path

import pytest

from sandbox_rt import BackendError, ConfigError, Settings, StateConflict
from sandbox_rt.backends.lxc import cgroup_limit_lines
from sandbox_rt.backends.lxc.hostcaps import (
    HostLoad,
    check_pids_budget,
    cpu_list,
    parse_cpu_list,
    pick_cpus,
    storage_device,
)
from sandbox_rt.backends.lxc.netstate import NetState, SandboxNet
from sandbox_rt.caps import (
    DEFAULT_DISK_IOPS,
    DEFAULT_DISK_MBPS,
    DEFAULT_NET_MBPS,
    net_bytes_per_s,
    pid_budget,
)
from sandbox_rt.validation import make_spec


# -- options -------------------------------------------------------------------------------------
def test_caps_default_to_the_documented_values() -> None:
    spec = make_spec(host_cpus=2)
    defaults = (DEFAULT_NET_MBPS, DEFAULT_DISK_MBPS, DEFAULT_DISK_IOPS)
    assert (spec.net_mbps, spec.disk_mbps, spec.disk_iops) == defaults
    s = Settings()
    assert (s.default_net_mbps, s.default_disk_mbps, s.default_disk_iops) == (1000, 100, 2000)


@pytest.mark.parametrize("name", ["net_mbps", "disk_mbps", "disk_iops"])
@pytest.mark.parametrize("value", [-1, 1.5, True, "10", 10**9, float("nan")])
def test_bad_caps_are_config_errors(name: str, value: object) -> None:
    with pytest.raises(ConfigError, match=name):
        make_spec(host_cpus=2, **{name: value})  # type: ignore[arg-type]


def test_zero_means_no_cap_and_is_valid() -> None:
    spec = make_spec(host_cpus=2, net_mbps=0, disk_mbps=0, disk_iops=0)
    assert (spec.net_mbps, spec.disk_mbps, spec.disk_iops) == (0, 0, 0)


def test_host_defaults_below_zero_are_refused() -> None:
    with pytest.raises(ConfigError, match="default_net_mbps"):
        Settings(default_net_mbps=-1)
    loaded = Settings.load(path="/nonexistent", env={"SANDBOX_RT_DEFAULT_DISK_MBPS": "40"})
    assert loaded.default_disk_mbps == 40


# -- cgroup lines --------------------------------------------------------------------------------
def test_v1_lines_throttle_the_storage_device_and_pin_cpus() -> None:
    spec = make_spec(host_cpus=2, disk_mbps=20, disk_iops=300)
    lines = cgroup_limit_lines(spec, v1=True, memsw=True, disk_device="7:0", cpuset="1")
    for key in ("read_bps_device", "write_bps_device"):
        assert f"lxc.cgroup.blkio.throttle.{key} = 7:0 {20 << 20}" in lines
    for key in ("read_iops_device", "write_iops_device"):
        assert f"lxc.cgroup.blkio.throttle.{key} = 7:0 300" in lines
    assert "lxc.cgroup.cpuset.cpus = 1" in lines


def test_v2_lines_use_io_max_and_zero_lifts_the_cap() -> None:
    spec = make_spec(host_cpus=2, disk_mbps=0, disk_iops=50)
    lines = cgroup_limit_lines(spec, v1=False, memsw=False, disk_device="254:0", cpuset="0-1")
    assert "lxc.cgroup2.io.max = 254:0 rbps=max wbps=max riops=50 wiops=50" in lines
    assert "lxc.cgroup2.cpuset.cpus = 0-1" in lines
    no_device = cgroup_limit_lines(spec, v1=False, memsw=False)
    assert not [line for line in no_device if "io.max" in line or "cpuset" in line]


# -- CPU placement -------------------------------------------------------------------------------
def test_cpu_lists_round_trip_and_bad_ones_are_empty() -> None:
    assert parse_cpu_list("0-2,5,7-8\n") == [0, 1, 2, 5, 7, 8]
    assert cpu_list([8, 7, 5, 2, 1, 0]) == "0-2,5,7-8"
    assert parse_cpu_list("3-1") == [] and parse_cpu_list("a") == [] and parse_cpu_list("0-99999999") == []


def test_pick_cpus_takes_ceil_of_cpus_from_the_least_loaded() -> None:
    assert pick_cpus(1, [0, 1], {}) == [0]  # ties: the lowest
    assert pick_cpus(0.5, [0, 1], {0: 1.0}) == [1]
    assert pick_cpus(1.5, [0, 1, 2, 3], {0: 0.5, 1: 2.0, 2: 0.1, 3: 1.0}) == [0, 2]
    assert pick_cpus(8, [0, 1], {}) == [0, 1]  # never more than the host has
    assert pick_cpus(1, [], {}) == []


def test_host_load_counts_pids_and_spreads_a_sandboxs_cpus_over_its_set() -> None:
    load = HostLoad()
    load.add_sandbox({"lxc.cgroup.pids.max": "1024", "lxc.cgroup.cpu.cfs_quota_us": "150000",
                      "lxc.cgroup.cpu.cfs_period_us": "100000", "lxc.cgroup.cpuset.cpus": "0-1"})  # fmt: skip
    load.add_sandbox({"lxc.cgroup2.pids.max": "64", "lxc.cgroup2.cpu.max": "50000 100000",
                      "lxc.cgroup2.cpuset.cpus": "1"})  # fmt: skip
    load.add_sandbox({"lxc.cgroup.pids.max": "bad"})
    assert load.pids == 1088
    assert load.cpu_load == {0: 0.75, 1: 1.25}
    assert pick_cpus(1, [0, 1], load.cpu_load) == [0]


# -- pids budget ---------------------------------------------------------------------------------
def test_pids_budget_refuses_past_seven_eighths_of_pid_max() -> None:
    assert pid_budget(4194304) == 3670016
    check_pids_budget(1024, 3670016 - 1024, 4194304)  # exactly full: fine
    with pytest.raises(StateConflict, match="pids budget is spent"):  # a state: HTTP 409, not 502
        check_pids_budget(1024, 3670016 - 1023, 4194304)
    with pytest.raises(ConfigError, match="pids_max=28673"):
        check_pids_budget(28673, 0, 32768)  # the kernel's default pid_max


# -- the storage device --------------------------------------------------------------------------
MOUNTINFO = """\
22 1 254:1 / / rw,relatime - ext4 /dev/vda1 rw
40 22 0:45 / /var/lib/sandbox_rt/lxc rw,noatime - btrfs /dev/loop0 rw,space_cache=v2
41 22 0:46 / /var/lib/sandbox_rt/lxc/sbx-x/rootfs rw - overlay overlay rw
42 22 0:47 / /srv/with\\040space rw - tmpfs tmpfs rw
"""


def test_storage_device_is_the_mount_source_disk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    devices = {"/dev/loop0": os.makedev(7, 0), "/dev/vda1": os.makedev(254, 1)}
    real_stat = os.stat

    def fake_stat(path: object, *args: object, **kwargs: object) -> object:
        if path in devices:
            return types.SimpleNamespace(st_rdev=devices[str(path)])
        return real_stat(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "stat", fake_stat)
    # /sys/dev/block/254:1 -> ../../block/vda/vda1 (a partition), whose disk is /sys/block/vda (254:0)
    (tmp_path / "block" / "vda" / "vda1").mkdir(parents=True)
    (tmp_path / "block" / "vda" / "vda1" / "partition").write_text("1\n")
    (tmp_path / "block" / "vda" / "dev").write_text("254:0\n")
    (tmp_path / "dev-block").mkdir()
    (tmp_path / "dev-block" / "254:1").symlink_to(tmp_path / "block" / "vda" / "vda1")
    monkeypatch.setattr("sandbox_rt.backends.lxc.hostcaps._SYS_BLOCK", tmp_path / "dev-block")
    assert storage_device(Path("/var/lib/sandbox_rt/lxc"), MOUNTINFO) == "7:0"  # btrfs: its source
    assert storage_device(Path("/var/lib/sandbox_rt/lxc/sbx-y/delta"), MOUNTINFO) == "7:0"
    assert storage_device(Path("/home"), MOUNTINFO) == "254:0"  # a partition: its disk
    assert storage_device(Path("/srv/with space/x"), MOUNTINFO) is None  # tmpfs: no device


# -- the port binding's nft script ---------------------------------------------------------------
def _net(**changes: object) -> SandboxNet:
    mac = "02:5b:0a:63:01:07"
    base = SandboxNet("sbx-0123456789", "10.99.1.7", port="sbx0123456789", mac=mac, net_mbps=80)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_fragment_binds_mac_address_and_arp_and_polices_both_ways(tmp_path: Path) -> None:
    text = NetState(Settings(net_state_dir=tmp_path)).fragment(_net())
    cin = "add rule bridge sandbox in_0123456789"
    assert f"{cin} ether saddr != 02:5b:0a:63:01:07 counter drop" in text
    assert f"{cin} ether type != {{ ip, arp }} counter drop" in text
    assert f"{cin} ether type ip ip saddr != 10.99.1.7 counter drop" in text
    assert f"{cin} ether type arp arp saddr ether != 02:5b:0a:63:01:07 counter drop" in text
    assert f"{cin} ether type arp arp saddr ip != 10.99.1.7 counter drop" in text
    rate = net_bytes_per_s(80)
    assert f"{cin} limit rate over {rate} bytes/second counter drop" in text
    assert f"add rule bridge sandbox out_0123456789 limit rate over {rate} bytes/second counter drop" in text
    assert f"{cin} ip daddr 10.99.0.1 tcp sport 22 accept" in text  # the runtime's SSH is not counted
    assert 'add element bridge sandbox port_in { "sbx0123456789" : jump in_0123456789 }' in text
    # the binding comes before any accept, the policer before the final accept
    assert text.index("ether saddr != ") < text.index(f"{cin} ip daddr") < text.index(f"{cin} accept")


def test_no_cap_no_policer_and_bad_names_are_refused(tmp_path: Path) -> None:
    state = NetState(Settings(net_state_dir=tmp_path))
    assert "limit rate" not in state.fragment(_net(net_mbps=0))
    for bad in (_net(mac="02:5b:0a:63:01:07 } drop"), _net(port="sbx x; flush ruleset")):
        with pytest.raises(BackendError):
            state.fragment(bad)


def test_replacing_keeps_the_port_unless_it_changes(tmp_path: Path) -> None:
    state = NetState(Settings(net_state_dir=tmp_path))
    old = _net()
    same = state.replace_script(old, dataclasses.replace(old, internet=True))
    assert "bridge" not in same  # internet on: the port's chains stay as they are
    faster = state.replace_script(old, dataclasses.replace(old, net_mbps=400))
    assert "flush chain bridge sandbox in_0123456789" in faster
    assert f"limit rate over {net_bytes_per_s(400)} bytes/second" in faster
    new = state.replace_script(None, old)
    assert "flush chain" not in new  # a new sandbox: adds only (no kernel grace period)


def test_remove_takes_the_port_objects_and_says_if_flows_need_forgetting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = NetState(Settings(net_state_dir=tmp_path))
    scripts: list[str] = []

    class Done:
        returncode, stderr = 0, ""

    monkeypatch.setattr(state, "_nft_script", lambda script: scripts.append(script) or Done())
    for net, forwards in ((_net(), False), (_net(internet=True), True)):
        state._write(net)
        assert state.remove(net.sandbox_id, net.ip) is forwards
        assert 'delete element bridge sandbox port_in { "sbx0123456789" }' in scripts[-1]
        assert "delete chain bridge sandbox out_0123456789" in scripts[-1]
        assert not list(tmp_path.glob("sbx-*"))
