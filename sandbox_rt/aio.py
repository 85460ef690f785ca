"""``AsyncManager`` / ``AsyncSandbox``: the runtime for asyncio callers on the host.

The runtime speaks SSH through paramiko, which blocks (its channels have no event-loop
integration), and a second SSH stack for asyncio (asyncssh) would be a second executor to harden.
So each call runs the sync API on a worker thread of a pool the ``AsyncManager`` owns (not the
loop's default executor: that one has ``min(32, cores + 4)`` threads, 6 on a 2-core host, shared
with ``getaddrinfo`` and everything else, which a few long commands would starve). A thread is
held only while a call blocks; a streamed command holds one per chunk awaited. An awaiting task
that is cancelled leaves its call to finish on its thread: a command runs until it ends or its
``timeout`` kills it, as with the sync API.

>>> async with sandbox_rt.AsyncManager.from_env() as mgr:
...     async with mgr.create(memory_mb=512) as sb:
...         print((await sb.exec("echo hi")).text)
...         async for chunk in sb.exec_stream("for i in 1 2 3; do echo $i; done"):
...             print(chunk.data)
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import contextlib
import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, Unpack

from .errors import ConfigError, SandboxError
from .models import EntryInfo, ExecResult, OutputChunk, SandboxRecord, SandboxStatus, SnapshotInfo
from .options import CreateOptions
from .output_limits import DEFAULT_DOWNLOAD_MAX_BYTES, DEFAULT_MAX_OUTPUT, DEFAULT_READ_MAX_BYTES

if TYPE_CHECKING:
    from .files import Files
    from .manager import GcResult, Manager
    from .sandbox import ExecStream, Sandbox

__all__ = ["AsyncExecStream", "AsyncFiles", "AsyncManager", "AsyncSandbox", "Pending"]

T = TypeVar("T")
Command = str | Sequence[str]
Run = Callable[..., Awaitable[Any]]
DEFAULT_MAX_WORKERS = 64


class _Destroyable(Protocol):
    async def destroy(self) -> None: ...


S = TypeVar("S", bound=_Destroyable)


class Pending(Generic[S]):
    """A sandbox being made: ``await`` it for the sandbox, or ``async with`` it to have the sandbox
    destroyed when the block ends (as ``with mgr.create() as sb`` does in the sync API)."""

    def __init__(self, make: Callable[[], Awaitable[S]]) -> None:
        self._make: Callable[[], Awaitable[S]] | None = make
        self._made: S | None = None

    def _start(self) -> Awaitable[S]:
        if self._make is None:
            raise SandboxError("this create() was awaited already; call create() again for another sandbox")
        make, self._make = self._make, None
        return make()

    def __await__(self) -> Generator[Any, None, S]:
        return self._start().__await__()

    async def __aenter__(self) -> S:
        self._made = await self._start()
        return self._made

    async def __aexit__(self, *exc: object) -> None:
        if self._made is not None:
            await self._made.destroy()


class AsyncManager:
    """:class:`~sandbox_rt.Manager` for asyncio: the same calls, awaited (see the module doc).

    ``manager`` is the sync manager it drives (``Manager.from_env()`` if None; it is closed with
    this one only then); ``max_workers`` bounds the threads running calls at once.
    """

    def __init__(self, manager: Manager | None = None, *, max_workers: int = DEFAULT_MAX_WORKERS) -> None:
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or not 1 <= max_workers <= 4096:
            raise ConfigError(f"max_workers={max_workers!r} must be a whole number from 1 to 4096")
        if manager is None:
            from .manager import Manager

            manager = Manager.from_env()
            self._owns = True
        else:
            self._owns = False
        self.sync = manager
        """The sync :class:`~sandbox_rt.Manager` behind this one."""
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="sandbox-rt-aio")

    @classmethod
    def from_env(cls, *, max_workers: int = DEFAULT_MAX_WORKERS) -> AsyncManager:
        return cls(None, max_workers=max_workers)

    async def run_sync(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run any blocking call (e.g. ``sb.sync.commands.list``) on this manager's threads."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    # -- lifecycle -------------------------------------------------------------------------------
    def create(self, **options: Unpack[CreateOptions]) -> Pending[AsyncSandbox]:
        """``await mgr.create(...)`` or ``async with mgr.create(...) as sb``: :meth:`Manager.create`."""

        async def make() -> AsyncSandbox:
            return AsyncSandbox(await self.run_sync(self.sync.create, **options), self.run_sync)

        return Pending(make)

    async def attach(self, sandbox_id: str) -> AsyncSandbox:
        return AsyncSandbox(await self.run_sync(self.sync.attach, sandbox_id), self.run_sync)

    async def destroy(self, sandbox_id: str) -> None:
        await self.run_sync(self.sync.destroy, sandbox_id)

    async def get(self, sandbox_id: str) -> SandboxRecord:
        return await self.run_sync(self.sync.get, sandbox_id)

    async def list(self, labels: Mapping[str, str] | None = None) -> builtins.list[SandboxRecord]:
        return await self.run_sync(self.sync.list, labels)

    async def gc(self, *, dead_owners: bool = False, dry_run: bool = False) -> builtins.list[GcResult]:
        return await self.run_sync(self.sync.gc, dead_owners=dead_owners, dry_run=dry_run)

    def templates(self) -> builtins.list[str]:
        """The template names ``create(template=...)`` takes (from the host contract: no I/O)."""
        return self.sync.templates()

    async def snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo:
        return await self.run_sync(self.sync.snapshot, sandbox_id, name)

    async def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        return await self.run_sync(self.sync.list_snapshots)

    async def delete_snapshot(self, name: str) -> None:
        await self.run_sync(self.sync.delete_snapshot, name)

    async def aclose(self) -> None:
        """Stop taking calls; close the sync manager if this one made it. Sandboxes stay."""
        if self._owns:
            await self.run_sync(self.sync.close)
        self._pool.shutdown(wait=False)

    async def __aenter__(self) -> AsyncManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncExecStream:
    """``async for chunk in sb.exec_stream(...)``: :class:`~sandbox_rt.OutputChunk` s as the command
    prints them; ``result`` once done (as :class:`~sandbox_rt.ExecStream`)."""

    def __init__(self, start: Callable[[], ExecStream], run: Run) -> None:
        self._start = start
        self._run = run
        self._events = self._iterate()
        self.result: ExecResult | None = None

    async def _iterate(self) -> AsyncIterator[OutputChunk]:
        stream: ExecStream = await self._run(self._start)
        chunks = iter(stream)
        done = object()
        try:
            while True:
                chunk = await self._run(next, chunks, done)
                if chunk is done:
                    break
                yield chunk
        finally:
            # a generator: closing it tells the reader to stop; ValueError if it still runs on a
            # thread (the awaiting task was cancelled): the command then ends by its timeout
            with contextlib.suppress(ValueError):
                chunks.close()  # type: ignore[attr-defined]
            self.result = stream.result

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        return self._events

    async def wait(self) -> ExecResult:
        """Consume the rest of the output and return the result."""
        async for _ in self._events:
            pass
        if self.result is None:
            raise SandboxError("the stream was closed before the command's result")
        return self.result

    async def aclose(self) -> None:
        """Stop reading (the command runs on until it ends or its timeout)."""
        await self._events.aclose()  # type: ignore[attr-defined]


class AsyncFiles:
    """``sb.files`` awaited: list, stat, exists, remove, mkdir, rename, read, write, upload, download."""

    def __init__(self, sandbox: Sandbox, run: Run) -> None:
        self._sandbox = sandbox
        self._run = run

    @property
    def _files(self) -> Files:
        return self._sandbox.files

    async def list(self, path: str, depth: int = 1) -> builtins.list[EntryInfo]:
        result: builtins.list[EntryInfo] = await self._run(self._files.list, path, depth)
        return result

    async def stat(self, path: str, *, follow_symlinks: bool = True) -> EntryInfo:
        result: EntryInfo = await self._run(self._files.stat, path, follow_symlinks=follow_symlinks)
        return result

    async def exists(self, path: str) -> bool:
        return bool(await self._run(self._files.exists, path))

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self._run(self._files.remove, path, recursive=recursive)

    async def mkdir(self, path: str, *, parents: bool = True, mode: int = 0o755) -> bool:
        return bool(await self._run(self._files.mkdir, path, parents=parents, mode=mode))

    async def rename(self, src: str, dst: str) -> EntryInfo:
        result: EntryInfo = await self._run(self._files.rename, src, dst)
        return result

    async def read(self, path: str, *, max_bytes: int = DEFAULT_READ_MAX_BYTES) -> bytes:
        return bytes(await self._run(self._files.read, path, max_bytes=max_bytes))

    async def read_text(
        self, path: str, encoding: str = "utf-8", *, max_bytes: int = DEFAULT_READ_MAX_BYTES
    ) -> str:
        return str(await self._run(self._files.read_text, path, encoding, max_bytes=max_bytes))

    async def write(self, path: str, data: bytes | str, *, mode: int | None = None) -> EntryInfo:
        result: EntryInfo = await self._run(self._files.write, path, data, mode=mode)
        return result

    async def upload(self, local: str | os.PathLike[str], remote: str) -> int:
        return int(await self._run(self._files.upload, local, remote))

    async def download(
        self, remote: str, local: str | os.PathLike[str], *, max_bytes: int = DEFAULT_DOWNLOAD_MAX_BYTES
    ) -> int:
        return int(await self._run(self._files.download, remote, local, max_bytes=max_bytes))


class AsyncSandbox:
    """:class:`~sandbox_rt.Sandbox` for asyncio (``sync`` is the sandbox itself: background
    processes, terminals and port forwards are reached through it, e.g.
    ``await mgr.run_sync(sb.sync.commands.list)``). Leaving ``async with`` destroys it."""

    def __init__(self, sandbox: Sandbox, run: Run) -> None:
        self.sync = sandbox
        self._run = run
        self.files = AsyncFiles(sandbox, run)

    @property
    def id(self) -> str:
        return self.sync.id

    @property
    def hostname(self) -> str:
        return self.sync.hostname

    @property
    def ip(self) -> str:
        return self.sync.ip

    @property
    def labels(self) -> dict[str, str]:
        return self.sync.labels

    @property
    def expires_at(self) -> float | None:
        return self.sync.expires_at

    @property
    def record(self) -> SandboxRecord:
        return self.sync.record

    def __repr__(self) -> str:
        return f"<AsyncSandbox {self.id} {self.ip}>"

    async def exec(
        self,
        command: Command,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        check: bool = False,
        max_output: int = DEFAULT_MAX_OUTPUT,
        user: str | None = None,
    ) -> ExecResult:
        """:meth:`Sandbox.exec`, awaited (for ``background=True`` use ``sync.exec`` via ``run_sync``)."""
        result: ExecResult = await self._run(
            self.sync.exec,
            command,
            timeout=timeout,
            cwd=cwd,
            env=env,
            stdin=stdin,
            check=check,
            max_output=max_output,
            user=user,
        )
        return result

    def exec_stream(
        self,
        command: Command,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        check: bool = False,
        max_output: int = DEFAULT_MAX_OUTPUT,
        user: str | None = None,
    ) -> AsyncExecStream:
        """:meth:`Sandbox.exec_stream` for ``async for``; the command starts when the iteration does."""
        start = functools.partial(
            self.sync.exec_stream,
            command,
            timeout=timeout,
            cwd=cwd,
            env=env,
            stdin=stdin,
            check=check,
            max_output=max_output,
            user=user,
        )
        return AsyncExecStream(start, self._run)

    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        await self._run(self.sync.write_file, path, data, mode=mode)

    async def read_file(self, path: str, *, max_bytes: int = DEFAULT_READ_MAX_BYTES) -> bytes:
        return bytes(await self._run(self.sync.read_file, path, max_bytes=max_bytes))

    async def read_text(
        self, path: str, encoding: str = "utf-8", *, max_bytes: int = DEFAULT_READ_MAX_BYTES
    ) -> str:
        return str(await self._run(self.sync.read_text, path, encoding, max_bytes=max_bytes))

    async def upload(self, local: str | os.PathLike[str], remote: str) -> int:
        return int(await self._run(self.sync.upload, local, remote))

    async def download(
        self, remote: str, local: str | os.PathLike[str], *, max_bytes: int = DEFAULT_DOWNLOAD_MAX_BYTES
    ) -> int:
        return int(await self._run(self.sync.download, remote, local, max_bytes=max_bytes))

    async def set_internet(self, enabled: bool) -> None:
        await self._run(self.sync.set_internet, enabled)

    async def set_egress(self, egress: Sequence[str]) -> tuple[str, ...]:
        return tuple(await self._run(self.sync.set_egress, egress))

    async def status(self) -> SandboxStatus:
        result: SandboxStatus = await self._run(self.sync.status)
        return result

    async def snapshot(self, name: str) -> SnapshotInfo:
        result: SnapshotInfo = await self._run(self.sync.snapshot, name)
        return result

    async def extend(self, ttl_s: int) -> None:
        await self._run(self.sync.extend, ttl_s)

    def is_connected(self) -> bool:
        return self.sync.is_connected()

    async def close(self) -> None:
        await self._run(self.sync.close)

    async def destroy(self) -> None:
        await self._run(self.sync.destroy)

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.destroy()
