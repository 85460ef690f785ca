"""The Proxmox VE sandboxes' CT setup hook (roles/template_build/files/sandbox-rt-pve-ct-setup), run as
LXC runs it (``<name> lxc mount``, ``LXC_ROOTFS_MOUNT``), in a throw-away user namespace mapped as an
unprivileged CT's (root = 100000) with a network namespace of its own holding an ``eth0``: the user
namespace lock lands in that namespace only, the address comes from the CT's network configuration,
and bad input fails (the start would fail). Nothing here touches this machine's network or limits;
the tests on the emulated PVE node run the same hook inside real CTs (test_pve_emulated.py,
tests/hardening)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.provision_helpers import REPO

pytestmark = [pytest.mark.slow, pytest.mark.root]

HOOK = REPO / "roles" / "template_build" / "files" / "sandbox-rt-pve-ct-setup"
KNOB = Path("/proc/sys/user/max_user_namespaces")


def run_hook(rootfs: Path, *, in_userns: bool = True) -> tuple[int, str, str]:
    """The hook (a copy the namespace's root can read, as kernel.yml installs it) in a fresh user +
    network namespace (eth0: one end of a veth pair made there); returns its exit code, what the
    namespace then shows (eth0's IPv4, the default route, the knob) and its stderr."""
    if os.geteuid() != 0:
        pytest.fail("the CT setup hook test maps a CT's ids: run as root", pytrace=False)
    hook = rootfs.parent / "pve-ct-setup"
    hook.write_bytes(HOOK.read_bytes())
    hook.chmod(0o755)
    show = (
        "ip -4 -o addr show eth0 | awk '{print $4}'; ip -4 route show default | awk '{print $3}'; "
        f"cat {KNOB}"
    )
    run = f"{hook} ct1 lxc mount; rc=$?; {show}; exit $rc"
    script = f"ip link add eth0 type veth peer name peer0 && {{ {run}; }}"
    prefix = ["lxc-usernsexec", "-m", "b:0:100000:65536", "--"] if in_userns else []
    proc = subprocess.run(
        [*prefix, "unshare", "--net", "--", "sh", "-c", script],
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LXC_ROOTFS_MOUNT": str(rootfs)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A directory the namespace's root (uid 100000 on this machine) can reach, removed after."""
    path = Path(tempfile.mkdtemp(prefix="sandbox-rt-ct-hook-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def ct_rootfs(tmp_path: Path, interfaces: str) -> Path:
    root = tmp_path / "rootfs"
    (root / "etc" / "network").mkdir(parents=True)
    (root / "etc" / "network" / "interfaces").write_text(interfaces)
    return root


STATIC = "auto lo\niface lo inet loopback\n\nauto eth0\niface eth0 inet static\n"
STATIC += "\taddress {a}\n\tgateway 10.90.0.1\n"


def test_the_address_and_the_lock_land_in_the_cts_namespaces_only(tmp_path: Path) -> None:
    before = KNOB.read_text()
    rc, shown, err = run_hook(ct_rootfs(tmp_path, STATIC.format(a="10.90.7.8/16")))
    assert rc == 0, err
    assert shown.split() == ["10.90.7.8/16", "10.90.0.1", "0"]
    assert KNOB.read_text() == before  # this machine's own limit is untouched


def test_the_older_netmask_form(tmp_path: Path) -> None:
    text = "auto eth0\niface eth0 inet static\n\taddress 10.90.7.9\n\tnetmask 255.255.0.0\n"
    rc, shown, err = run_hook(ct_rootfs(tmp_path, text))
    assert rc == 0, err
    assert shown.split()[:1] == ["10.90.7.9/16"]


def test_dhcp_leaves_eth0_without_an_address(tmp_path: Path) -> None:
    rc, shown, err = run_hook(ct_rootfs(tmp_path, "auto eth0\niface eth0 inet dhcp\n"))
    assert rc == 0 and "no static IPv4 address" in err
    assert shown.split() == ["0"]  # no address, no route; the lock all the same


@pytest.mark.parametrize(
    "address",
    ["10.90.7.300/16", "10.90.7.8/40", "10.90.7.8/16;reboot", "10.90..8/16", "$(id)"],
)
def test_malformed_values_fail_the_start(tmp_path: Path, address: str) -> None:
    rc, shown, err = run_hook(ct_rootfs(tmp_path, STATIC.format(a=address)))
    assert rc != 0, shown
    assert "bad" in err
    assert "10.90" not in shown.split()[0] if shown.split() else True


def test_a_symlinked_configuration_fails_the_start(tmp_path: Path) -> None:
    root = ct_rootfs(tmp_path, "")
    interfaces = root / "etc" / "network" / "interfaces"
    interfaces.unlink()
    interfaces.symlink_to("/etc/passwd")  # planted by the CT's root: never followed out of it
    rc, _, err = run_hook(root)
    assert rc != 0 and "symbolic link" in err


def test_it_refuses_to_run_outside_a_cts_user_namespace(tmp_path: Path) -> None:
    before = KNOB.read_text()
    rc, _, err = run_hook(ct_rootfs(tmp_path, STATIC.format(a="10.90.7.8/16")), in_userns=False)
    assert rc != 0 and "not in an unprivileged CT's user namespace" in err
    assert KNOB.read_text() == before
