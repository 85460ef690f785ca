"""Proof that the checks can fail: for every control in PROVES, the protection is removed in a
throw-away setup and the control's own check function must then report a Violation (and, for the
network ones, pass again once the protection is back). Nothing here touches the template or other
users' sandboxes: each proof uses its own fresh sandboxes (the kernel-surface ones are clones of a
throw-away copy of the template's config, tests/hardening/variants.py), and nft rules inserted here
match only their addresses and are deleted by handle afterwards, also on failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox_rt.backends.lxc.backend as lxc_backend
from sandbox_rt import Manager, Settings
from sandbox_rt.backends.lxc.hostcaps import storage_device
from sandbox_rt.backends.lxc.netstate import NetState
from sandbox_rt.backends.lxc.nft import NftInternetSet
from sandbox_rt.ipam import mac_for_ip
from tests.integration.provision_helpers import sh, tcp_open, wait_for

from . import cgroup_checks as cc
from . import checks, sites
from . import neighbour_checks as nc
from .checks import Target, Violation
from .conftest import SESSION_LABEL, SITES, Factory, _factory, _node_site
from .testnet import SimNet, host_listeners
from .variants import ALLOW_ALL_SECCOMP, STOCK_SECCOMP, pve_template_variant, template_variant

pytestmark = [pytest.mark.slow]

# proof test -> the control whose check it shows failing
PROVES = {
    "test_proof_internet_added_by_hand_is_caught": "SBX-NET-04",
    "test_proof_lan_accept_rule_is_caught": "SBX-NET-07",
    "test_proof_unisolated_ports_are_caught": "SBX-NET-08",
    "test_proof_host_port_opened_is_caught": "SBX-NET-09",
    "test_proof_unlimited_pids_are_caught": "SBX-RES-01",
    "test_proof_sudo_granted_is_caught": "SBX-USER-02",
    "test_proof_password_login_enabled_is_caught": "SBX-SSH-02",
    "test_proof_dns_for_any_name_is_caught": "SBX-NET-18",
    # the kernel surface (issue 16): LXC's stock profile, or a filter refusing nothing
    "test_proof_stock_seccomp_lets_user_namespaces_through": "SBX-ESC-08",
    "test_proof_stock_seccomp_is_not_ours": "SBX-ESC-11",
    "test_proof_stock_seccomp_lets_setns_through": "SBX-ESC-15",
    "test_proof_stock_seccomp_lets_keyring_through": "SBX-ESC-16",
    "test_proof_stock_seccomp_lets_io_uring_through": "SBX-ESC-17",
    "test_proof_stock_seccomp_lets_userfaultfd_through": "SBX-ESC-18",
    "test_proof_stock_seccomp_lets_bpf_through": "SBX-ESC-19",
    "test_proof_stock_seccomp_lets_perf_events_through": "SBX-ESC-20",
    "test_proof_stock_seccomp_lets_mount_calls_through": "SBX-ESC-21",
    "test_proof_stock_seccomp_lets_clock_setting_through": "SBX-ESC-22",
    "test_proof_stock_seccomp_lets_ptrace_through": "SBX-ESC-23",
    "test_proof_stock_seccomp_lets_reboot_through": "SBX-ESC-24",
    "test_proof_stock_seccomp_lets_admin_calls_through": "SBX-ESC-25",
    "test_proof_module_calls_reaching_the_kernel_are_caught": "SBX-ESC-07",
    "test_proof_missing_userns_lock_is_caught": "SBX-ESC-14",
    "test_proof_setuid_with_new_privs_is_caught": "SBX-ESC-26",
    "test_proof_init_started_as_root_is_caught": "SBX-ESC-28",
    "test_proof_user_owned_authorized_keys_are_caught": "SBX-USER-04",
    # PVE-backed sandboxes (the emulated node): a CT whose template lacks the raw lxc.* keys
    "test_proof_pve_ct_without_raw_keys_runs_pves_seccomp": "SBX-ESC-11",
    "test_proof_pve_ct_without_raw_keys_keeps_its_capabilities": "SBX-ESC-10",
    "test_proof_pve_ct_without_raw_keys_gains_new_privileges": "SBX-ESC-26",
    "test_proof_pve_ct_without_raw_keys_lets_the_keyring_through": "SBX-ESC-16",
    # ... and a CT whose caps the node's hookscript did not set (the template's raw pids.max, no throttle)
    "test_proof_pve_ct_without_the_hookscripts_pids_cap_is_caught": "SBX-RES-01",
    "test_proof_pve_ct_without_the_hookscripts_disk_caps_is_caught": "SBX-RES-10",
    # shared resources (issue 26): each cap removed for one sandbox
    "test_proof_uncapped_conntrack_is_caught": "SBX-RES-06",
    "test_proof_unlimited_dns_is_caught": "SBX-RES-07",
    "test_proof_unlimited_new_flows_to_the_host_are_caught": "SBX-RES-08",
    "test_proof_unpoliced_port_is_caught": "SBX-RES-09",
    "test_proof_unthrottled_disk_is_caught": "SBX-RES-10",
    "test_proof_unbudgeted_pids_are_caught": "SBX-RES-11",
    "test_proof_host_limits_without_lxcfs_are_caught": "SBX-RES-12",
    "test_proof_unbound_port_is_caught": "SBX-NET-19",
    # root leaving its limits (issue 35): the cgroup tree mounted as before (cgroup:mixed)
    "test_proof_writable_cgroup_tree_is_caught": "SBX-RES-13",
    "test_proof_pve_ct_with_a_writable_cgroup_tree_is_caught": "SBX-RES-13",
}


def expect_violation(control: str, check: object, *args: object, match: str = "") -> Violation:
    with pytest.raises(Violation) as caught:
        check(*args)  # type: ignore[operator]
    assert caught.value.control == control, caught.value
    assert match in str(caught.value), caught.value
    return caught.value


@contextlib.contextmanager
def nft_rule(settings: Settings, chain: str, rule: str, family: str = "inet") -> Iterator[None]:
    """Insert ``rule`` at the top of ``chain`` of the ``family`` sandbox table; delete it by handle
    after."""
    tag = f"hardening-proof-{secrets.token_hex(4)}"
    table = [family, settings.nft_table]
    sh("nft", "insert", "rule", *table, chain, *rule.split(), "comment", f'"{tag}"')
    try:
        yield
    finally:
        listing = sh("nft", "-a", "list", "chain", *table, chain).stdout
        for line in listing.splitlines():
            if tag in line:
                sh("nft", "delete", "rule", *table, chain, "handle", line.rsplit("handle", 1)[1].strip())
        assert tag not in sh("nft", "list", "chain", *table, chain).stdout, "proof rule not removed"


@contextlib.contextmanager
def renamed_port(port: str, new: str) -> Iterator[None]:
    """Give a sandbox's bridge port a name outside the isolated ``sbx*`` prefix; rename it back after."""
    sh("ip", "link", "set", "dev", port, "down")
    sh("ip", "link", "set", "dev", port, "name", new)
    sh("ip", "link", "set", "dev", new, "up")
    try:
        yield
    finally:
        if sh("ip", "link", "show", "dev", new, check=False).returncode == 0:
            sh("ip", "link", "set", "dev", new, "down")
            sh("ip", "link", "set", "dev", new, "name", port)
            sh("ip", "link", "set", "dev", port, "up")


