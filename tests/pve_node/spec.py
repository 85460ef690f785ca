"""What an emulated PVE node is made of: names, addresses, packages, paths (values only).

    controller (this machine, root netns)            node container "pve1" (privileged, systemd)
    <p>m 10.97.0.1/30  <------- veth ------->        eth0 10.97.0.2/30  (management: SSH, the API's "node")
    route 10.90.0.0/16 via 10.97.0.2                 vmbr1 10.90.0.1/16 (made by site.yml: sandbox_network)
                                                       `- veth<vmid>i0 of each nested CT (unprivileged)
    netns "<p>-wan" (the node's internet)            eth1 192.0.2.2/24, default route via 192.0.2.1
    eth0 192.0.2.1/24  <------- veth ------->

The node has no link to the machine's uplink: its only default route leads into the wan netns the
helper made, where tests run their servers. The controller reaches the sandboxes on the node's
vmbr1 through the management link (the node's nftables let the controller's SSH through, nothing
else). ``<p>`` is :attr:`NodeSpec.prefix` (host interface names are at most 15 characters).
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import os
import platform
from pathlib import Path

# The OS half of a PVE node (Debian 12 is what PVE 8 is built on), plus what the nested sandboxes
# need (lxc, uidmap) and what Ansible and the sandbox_network role use there.
NODE_PACKAGES: tuple[str, ...] = (
    "systemd-sysv",
    "dbus",
    "libpam-systemd",
    "ifupdown2",
    "openssh-server",
    "nftables",
    "dnsmasq-base",
    "lxc",
    "uidmap",
    "python3",
    "iproute2",
    "bridge-utils",
    "conntrack",
    "procps",
    "rsync",
    "zstd",  # PVE unpacks .tar.zst CT templates
    "ca-certificates",
)
MMDEBSTRAP_OPTIONS: tuple[str, ...] = (
    '--aptopt=APT::Install-Recommends "false"',
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
)
# Bumped whenever the way a rootfs is made changes (part of the cache key).
FORMAT = "1"


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """One emulated node. Two nodes on one machine need distinct names, prefixes and addresses."""

    name: str = "pve1"  # the PVE node name (hostname; what the API test server serves)
    prefix: str = "pvn0"  # host-side interface / netns names start with it
    mgmt_host_ip: str = "10.97.0.1"
    mgmt_node_ip: str = "10.97.0.2"
    mgmt_prefixlen: int = 30
    wan_gateway_ip: str = "192.0.2.1"  # the wan netns' end (the node's default gateway)
    wan_node_ip: str = "192.0.2.2"
    wan_prefixlen: int = 24
    # The node's sandbox network (vmbr1, made by site.yml in the node): distinct from the networks this
    # machine has itself (the embedded default's 10.99.0.0/16, the molecule scenario's 10.98.0.0/16),
    # so the controller can route to it.
    sandbox_cidr: str = "10.90.0.0/16"
    state_root: Path = Path("/var/lib/sandbox_rt/pve-nodes")
    cache_dir: Path = Path("/var/cache/sandbox_rt")
    suite: str = "bookworm"
    mirror: str = "http://deb.debian.org/debian"
    packages: tuple[str, ...] = NODE_PACKAGES

    def __post_init__(self) -> None:
        if not self.name.replace("-", "").isalnum() or len(self.name) > 30:
            raise ValueError(f"node name {self.name!r}: letters, digits and '-' only")
        if not self.prefix.isalnum() or len(self.prefix) > 8:
            raise ValueError(f"prefix {self.prefix!r}: at most 8 letters/digits (interface names)")
        mgmt = ipaddress.IPv4Interface(f"{self.mgmt_host_ip}/{self.mgmt_prefixlen}").network
        if ipaddress.IPv4Address(self.mgmt_node_ip) not in mgmt:
            raise ValueError(f"{self.mgmt_node_ip} is not in the management network {mgmt}")

    # --- paths ------------------------------------------------------------------------------------
    @property
    def home(self) -> Path:
        """Everything of this node on the controller: container, keys, API server files."""
        return self.state_root / self.name

    @property
    def lxc_path(self) -> Path:
        return self.home / "lxc"

    @property
    def rootfs(self) -> Path:
        return self.lxc_path / self.name / "rootfs"

    @property
    def ssh_dir(self) -> Path:
        return self.home / "ssh"

    @property
    def ssh_key(self) -> Path:
        """The controller's key for root@node (generated per node)."""
        return self.ssh_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        """Exactly one entry: the node's management address and its pinned host key."""
        return self.ssh_dir / "known_hosts"

    @property
    def ansible_home(self) -> Path:
        """HOME for Ansible runs against the node: ``~/.ssh/known_hosts`` is :attr:`known_hosts`
        (the proxmox_pct_remote connection reads only that file)."""
        return self.home / "home"

    @property
    def api_dir(self) -> Path:
        """The PVE API test server's files (info.json, root.token, tls/, state.json, pid)."""
        return self.home / "api"

    # --- host-side names ----------------------------------------------------------------------------
    @property
    def mgmt_if(self) -> str:
        return f"{self.prefix}m"

    @property
    def wan_if(self) -> str:
        """The host-side end of the node's eth1 until it is moved into the wan netns."""
        return f"{self.prefix}w"

    @property
    def wan_netns(self) -> str:
        return f"{self.prefix}-wan"

    # --- the cached root filesystem ----------------------------------------------------------------
    @property
    def cache_key(self) -> str:
        parts = [
            FORMAT,
            self.suite,
            self.mirror,
            platform.machine(),
            *sorted(self.packages),
            *MMDEBSTRAP_OPTIONS,
        ]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]

    @property
    def tarball(self) -> Path:
        return self.cache_dir / f"pve-node-{self.suite}-{self.cache_key}.tar"

    # --- the node's sandbox network (what site.yml makes in it; the inventory reads node.json) --------
    @property
    def sandbox_gateway(self) -> str:
        return str(ipaddress.IPv4Network(self.sandbox_cidr).network_address + 1)

    @property
    def sandbox_dhcp_range(self) -> tuple[str, str]:
        base = ipaddress.IPv4Network(self.sandbox_cidr).network_address
        return str(base + 100), str(base + 250)

    @property
    def sandbox_pool(self) -> tuple[str, str]:
        net = ipaddress.IPv4Network(self.sandbox_cidr)
        return str(net.network_address + 256), str(net.broadcast_address - 1)


