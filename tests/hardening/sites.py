"""Where the catalogue's sandboxes run, and how the checks reach their containers from this machine.

* ``lxc``: the embedded default. The containers are in this machine's LXC path; commands for them run
  here (``lxc-attach``, ``lxc-info``), their cgroups are ``lxc.payload.<id>``.
* ``pve-node``: PVE-backed sandboxes on the emulated Proxmox VE node (tests/pve_node), made by the
  runtime through the PVE API test server with the host contract ``site.yml`` wrote for the node. Each
  is a CT (an unprivileged LXC container named by its VMID) nested in the node: commands for it run in
  the node (``lxc-attach`` into the node, then the node's own ``lxc-attach``/``lxc-info``); its config
  is the node's ``/var/lib/lxc/<vmid>/config`` (read through the node's root filesystem, which this
  machine sees: the node is privileged); its cgroups are ``lxc.payload.<node>/lxc.payload.<vmid>``;
  its PID 1, as this machine numbers it, is the process of those cgroups that is PID 1 in its own
  namespace. The node's ``host`` is a testinfra host in the node (its sysctls, nftables, units).
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Any

import testinfra
from testinfra.host import Host

from sandbox_rt import Settings

CGROUP = Path("/sys/fs/cgroup")
CGROUP_V1 = (CGROUP / "memory" / "memory.limit_in_bytes").exists()
LXC = "lxc"
PVE_NODE = "pve-node"
ALL = (LXC, PVE_NODE)


@dataclasses.dataclass(frozen=True)
class Site:
    """One place sandboxes run (see the module docstring)."""

    name: str
    settings: Settings  # the runtime's settings for this site (its host contract)
    lxc_dir: Path  # this machine's path of the LXC path that holds the containers
    lxc_path: str  # the same LXC path as the commands of ``prefix`` see it
    prefix: tuple[str, ...]  # argv that runs a command where the containers live; () = here
    cgroup_parent: str  # the containers' parent cgroup ("" here, "lxc.payload.<node>/" in the node)
    host: Host  # the machine that runs the containers (this one, or the node)
    template_rootfs: Path  # this machine's path of the template's root filesystem
    root: Path = Path("/")  # this machine's path of the root of the machine that runs the containers
    admin_api: Any = None  # PVE sites: proxmoxer with the admin's (root@pam) token
    settings_file: Path | None = None  # the host contract ``settings`` came from (another process's)

    @property
    def is_pve(self) -> bool:
        return self.settings.backend == "proxmox"

    def path(self, path: str | Path) -> Path:
        """This machine's path of ``path`` on the machine that runs the containers."""
        return self.root / str(path).lstrip("/")

    def run(self, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A command where the containers live (as root there)."""
        return subprocess.run(
            [*self.prefix, *cmd], capture_output=True, text=True, timeout=timeout, check=False
        )

    def config_file(self, ct: str) -> Path:
        return self.lxc_dir / ct / "config"

    def cgroup_dir(self, ct: str, controller: str) -> Path:
        group = f"{self.cgroup_parent}lxc.payload.{ct}"
        return CGROUP / controller / group if CGROUP_V1 else CGROUP / group

    def init_pid(self, ct: str) -> int:
        """PID 1 of container ``ct`` as this machine numbers it."""
        if not self.prefix:
            out = self.run("lxc-info", "-P", self.lxc_path, "-n", ct, "-p", "-H").stdout.strip()
            assert out.isdigit(), f"{ct} has no init pid ({out!r})"
            return int(out)
        group = self.cgroup_dir(ct, "pids" if CGROUP_V1 else "")
        # the CT's own cgroup and those below it (an init like systemd moves itself into one)
        pids = [pid for procs in sorted(group.rglob("cgroup.procs")) for pid in procs.read_text().split()]
        for pid in pids:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:  # gone meanwhile
                continue
            nspid = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), [])
            if len(nspid) >= 2 and nspid[-1] == "1":
                return int(pid)
        raise AssertionError(f"no PID 1 of {ct} in {group}")


def local_site(settings: Settings) -> Site:
    """The embedded default: this machine's LXC path, its template."""
    lxc = settings.lxc_path
    host = testinfra.get_host("local://")
    return Site(LXC, settings, lxc, str(lxc), (), "", host, lxc / settings.template / "rootfs")
