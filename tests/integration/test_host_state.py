"""What the roles leave on the host (docs/host-contract.md), checked with testinfra's local backend."""

from __future__ import annotations

import json
import os
import re

import pytest
import testinfra

from tests.integration.provision_helpers import REPO, ensure_provisioned

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="inspects root-only state: needs root"),
]

CONTRACT_KEYS = {
    "backend",
    "lxc_path",
    "template",
    "templates",
    "bridge",
    "network_cidr",
    "gateway",
    "dns_server",
    "ip_pool_start",
    "ip_pool_end",
    "ssh_user",
    "ssh_key",
    "nft_family",
    "nft_table",
    "nft_internet_set",
    "net_state_dir",
    "dnsmasq_conf_dir",
    "dnsmasq_conf",
    "dnsmasq_pidfile",
    "egress_dns_port_min",
    "egress_dns_port_max",
    "idmap_base",
    "idmap_size",
    "disk_limits",
    "volume_dir",
    "volume_host_dirs",
}


@pytest.fixture(scope="module")
def settings() -> dict[str, object]:
    return ensure_provisioned()


@pytest.fixture(scope="module")
def host():  # type: ignore[no-untyped-def]
    return testinfra.get_host("local://")


@pytest.fixture(scope="module")
def rootfs(settings: dict[str, object]) -> str:
    return f"{settings['lxc_path']}/{settings['template']}/rootfs"


def test_host_json_has_exactly_the_contract_keys(host, settings) -> None:  # type: ignore[no-untyped-def]
    f = host.file("/etc/sandbox_rt/host.json")
    assert f.mode == 0o644 and f.user == "root"
    data = json.loads(f.content_string)
    assert set(data) == CONTRACT_KEYS
    assert data["backend"] == "lxc" and data["idmap_base"] == 100000 and data["idmap_size"] == 65536
    assert isinstance(data["idmap_base"], int)
    assert data["disk_limits"] is True  # lxc_host_storage: btrfs_loop, the default


def test_lxc_path_is_btrfs_with_quotas_from_fstab(host, settings) -> None:  # type: ignore[no-untyped-def]
    lxc_path = str(settings["lxc_path"])
    mount = host.mount_point(lxc_path)
    assert mount.exists and mount.filesystem == "btrfs"
    assert host.run(f"btrfs qgroup show {lxc_path}").rc == 0  # quotas are on
    fstab = [line.split() for line in host.file("/etc/fstab").content_string.splitlines()]
    assert any(f[1:3] == [lxc_path, "btrfs"] and "loop" in f[3] for f in fstab if len(f) >= 4)
    image = host.file("/var/lib/sandbox_rt/lxc-storage.btrfs")
    assert image.mode == 0o600 and image.user == "root"


def test_runtime_key_is_private(host, settings) -> None:  # type: ignore[no-untyped-def]
    key = host.file(str(settings["ssh_key"]))
    assert key.exists and key.user == "root" and key.mode == 0o600
    assert host.file(str(settings["ssh_key"]) + ".pub").content_string.startswith("ssh-ed25519 ")
    assert host.file(os.path.dirname(str(settings["ssh_key"]))).mode == 0o700


def test_subordinate_ids_for_unprivileged_containers(host) -> None:  # type: ignore[no-untyped-def]
    # the template's range and one per sandbox address (isolated id maps), all below 2^32
    for path in ("/etc/subuid", "/etc/subgid"):
        assert f"root:100000:{65536 * (1 + 65533)}" in host.file(path).content_string.splitlines()


def test_bridge_up_with_address_and_fixed_mac(host, settings) -> None:  # type: ignore[no-untyped-def]
    bridge = str(settings["bridge"])
    link = json.loads(host.check_output(f"ip -j -d addr show dev {bridge}"))[0]
    assert link["linkinfo"]["info_kind"] == "bridge"
    assert "UP" in link["flags"]
    assert link["address"] == "02:00:0a:63:00:01"
    inet = [(a["local"], a["prefixlen"]) for a in link["addr_info"] if a["family"] == "inet"]
    assert inet == [(settings["gateway"], 16)]
    assert not [a for a in link["addr_info"] if a["family"] == "inet6"], "IPv6 on the sandbox bridge"
    assert host.sysctl(f"net.ipv6.conf.{bridge}.disable_ipv6") == 1


def test_bridge_has_no_physical_port(host, settings) -> None:  # type: ignore[no-untyped-def]
    ports = json.loads(host.check_output(f"ip -j -d link show master {settings['bridge']}") or "[]")
    assert all(p.get("linkinfo", {}).get("info_kind") == "veth" for p in ports), ports