MAX_INDEX = 8


def spec_for_index(index: int, state_root: Path | None = None) -> NodeSpec:
    """Node ``index`` of this machine: nodes with different indexes can run at the same time (their
    names, interfaces and networks differ). Index 0 is :class:`NodeSpec`'s defaults."""
    if not 0 <= index < MAX_INDEX:
        raise ValueError(f"node index {index} must be in 0..{MAX_INDEX - 1}")
    fields: dict[str, object] = {
        "name": f"pve{index + 1}",
        "prefix": f"pvn{index}",
        "mgmt_host_ip": f"10.97.{index}.1",
        "mgmt_node_ip": f"10.97.{index}.2",
        "sandbox_cidr": f"10.{90 - index}.0.0/16",
    }
    if state_root is not None:
        fields["state_root"] = state_root
    return NodeSpec(**fields)  # type: ignore[arg-type]


def spec_from_env(env: dict[str, str] | None = None) -> NodeSpec:
    """The node ``SANDBOX_RT_PVE_NODE_INDEX`` (default 0) names, under ``SANDBOX_RT_PVE_NODE_STATE_ROOT``."""
    env = dict(os.environ if env is None else env)
    root = env.get("SANDBOX_RT_PVE_NODE_STATE_ROOT")
    return spec_for_index(int(env.get("SANDBOX_RT_PVE_NODE_INDEX") or 0), Path(root) if root else None)
