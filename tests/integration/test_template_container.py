"""Real sandboxes from the template: SSH with the runtime key only, no sudo, the bridge, DHCP, and no
sandbox <-> sandbox traffic. Every clone, netns and veth made here is removed again, also on failure."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from tests.integration.provision_helpers import DNSMASQ_LEASES, Clone, ensure_provisioned, sh, template_clone

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    # CI runs as root (it provisions the host first), so this never skips there
    pytest.mark.skipif(os.geteuid() != 0, reason="starts containers: needs root"),
]

DHCP_PROBE = Path(__file__).with_name("dhcp_probe.py")


@pytest.fixture(scope="module")
def settings() -> dict[str, object]:
    return ensure_provisioned()


@pytest.fixture
def clone(settings: dict[str, object]) -> Iterator[Clone]:
    with template_clone(settings) as made:
        yield made


def _tcp_probe(clone: Clone, client: paramiko.SSHClient, address: str, port: int) -> bool:
    """True if a TCP connection from inside the sandbox to address:port succeeds (bash /dev/tcp)."""
    status, _, _ = clone.run(client, f"timeout 3 bash -c 'exec 3<>/dev/tcp/{address}/{port}' 2>/dev/null")
    return status == 0


def test_sshd_accepts_only_the_runtime_key_as_sandbox(clone: Clone) -> None:
    client = clone.client()
    try:
        status, out, _ = clone.run(client, "id -un; id -u; ip -4 -o addr show dev eth0")
        assert status == 0
        user, uid, addr = out.splitlines()[:3]
        assert (user, uid) == ("sandbox", "1000")
        assert f"inet {clone.address}/16" in addr
    finally:
        client.close()


def test_password_login_is_refused(clone: Clone) -> None:
    client = paramiko.SSHClient()
    client.get_host_keys().add(clone.address, "ssh-ed25519", clone.host_key())
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    # sshd offers nothing but public keys (SBX-SSH-02): the password is not even tried.
    with pytest.raises(paramiko.BadAuthenticationType) as refused:
        client.connect(
            clone.address,
            username="sandbox",
            password="sandbox",
            look_for_keys=False,
            allow_agent=False,
            timeout=10,
        )
    assert refused.value.allowed_types == ["publickey"]
    client.close()


def test_root_login_is_refused_even_with_the_runtime_key(clone: Clone) -> None:
    with pytest.raises(paramiko.AuthenticationException):
        clone.client(user="root").close()


def test_unknown_host_key_is_rejected(clone: Clone, settings: dict[str, object]) -> None:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException):
        client.connect(
            clone.address,
            username="sandbox",
            key_filename=str(settings["ssh_key"]),
            look_for_keys=False,
            allow_agent=False,
            timeout=10,
        )
    client.close()


def test_sandbox_user_has_no_sudo_and_the_limits_apply(clone: Clone) -> None:
    client = clone.client()
    try:
        start = time.monotonic()
        status, _, err = clone.run(client, "sudo -n true")
        assert status != 0, "sandbox may sudo"
        assert time.monotonic() - start < 5, (
            f"sudo took {time.monotonic() - start:.1f} s (DNS must fail fast): {err}"
        )
        status, out, _ = clone.run(client, "ulimit -Su; ulimit -Hu; ulimit -Hc; ulimit -Sn; id -Gn")
        assert status == 0
        assert out.split() == ["256", "512", "0", "4096", "sandbox"]
        status, out, _ = clone.run(
            client, "cat /proc/1/cmdline | tr '\\0' ' '; ls /dev; test -w /dev/shm && echo shm"
        )
        assert out.startswith("/usr/bin/tini -- /usr/sbin/sshd -D -e")
        assert "kmsg" not in out.split() and "shm" in out.split()
    finally:
        client.close()


def test_clone_port_is_on_the_bridge(clone: Clone, settings: dict[str, object]) -> None:
    ports = json.loads(sh("ip", "-j", "link", "show", "master", str(settings["bridge"])).stdout or "[]")
    assert clone.port in [port["ifname"] for port in ports]
    # Its identity is its own, not the template's.
    machine_id = (clone.delta / "etc" / "machine-id").read_text().strip()
    assert len(machine_id) == 32


def test_dns_only_with_internet(clone: Clone, settings: dict[str, object]) -> None:
    """SBX-NET: no internet -> no DNS at all (refused at once); in the internet set -> the host's dnsmasq."""
    table, set_name = str(settings["nft_table"]), str(settings["nft_internet_set"])
    client = clone.client()
    try:
        start = time.monotonic()
        status, _, _ = clone.run(client, "getent hosts host.sandbox.internal")
        assert status != 0 and time.monotonic() - start < 3
        sh("nft", "add", "element", "inet", table, set_name, "{", clone.address, "}")
        try:
            status, out, _ = clone.run(client, "getent hosts host.sandbox.internal")
            assert status == 0 and out.split()[0] == settings["gateway"], out
        finally:
            sh("nft", "delete", "element", "inet", table, set_name, "{", clone.address, "}")
        # The host itself (SSH, anything but DNS/DHCP) stays closed to sandboxes.
        assert not _tcp_probe(clone, client, str(settings["gateway"]), 22)
    finally:
        client.close()


