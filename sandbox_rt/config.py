"""Typed runtime settings: the host contract file (``/etc/sandbox_rt/host.json``) plus env overrides.

Validated at the edge: a bad value raises :class:`~sandbox_rt.errors.ConfigError` naming it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Any

from .caps import DEFAULT_DISK_IOPS, DEFAULT_DISK_MBPS, DEFAULT_NET_MBPS
from .errors import ConfigError
from .models import DEFAULT_TEMPLATE
from .template_registry import built_containers, built_vmids
from .validation import NODE_NAME, check_template_name

__all__ = ["DEFAULT_HOST_CONFIG", "Settings"]

DEFAULT_HOST_CONFIG = Path("/etc/sandbox_rt/host.json")
ENV_PREFIX = "SANDBOX_RT_"


@dataclasses.dataclass(frozen=True)
class Settings:
    """Where the sandboxes live and how to reach them. Field names match ``host.json`` keys."""

    backend: str = "lxc"
    lxc_path: Path = Path("/var/lib/sandbox_rt/lxc")
    # the default template's container (create(template="default"), the usual case)
    template: str = "sandbox-template"
    # more named templates (template_build_templates): name -> container of lxc_path
    templates: dict[str, str] = dataclasses.field(default_factory=dict)
    bridge: str = "vmbr1"
    network_cidr: str = "10.99.0.0/16"
    gateway: str = "10.99.0.1"
    dns_server: str = "10.99.0.1"
    ip_pool_start: str = "10.99.1.0"
    ip_pool_end: str = "10.99.255.254"
    ssh_user: str = "sandbox"
    ssh_key: Path = Path("/etc/sandbox_rt/ssh/id_ed25519")
    nft_family: str = "inet"
    nft_table: str = "sandbox"
    nft_internet_set: str = "internet_allowed"
    # per-sandbox network state (internet, egress) the sandbox tables include on every load
    net_state_dir: Path = Path("/var/lib/sandbox_rt/net")
    # dnsmasq reads *.conf here; the runtime writes the egress allow-list's nftset lines
    dnsmasq_conf_dir: Path = Path("/etc/sandbox_rt/dnsmasq.d")
    dnsmasq_conf: Path = Path("/etc/sandbox_rt/dnsmasq.conf")
    dnsmasq_pidfile: Path = Path("/run/sandbox_rt/dnsmasq.pid")
    # each sandbox whose egress list has names gets its own resolver (dnsmasq) on dns_server, one port
    # of this range each (the sandbox's DNS is DNATed to it; see sandbox_rt/backends/lxc/egress_dns.py)
    egress_dns_port_min: int = 20000
    egress_dns_port_max: int = 21999
    idmap_base: int = 100000
    idmap_size: int = 65536
    # LXC: each sandbox maps its ids to a host range of its own (after the template's), so an escape
    # from one does not own the others' files; needs the ranges in /etc/subuid (lxc_host role)
    idmap_isolated: bool = True
    # LXC: enforce disk_gb (each container dir a btrfs subvolume with a qgroup limit); needs the
    # LXC path on btrfs with quotas (lxc_host_storage: btrfs_loop). Off: disk_gb is not enforced.
    disk_limits: bool = False
    ssh_ready_timeout_s: float = 30.0
    command_timeout_s: float = 300.0
    default_ttl_s: int = 3600
    # the host's default per-sandbox caps (create(net_mbps=, disk_mbps=, disk_iops=); 0 = none):
    # network Mbit/s each way, disk MB/s and IOPS each way (sandbox_rt/caps.py)
    default_net_mbps: int = DEFAULT_NET_MBPS
    default_disk_mbps: int = DEFAULT_DISK_MBPS
    default_disk_iops: int = DEFAULT_DISK_IOPS
    # Proxmox VE backend (backend="proxmox"); the token secret comes from the environment
    # (SANDBOX_RT_PVE_TOKEN_SECRET) or a root-only file, never from host.json.
    pve_url: str = ""
    pve_token_id: str = ""  # user@realm!tokenname
    pve_token_secret: str = dataclasses.field(default="", repr=False)
    pve_token_secret_file: str = ""
    pve_verify: str = "true"  # "true" (system CAs), a CA file path, or "false" (warns)
    pve_node: str = ""  # "" = the template's node (linked clones live where the template is)
    pve_template_vmid: int = 0
    # more named templates on Proxmox VE: name -> the VMID of its CT template
    pve_templates: dict[str, int] = dataclasses.field(default_factory=dict)
    # a cluster: each node's own copies of the templates (linked clones live on their template's
    # node): node -> {template name ("default" or a pve_templates name) -> VMID}; the VMIDs above
    # count for the node that holds them (docs/proxmox.md, "Placement")
    pve_node_templates: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    pve_pool: str = "sandbox-pool"
    # templates from code on PVE (Manager.build_template / remove_template, docs/templates.md): a
    # root-only (0600) file holding the operator's admin API token, USER@REALM!TOKENID=SECRET. The
    # runtime's own token cannot convert a CT to a template, move it out of its pool or grant ACLs.
    pve_admin_token_file: str = ""
    # the clone-only role a built template gets for the runtime's user and token on /vms/<vmid>, as
    # roles/proxmox_access grants it on the inventory's templates (proxmox_access_template_role)
    pve_template_role: str = "SandboxTemplateClone"
    # how long one PVE task (clone, start, resize, destroy) may run, and how long a "CT is locked"
    # answer is retried; a task still running then is stopped and the step fails (BackendError)
    pve_task_timeout_s: float = 300.0
    state_dir: Path = Path("/var/lib/sandbox_rt/state")
    # LXC: named volumes (``sandbox-rt volume``), one directory each, outliving sandboxes
    volume_dir: Path = Path("/var/lib/sandbox_rt/volumes")
    # LXC: host directories a sandbox may mount (``VolumeMount(host_path=...)``) lie under one of
    # these; empty: none (``sandbox-rt serve --allow-host-path DIR`` adds one)
    volume_host_dirs: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.validate()

    # -- loading ---------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: Path | str | None = None, env: dict[str, str] | None = None) -> Settings:
        """Read ``host.json`` (``$SANDBOX_RT_CONFIG`` or the default path) and apply env overrides.

        A missing file is fine (defaults apply); an unreadable or malformed one is a ConfigError.
        """
        env = dict(os.environ if env is None else env)
        file = Path(path or env.get(ENV_PREFIX + "CONFIG") or DEFAULT_HOST_CONFIG)
        values: dict[str, Any] = {}
        if file.exists():
            try:
                values = json.loads(file.read_text())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"cannot read runtime config {file}: {exc}") from exc
            if not isinstance(values, dict):
                raise ConfigError(f"runtime config {file} must hold a JSON object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ConfigError(f"unknown key(s) in {file}: {', '.join(unknown)}")
        for name in fields:
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is not None:
                values[name] = raw
        return cls(**{k: _coerce(fields[k], k, v) for k, v in values.items()})

    # -- validation ------------------------------------------------------------------------------
    def validate(self) -> None:
        try:
            net = ipaddress.IPv4Network(self.network_cidr)
        except ValueError as exc:
            raise ConfigError(f"network_cidr={self.network_cidr!r} is not an IPv4 network: {exc}") from exc
        for name in ("gateway", "dns_server", "ip_pool_start", "ip_pool_end"):
            value = getattr(self, name)
            try:
                addr = ipaddress.IPv4Address(value)
            except ValueError as exc:
                raise ConfigError(f"{name}={value!r} is not an IPv4 address") from exc
            if addr not in net:
                raise ConfigError(f"{name}={value} is not inside network_cidr={net}")
        if ipaddress.IPv4Address(self.ip_pool_start) > ipaddress.IPv4Address(self.ip_pool_end):
            raise ConfigError(f"ip_pool_start={self.ip_pool_start} is after ip_pool_end={self.ip_pool_end}")
        if not 1024 <= self.egress_dns_port_min <= self.egress_dns_port_max <= 65535:
            raise ConfigError(
                f"egress_dns_port_min..max={self.egress_dns_port_min}..{self.egress_dns_port_max} "
                "must be an ascending range of ports within 1024-65535"
            )
        if self.backend not in ("lxc", "proxmox"):
            raise ConfigError(f"backend={self.backend!r} must be 'lxc' or 'proxmox'")
        for name in ("default_net_mbps", "default_disk_mbps", "default_disk_iops"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 0 (0: no cap)")
        for name in ("ssh_ready_timeout_s", "command_timeout_s", "pve_task_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be > 0")
        self._validate_templates()
        for allowed in self.volume_host_dirs:
            if not (isinstance(allowed, str) and allowed.startswith("/") and "\x00" not in allowed):
                raise ConfigError(f"volume_host_dirs: {allowed!r} is not an absolute path")
            if {".", ".."} & set(allowed.split("/")):
                raise ConfigError(
                    f"volume_host_dirs: {allowed!r} has a '.' or '..' component (host paths are "
                    "compared as written, never resolved: give the directory's plain path)"
                )
            if Path(allowed).resolve() == Path("/"):
                raise ConfigError("volume_host_dirs: '/' would let sandboxes mount any host directory")
        if self.backend == "proxmox":
            self._validate_proxmox()

    def _validate_templates(self) -> None:
        for field, mapping in (("templates", self.templates), ("pve_templates", self.pve_templates)):
            if not isinstance(mapping, dict):
                raise ConfigError(f"{field} must map template names to templates, not {mapping!r}")
            for name, where in mapping.items():
                try:
                    check_template_name(name)
                except ConfigError as exc:
                    raise ConfigError(f"{field}: {exc}") from None
                if name == DEFAULT_TEMPLATE:
                    raise ConfigError(
                        f"{field}: {DEFAULT_TEMPLATE!r} is the host's default template "
                        "(template / pve_template_vmid), not a name to map"
                    )
                if field == "templates" and not (
                    isinstance(where, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", where)
                ):
                    raise ConfigError(f"templates: {name} -> {where!r} is not a container name")
                if field == "pve_templates" and not (isinstance(where, int) and where >= 100):
                    raise ConfigError(f"pve_templates: {name} -> {where!r} is not a VMID (>= 100)")

    def template_names(self) -> list[str]:
        """The templates ``create(template=...)`` may name on this host: ``default`` first."""
        named = self.pve_template_vmids() if self.backend == "proxmox" else self.lxc_templates()
        return [DEFAULT_TEMPLATE, *sorted(named)]

    def pve_template_vmids(self) -> dict[str, int]:
        """Named template -> VMID of its CT template on Proxmox VE: host.json's ``pve_templates``
        and the ones built from code (``<state_dir>/templates.json``, read live)."""
        return {**built_vmids(self.state_dir), **self.pve_templates}

    def lxc_templates(self) -> dict[str, str]:
        """Named template -> container: host.json's ``templates`` and the ones built from code
        (``<state_dir>/templates.json``, read live: a build in another process counts at once)."""
        return {**built_containers(self.state_dir, "lxc"), **self.templates}

    def check_template(self, name: str) -> None:
        """ConfigError naming the known templates unless this host has template ``name``."""
        known = self.template_names()
        if name not in known:
            raise ConfigError(f"unknown template {name!r}; this host has: {', '.join(known)}")

    def _validate_proxmox(self) -> None:
        if not self.pve_url.startswith("https://"):
            raise ConfigError(f"pve_url={self.pve_url!r} must be an https:// URL of the PVE API")
        if not re.fullmatch(r"[^@!\s]+@[^@!\s]+![A-Za-z][A-Za-z0-9._-]*", self.pve_token_id):
            raise ConfigError(f"pve_token_id={self.pve_token_id!r} must look like user@realm!tokenname")
        if not self.pve_token_secret and not self.pve_token_secret_file:
            raise ConfigError("no PVE token secret: set SANDBOX_RT_PVE_TOKEN_SECRET or pve_token_secret_file")
        if self.pve_template_vmid < 100:
            raise ConfigError(f"pve_template_vmid={self.pve_template_vmid!r} must be a VMID (>= 100)")
        if not re.fullmatch(r"[A-Za-z0-9.\-_]+", self.pve_template_role):
            raise ConfigError(f"pve_template_role={self.pve_template_role!r} is not a PVE role id")
        self._validate_node_templates()

    def _validate_node_templates(self) -> None:
        """pve_node_templates: node names as PVE takes them, known template names, distinct VMIDs."""
        if not isinstance(self.pve_node_templates, dict):
            raise ConfigError(f"pve_node_templates must map nodes to templates: {self.pve_node_templates!r}")
        seen = {self.pve_template_vmid, *self.pve_templates.values()}
        for node, copies in self.pve_node_templates.items():
            if not NODE_NAME.fullmatch(str(node)):
                raise ConfigError(f"pve_node_templates: {node!r} is not a PVE node name")
            if not isinstance(copies, dict):
                raise ConfigError(f"pve_node_templates: {node} -> {copies!r} must map names to VMIDs")
            for name, vmid in copies.items():
                if name not in self.template_names():
                    raise ConfigError(f"pve_node_templates: {node}/{name}: no such template on this host")
                if not (isinstance(vmid, int) and vmid >= 100):
                    raise ConfigError(f"pve_node_templates: {node}/{name} -> {vmid!r} is not a VMID (>= 100)")
                if vmid in seen:
                    raise ConfigError(f"pve_node_templates: {node}/{name} -> VMID {vmid} is used twice")
                seen.add(vmid)

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.network_cidr)


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off", "")


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(value)


def _coerce(field: dataclasses.Field[Any], name: str, value: Any) -> Any:
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    try:
        if kind == "Path":
            return Path(value)
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
        if kind == "bool":
            return _boolean(value)
        if kind.startswith("dict["):  # a JSON object (host.json, or an env var holding JSON)
            mapping = json.loads(value) if isinstance(value, str) else value
            if not isinstance(mapping, dict):
                raise ValueError(value)
            if kind.startswith("dict[str, dict["):  # node -> {name -> VMID}
                return {str(k): _coerce_ints(v) for k, v in mapping.items()}
            return {str(k): int(v) if "int]" in kind else str(v) for k, v in mapping.items()}
        if kind.startswith("list["):  # a JSON array, or an env var holding one or a ':'-list
            if isinstance(value, str):
                listed = value.lstrip().startswith("[")
                value = json.loads(value) if listed else [v for v in value.split(":") if v]
            if not isinstance(value, list):
                raise ValueError(value)
            return [str(v) for v in value]
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}={value!r} is not a valid {kind}") from exc


def _coerce_ints(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise ValueError(value)
    return {str(k): int(v) for k, v in value.items()}