def test_proof_internet_added_by_hand_is_caught(make: Factory, net: SimNet, nft: NftInternetSet) -> None:
    t = make()
    s = t.settings
    element = ["inet", s.nft_table, s.nft_internet_set, "{", t.ip, "}"]
    sh("nft", "add", "element", *element)
    try:
        expect_violation("SBX-NET-04", checks.check_no_internet, t, net, nft, match="reached the internet")
    finally:
        sh("nft", "delete", "element", *element, check=False)
    checks.check_no_internet(t, net, nft)


def test_proof_lan_accept_rule_is_caught(make: Factory, net: SimNet, settings: Settings) -> None:
    t = make()
    with nft_rule(settings, "forward", f"ip saddr {t.ip} ip daddr {net.lan_ip} accept"):
        expect_violation("SBX-NET-07", checks.check_no_lan, t, net, match="reached the LAN")
    checks.check_no_lan(t, net)


def test_proof_unisolated_ports_are_caught(make: Factory, settings: Settings) -> None:
    a, b = make(), make()
    ports = [checks.Footprint.of(x.id, settings.lxc_path).port for x in (a, b)]
    with (
        nft_rule(settings, "forward", f"ip saddr {a.ip} ip daddr {b.ip} accept"),
        nft_rule(settings, "forward", f"ip saddr {b.ip} ip daddr {a.ip} accept"),
    ):
        # routing-layer accept alone: the layer-2 rule on sbx* ports still keeps them apart
        checks.check_isolated(a, b)
        # and without the sbx* names (the bridge table no longer matches) they meet
        with renamed_port(ports[0], "hproofa0"), renamed_port(ports[1], "hproofb0"):
            expect_violation("SBX-NET-08", checks.check_isolated, a, b, match="reached")
    checks.check_isolated(a, b)


