"""Value objects the public API returns or takes."""

from __future__ import annotations

import dataclasses
from typing import Literal

__all__ = [
    "EntryInfo",
    "ExecResult",
    "OutputChunk",
    "ProcessInfo",
    "ResourceUsage",
    "SandboxRecord",
    "SandboxSpec",
    "SandboxStatus",
    "SnapshotInfo",
    "VolumeInfo",
    "VolumeMount",
]


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """What a finished command gave: its output, exit code and wall time."""

    command: str
    stdout: bytes
    stderr: bytes
    exit_code: int
    duration_s: float
    # bytes the command printed past ``max_output`` on each stream, dropped (not in stdout/stderr)
    stdout_dropped: int = 0
    stderr_dropped: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def truncated(self) -> bool:
        """True if ``stdout`` or ``stderr`` lacks output past ``max_output`` (see ``*_dropped``)."""
        return bool(self.stdout_dropped or self.stderr_dropped)

    @property
    def text(self) -> str:
        """stdout decoded as UTF-8 (undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")


@dataclasses.dataclass(frozen=True)
class OutputChunk:
    """A piece of a running command's output, as :meth:`Sandbox.exec_stream` yields it."""

    stream: Literal["stdout", "stderr"]
    data: bytes


# What create() gives a sandbox when the caller says nothing: the declaration of the create options
# (sandbox_rt.options), which every front door reads, quotes them; so does SandboxSpec below.
DEFAULT_CPUS = 1.0
DEFAULT_MEMORY_MB = 1024
DEFAULT_DISK_GB = 8
DEFAULT_PIDS_MAX = 1024
# The template a sandbox is cloned from unless create() names another (the host contract's
# ``template`` / ``pve_template_vmid``); more named templates come from the inventory (issue 17).
DEFAULT_TEMPLATE = "default"


@dataclasses.dataclass(frozen=True)
class VolumeMount:
    """A directory of the host mounted into a sandbox at ``mount_path`` (the LXC backend).

    The source is either a named volume (``volume``: :meth:`Manager.volumes`, outlives sandboxes)
    or a host directory (``host_path``) under one the operator allows (``volume_host_dirs``).
    ``sub_path`` mounts a directory inside the source instead (relative, no ``..``); ``read_only``
    refuses every write, root's included. Checked by :func:`sandbox_rt.volumes.check_mounts`.
    """

    mount_path: str
    volume: str | None = None
    host_path: str | None = None
    sub_path: str | None = None
    read_only: bool = False


@dataclasses.dataclass(frozen=True)
class SandboxSpec:
    """The validated request for a new sandbox."""

    hostname: str | None = None
    cpus: float = DEFAULT_CPUS
    memory_mb: int = DEFAULT_MEMORY_MB
    disk_gb: int = DEFAULT_DISK_GB
    pids_max: int = DEFAULT_PIDS_MAX
    internet: bool = False
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    ttl_s: int | None = None
    detached: bool = False  # no owner process: only the TTL ends it (gc --dead-owners spares it)
    # destinations reachable without internet: IPv4 addresses, networks, domain names (normalised)
    egress: tuple[str, ...] = ()
    # caps on what the sandbox shares with its neighbours (sandbox_rt/caps.py; 0 = none):
    # network bandwidth each way in Mbit/s, disk bandwidth (MB/s) and IOPS each way on the host's
    # sandbox storage device
    net_mbps: int = 0
    disk_mbps: int = 0
    disk_iops: int = 0
    # root on request: commands may run as the sandbox's root (``exec(..., user="root")``); the
    # container stays unprivileged (its root is an unprivileged host uid without Docker's dropped
    # capabilities). Set at creation only: a sandbox never gains or loses it.
    root: bool = False
    # the named template it is cloned from (Settings.template_names(); a fork: its snapshot's)
    template: str = DEFAULT_TEMPLATE
    # host directories mounted into it (named volumes, allowed host paths); fixed at creation
    volumes: tuple[VolumeMount, ...] = ()


@dataclasses.dataclass(frozen=True)
class SandboxRecord:
    """What a backend knows about one sandbox, enough to reach it again (``attach``)."""

    id: str
    hostname: str
    ip: str
    host_key: str  # "ssh-ed25519 AAAA..." pinned at creation
    spec: SandboxSpec
    created_at: float
    expires_at: float | None
    owner_pid: int
    owner_host: str
    backend: str


@dataclasses.dataclass(frozen=True)
class ResourceUsage:
    """Resources a sandbox uses now, read from the host's cgroups."""

    memory_bytes: int | None = None
    memory_peak_bytes: int | None = None
    cpu_time_s: float | None = None
    pids: int | None = None
    # root filesystem bytes the sandbox uses: LXC what it wrote (its overlay delta; the template is
    # shared), PVE the rootfs usage PVE reports (``disk`` of status/current); None if unknown
    disk_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class SandboxStatus:
    """``Sandbox.status()``: state, configured limits, address, uptime and usage."""

    id: str
    state: str  # "running", "stopped", ...
    ip: str
    hostname: str
    cpus: float
    memory_mb: int
    disk_gb: int
    internet: bool
    uptime_s: float | None
    usage: ResourceUsage
    labels: dict[str, str]
    expires_at: float | None
    egress: tuple[str, ...] = ()
    net_mbps: int = 0
    disk_mbps: int = 0
    disk_iops: int = 0
    template: str = DEFAULT_TEMPLATE


@dataclasses.dataclass(frozen=True)
class SnapshotInfo:
    """A saved sandbox filesystem: ``Manager.create(from_snapshot=name)`` forks new sandboxes from it.

    LXC: a copy of the sandbox's overlay delta, independent of the sandbox (it outlives it).
    Proxmox VE: a PVE snapshot of the sandbox's CT, removed with that CT (docs/proxmox.md).
    """

    name: str
    source_id: str  # the sandbox it was taken from
    created_at: float
    backend: str
    size_bytes: int | None = None  # LXC: bytes of the saved delta; PVE: not reported
    template: str = DEFAULT_TEMPLATE  # the source's template: every fork is cloned from it too


@dataclasses.dataclass(frozen=True)
class VolumeInfo:
    """A named volume (``Manager.volumes``): a directory of the host that outlives sandboxes.

    ``path`` is its directory on the host; files in it carry the ids of the template's range
    (``idmap_base + uid``), which each sandbox sees as its own ``uid``.
    """

    name: str
    path: str
    created_at: float
    used_by: tuple[str, ...] = ()  # ids of the sandboxes that mount it now
    size_bytes: int | None = None  # bytes it holds (None: too large to count quickly)


EntryType = Literal["file", "dir", "symlink", "other"]


@dataclasses.dataclass(frozen=True)
class EntryInfo:
    """A file system entry in a sandbox, as ``sb.files.list`` and ``sb.files.stat`` report it.

    Every field comes from the sandbox and was checked on the host: ``name`` is one path component,
    ``path`` is the listed directory joined with it, sizes and times are plain numbers.
    """

    name: str
    path: str
    type: EntryType
    size: int
    mode: int  # permission bits (0o7777)
    mtime: float
    symlink_target: str | None = None


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """A background command of a sandbox (``sb.commands.list()``)."""

    pid: int
    handle: str
    command: str
    running: bool
    exit_code: int | None
