"""The seam between the API emulation and what actually runs a CT.

The server keeps every PVE-level fact (configs, locks, pools, tasks) itself; an engine only makes
the container behind a CT exist, run and stop. :class:`MemoryEngine` (``engine_memory``) keeps
records (fast, unit tests); :class:`LxcEngine` (``engine_lxc``) makes real overlay clones of the
host's LXC template, reachable over SSH at the static IP of ``net0``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .hookcaps import Published

CTConfig = Mapping[str, Any]


class EngineError(Exception):
    """An engine operation failed; the message becomes the task's exit status."""


class Engine(Protocol):
    name: str

    def unavailable_reason(self) -> str | None:
        """Why this engine cannot work on this machine, or None if it can."""

    def restore(self, vmid: int, config: CTConfig, running: bool) -> None:
        """Re-adopt a CT recorded in a persisted state file (server restart)."""

    def create(self, vmid: int, config: CTConfig, ostemplate: str = "", ssh_public_keys: str = "") -> None:
        """Make the container for a new CT (``POST /nodes/{node}/lxc``) from ``ostemplate`` (a
        volid; engines without real storage ignore it), with root's ``ssh_public_keys``."""

    def clone(self, source_vmid: int, vmid: int, config: CTConfig) -> None:
        """Make the container for a clone of ``source_vmid``."""

    def apply_config(self, vmid: int, config: CTConfig) -> None:
        """Bring the container's settings (network, limits, hostname) in line with ``config``."""

    def start(self, vmid: int, config: CTConfig) -> str:
        """Start the container; returns its SSH host public key line (see ``hostkey``)."""

    def post_start(self, vmid: int, config: CTConfig) -> Published:
        """The hookscript's ``post-start`` on the running CT: the caps of its description's
        ``sandbox-rt-caps:`` line, bounded by the node's ceilings; returns what it publishes
        (``hookcaps.Published``): the ``sandbox-rt-caps-applied:`` value, or none where the script
        fails (PVE then only warns: the start stays done), with ``sandbox-rt-caps-refused:`` where
        the node refused the caps (its pids budget)."""

    def stop(self, vmid: int) -> None:
        """Stop immediately (``lxc-stop -k``)."""

    def shutdown(self, vmid: int, timeout: float) -> None:
        """Clean shutdown, killing after ``timeout`` seconds."""

    def destroy(self, vmid: int) -> None:
        """Remove the container and everything it wrote."""

    def is_running(self, vmid: int) -> bool: ...

    def memory_used(self, vmid: int) -> int:
        """Bytes of memory the running CT uses now (its cgroup), 0 when stopped."""

    def interfaces(self, vmid: int, config: CTConfig) -> list[dict[str, Any]] | None:
        """``GET .../interfaces`` of a running CT (None when it is not running)."""

    def disk_used(self, vmid: int) -> int:
        """Bytes the CT's root filesystem holds of its own (``disk`` of status/current)."""

    def snapshot(self, vmid: int, snapname: str) -> None:
        """Save the CT's filesystem as it is now (a running CT is frozen meanwhile)."""

    def delete_snapshot(self, vmid: int, snapname: str) -> None:
        """Forget a snapshot (missing is fine). ``destroy`` removes a CT's snapshots too."""

    def clone_snapshot(self, source_vmid: int, snapname: str, vmid: int, config: CTConfig) -> None:
        """Make the container for a (full) clone of ``source_vmid``'s snapshot ``snapname``: its
        files, minus what PVE's clone and the host-key hookscript renew (machine-id, host keys)."""


@runtime_checkable
class StorageBacked(Protocol):
    """An engine whose node has real directory storages (the node engine): uploads go there."""

    def storage_dir(self, storage: str) -> Path | None:
        """This machine's path of a directory storage's root, or None if it has none."""


@runtime_checkable
class ConfigFileBacked(Protocol):
    """An engine whose node keeps the CTs' config files (``/etc/pve/lxc/<vmid>.conf``, the node
    engine): root may edit them by hand there (raw ``lxc.*`` keys, which the API cannot set)."""

    def sync_config_files(self, cts: dict[str, dict[str, Any]], node: str) -> bool:
        """Read root's changes of the raw ``lxc`` entries into ``cts`` (True if any), then write
        every CT file of ``node`` from ``cts`` (PVE's pmxcfs: the files are the configs)."""
