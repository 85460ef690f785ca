"""What the HTTP API needs of the runtime (``sandbox_rt.Manager`` and ``Sandbox`` fit these
protocols; the unit tests serve fakes), and the cache of attached sandboxes the routes share: one
attached :class:`~sandbox_rt.Sandbox` per id, so consecutive execs reuse its SSH transport.
"""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from ..models import (
    DEFAULT_CPUS,
    DEFAULT_DISK_GB,
    DEFAULT_MEMORY_MB,
    DEFAULT_PIDS_MAX,
    EntryInfo,
    ExecResult,
    OutputChunk,
    ProcessInfo,
    SandboxRecord,
    SandboxStatus,
    SnapshotInfo,
    VolumeInfo,
    VolumeMount,
)

if TYPE_CHECKING:
    from ..manager import Manager
    from ..sandbox import ExecStream

__all__ = [
    "CommandsLike",
    "ExecStreamLike",
    "FilesLike",
    "ManagerLike",
    "ProcessLike",
    "SandboxCache",
    "SandboxLike",
    "quiet_close",
]

log = logging.getLogger(__name__)


# -- what the server needs from the runtime (sandbox_rt.Manager / Sandbox fit; tests use fakes) ----
class ExecStreamLike(Protocol):
    @property
    def result(self) -> ExecResult | None: ...

    def __iter__(self) -> Iterator[OutputChunk]: ...


class FilesLike(Protocol):
    """What the API uses of ``sb.files`` (sandbox_rt/files.py)."""

    def list(self, path: str, depth: int = 1) -> builtins.list[EntryInfo]: ...

    def stat(self, path: str, *, follow_symlinks: bool = True) -> EntryInfo: ...

    def remove(self, path: str, *, recursive: bool = False) -> None: ...

    def mkdir(self, path: str, *, parents: bool = True, mode: int = 0o755) -> bool: ...

    def rename(self, src: str, dst: str) -> EntryInfo: ...


class ProcessLike(Protocol):
    """A background command (:class:`sandbox_rt.background.BackgroundProcess`)."""

    pid: int
    handle: str
    command: str

    def exit_code(self) -> int | None: ...

    def is_running(self) -> bool: ...

    def info(self) -> ProcessInfo: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_stdin(self, data: bytes | str, *, timeout: float = 30.0) -> None: ...

    def close_stdin(self) -> None: ...

    def kill(self, sig: int = ...) -> None: ...

    def logs_from(
        self, stdout_offset: int, stderr_offset: int, *, max_bytes: int | None = None
    ) -> tuple[bytes, bytes]: ...


