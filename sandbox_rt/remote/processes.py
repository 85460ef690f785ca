"""Background commands of a remote sandbox (sync and async), in the shape of the in-process
:class:`~sandbox_rt.background.BackgroundProcess` and ``sb.commands``
(:class:`~sandbox_rt.commands.Commands`): ``sb.exec(cmd, background=True)`` gives a
:class:`RemoteProcess`, ``sb.commands`` lists, reconnects, writes stdin and kills by pid.

The server keeps no reader state: a process object keeps its own byte offsets and asks for the
output from them on as base64 (exact bytes), so nothing is skipped or read twice, and every
answer's offsets are checked against the bytes it carries (:func:`answers.parse_logs`).
"""

from __future__ import annotations

import asyncio
import builtins
import signal as _signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from ..errors import CommandTimeout, ConfigError
from ..models import ExecResult, ProcessInfo
from ..output_limits import DEFAULT_MAX_OUTPUT
from ..validation import check_max_bytes, check_timeout
from . import calls
from .wire import Call

if TYPE_CHECKING:
    from .aclient import AsyncRemoteExecStream, AsyncRemoteSandbox
    from .client import RemoteExecStream, RemoteSandbox

__all__ = ["AsyncRemoteCommands", "AsyncRemoteProcess", "RemoteCommands", "RemoteProcess", "start_call"]

T = TypeVar("T")
Command = str | Sequence[str]

# one wait request lasts at most this long: a wait without timeout is a series of them (an HTTP
# request held for hours is cut by proxies; the client's read timeout is each slice plus a grace)
WAIT_SLICE_S = 300.0
# a wait answered with a timeout much sooner than asked is retried after this pause at most (a
# server that answers 504 at once must not make the client spin)
_EARLY_PAUSE_S = 1.0


def start_call(
    sandbox_id: str,
    command: Command,
    *,
    timeout: float | None,
    cwd: str | None,
    env: Mapping[str, str] | None,
    stdin: bytes | str | None,
    check: bool,
    max_output: int,
    user: str | None,
) -> Call[ProcessInfo]:
    """The request of ``exec(..., background=True)``, by ``Sandbox.exec``'s rules: neither stdin
    nor check, the sandbox user only; ``timeout`` and ``max_output`` are checked as for any exec
    but bind nothing (a background command runs until it ends or is killed)."""
    if stdin is not None or check:
        raise ConfigError("background=True takes neither stdin nor check")
    if user is not None:
        raise ConfigError("background processes run as the sandbox user (user=None)")
    check_timeout(timeout)
    check_max_bytes(max_output, "max_output")
    return calls.start_process(sandbox_id, command, cwd, env)


class _LogRead:
    """One ``logs()`` call in progress: what to ask next, what came back, the offsets it leads to.
    Requests go on while a stream fills what was asked (there may be more), until ``cap`` bytes of
    either stream; the offsets are the process's only once the whole read succeeded."""

    def __init__(self, offsets: tuple[int, int], cap: int) -> None:
        self.offsets = offsets
        self._cap = check_max_bytes(cap)
        self._out = bytearray()
        self._err = bytearray()
        self._more = True

    def ask(self) -> int:
        """Bytes of each stream to ask for next; 0 when done."""
        if not self._more:
            return 0
        return min(calls.LOG_CHUNK_BYTES, self._cap - max(len(self._out), len(self._err)))

    def add(self, asked: int, out: bytes, err: bytes) -> None:
        self._out += out
        self._err += err
        self.offsets = (self.offsets[0] + len(out), self.offsets[1] + len(err))
        self._more = len(out) >= asked or len(err) >= asked

    def result(self) -> tuple[bytes, bytes]:
        return bytes(self._out), bytes(self._err)