def test_proof_host_port_opened_is_caught(make: Factory, settings: Settings, net: SimNet) -> None:
    t = make()
    with host_listeners(settings.gateway, [8006]) as served:
        assert served == [8006] and tcp_open(settings.gateway, 8006), "precondition: the host serves :8006"
        with nft_rule(settings, "from_sandbox", f"ip saddr {t.ip} tcp dport 8006 accept"):
            expect_violation(
                "SBX-NET-09", checks.check_no_host_services, t, settings.gateway, [8006], match="8006"
            )
        checks.check_no_host_services(t, settings.gateway, [8006])


def test_proof_unlimited_pids_are_caught(make: Factory) -> None:
    loose = make(pids_max=1 << 21)  # far above the check's 128 and within the host's pids budget
    expect_violation("SBX-RES-01", checks.check_pids_fenced, loose, 128, match="pids.max")
    checks.check_pids_fenced(make(pids_max=128), 128)


def test_proof_sudo_granted_is_caught(make: Factory) -> None:
    t = make()
    grant = "/etc/sudoers.d/zz-hardening-proof"
    made = checks.run_root(t, f"echo 'sandbox ALL=(ALL) NOPASSWD:ALL' > {grant} && chmod 0440 {grant}")
    assert made.returncode == 0, made.stderr
    try:
        # with no_new_privs (SBX-ESC-26) even a granted sudo cannot run (`sudo -n true` stops at the
        # flag): the check catches the grant in sudo's own policy listing
        expect_violation("SBX-USER-02", checks.check_no_sudo, t, match="may run the following commands")
    finally:
        checks.run_root(t, f"rm -f {grant}")
    checks.check_no_sudo(t)


def test_proof_password_login_enabled_is_caught(make: Factory) -> None:
    t: Target = make()
    weaken = (
        "echo 'sandbox:proof-only-password' | chpasswd && "
        "sed -i -e 's/^PasswordAuthentication no/PasswordAuthentication yes/' "
        "-e 's/^AuthenticationMethods publickey/AuthenticationMethods any/' /etc/ssh/sshd_config && "
        "kill -HUP $(ps -eo pid=,ppid=,comm= | awk '$2 == 1 && $3 == \"sshd\" {print $1}')"
    )
    done = checks.run_root(t, weaken)
    assert done.returncode == 0, done.stderr
    assert checks.sshd_value(checks.sshd_settings(t), "passwordauthentication") == "yes"
    wait_for(lambda: tcp_open(t.ip, 22), 10, "sshd back after HUP")  # it re-executes itself
    expect_violation("SBX-SSH-02", checks.check_password_refused, t, match="password auth is on")