class CommandsLike(Protocol):
    """What the API uses of ``sb.commands`` (sandbox_rt/commands.py): background commands."""

    def run(
        self,
        command: str | builtins.list[str],
        *,
        background: Literal[True],
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProcessLike: ...

    def list(self) -> builtins.list[ProcessInfo]: ...

    def connect(self, pid: int) -> ProcessLike: ...


class SandboxLike(Protocol):
    @property
    def id(self) -> str: ...

    def exec(
        self,
        command: str | builtins.list[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        user: str | None = None,
    ) -> ExecResult: ...

    def exec_stream(
        self,
        command: str | builtins.list[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        user: str | None = None,
    ) -> ExecStreamLike: ...

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None: ...

    def read_file(self, path: str) -> bytes: ...

    def set_internet(self, enabled: bool) -> None: ...

    def set_egress(self, egress: Sequence[str]) -> tuple[str, ...]: ...

    def extend(self, ttl_s: int) -> None: ...

    @property
    def files(self) -> FilesLike: ...

    @property
    def commands(self) -> CommandsLike: ...

    def status(self) -> SandboxStatus: ...

    def is_connected(self) -> bool: ...

    def close(self) -> None: ...


class VolumesLike(Protocol):
    """The host's named volumes (``sandbox_rt.volumes.VolumeStore``)."""

    def create(self, name: str) -> VolumeInfo: ...

    def ensure(self, name: str) -> None: ...

    def get(self, name: str, *, size: bool = True) -> VolumeInfo: ...

    def list(self, *, size: bool = False) -> builtins.list[VolumeInfo]: ...

    def remove(self, name: str) -> None: ...


@runtime_checkable
class VolumeRuntime(Protocol):
    """A runtime with named volumes (``sandbox_rt.Manager``; on PVE its ``volumes`` raises a
    ConfigError saying why there are none)."""

    @property
    def volumes(self) -> VolumesLike: ...


class ManagerLike(Protocol):
    def create(
        self,
        *,
        hostname: str | None = None,
        cpus: float = DEFAULT_CPUS,
        memory_mb: int = DEFAULT_MEMORY_MB,
        disk_gb: int = DEFAULT_DISK_GB,
        pids_max: int = DEFAULT_PIDS_MAX,
        internet: bool = False,
        labels: Mapping[str, str] | None = None,
        ttl_s: int | None = None,
        detached: bool = False,
        egress: Sequence[str] | None = None,
        net_mbps: int | None = None,
        disk_mbps: int | None = None,
        disk_iops: int | None = None,
        root: bool = False,
        template: str | None = None,
        from_snapshot: str | None = None,
        volumes: Sequence[VolumeMount] | None = None,
    ) -> SandboxLike: ...

    def templates(self) -> builtins.list[str]: ...

    def attach(self, sandbox_id: str) -> SandboxLike: ...

    def snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo: ...

    def list_snapshots(self) -> builtins.list[SnapshotInfo]: ...

    def delete_snapshot(self, name: str) -> None: ...

    def destroy(self, sandbox_id: str) -> None: ...

    def list(self, labels: Mapping[str, str] | None = None) -> builtins.list[SandboxRecord]: ...


if TYPE_CHECKING:  # mypy proves the real classes fit the protocols

    def _manager_fits(m: Manager) -> ManagerLike:
        return m

    def _volumes_fit(m: Manager) -> VolumeRuntime:
        return m

    def _stream_fits(s: ExecStream) -> ExecStreamLike:
        return s


# -- the attached-sandbox cache ----------------------------------------------------------------------
class SandboxCache:
    """One attached sandbox per id, shared by all requests (one SSH transport, channels per exec)."""

    def __init__(self, manager: ManagerLike) -> None:
        self._manager = manager
        self._lock = threading.Lock()
        self._items: dict[str, SandboxLike] = {}
        self._attaching: dict[str, threading.Lock] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def put(self, sb: SandboxLike) -> None:
        with self._lock:
            old = self._items.get(sb.id)
            self._items[sb.id] = sb
        if old is not None and old is not sb:
            quiet_close(old)

    def get(self, sandbox_id: str) -> SandboxLike:
        with self._lock:
            sb = self._items.get(sandbox_id)
            if sb is not None and sb.is_connected():
                return sb
            gate = self._attaching.setdefault(sandbox_id, threading.Lock())
        with gate:  # one attach per id at a time; the others wait and share its result
            with self._lock:
                sb = self._items.get(sandbox_id)
                if sb is not None and sb.is_connected():
                    return sb
                stale = self._items.pop(sandbox_id, None)
            if stale is not None:
                quiet_close(stale)
            try:
                sb = self._manager.attach(sandbox_id)
            finally:
                with self._lock:
                    self._attaching.pop(sandbox_id, None)
            self.put(sb)
            return sb

    def drop(self, sandbox_id: str) -> None:
        """Forget (and disconnect from) a sandbox; it keeps running."""
        with self._lock:
            sb = self._items.pop(sandbox_id, None)
        if sb is not None:
            quiet_close(sb)

    def close_all(self) -> None:
        with self._lock:
            items = builtins.list(self._items.values())
            self._items.clear()
        for sb in items:
            quiet_close(sb)


def quiet_close(sb: SandboxLike) -> None:
    try:
        sb.close()
    except Exception:  # closing a dead connection must not fail a request
        log.debug("closing the connection to %s failed", sb.id, exc_info=True)
