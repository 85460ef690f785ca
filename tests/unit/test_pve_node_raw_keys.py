"""Raw ``lxc.*`` keys on the emulated PVE node, as pve-container treats them (pve_testserver/pct_conf.py,
the node engine's config files and LXC configs), without a running node: a node root filesystem in a
temporary directory."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for pve_testserver

from pve_testserver import pct_conf
from pve_testserver.engine_memory import MemoryEngine
from pve_testserver.engine_node import NodeEngine, debian_interfaces, pve_cgroup_lines, pve_net_lines

NET0 = "name=eth0,bridge=vmbr1,hwaddr=BC:24:11:AA:BB:CC,ip=10.90.1.9/16,gw=10.90.0.1,firewall=1,type=veth"
OURS = [
    ["lxc.init.cmd", "/sbin/sandbox-init"],
    ["lxc.seccomp.profile", "/etc/sandbox_rt/lxc/sandbox.seccomp"],
    ["lxc.cap.drop", "sys_admin net_admin net_raw"],
    ["lxc.hook.mount", "/usr/local/libexec/sandbox_rt/pve-ct-setup"],
    ["lxc.mount.auto", "cgroup:ro"],
    ["lxc.mount.entry", "tmpfs dev/shm tmpfs rw,nosuid,nodev,noexec,create=dir,mode=1777,size=64m 0 0"],
    ["lxc.cgroup2.pids.max", "2048"],
]


def test_the_whitelist_keeps_ours_and_refuses_what_pve_refuses() -> None:
    text = "\n".join(
        [
            "#a description",
            "arch: amd64",
            *(f"{k}: {v}" for k, v in OURS),
            "lxc.prlimit.nofile = 1024",  # '=' is read too; prlimit/net/cgroup keys are all allowed
            "lxc.no_new_privs: 1",
            "lxc.hook.start-host: /usr/local/libexec/sandbox_rt/userns-lock",
            "lxc.rootfs.path: /tmp/elsewhere",
            "lxc.sysctl.kernel.core_pattern: |/tmp/x",
            "",
            "[snap1]",
            "lxc.cap.keep: sys_admin",  # a snapshot's own section is not the CT's
        ]
    )
    kept, warnings = pct_conf.parse_raw(text)
    assert kept == [*OURS, ["lxc.prlimit.nofile", "1024"]]
    refused = sorted(w.split(":", 1)[0] for w in warnings)
    assert refused == [
        "lxc.hook.start-host",
        "lxc.no_new_privs",
        "lxc.rootfs.path",
        "lxc.sysctl.kernel.core_pattern",
    ]
    assert pct_conf.key_allowed("lxc.sysctl.kernel.shmmax") and not pct_conf.key_allowed("lxc.sysctl.net.x")


def test_the_file_lists_options_then_raw_keys_then_snapshots() -> None:
    conf = {"description": "line one\nline two", "memory": 512, "lxc": OURS[:2], "hostname": "ct"}
    text = pct_conf.render(conf, {"s1": {"config": {"memory": 256}}})
    assert text.splitlines() == [
        "#line one",
        "#line two",
        "hostname: ct",
        "memory: 512",
        "lxc.init.cmd: /sbin/sandbox-init",
        "lxc.seccomp.profile: /etc/sandbox_rt/lxc/sandbox.seccomp",
        "",
        "[s1]",
        "memory: 256",
    ]
    assert pct_conf.parse_raw(text)[0] == OURS[:2]  # and it reads back


def _engine(tmp_path: Path) -> NodeEngine:
    (tmp_path / "pve9" / "rootfs" / "etc").mkdir(parents=True)
    return NodeEngine(tmp_path, "pve9")


def _cts(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {"9000": {"vmid": 9000, "node": "pve9", "config": config}}


def test_root_edits_of_the_file_become_the_cts_raw_entries(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    cts = _cts({"hostname": "sandbox-template", "memory": 512, "template": 1})
    assert not engine.sync_config_files(cts, "pve9")  # written: nothing to read back yet
    path = engine.config_file("pve9", 9000)
    assert path.read_text() == "hostname: sandbox-template\nmemory: 512\ntemplate: 1\n"
    assert (engine.host_path("/etc/pve/lxc")).resolve() == path.parent.resolve()  # PVE's link
    # root on the node adds the raw lines (the node play's lineinfile), and a key PVE refuses
    path.write_text(path.read_text() + "".join(f"{k}: {v}\n" for k, v in OURS) + "lxc.no_new_privs: 1\n")
    assert engine.sync_config_files(cts, "pve9")
    assert cts["9000"]["config"]["lxc"] == OURS
    assert engine.refused_keys[9000] == ["lxc.no_new_privs"]
    assert "lxc.no_new_privs" not in path.read_text()  # written back as PVE writes what it parsed
    assert not engine.sync_config_files(cts, "pve9")  # unchanged since: nothing to read
    # root removes them again
    path.write_text("hostname: sandbox-template\nmemory: 512\ntemplate: 1\n")
    assert engine.sync_config_files(cts, "pve9") and "lxc" not in cts["9000"]["config"]
    # a CT that is gone loses its file
    engine.sync_config_files({}, "pve9")
    assert not path.exists()


def test_no_node_no_files(tmp_path: Path) -> None:
    engine = NodeEngine(tmp_path, "absent")
    assert not engine.sync_config_files(_cts({"memory": 512}), "absent")
    assert not (tmp_path / "absent").exists()


def test_the_lxc_config_appends_the_raw_entries_last(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    ct = engine.host_path("/var/lib/lxc/101")
    ct.mkdir(parents=True)
    # what lxc-copy leaves: the source's config with its own rootfs line appended at the end
    (ct / "config").write_text(
        engine.lxc_config(9000, "dir:/var/lib/lxc/9000/rootfs")
        + "lxc.net.0.ipv4.address = 10.90.9.9/16\nlxc.rootfs.path = overlayfs:/var/lib/lxc/9000/rootfs:/d\n"
    )
    config = {"hostname": "sbx", "memory": 256, "swap": 0, "cpulimit": "0.5", "net0": NET0}
    engine.apply_config(101, {**config, "lxc": [*OURS, ["lxc.no_new_privs", "1"]]})
    lines = (ct / "config").read_text().splitlines()
    assert lines[-len(OURS) :] == [f"{k} = {v}" for k, v in OURS]  # last, in order, refused key dropped
    assert "lxc.no_new_privs = 1" not in lines
    assert [ln for ln in lines if ln.startswith("lxc.rootfs.path")] == [
        "lxc.rootfs.path = overlayfs:/var/lib/lxc/9000/rootfs:/d"
    ]
    assert not [ln for ln in lines if "ipv4" in ln]  # pve-container sets no address: the CT's config does
    assert "lxc.seccomp.allow_nesting = 1" in lines  # the node itself is seccomp-filtered (see engine)
    # again, without raw entries: none left over
    engine.apply_config(101, config)
    assert not [ln for ln in (ct / "config").read_text().splitlines() if ln.startswith("lxc.init.cmd")]


def test_what_pve_container_writes_for_net0_and_the_cpu_limit() -> None:
    assert pve_net_lines(7, {"net0": NET0}) == [
        "lxc.net.0.veth.pair = veth7i0",
        "lxc.net.0.link = vmbr1",
        "lxc.net.0.name = eth0",
        "lxc.net.0.hwaddr = bc:24:11:aa:bb:cc",
    ]
    assert debian_interfaces({"net0": NET0}).splitlines() == [
        "auto lo",
        "iface lo inet loopback",
        "",
        "auto eth0",
        "iface eth0 inet static",
        "\taddress 10.90.1.9/16",
        "\tgateway 10.90.0.1",
    ]
    assert "iface eth0 inet dhcp" in debian_interfaces({"net0": "name=eth0,ip=dhcp"})
    # cpulimit is the quota (cores pins CPUs on PVE: no quota from it)
    v1 = pve_cgroup_lines({"memory": 256, "swap": 0, "cores": 1, "cpulimit": "0.5"}, 1, memsw=True)
    assert "lxc.cgroup.cpu.cfs_quota_us = 50000" in v1 and "lxc.cgroup.cpu.cfs_period_us = 100000" in v1
    assert not [ln for ln in pve_cgroup_lines({"memory": 256, "cores": 2}, 1, memsw=True) if "cpu" in ln]
    assert "lxc.cgroup2.cpu.max = 150000 100000" in pve_cgroup_lines({"memory": 1, "cpulimit": 1.5}, 2, False)


def test_a_clone_copies_the_raw_entries() -> None:
    """pct clone copies every key it does not special-case: the template's raw entries reach every
    linked clone (the API's clone handler, engine aside), and GET .../config lists them."""
    from proxmoxer.tools import Tasks

    from pve_testserver import PVETestServer

    def ok(api: Any, upid: str) -> None:
        status = Tasks.blocking_status(api, upid, timeout=10, polling_interval=0.02)
        assert status is not None and status["exitstatus"] == "OK", status

    with PVETestServer(engine=MemoryEngine()) as srv:
        root = srv.client(timeout=10)
        node = srv.core.local_node
        ostemplate = "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"
        ok(root, root.nodes(node).lxc.post(vmid=9000, ostemplate=ostemplate, rootfs="local-lvm:8"))
        with srv.core.state.lock:  # root's edit of /etc/pve/lxc/9000.conf (the node engine reads it so)
            srv.core.state.cts["9000"]["config"]["lxc"] = OURS
        root.nodes(node).lxc(9000).template.post()
        ok(root, root.nodes(node).lxc(9000).clone.post(newid=101, hostname="sbx-101"))
        assert root.nodes(node).lxc(101).config.get()["lxc"] == OURS
        assert root.nodes(node).lxc(9000).config.get()["lxc"] == OURS