def test_proof_dns_for_any_name_is_caught(make: Factory, net: SimNet, settings: Settings) -> None:
    # the old design: a listed sandbox asks the host's shared dnsmasq, which forwards any name upstream
    t = make(egress=[net.dns_name])
    tag = secrets.token_hex(4)
    with (
        nft_rule(settings, "prerouting", f"ip saddr {t.ip} accept"),  # no DNAT to its own resolver
        nft_rule(settings, "from_sandbox", f"ip saddr {t.ip} meta l4proto {{ tcp, udp }} th dport 53 accept"),
    ):
        allowed, outside = (f"q{tag}.{net.dns_name}", net.public_web_ip), [f"p{tag}.{net.other_dns_name}"]
        expect_violation("SBX-NET-18", checks.check_dns_answers_only_the_list, t, net, allowed, outside)
    allowed, outside = (f"r{tag}.{net.dns_name}", net.public_web_ip), [f"s{tag}.{net.other_dns_name}"]
    checks.check_dns_answers_only_the_list(t, net, allowed, outside)


# -- the kernel surface (issue 16) ----------------------------------------------------------------
@pytest.fixture(scope="module")
def stock_seccomp(settings: Settings, workdir: Path) -> Iterator[Target]:
    """A throw-away sandbox whose config loads LXC's stock common.seccomp (all else as the template)."""
    with (
        template_variant(settings, {"lxc.seccomp.profile": STOCK_SECCOMP}) as variant,
        _factory(Manager(variant), settings, workdir) as make_stock,
    ):
        yield make_stock()


@pytest.fixture(scope="module")
def unconfined(settings: Settings, workdir: Path) -> Iterator[Target]:
    """A throw-away sandbox with a filter that refuses nothing, no user namespace lock and no
    no_new_privs: the kernel's own checks alone (its one start hook opens port 22, SBX-ESC-28)."""
    profile = workdir / "allow-all.seccomp"
    profile.write_text(ALLOW_ALL_SECCOMP)
    port_hook = str(checks.role_defaults("template_build")["template_build_sshd_port_hook"])
    changes = {"lxc.seccomp.profile": str(profile), "lxc.hook.start-host": port_hook, "lxc.no_new_privs": "0"}
    with (
        template_variant(settings, changes) as variant,
        _factory(Manager(variant), settings, workdir) as make_unconfined,
    ):
        yield make_unconfined()


def test_proof_stock_seccomp_lets_user_namespaces_through(stock_seccomp: Target) -> None:
    expect_violation("SBX-ESC-08", checks.check_no_user_namespaces, stock_seccomp, match="ENOSPC")
    # ... and still refused, by the second lock alone (SBX-ESC-14): ENOSPC, not the filter's EPERM
    got = checks.kernel_probe(stock_seccomp, "userns")["userns"]
    assert got["unshare(CLONE_NEWUSER)"]["errno"] == errno.ENOSPC, got
    assert got["clone(CLONE_NEWUSER)"]["errno"] == errno.ENOSPC, got
    checks.check_userns_lock(stock_seccomp)


def test_proof_stock_seccomp_is_not_ours(stock_seccomp: Target) -> None:
    expect_violation("SBX-ESC-11", checks.check_seccomp, stock_seccomp, match="answers umount2 with allow")


def test_proof_stock_seccomp_lets_setns_through(stock_seccomp: Target) -> None:
    expect_violation("SBX-ESC-15", checks.check_refused, stock_seccomp, "setns")


def test_proof_stock_seccomp_lets_keyring_through(stock_seccomp: Target) -> None:
    expect_violation("SBX-ESC-16", checks.check_refused, stock_seccomp, "keyring")


def test_proof_stock_seccomp_lets_io_uring_through(stock_seccomp: Target) -> None:
    expect_violation("SBX-ESC-17", checks.check_refused, stock_seccomp, "io_uring")


def test_proof_stock_seccomp_lets_userfaultfd_through(stock_seccomp: Target) -> None:
    expect_violation("SBX-ESC-18", checks.check_refused, stock_seccomp, "userfaultfd")


