"""``sb.files`` of a remote sandbox (sync and async): the server's file primitives, each answer
checked (answers.parse_entry), the same shape as :class:`sandbox_rt.files.Files`."""

from __future__ import annotations

import builtins
import errno
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..errors import FileOperationError
from ..files import LIST_MAX_ENTRIES
from ..models import EntryInfo
from ..output_limits import DEFAULT_READ_MAX_BYTES
from . import calls
from .wire import Call

__all__ = ["AsyncRemoteFiles", "RemoteFiles"]

T = TypeVar("T")


class RemoteFiles:
    """The file operations of one remote sandbox (``sb.files``)."""

    def __init__(self, sandbox_id: str, send: Callable[[Call[Any]], Any], alive: Callable[[], None]) -> None:
        self._id = sandbox_id
        self._send = send
        self._alive = alive

    def _call(self, call: Call[T]) -> T:
        self._alive()
        result: T = self._send(call)
        return result

    def list(
        self, path: str, depth: int = 1, *, max_entries: int = LIST_MAX_ENTRIES
    ) -> builtins.list[EntryInfo]:
        """The entries of directory ``path``, ``depth`` levels deep, sorted by path."""
        entries = self._call(calls.list_files(self._id, path, depth))
        if len(entries) > max_entries:
            raise FileOperationError(errno.E2BIG, f"list: more than {max_entries} entries", path)
        return entries

    def stat(self, path: str, *, follow_symlinks: bool = True) -> EntryInfo:
        return self._call(calls.stat_file(self._id, path, follow_symlinks))

    def exists(self, path: str) -> bool:
        try:
            self.stat(path, follow_symlinks=False)
        except FileOperationError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise
        return True

    def remove(self, path: str, *, recursive: bool = False) -> None:
        self._call(calls.remove_file(self._id, path, recursive))

    def mkdir(self, path: str, *, parents: bool = True) -> bool:
        """Make directory ``path``; False if it was already there."""
        return self._call(calls.mkdir(self._id, path, parents))

    def rename(self, src: str, dst: str) -> EntryInfo:
        return self._call(calls.rename_file(self._id, src, dst))

    def read(self, path: str, *, max_bytes: int = DEFAULT_READ_MAX_BYTES) -> bytes:
        return self._call(calls.read_file(self._id, path, max_bytes))

    def write(self, path: str, data: bytes | str, *, mode: int | None = None) -> EntryInfo:
        self._call(calls.write_file(self._id, path, data, mode))
        return self.stat(path)


class AsyncRemoteFiles:
    """``sb.files`` of an :class:`~sandbox_rt.remote.AsyncRemoteSandbox` (see :class:`RemoteFiles`)."""

    def __init__(
        self, sandbox_id: str, send: Callable[[Call[Any]], Awaitable[Any]], alive: Callable[[], None]
    ) -> None:
        self._id = sandbox_id
        self._send = send
        self._alive = alive

    async def _call(self, call: Call[T]) -> T:
        self._alive()
        result: T = await self._send(call)
        return result

    async def list(
        self, path: str, depth: int = 1, *, max_entries: int = LIST_MAX_ENTRIES
    ) -> builtins.list[EntryInfo]:
        entries = await self._call(calls.list_files(self._id, path, depth))
        if len(entries) > max_entries:
            raise FileOperationError(errno.E2BIG, f"list: more than {max_entries} entries", path)
        return entries

    async def stat(self, path: str, *, follow_symlinks: bool = True) -> EntryInfo:
        return await self._call(calls.stat_file(self._id, path, follow_symlinks))

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path, follow_symlinks=False)
        except FileOperationError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise
        return True

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self._call(calls.remove_file(self._id, path, recursive))

    async def mkdir(self, path: str, *, parents: bool = True) -> bool:
        return await self._call(calls.mkdir(self._id, path, parents))

    async def rename(self, src: str, dst: str) -> EntryInfo:
        return await self._call(calls.rename_file(self._id, src, dst))

    async def read(self, path: str, *, max_bytes: int = DEFAULT_READ_MAX_BYTES) -> bytes:
        return await self._call(calls.read_file(self._id, path, max_bytes))

    async def write(self, path: str, data: bytes | str, *, mode: int | None = None) -> EntryInfo:
        await self._call(calls.write_file(self._id, path, data, mode))
        return await self.stat(path)