class _Waiting:
    """The slices of one ``wait(timeout)``: how long the next request may wait, and the pause after
    one that timed out early."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = check_timeout(timeout)
        self._deadline = None if self.timeout is None else time.monotonic() + self.timeout
        self._sent = 0.0
        self._asked = 0.0

    def next_slice(self) -> float | None:
        """Seconds the next request waits; None: the deadline has passed."""
        left = WAIT_SLICE_S if self._deadline is None else self._deadline - time.monotonic()
        if left <= 0:
            return None
        self._sent, self._asked = time.monotonic(), min(left, WAIT_SLICE_S)
        return self._asked

    def pause(self) -> float:
        """Seconds to pause after a slice that timed out (0 unless it came back early)."""
        early = self._asked - (time.monotonic() - self._sent)
        return max(0.0, min(early, _EARLY_PAUSE_S))


class RemoteProcess:
    """A background command of a remote sandbox (``sb.exec(..., background=True)``,
    ``sb.commands.connect(pid)``), as :class:`~sandbox_rt.background.BackgroundProcess`."""

    def __init__(
        self, sandbox_id: str, info: ProcessInfo, send: Callable[[Call[Any]], Any], alive: Callable[[], None]
    ) -> None:
        self.pid = info.pid
        self.handle = info.handle
        self.command = info.command
        self._sid = sandbox_id
        self._send = send
        self._alive = alive
        self._offsets = (0, 0)

    def __repr__(self) -> str:
        return f"<RemoteProcess {self.handle} pid={self.pid} {self.command[:80]!r}>"

    def _call(self, call: Call[T]) -> T:
        self._alive()
        result: T = self._send(call)
        return result

    def info(self) -> ProcessInfo:
        """The command as the server sees it now (running, or its exit code)."""
        return self._call(calls.get_process(self._sid, self.pid))

    def exit_code(self) -> int | None:
        """The exit status once the command ended, None while it runs."""
        return self.info().exit_code

    def is_running(self) -> bool:
        return self.info().running

    def wait(self, timeout: float | None = None) -> int:
        """Block until the command ends; its exit status. CommandTimeout (with what it printed since
        the last :meth:`logs`, which it consumes) if it outlives ``timeout``."""
        waiting = _Waiting(timeout)
        while (seconds := waiting.next_slice()) is not None:
            try:
                return self._call(calls.wait_process(self._sid, self.pid, seconds, self.command))
            except CommandTimeout:
                time.sleep(waiting.pause())
        out, err = self.logs()
        raise CommandTimeout(self.command, waiting.timeout or 0.0, out, err)

    def send_stdin(self, data: bytes | str) -> None:
        """Write ``data`` to the command's stdin (SandboxError once it was closed or the command ended)."""
        self._call(calls.write_stdin(self._sid, self.pid, data))

    def close_stdin(self) -> None:
        """End the command's input: it reads EOF once it has read what was sent. Idempotent."""
        self._call(calls.close_stdin(self._sid, self.pid))

    def kill(self, sig: int = _signal.SIGKILL) -> None:
        """Send ``sig`` to the command's whole process group."""
        self._call(calls.kill_process(self._sid, self.pid, sig))

    def logs(self, *, max_bytes: int = DEFAULT_MAX_OUTPUT) -> tuple[bytes, bytes]:
        """What the command printed since the last call: (stdout, stderr), exact bytes, at most
        ``max_bytes`` of each (the rest comes with the next call: nothing is dropped)."""
        read = _LogRead(self._offsets, max_bytes)
        while (ask := read.ask()) > 0:
            out, err = self._call(calls.process_logs(self._sid, self.pid, *read.offsets, ask))
            read.add(ask, out, err)
        self._offsets = read.offsets
        return read.result()


class AsyncRemoteProcess:
    """:class:`RemoteProcess` for asyncio: the same attributes, its methods awaited."""

    def __init__(
        self,
        sandbox_id: str,
        info: ProcessInfo,
        send: Callable[[Call[Any]], Awaitable[Any]],
        alive: Callable[[], None],
    ) -> None:
        self.pid = info.pid
        self.handle = info.handle
        self.command = info.command
        self._sid = sandbox_id
        self._send = send
        self._alive = alive
        self._offsets = (0, 0)

    def __repr__(self) -> str:
        return f"<AsyncRemoteProcess {self.handle} pid={self.pid} {self.command[:80]!r}>"

    async def _call(self, call: Call[T]) -> T:
        self._alive()
        result: T = await self._send(call)
        return result

    async def info(self) -> ProcessInfo:
        return await self._call(calls.get_process(self._sid, self.pid))

    async def exit_code(self) -> int | None:
        return (await self.info()).exit_code

    async def is_running(self) -> bool:
        return (await self.info()).running

    async def wait(self, timeout: float | None = None) -> int:
        """See :meth:`RemoteProcess.wait`."""
        waiting = _Waiting(timeout)
        while (seconds := waiting.next_slice()) is not None:
            try:
                return await self._call(calls.wait_process(self._sid, self.pid, seconds, self.command))
            except CommandTimeout:
                await asyncio.sleep(waiting.pause())
        out, err = await self.logs()
        raise CommandTimeout(self.command, waiting.timeout or 0.0, out, err)

    async def send_stdin(self, data: bytes | str) -> None:
        await self._call(calls.write_stdin(self._sid, self.pid, data))

    async def close_stdin(self) -> None:
        await self._call(calls.close_stdin(self._sid, self.pid))

    async def kill(self, sig: int = _signal.SIGKILL) -> None:
        await self._call(calls.kill_process(self._sid, self.pid, sig))

    async def logs(self, *, max_bytes: int = DEFAULT_MAX_OUTPUT) -> tuple[bytes, bytes]:
        """See :meth:`RemoteProcess.logs`."""
        read = _LogRead(self._offsets, max_bytes)
        while (ask := read.ask()) > 0:
            out, err = await self._call(calls.process_logs(self._sid, self.pid, *read.offsets, ask))
            read.add(ask, out, err)
        self._offsets = read.offsets
        return read.result()