def test_proof_stock_seccomp_lets_bpf_through(stock_seccomp: Target) -> None:
    expect_violation("SBX-ESC-19", checks.check_refused, stock_seccomp, "bpf")


def test_proof_stock_seccomp_lets_perf_events_through(stock_seccomp: Target) -> None:
    expect_violation("SBX-ESC-20", checks.check_refused, stock_seccomp, "perf_event_open")


def test_proof_stock_seccomp_lets_mount_calls_through(stock_seccomp: Target) -> None:
    expect_violation("SBX-ESC-21", checks.check_refused, stock_seccomp, "mount")


def test_proof_stock_seccomp_lets_clock_setting_through(stock_seccomp: Target) -> None:
    expect_violation("SBX-ESC-22", checks.check_refused, stock_seccomp, "clock")


def test_proof_stock_seccomp_lets_ptrace_through(stock_seccomp: Target) -> None:
    expect_violation("SBX-ESC-23", checks.check_refused, stock_seccomp, "ptrace")


def test_proof_stock_seccomp_lets_reboot_through(stock_seccomp: Target) -> None:
    # reboot and kexec_load get EPERM from the kernel too: the loaded filter's answer tells them apart
    expect_violation("SBX-ESC-24", checks.check_refused, stock_seccomp, "reboot")


def test_proof_stock_seccomp_lets_admin_calls_through(stock_seccomp: Target) -> None:
    expect_violation("SBX-ESC-25", checks.check_refused, stock_seccomp, "admin")


def test_proof_module_calls_reaching_the_kernel_are_caught(unconfined: Target) -> None:
    # the stock profile refuses the module calls too; with a filter that refuses nothing the kernel
    # answers them itself (EPERM, or ENOSYS without module support), and the check sees the filter
    # let them through
    expect_violation("SBX-ESC-07", checks.check_no_modules, unconfined)


def test_proof_missing_userns_lock_is_caught(unconfined: Target) -> None:
    expect_violation("SBX-ESC-14", checks.check_userns_lock, unconfined, match="max_user_namespaces is")


def test_proof_setuid_with_new_privs_is_caught(unconfined: Target) -> None:
    expect_violation("SBX-ESC-26", checks.check_no_new_privs, unconfined, match="sudo ran as root")


def test_proof_user_owned_authorized_keys_are_caught(make: Factory) -> None:
    """The key file owned by the sandbox user (the old ~/.ssh/authorized_keys arrangement): the
    check sees the owner and that the user can write it; with sshd reading ~/.ssh again, it sees the
    user's own key log in."""
    t = make()
    keys = f"{checks.role_defaults('sandbox_template')['sandbox_template_authorized_keys_dir']}/sandbox"
    given = checks.run_root(t, f"chown sandbox:sandbox {keys} && chmod 0600 {keys}")
    assert given.returncode == 0, given.stderr
    expect_violation("SBX-USER-04", checks.check_authorized_keys, t, match="is sandbox:sandbox")
    expect_violation("SBX-USER-04", checks.check_keys_not_writable, t, keys, match="could append to")
    old = (
        "sed -i 's|^AuthorizedKeysFile .*|AuthorizedKeysFile .ssh/authorized_keys|' /etc/ssh/sshd_config && "
        "kill -HUP $(ps -eo pid=,ppid=,comm= | awk '$2 == 1 && $3 == \"sshd\" {print $1}')"
    )
    done = checks.run_root(t, old)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: tcp_open(t.ip, 22), 10, "sshd back after HUP")  # it re-executes itself
    expect_violation("SBX-USER-04", checks.check_own_key_ignored, t, match="logged in")