def test_dnsmasq_runs_bound_only_to_the_bridge(host, settings) -> None:  # type: ignore[no-untyped-def]
    pid = host.file("/run/sandbox_rt/dnsmasq.pid").content_string.strip()
    cmdline = host.file(f"/proc/{pid}/cmdline").content_string.replace("\0", " ")
    assert "dnsmasq" in cmdline and "--conf-file=/etc/sandbox_rt/dnsmasq.conf" in cmdline
    sockets = [
        line.split() for line in host.check_output("ss -H -lntup").splitlines() if f"pid={pid}," in line
    ]
    local = sorted({fields[4] for fields in sockets})
    assert local, "dnsmasq has no sockets"
    allowed = {f"{settings['gateway']}:53", f"0.0.0.0%{settings['bridge']}:67"}
    assert set(local) <= allowed, f"dnsmasq listens beyond the bridge: {local}"
    conf = host.file("/etc/sandbox_rt/dnsmasq.conf").content_string
    for line in (
        "interface=vmbr1",
        "bind-interfaces",
        "except-interface=lo",
        "no-resolv",
        "dhcp-range=10.99.0.100,10.99.0.250,255.255.0.0,1h",
    ):
        assert line in conf.splitlines(), line


def test_nftables_tables_are_loaded_and_default_deny(host, settings) -> None:  # type: ignore[no-untyped-def]
    table = host.check_output(f"nft list table inet {settings['nft_table']}")
    assert re.search(rf"set {settings['nft_internet_set']} \{{\s*type ipv4_addr", table)
    forward = table[table.index("chain forward") :]
    assert "policy drop;" in forward.splitlines()[1]
    assert "ct state established,related accept" in forward
    from_sandbox = table[table.index("chain from_sandbox") :]
    assert (
        "udp dport 67 accept" in from_sandbox
        and "ip saddr @internet_allowed udp dport 53 accept" in from_sandbox
    )
    assert "masquerade" not in table, "no uplink is configured locally: there must be no NAT"
    bridge = host.check_output(f"nft list table bridge {settings['nft_table']}")
    assert 'iifname "sbx*"' in bridge and "drop" in bridge
    # Only our two tables were touched: whatever else exists (e.g. netguard) is still there.
    assert host.run("nft list ruleset").rc == 0


def test_template_rootfs_is_unprivileged_and_has_no_identity(host, rootfs) -> None:  # type: ignore[no-untyped-def]
    root = host.file(rootfs)
    assert root.uid == 100000 and root.gid == 100000
    for path in ("etc", "etc/shadow", "usr/bin/sudo", "etc/ssh/sshd_config", "sbin/sandbox-init"):
        assert host.file(f"{rootfs}/{path}").uid == 100000, path
    assert host.file(f"{rootfs}/usr/bin/sudo").mode & 0o4000, "setuid bits lost in extraction"
    assert host.check_output(f"find {rootfs}/etc/ssh -name 'ssh_host_*'") == ""
    assert host.file(f"{rootfs}/etc/machine-id").size == 0
    init = host.file(f"{rootfs}/sbin/sandbox-init")
    assert init.mode == 0o755 and "exec /usr/bin/tini -- /usr/sbin/sshd -D -e" in init.content_string
    assert not host.file(f"{rootfs}/tmp/.ansible-sandbox_template").exists
    assert not host.file(f"{rootfs}/root/.ansible").exists


def test_template_authorized_keys_hold_the_runtime_key(host, settings, rootfs) -> None:  # type: ignore[no-untyped-def]
    # root-owned (container root = host 100000), not the sandbox user's (101000): it cannot rewrite them
    keys_dir = host.file(f"{rootfs}/etc/ssh/authorized_keys")
    keys = host.file(f"{rootfs}/etc/ssh/authorized_keys/sandbox")
    assert keys_dir.mode == 0o755 and keys.mode == 0o644
    assert keys_dir.uid == keys.uid == keys_dir.gid == keys.gid == 100000
    public = host.file(str(settings["ssh_key"]) + ".pub").content_string.split()[1]
    lines = keys.content_string.splitlines()
    assert len(lines) == 1 and public in lines[0] and lines[0].startswith("restrict")
    assert not host.file(f"{rootfs}/home/sandbox/.ssh").exists  # sshd never reads it
    sshd = host.file(f"{rootfs}/etc/ssh/sshd_config").content_string.splitlines()
    assert "AuthorizedKeysFile /etc/ssh/authorized_keys/%u" in sshd