def test_sandboxes_cannot_reach_each_other(settings: dict[str, object]) -> None:
    with template_clone(settings) as first, template_clone(settings) as second:
        a, b = first.client(), second.client()
        try:
            # Host -> both works.
            for clone, client in ((first, a), (second, b)):
                assert clone.run(client, "true")[0] == 0
            # Sandbox -> sandbox does not, in either direction (layer 2, bridge family table).
            assert not _tcp_probe(first, a, second.address, 22)
            assert not _tcp_probe(second, b, first.address, 22)
            # ...and still works from the host afterwards.
            assert first.run(a, "true")[0] == 0 and second.run(b, "true")[0] == 0
        finally:
            a.close()
            b.close()


def test_dhcp_lease_from_the_sandbox_range(settings: dict[str, object]) -> None:
    """A client without a static address gets a lease in 10.99.0.100-250 from the bridge's dnsmasq.

    The template has no DHCP client (sandboxes get static addresses), so the client is a small Python
    one in a network namespace on a veth attached to the bridge. Its port is not named like a sandbox
    port (``sbx*``): those send nothing until the runtime binds them to their MAC and static address
    (issue 26, SBX-NET-19), so DHCP serves guests of the bridge that are not the runtime's sandboxes.
    """
    suffix = secrets.token_hex(3)
    netns, port = f"sbxtest-dhcp-{suffix}", f"dhcpt{suffix}"
    mac = "02:5b:" + ":".join(f"{b:02x}" for b in secrets.token_bytes(4))
    try:
        sh("ip", "netns", "add", netns)
        sh("ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", netns)
        sh("ip", "-n", netns, "link", "set", "eth0", "address", mac, "up")
        sh("ip", "link", "set", port, "master", str(settings["bridge"]), "up")
        probe = [sys.executable, str(DHCP_PROBE)]
        result = subprocess.run(
            ["ip", "netns", "exec", netns, *probe, "acquire", "eth0", mac],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        address, router, netmask, server = result.stdout.split()
        last_octets = tuple(int(x) for x in address.split("."))
        assert last_octets[:3] == (10, 99, 0) and 100 <= last_octets[3] <= 250, address
        assert (router, netmask, server) == (settings["gateway"], "255.255.0.0", settings["gateway"])
        leases = DNSMASQ_LEASES.read_text()
        assert f"{mac} {address}" in leases
        # Give the lease back so the test leaves nothing behind.
        sh("ip", "-n", netns, "addr", "add", f"{address}/16", "dev", "eth0")
        sh("ip", "netns", "exec", netns, *probe, "release", "eth0", mac, address, server)
        deadline = time.monotonic() + 5
        while f"{mac} {address}" in DNSMASQ_LEASES.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert f"{mac} {address}" not in DNSMASQ_LEASES.read_text(), "lease not released"
    finally:
        sh("ip", "link", "del", port, check=False)
        sh("ip", "netns", "del", netns, check=False)