class RemoteCommands:
    """``sb.commands`` of a :class:`~sandbox_rt.remote.RemoteSandbox`, as
    :class:`~sandbox_rt.commands.Commands`: ``run``, ``stream``, and the background commands by pid."""

    def __init__(
        self, sandbox: RemoteSandbox, send: Callable[[Call[Any]], Any], alive: Callable[[], None]
    ) -> None:
        self._sb = sandbox
        self._send = send
        self._alive = alive

    def _call(self, call: Call[T]) -> T:
        self._alive()
        result: T = self._send(call)
        return result

    @overload
    def run(
        self,
        command: Command,
        *,
        background: Literal[False] = False,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        check: bool = False,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> ExecResult: ...

    @overload
    def run(
        self,
        command: Command,
        *,
        background: Literal[True],
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        check: bool = False,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> RemoteProcess: ...

    def run(
        self,
        command: Command,
        *,
        background: bool = False,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        check: bool = False,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> ExecResult | RemoteProcess:
        """``sb.exec``: wait for the result, or with ``background=True`` a handle at once."""
        if background:
            return self._sb.exec(command, timeout=timeout, cwd=cwd, env=env, background=True)
        return self._sb.exec(
            command, timeout=timeout, cwd=cwd, env=env, stdin=stdin, check=check, max_output=max_output
        )

    def stream(
        self,
        command: Command,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        check: bool = False,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> RemoteExecStream:
        """``sb.exec_stream``: output chunks while the command runs."""
        return self._sb.exec_stream(
            command, timeout=timeout, cwd=cwd, env=env, stdin=stdin, check=check, max_output=max_output
        )

    def list(self) -> builtins.list[ProcessInfo]:
        """The sandbox's background commands, running and ended (newest first, at most 1000)."""
        return self._call(calls.list_processes(self._sb.id))

    def connect(self, pid: int) -> RemoteProcess:
        """A handle on the background command ``pid`` (started by this or any other client);
        ProcessNotFound if the sandbox has none. Its logs are read from the start."""
        info = self._call(calls.get_process(self._sb.id, pid))
        return RemoteProcess(self._sb.id, info, self._send, self._alive)

    def send_stdin(self, pid: int, data: bytes | str) -> None:
        self._call(calls.write_stdin(self._sb.id, pid, data))

    def close_stdin(self, pid: int) -> None:
        self._call(calls.close_stdin(self._sb.id, pid))

    def kill(self, pid: int, sig: int = _signal.SIGKILL) -> None:
        self._call(calls.kill_process(self._sb.id, pid, sig))


class AsyncRemoteCommands:
    """``sb.commands`` of an :class:`~sandbox_rt.remote.AsyncRemoteSandbox` (see :class:`RemoteCommands`)."""

    def __init__(
        self,
        sandbox: AsyncRemoteSandbox,
        send: Callable[[Call[Any]], Awaitable[Any]],
        alive: Callable[[], None],
    ) -> None:
        self._sb = sandbox
        self._send = send
        self._alive = alive

    async def _call(self, call: Call[T]) -> T:
        self._alive()
        result: T = await self._send(call)
        return result

    @overload
    async def run(
        self,
        command: Command,
        *,
        background: Literal[False] = False,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        check: bool = False,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> ExecResult: ...

    @overload
    async def run(
        self,
        command: Command,
        *,
        background: Literal[True],
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        check: bool = False,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> AsyncRemoteProcess: ...

    async def run(
        self,
        command: Command,
        *,
        background: bool = False,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        check: bool = False,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> ExecResult | AsyncRemoteProcess:
        if background:
            return await self._sb.exec(command, timeout=timeout, cwd=cwd, env=env, background=True)
        return await self._sb.exec(
            command, timeout=timeout, cwd=cwd, env=env, stdin=stdin, check=check, max_output=max_output
        )

    def stream(
        self,
        command: Command,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        check: bool = False,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> AsyncRemoteExecStream:
        """For ``async for``; nothing is sent until the iteration starts."""
        return self._sb.exec_stream(
            command, timeout=timeout, cwd=cwd, env=env, stdin=stdin, check=check, max_output=max_output
        )

    async def list(self) -> builtins.list[ProcessInfo]:
        return await self._call(calls.list_processes(self._sb.id))

    async def connect(self, pid: int) -> AsyncRemoteProcess:
        info = await self._call(calls.get_process(self._sb.id, pid))
        return AsyncRemoteProcess(self._sb.id, info, self._send, self._alive)

    async def send_stdin(self, pid: int, data: bytes | str) -> None:
        await self._call(calls.write_stdin(self._sb.id, pid, data))

    async def close_stdin(self, pid: int) -> None:
        await self._call(calls.close_stdin(self._sb.id, pid))

    async def kill(self, pid: int, sig: int = _signal.SIGKILL) -> None:
        await self._call(calls.kill_process(self._sb.id, pid, sig))
