"""What the front doors use of the runtime, declared once (issue 36): ``sandbox_rt.Manager`` and
``Sandbox`` fit these protocols (mypy proves it below), the unit tests serve fakes. The native HTTP
API, its OpenSandbox dialect (lifecycle and execd) and the MCP server all take a :class:`ManagerLike`
and hand out :class:`SandboxLike` values; each door uses the part it needs.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Protocol, Unpack, runtime_checkable

from .models import (
    EntryInfo,
    ExecResult,
    OutputChunk,
    ProcessInfo,
    SandboxRecord,
    SandboxStatus,
    SnapshotInfo,
    VolumeInfo,
)
from .options import CreateOptions

if TYPE_CHECKING:
    from .manager import Manager
    from .sandbox import ExecStream, Sandbox

__all__ = [
    "CommandsLike",
    "ExecStreamLike",
    "FilesLike",
    "ManagerLike",
    "ProcessLike",
    "SandboxLike",
    "VolumeRuntime",
    "VolumesLike",
]

Command = str | Sequence[str]


class ExecStreamLike(Protocol):
    @property
    def result(self) -> ExecResult | None: ...

    def __iter__(self) -> Iterator[OutputChunk]: ...


class FilesLike(Protocol):
    """What the doors use of ``sb.files`` (sandbox_rt/files.py)."""

    def list(self, path: str, depth: int = 1, *, max_entries: int = ...) -> builtins.list[EntryInfo]: ...

    def stat(self, path: str, *, follow_symlinks: bool = True) -> EntryInfo: ...

    def remove(self, path: str, *, recursive: bool = False) -> None: ...

    def mkdir(self, path: str, *, parents: bool = True, mode: int = 0o755) -> bool: ...

    def rename(self, src: str, dst: str) -> EntryInfo: ...

    def write(self, path: str, data: bytes | str, *, mode: int | None = None) -> EntryInfo: ...


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
    """What the doors use of ``sb.commands`` (sandbox_rt/commands.py): background commands."""

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
    """What the doors use of a :class:`~sandbox_rt.Sandbox`."""

    @property
    def id(self) -> str: ...

    @property
    def hostname(self) -> str: ...

    @property
    def ip(self) -> str: ...

    @property
    def labels(self) -> dict[str, str]: ...

    @property
    def expires_at(self) -> float | None: ...

    def exec(
        self,
        command: Command,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        max_output: int = ...,
        user: str | None = None,
    ) -> ExecResult: ...

    def exec_stream(
        self,
        command: Command,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        max_output: int = ...,
        user: str | None = None,
    ) -> ExecStreamLike: ...

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None: ...

    def read_file(self, path: str, *, max_bytes: int = ...) -> bytes: ...

    def set_internet(self, enabled: bool) -> None: ...

    def set_egress(self, egress: Sequence[str]) -> tuple[str, ...]: ...

    def extend(self, ttl_s: int) -> None: ...

    @property
    def files(self) -> FilesLike: ...

    @property
    def commands(self) -> CommandsLike: ...

    def status(self) -> SandboxStatus: ...

    def snapshot(self, name: str) -> SnapshotInfo: ...

    def is_connected(self) -> bool: ...

    def destroy(self) -> None: ...

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
    """What the doors use of a :class:`~sandbox_rt.Manager`."""

    def create(self, **options: Unpack[CreateOptions]) -> SandboxLike: ...

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

    def _sandbox_fits(s: Sandbox) -> SandboxLike:
        return s

    def _volumes_fit(m: Manager) -> VolumeRuntime:
        return m

    def _stream_fits(s: ExecStream) -> ExecStreamLike:
        return s
