"""The node's root filesystem: an mmdebstrap tarball (cached by a hash of its inputs), extracted and
given what a PVE installer gives a node: hostname, /etc/network/interfaces, subordinate ids, its own
SSH host key and root's authorized key. Nothing here is Ansible's job (site.yml runs afterwards).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import textwrap
from pathlib import Path

from pve_testserver.hostkey import generate_ed25519

from .spec import MMDEBSTRAP_OPTIONS, NodeSpec

# What PVE's `pct exec` does, as far as Ansible's community.proxmox.proxmox_pct_remote connection
# uses it (`pct exec <vmid> -- <command>`): run the command in the CT as its root. PVE names a CT's
# LXC container by its VMID, and so does the test server's node engine.
PCT_SHIM = """\
#!/bin/sh
# Emulated PVE node (tests/pve_node): the subset of PVE's pct that Ansible's proxmox_pct_remote
# connection uses. pct exec <vmid> -- <command...> runs the command as root inside CT <vmid>.
set -eu
if [ "${1:-}" != exec ] || [ $# -lt 3 ]; then
  echo "pct (emulated node): only 'pct exec <vmid> -- <command>' is available" >&2
  exit 2
fi
vmid=$2
shift 2
[ "$1" = -- ] && shift
case $vmid in '' | *[!0-9]*) echo "pct: invalid vmid '$vmid'" >&2; exit 2 ;; esac
if [ ! -f "/var/lib/lxc/$vmid/config" ]; then
  echo "Configuration file 'nodes/$(hostname)/lxc/$vmid.conf' does not exist" >&2
  exit 2
fi
# --elevated-privileges=CGROUP: the command stays in this shim's cgroup. On this cgroup v1 hybrid
# host LXC could not always move it into the CT's: lxc-attach ran the command, then exited 1 with
# "Failed to attach cgroup" (ENOENT), seen on template CTs of an update, for minutes on end.
exec lxc-attach -n "$vmid" --elevated-privileges=CGROUP --clear-env \\
  --set-var PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --set-var HOME=/root -- "$@"
"""


def build_tarball(spec: NodeSpec) -> Path:
    """The cached node tarball; built with mmdebstrap (~30 s, ~240 MB) when absent. Written under a
    temporary name and renamed, so an interrupted build never poisons the cache."""
    if spec.tarball.is_file():
        return spec.tarball
    spec.cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = spec.tarball.with_name(spec.tarball.name + f".partial-{os.getpid()}")
    cmd = [
        "mmdebstrap",
        "--quiet",
        "--format=tar",
        "--variant=minbase",
        "--include=" + ",".join(spec.packages),
        *MMDEBSTRAP_OPTIONS,
        spec.suite,
        str(partial),
        spec.mirror,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-15:])
            raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{tail}")
        partial.replace(spec.tarball)
    finally:
        partial.unlink(missing_ok=True)
    return spec.tarball


def extract(tarball: Path, rootfs: Path) -> None:
    """Unpack as is (the node is a privileged container: its ids are the host's)."""
    rootfs.mkdir(parents=True, mode=0o755)
    cmd = ["tar", "-C", str(rootfs), "--numeric-owner", "-xpf", str(tarball)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")


def _write(path: Path, text: str | bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".pve-node-tmp")
    tmp.write_bytes(text.encode() if isinstance(text, str) else text)
    tmp.chmod(mode)
    tmp.replace(path)


def interfaces(spec: NodeSpec) -> str:
    """/etc/network/interfaces as a PVE installer writes it (management and uplink), sourcing
    interfaces.d, where the sandbox_network role puts vmbr1."""
    return textwrap.dedent(
        f"""\
        # Emulated PVE node (tests/pve_node): management link and uplink, as the installer writes them.
        auto lo
        iface lo inet loopback

        auto eth0
        iface eth0 inet static
            address {spec.mgmt_node_ip}/{spec.mgmt_prefixlen}

        # The uplink: leads only into the wan network namespace the helper made on the controller.
        auto eth1
        iface eth1 inet static
            address {spec.wan_node_ip}/{spec.wan_prefixlen}
            gateway {spec.wan_gateway_ip}

        source /etc/network/interfaces.d/*
        """
    )


def ensure_controller_key(spec: NodeSpec) -> str:
    """The controller's key for root@node (made once per node); returns its public line."""
    spec.ssh_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not spec.ssh_key.is_file():
        private, public = generate_ed25519(f"sandbox_rt controller -> {spec.name}")
        _write(spec.ssh_key, private, 0o600)
        _write(spec.ssh_key.with_name("id_ed25519.pub"), public + "\n", 0o644)
    return spec.ssh_key.with_name("id_ed25519.pub").read_text().strip()


def customize(spec: NodeSpec) -> str:
    """Give the extracted rootfs its identity; returns the node's SSH host public key line."""
    root = spec.rootfs
    authorized = ensure_controller_key(spec)
    _write(root / "etc/hostname", f"{spec.name}\n")
    _write(
        root / "etc/hosts",
        f"127.0.0.1 localhost\n{spec.mgmt_node_ip} {spec.name}.sandbox-rt.test {spec.name}\n"
        "::1 localhost ip6-localhost ip6-loopback\n",
    )
    _write(root / "etc/network/interfaces", interfaces(spec))
    (root / "etc/network/interfaces.d").mkdir(parents=True, exist_ok=True)
    _write(root / "etc/resolv.conf", f"nameserver {spec.wan_gateway_ip}\n")
    # PVE's defaults: container root = host uid 100000 (unprivileged CTs).
    _write(root / "etc/subuid", "root:100000:65536\n")
    _write(root / "etc/subgid", "root:100000:65536\n")
    _write(root / "etc/machine-id", os.urandom(16).hex() + "\n", 0o444)
    # PVE starts CTs itself (pve-container@), never Debian's LXC autostart; lxc.service would wait
    # 30 s for lxcbr0 at every boot, lxc-net would make a NATed lxcbr0.
    for unit in ("lxc.service", "lxc-net.service"):
        link = root / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    # SSH: one fresh ed25519 host key (the tarball's package-time keys are shared by every node
    # built from it), root by key only.
    for old in (root / "etc/ssh").glob("ssh_host_*"):
        old.unlink()
    private, public = generate_ed25519(f"root@{spec.name}")
    _write(root / "etc/ssh/ssh_host_ed25519_key", private, 0o600)
    _write(root / "etc/ssh/ssh_host_ed25519_key.pub", public + "\n")
    _write(
        root / "etc/ssh/sshd_config.d/pve-node.conf",
        "HostKey /etc/ssh/ssh_host_ed25519_key\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\n",
    )
    (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    _write(root / "root/.ssh/authorized_keys", authorized + "\n", 0o600)
    _write(root / "usr/sbin/pct", PCT_SHIM, 0o755)
    # pmxcfs' place for the CTs' config files (the PVE API test server's node engine writes them there,
    # root edits raw lxc.* keys in them): /etc/pve/lxc is a link to this node's directory, as on PVE.
    (root / "etc/pve/nodes" / spec.name / "lxc").mkdir(parents=True, exist_ok=True)
    pve_lxc = root / "etc/pve/lxc"
    if not pve_lxc.is_symlink():
        pve_lxc.symlink_to(f"nodes/{spec.name}/lxc")
    # PVE's "local" storage directories (hookscript snippets, uploaded CT templates).
    for sub in ("snippets", "template/cache"):
        (root / "var/lib/vz" / sub).mkdir(parents=True, exist_ok=True)
    return public
