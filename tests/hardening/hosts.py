"""testinfra hosts for the control checks.

- :func:`sandbox_host`: the sandbox as its user, over SSH with testinfra's paramiko backend, the host
  key pinned (a known_hosts file holding only the key the runtime generated for this clone and read
  from its overlay, never from the network) and ``RejectPolicy`` for anything else.
- :func:`sandbox_root_host`: the sandbox as container root through ``lxc-attach`` (testinfra's
  ``lxc://`` backend means LXD, not LXC). Container root is what an attacker has after a privilege
  escalation inside the sandbox, so escape attempts run as both.
- :func:`local_host`: this machine (``local://``).
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import paramiko
import testinfra
from testinfra.backend import base
from testinfra.backend.paramiko import ParamikoBackend
from testinfra.host import Host

import sandbox_rt

from .sites import Site


def write_known_hosts(path: Path, address: str, host_key: str) -> Path:
    """A known_hosts file with exactly one entry: ``address`` -> the pinned ``host_key``."""
    key_type, key_b64 = host_key.split()[:2]
    path.write_text(f"{address} {key_type} {key_b64}\n")
    path.chmod(0o600)
    return path


def pinned_client(
    address: str, user: str, known_hosts: Path, key_file: Path | None = None, **connect: Any
) -> paramiko.SSHClient:
    """A paramiko client that knows only ``known_hosts`` and rejects any other key (never AutoAdd)."""
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    args: dict[str, Any] = {
        "username": user,
        "look_for_keys": False,
        "allow_agent": False,
        "timeout": 10,
        "banner_timeout": 10,
        "auth_timeout": 10,
    }
    if key_file is not None:
        args["key_filename"] = str(key_file)
    args.update(connect)
    try:
        client.connect(address, **args)
    except BaseException:
        client.close()
        raise
    return client


class PinnedParamikoBackend(ParamikoBackend):
    """testinfra's paramiko backend with the host key pinned from a known_hosts file."""

    def __init__(self, hostspec: str, known_hosts: Path, ssh_identity_file: str, **kwargs: Any) -> None:
        self.known_hosts = known_hosts
        super().__init__(hostspec, ssh_identity_file=ssh_identity_file, **kwargs)

    @functools.cached_property
    def client(self) -> paramiko.SSHClient:
        return pinned_client(
            self.host.name,
            self.host.user or "sandbox",
            self.known_hosts,
            Path(self.ssh_identity_file or ""),
            timeout=self.timeout,
        )


class LxcAttachBackend(base.BaseBackend):
    """Commands as container root via ``lxc-attach`` (clean environment, the container's caps);
    ``prefix`` runs that where the container lives (in the emulated PVE node: its own lxc-attach)."""

    NAME = "lxc-attach"

    def __init__(
        self,
        name: str,
        lxc_path: Path | str,
        timeout: float = 60,
        prefix: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> None:
        self.container = name
        self.lxc_path = lxc_path
        self.timeout = timeout
        self.prefix = prefix
        super().__init__(name, **kwargs)

    def run(self, command: str, *args: str, **kwargs: Any) -> base.CommandResult:
        cmd = self.get_command(command, *args)
        proc = subprocess.run(
            [
                *self.prefix,
                "lxc-attach",
                "-P",
                str(self.lxc_path),
                "-n",
                self.container,
                "--clear-env",
                "--",
                "/bin/sh",
                "-c",
                cmd,
            ],
            capture_output=True,
            timeout=self.timeout,
            check=False,
        )
        return self.result(proc.returncode, self.encode(cmd), proc.stdout, proc.stderr)


def known_hosts_path(workdir: Path, sb: sandbox_rt.Sandbox) -> Path:
    return workdir / f"known_hosts.{sb.id}"


def sandbox_host(
    sb: sandbox_rt.Sandbox, settings: sandbox_rt.Settings, workdir: Path, user: str | None = None
) -> Host:
    """testinfra over the runtime's SSH (pinned host key) as the sandbox user, or ``user``."""
    known = write_known_hosts(known_hosts_path(workdir, sb), sb.ip, sb.record.host_key)
    backend = PinnedParamikoBackend(
        f"{user or settings.ssh_user}@{sb.ip}", known, ssh_identity_file=str(settings.ssh_key)
    )
    return Host(backend)


def sandbox_root_host(sb: sandbox_rt.Sandbox, settings: sandbox_rt.Settings, container: str = "") -> Host:
    return Host(LxcAttachBackend(container or sb.id, settings.lxc_path))


def site_root_host(site: Site, container: str) -> Host:
    """Container root of ``container`` on ``site`` (through the node for a PVE-backed sandbox)."""
    return Host(LxcAttachBackend(container, site.lxc_path, prefix=site.prefix))


def pve_vmid(mgr: sandbox_rt.Manager, sandbox_id: str) -> str:
    """The VMID of a PVE-backed sandbox's CT (its tags carry the sandbox id), via the runtime's API."""
    api: Any = getattr(mgr.backend, "api", None)
    assert api is not None, f"{sandbox_id} is not PVE-backed"
    guests = api.cluster.resources.get(type="vm")
    found = [str(r["vmid"]) for r in guests if sandbox_id in str(r.get("tags", "")).split(";")]
    assert len(found) == 1, f"{sandbox_id}: CTs {found}"
    return found[0]


def container_of(sb: sandbox_rt.Sandbox, lxc_path: Path) -> str:
    """The LXC container on this host that holds ``sb`` (found by its address): the sandbox id
    locally, ``<engine prefix><vmid>`` for a sandbox the PVE API test server made."""
    if (lxc_path / sb.id / "config").is_file():
        return sb.id
    want = f"lxc.net.0.ipv4.address = {sb.ip}/"
    found = []
    for cfg in lxc_path.glob("*/config"):
        try:
            lines = cfg.read_text().splitlines()
        except OSError:  # another test's container going away
            continue
        if any(line.strip().startswith(want) for line in lines):
            found.append(cfg.parent.name)
    assert len(found) == 1, f"{sb.id} ({sb.ip}): containers {found} on this host"
    return found[0]


def local_host() -> Host:
    return testinfra.get_host("local://")