def test_template_sshd_and_limits(host, rootfs) -> None:  # type: ignore[no-untyped-def]
    sshd = host.file(f"{rootfs}/etc/ssh/sshd_config").content_string.splitlines()
    for line in (
        "PermitRootLogin no",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "AllowUsers sandbox",
        "MaxAuthTries 3",
        "MaxSessions 100",
        "MaxStartups 100:30:200",
        "AllowTcpForwarding no",
        "X11Forwarding no",
        "AllowAgentForwarding no",
        "PermitTunnel no",
        "HostKey /etc/ssh/ssh_host_ed25519_key",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "Subsystem sftp internal-sftp",
    ):
        assert line in sshd, line
    assert len([line for line in sshd if line.startswith("HostKey ")]) == 1
    limits = host.file(f"{rootfs}/etc/security/limits.d/sandbox.conf").content_string
    for expected in (r"\*\s+soft\s+nproc\s+256", r"\*\s+hard\s+nproc\s+512", r"\*\s+hard\s+core\s+0"):
        assert re.search(expected, limits), expected


def test_template_config_is_complete_and_confined(host, settings) -> None:  # type: ignore[no-untyped-def]
    config = host.file(f"{settings['lxc_path']}/{settings['template']}/config").content_string
    lines = [line.strip() for line in config.splitlines()]
    for line in (
        "lxc.idmap = u 0 100000 65536",
        "lxc.idmap = g 0 100000 65536",
        "lxc.init.cmd = /sbin/sandbox-init",
        "lxc.net.0.type = veth",
        f"lxc.net.0.link = {settings['bridge']}",
        "lxc.net.0.name = eth0",
        "lxc.seccomp.profile = /etc/sandbox_rt/lxc/sandbox.seccomp",
        "lxc.no_new_privs = 1",
        "lxc.hook.start-host = /usr/local/libexec/sandbox_rt/userns-lock",
        "lxc.cgroup.devices.deny = a",
    ):
        assert line in lines, line
    profile = host.file("/etc/sandbox_rt/lxc/sandbox.seccomp")
    assert profile.user == "root" and profile.mode == 0o644
    assert profile.content == (REPO / "roles/template_build/files/sandbox.seccomp").read_bytes()
    hook = host.file("/usr/local/libexec/sandbox_rt/userns-lock")
    assert hook.user == "root" and hook.mode == 0o755
    assert not any(line.startswith("lxc.include") for line in lines), "no common.conf (lxcfs hooks)"
    assert not any(line.startswith("lxc.net.0.ipv4") for line in lines), "the template has no address"
    dropped = " ".join(line.split("=", 1)[1] for line in lines if line.startswith("lxc.cap.drop")).split()
    assert {"sys_admin", "sys_module", "sys_rawio", "sys_ptrace", "mac_admin", "net_admin"} <= set(dropped)


def test_host_does_not_enable_unprivileged_user_namespaces(host) -> None:  # type: ignore[no-untyped-def]
    """lxc_host sets kernel.unprivileged_userns_clone=0 where the kernel has the key (Debian/Ubuntu
    kernels; upstream ones, like this CI machine's, do not) and never writes 1."""
    dropin = host.file("/etc/sysctl.d/60-sandbox_rt-lxc.conf").content_string
    assert not re.search(r"^kernel\.unprivileged_userns_clone\s*=\s*1", dropin, re.M), dropin
    if host.file("/proc/sys/kernel/unprivileged_userns_clone").exists:
        assert host.sysctl("kernel.unprivileged_userns_clone") == 0


def test_bridge_keeps_carrier_through_a_stub_port_alone_in_its_netns(host, settings) -> None:  # type: ignore[no-untyped-def]
    bridge = str(settings["bridge"])
    link = json.loads(host.check_output(f"ip -j -d link show dev {bridge}"))[0]
    assert "LOWER_UP" in link["flags"], link["flags"]  # carrier, with or without sandboxes
    stub = json.loads(host.check_output(f"ip -j -d link show dev {bridge}-stub"))[0]
    assert stub["master"] == bridge and stub["linkinfo"]["info_kind"] == "veth"
    assert not json.loads(host.check_output(f"ip -j addr show dev {bridge}-stub"))[0]["addr_info"]
    netns = f"sandbox_rt-carrier-{bridge}"
    inside = json.loads(host.check_output(f"ip -n {netns} -j addr show"))
    assert sorted(i["ifname"] for i in inside) == ["lo", "stub0"]
    assert all(not i["addr_info"] for i in inside), inside  # no address at all (lo down, IPv6 off)
    assert host.run(f"ip netns exec {netns} sysctl -n net.ipv6.conf.all.disable_ipv6").stdout.strip() == "1"


def test_template_pam_session_has_limits_but_no_motd_scripts(host, rootfs) -> None:  # type: ignore[no-untyped-def]
    stack = [
        line.split()
        for line in host.file(f"{rootfs}/etc/pam.d/sshd").content_string.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    modules = [words[2] for words in stack if len(words) >= 3 and words[0] == "session"]
    assert "pam_limits.so" in modules
    assert not {"pam_motd.so", "pam_mail.so"} & set(modules), modules