# -- shared resources (issue 26) ------------------------------------------------------------------
@contextlib.contextmanager
def port_unbound(t: Target) -> Iterator[None]:
    """The sandbox's port chains as before issue 26 (accept everything); put back from its state."""
    table = t.settings.nft_table
    state = NetState(t.settings)
    net = state.read(t.id)
    assert net is not None and net.bound, f"precondition: {t.id} has a bound port"
    for chain in net.port_chains:
        sh("nft", "flush", "chain", "bridge", table, chain)
        sh("nft", "add", "rule", "bridge", table, chain, "accept")
    try:
        yield
    finally:
        flush = "".join(f"flush chain bridge {table} {chain}\n" for chain in net.port_chains)
        script = flush + state.fragment(net)
        put_back = subprocess.run(["nft", "-f", "-"], input=script, text=True, check=False)
        assert put_back.returncode == 0, f"the port chains of {t.id} were not put back"


def test_proof_uncapped_conntrack_is_caught(make: Factory, settings: Settings) -> None:
    t = make(internet=True)
    with nft_rule(settings, "caps", f"ip saddr {t.ip} accept"):
        expect_violation("SBX-RES-06", nc.check_conntrack_capped, t, 4.0, match="conntrack entries")


def test_proof_unlimited_dns_is_caught(make: Factory, settings: Settings) -> None:
    flooder, neighbour = make(internet=True), make(internet=True)
    net = NetState(settings).read(flooder.id)
    assert net is not None and net.port, f"precondition: {flooder.id} has a bridge port"
    # the DNS meter is twice: per port where frames enter the bridge, per address in the caps chain
    with (
        nft_rule(settings, "prerouting", f'iifname "{net.port}" accept', family="bridge"),
        nft_rule(settings, "caps", f"ip saddr {flooder.ip} accept"),
    ):
        expect_violation("SBX-RES-07", nc.check_dns_rate_limited, flooder, neighbour, match="the flooder got")


def test_proof_unlimited_new_flows_to_the_host_are_caught(make: Factory, settings: Settings) -> None:
    t = make()
    with nft_rule(settings, "caps", f"ip saddr {t.ip} accept"):
        expect_violation("SBX-RES-08", nc.check_new_flows_to_host_limited, t, match="new flows reached")


def test_proof_unpoliced_port_is_caught(make: Factory) -> None:
    t = make(net_mbps=80)
    with port_unbound(t):
        expect_violation("SBX-RES-09", nc.check_bandwidth_capped, t, 80, match="Mbit/s with net_mbps=80")
    nc.check_bandwidth_capped(t, 80)


def test_proof_unthrottled_disk_is_caught(make: Factory, settings: Settings) -> None:
    t = make(disk_mbps=20, disk_iops=200)
    device = storage_device(settings.lxc_path)
    assert device, "precondition: the sandbox storage is on a block device"
    if checks.CGROUP_V1:
        for name in ("write_bps_device", "read_bps_device", "write_iops_device", "read_iops_device"):
            (checks.cgroup_dir(t.id, "blkio") / f"blkio.throttle.{name}").write_text(f"{device} 0")
    else:
        lifted = f"{device} rbps=max wbps=max riops=max wiops=max"
        (checks.cgroup_dir(t.id, "io") / "io.max").write_text(lifted)
    expect_violation("SBX-RES-10", nc.check_disk_limits_set, t, 20, 200, match="want")
    expect_violation("SBX-RES-10", nc.check_disk_rates, t, 20, 200, match="O_DIRECT writes at")


def test_proof_unbudgeted_pids_are_caught(manager: Manager, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lxc_backend, "check_pids_budget", lambda *_args: None)
    check = nc.check_pids_over_budget_refused
    expect_violation("SBX-RES-11", check, manager, SESSION_LABEL, match="pids_max=")


def test_proof_host_limits_without_lxcfs_are_caught(settings: Settings, workdir: Path) -> None:
    with (
        template_variant(settings, {"lxc.mount.entry": None}) as variant,
        _factory(Manager(variant), settings, workdir) as make_plain,
    ):
        t = make_plain(memory_mb=384, cpus=1)
        expect_violation("SBX-RES-12", nc.check_own_limits_visible, t, 384, 1, match="MemTotal")


