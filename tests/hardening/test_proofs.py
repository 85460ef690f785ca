"""Proof that the checks can fail: for seven controls, the protection is removed in a throw-away setup
and the control's own check function must then report a Violation (and pass again once the
protection is back). Nothing here touches the template or other users' sandboxes: each proof uses
its own fresh sandboxes, and nft rules inserted here match only their addresses and are deleted by
handle afterwards, also on failure.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator

import pytest

from sandbox_rt import Settings
from sandbox_rt.network import NftInternetSet
from tests.integration.provision_helpers import sh, tcp_open, wait_for

from . import checks
from .checks import Target, Violation
from .conftest import Factory
from .testnet import SimNet, host_listeners

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
}


def expect_violation(control: str, check: object, *args: object, match: str = "") -> Violation:
    with pytest.raises(Violation) as caught:
        check(*args)  # type: ignore[operator]
    assert caught.value.control == control, caught.value
    assert match in str(caught.value), caught.value
    return caught.value


@contextlib.contextmanager
def nft_rule(settings: Settings, chain: str, rule: str) -> Iterator[None]:
    """Insert ``rule`` at the top of ``chain`` of the inet sandbox table; delete it by handle after."""
    tag = f"hardening-proof-{secrets.token_hex(4)}"
    table = ["inet", settings.nft_table]
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
    loose = make(pids_max=1 << 22)
    expect_violation("SBX-RES-01", checks.check_pids_fenced, loose, 128, match="pids.max")
    checks.check_pids_fenced(make(pids_max=128), 128)


def test_proof_sudo_granted_is_caught(make: Factory) -> None:
    t = make()
    grant = "/etc/sudoers.d/zz-hardening-proof"
    made = checks.run_root(t, f"echo 'sandbox ALL=(ALL) NOPASSWD:ALL' > {grant} && chmod 0440 {grant}")
    assert made.returncode == 0, made.stderr
    try:
        expect_violation("SBX-USER-02", checks.check_no_sudo, t, match="`sudo -n true` succeeded")
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