def test_proof_unbound_port_is_caught(make: Factory, make_with_net_caps: Factory, settings: Settings) -> None:
    """Root with net_admin and net_raw and the port binding gone (the old behaviour): it takes the
    victim's address, ARP and MAC; with the binding back it takes none."""
    victim, attacker = make(internet=True), make_with_net_caps()
    victim_mac = mac_for_ip(victim.ip)
    attacker_port = nc.port_of(attacker)
    with port_unbound(attacker):
        expect_violation("SBX-NET-19", nc.check_no_forged_address, attacker, victim, match="the host took it")
        try:
            expect_violation("SBX-NET-19", nc.check_no_arp_claim, attacker, victim, match="traffic to")
        finally:
            sh("ip", "neigh", "del", victim.ip, "dev", settings.bridge, check=False)
        try:
            expect_violation("SBX-NET-19", nc.check_no_mac_takeover, attacker, victim, match="learnt")
        finally:  # the bridge and the host learnt the victim's MAC for the attacker's port and address
            sh("bridge", "fdb", "del", victim_mac, "dev", attacker_port, "master", check=False)
            sh("ip", "neigh", "del", attacker.ip, "dev", settings.bridge, check=False)
    nc.check_port_bound(attacker, victim)


def test_proof_writable_cgroup_tree_is_caught(
    settings: Settings, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The template's cgroup:mixed and no per-clone cgroup:ro (the config before issue 35): root moves
    into a blkio group of its own and writes past the disk caps; the tree is read-write."""
    monkeypatch.setattr(lxc_backend, "CGROUP_MOUNT", "lxc.mount.auto = cgroup:mixed")
    with (
        template_variant(settings, {"lxc.mount.auto": "cgroup:mixed proc:mixed sys:mixed"}) as variant,
        _factory(Manager(variant), settings, workdir) as make_old,
    ):
        t = cc.root_target(make_old(root=True, **cc.Caps().create_kwargs()), workdir)
        expect_violation("SBX-RES-13", cc.check_caps_hold, t, cc.Caps(), match="O_DIRECT writes at")
        expect_violation("SBX-RES-13", cc.check_cgroup_tree_read_only, t, match="mounted read-write")


# -- PVE-backed sandboxes: the raw keys are what confines them ----------------------------------------
def _selected_node_site(request: pytest.FixtureRequest) -> sites.Site:
    """The emulated node's site for the PVE proofs. A run that selects the lxc site only
    (SANDBOX_RT_HARDENING_SITES=lxc) has no node for them and skips them; .ci/run selects every
    site, so CI always runs them."""
    if sites.PVE_NODE not in SITES:
        pytest.skip("the pve-node site is not selected (SANDBOX_RT_HARDENING_SITES)")
    return _node_site(request.getfixturevalue("emulated_pve"))


@pytest.fixture(scope="module")
def pve_unconfined(request: pytest.FixtureRequest, workdir: Path) -> Iterator[Target]:
    """A throw-away PVE sandbox on the emulated node, cloned from a variant of the template whose raw
    lxc.* lines root removed, all but lxc.hook.mount (without the CT setup hook a CT has no address:
    it would not even come up, see tests/integration/test_pve_emulated.py). Such a CT is what PVE makes
    of the template on its own: it boots the template's systemd under pve-container's defaults (LXC's
    stock seccomp profile, PVE's capability set, no no_new_privs)."""
    site = _selected_node_site(request)
    with pve_template_variant(site, keep={"lxc.hook.mount"}) as variant:
        variant_site = dataclasses.replace(site, settings=variant)
        with _factory(Manager(variant), variant, workdir, variant_site) as make_unconfined:
            yield make_unconfined()


def test_proof_pve_ct_with_a_writable_cgroup_tree_is_caught(
    request: pytest.FixtureRequest, workdir: Path
) -> None:
    """The template CT without its raw lxc.mount.auto: common.conf's cgroup:mixed (pve-container's own)."""
    site = _selected_node_site(request)
    with pve_template_variant(site, drop={"lxc.mount.auto"}) as variant:
        variant_site = dataclasses.replace(site, settings=variant)
        with _factory(Manager(variant), variant, workdir, variant_site) as make_old:
            t = cc.root_target(make_old(root=True, **cc.Caps().create_kwargs()), workdir)
            expect_violation("SBX-RES-13", cc.check_caps_hold, t, cc.Caps(), match="O_DIRECT writes at")
            expect_violation("SBX-RES-13", cc.check_cgroup_tree_read_only, t, match="mounted read-write")


def test_proof_pve_ct_without_raw_keys_runs_pves_seccomp(pve_unconfined: Target) -> None:
    expect_violation("SBX-ESC-11", checks.check_seccomp, pve_unconfined, match="answers umount2 with allow")


def test_proof_pve_ct_without_raw_keys_keeps_its_capabilities(pve_unconfined: Target) -> None:
    expect_violation("SBX-ESC-10", checks.check_caps_dropped, pve_unconfined, match="lxc.cap.drop lacks")


def test_proof_pve_ct_without_raw_keys_gains_new_privileges(pve_unconfined: Target) -> None:
    expect_violation("SBX-ESC-26", checks.check_no_new_privs, pve_unconfined, match="sudo ran as root")


def test_proof_pve_ct_without_raw_keys_lets_the_keyring_through(pve_unconfined: Target) -> None:
    expect_violation("SBX-ESC-16", checks.check_refused, pve_unconfined, "keyring")


# -- PVE-backed sandboxes: the caps the node's hookscript sets at post-start -------------------------
@pytest.fixture
def pve_make(request: pytest.FixtureRequest, workdir: Path) -> Iterator[Factory]:
    """Throw-away PVE sandboxes on the emulated node (the runtime, the node's hookscript as site.yml
    installed it); each proof then takes back, in that one CT's cgroup, what the hookscript set."""
    site = _selected_node_site(request)
    with _factory(Manager(site.settings), site.settings, workdir, site) as make_pve:
        yield make_pve


def test_proof_pve_ct_without_the_hookscripts_pids_cap_is_caught(pve_make: Factory) -> None:
    t = pve_make(pids_max=128)
    checks.check_pids_fenced(t, 128)  # precondition: the hookscript's cap is there
    # what the CT has without the hookscript's post-start: the template's raw lxc.cgroup*.pids.max
    raw = str(checks.role_defaults("template_build")["template_build_pids_max"])
    (checks.cgroup_dir(t, "pids") / "pids.max").write_text(raw)
    expect_violation("SBX-RES-01", checks.check_pids_fenced, t, 128, match=f"pids.max is {raw}")


def test_proof_pve_ct_without_the_hookscripts_disk_caps_is_caught(pve_make: Factory) -> None:
    t = pve_make(disk_mbps=20, disk_iops=200)
    nc.check_disk_limits_set(t, 20, 200)  # precondition: the hookscript's caps are there
    device = nc.sandbox_disk(t)
    if checks.CGROUP_V1:  # what the CT has without the hookscript's post-start: no throttle
        for name in ("write_bps_device", "read_bps_device", "write_iops_device", "read_iops_device"):
            (checks.cgroup_dir(t, "blkio") / f"blkio.throttle.{name}").write_text(f"{device} 0")
    else:
        lifted = f"{device} rbps=max wbps=max riops=max wiops=max"
        (checks.cgroup_dir(t, "io") / "io.max").write_text(lifted)
    expect_violation("SBX-RES-10", nc.check_disk_limits_set, t, 20, 200, match="want")
    expect_violation("SBX-RES-10", nc.check_disk_rates, t, 20, 200, match="O_DIRECT writes at")


def test_proof_init_started_as_root_is_caught(make: Factory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sandbox started as before SBX-ESC-28 (no lxc.init.uid lines: PID 1 and sshd as root)."""
    monkeypatch.setattr(lxc_backend, "init_lines", lambda *_args: [])
    expect_violation(
        "SBX-ESC-28", checks.check_nothing_runs_as_root, make(), match="not running as the sandbox user"
    )
