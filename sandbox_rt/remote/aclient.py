"""``remote.AsyncClient``: :class:`~sandbox_rt.remote.Client` for asyncio (httpx's async client,
no thread per call), in the shape of :class:`~sandbox_rt.AsyncManager` / ``AsyncSandbox``."""

from __future__ import annotations

import builtins
import contextlib
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal, TypeVar, Unpack, overload

import httpx

from ..aio import Pending
from ..errors import SandboxError, SandboxNotFound
from ..models import ExecResult, OutputChunk, SandboxRecord, SandboxStatus, SnapshotInfo
from ..options import CreateOptions
from ..output_limits import DEFAULT_MAX_OUTPUT, DEFAULT_READ_MAX_BYTES
from . import calls, error_map, events, wire
from .error_map import ErrorContext
from .files import AsyncRemoteFiles
from .processes import AsyncRemoteCommands, AsyncRemoteProcess, start_call
from .wire import Call

__all__ = ["AsyncClient", "AsyncRemoteExecStream", "AsyncRemoteSandbox"]

T = TypeVar("T")
Command = str | Sequence[str]


class AsyncClient:
    """The sandboxes of one ``sandbox-rt serve`` for asyncio callers; the same arguments, errors and
    answer checks as :class:`~sandbox_rt.remote.Client`. Use ``async with`` (or :meth:`aclose`)."""

    def __init__(
        self,
        url: str = calls.DEFAULT_URL,
        *,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        timeout: float = 30.0,
        verify: bool | str = True,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url, token = calls.endpoint(url, token, token_file)
        self._timeout = wire.check_client_timeout(timeout)
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=self._timeout,
            verify=verify,
            transport=transport,
            follow_redirects=False,
            trust_env=False,
        )
        self._closed = False

    def __repr__(self) -> str:
        return f"<remote.AsyncClient {self.url}>"

    # -- plumbing --------------------------------------------------------------------------------
    def _request(self, call: Call[Any]) -> httpx.Request:
        content, headers = wire.request_parts(call)
        timeout = httpx.Timeout(self._timeout, read=call.read_timeout or self._timeout)
        params = httpx.QueryParams(list(call.params))
        return self._http.build_request(
            call.method, call.path, params=params, content=content, headers=headers, timeout=timeout
        )

    async def _send(self, call: Call[T]) -> T:
        if self._closed:
            raise SandboxError("this remote.AsyncClient was closed")
        try:
            response = await self._http.send(self._request(call), stream=True)
            try:
                ok = response.status_code == call.ok
                wire.check_length(call, response.headers.get("Content-Length"), ok)
                body = bytearray()
                async for piece in response.aiter_bytes():
                    body += piece
                    wire.overflow(call, len(body), ok)
            finally:
                await response.aclose()
        except httpx.HTTPError as exc:
            raise wire.transport_error(exc, self.url) from None
        if ok:
            return call.parse(bytes(body))
        raise error_map.answer_error(response.status_code, bytes(body), call.context)

    async def _stream(self, call: Call[Any]) -> AsyncIterator[bytes]:
        try:
            async with self._http.stream(
                call.method,
                call.path,
                content=wire.json_body(call.json),
                headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
                timeout=httpx.Timeout(self._timeout, read=call.read_timeout),
            ) as response:
                if response.status_code != call.ok:
                    body = bytearray()
                    async for piece in response.aiter_bytes():
                        body += piece
                        wire.overflow(call, len(body), False)
                    raise error_map.answer_error(response.status_code, bytes(body), call.context)
                wire.check_event_stream(response.headers.get("Content-Type"))
                async for piece in response.aiter_bytes():
                    yield piece
        except httpx.HTTPError as exc:
            raise wire.transport_error(exc, self.url) from None

    # -- lifecycle -------------------------------------------------------------------------------
    def create(self, **options: Unpack[CreateOptions]) -> Pending[AsyncRemoteSandbox]:
        """``await client.create(...)``, or ``async with client.create(...) as sb`` to have it
        destroyed at the end of the block (arguments as :meth:`remote.Client.create`)."""
        call = calls.create(**options)

        async def make() -> AsyncRemoteSandbox:
            return AsyncRemoteSandbox(self, await self._send(call))

        return Pending(make)

    async def attach(self, sandbox_id: str) -> AsyncRemoteSandbox:
        status = await self._send(calls.status(sandbox_id))
        if status.state != "running":
            raise SandboxError(f"sandbox {sandbox_id} is {status.state}, not running")
        return AsyncRemoteSandbox(self, status)

    async def destroy(self, sandbox_id: str) -> None:
        await self._send(calls.destroy(sandbox_id))

    async def list(self, labels: Mapping[str, str] | None = None) -> builtins.list[SandboxRecord]:
        return await self._send(calls.list_sandboxes(labels))

    async def templates(self) -> builtins.list[str]:
        """The template names ``create(template=...)`` takes on the server's host (``default`` first)."""
        return await self._send(calls.templates())

    async def snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo:
        return await self._send(calls.snapshot(sandbox_id, name))

    async def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        """The server's snapshots (``Manager.list_snapshots``)."""
        return await self._send(calls.list_snapshots())

    async def delete_snapshot(self, name: str) -> None:
        """Delete a snapshot by name; SnapshotNotFound if there is none."""
        await self._send(calls.delete_snapshot(name))

    async def aclose(self) -> None:
        """Close the HTTP connections; sandboxes keep running."""
        self._closed = True
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncRemoteExecStream:
    """``async for chunk in sb.exec_stream(...)``; ``result`` when done."""

    def __init__(self, pieces: AsyncIterator[bytes], state: events.ExecState, check: bool) -> None:
        self._pieces = pieces
        self._state = state
        self._check = check
        self._events = self._iterate()
        self.result: ExecResult | None = None

    async def _iterate(self) -> AsyncIterator[OutputChunk]:
        decoder = events.SseDecoder()
        try:
            async for piece in self._pieces:
                for name, data in decoder.feed(piece):
                    chunk = self._state.event(name, data)
                    if chunk is not None:
                        yield chunk
                if self._state.result is not None:
                    break
        finally:
            await self._pieces.aclose()  # type: ignore[attr-defined]
        self.result = wire.check_exec_result(self._state.finish(), self._check)

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        return self._events

    async def wait(self) -> ExecResult:
        async for _ in self._events:
            pass
        if self.result is None:
            raise SandboxError("the stream was closed before the command's result")
        return self.result

    async def aclose(self) -> None:
        """Stop reading (the command runs on until it ends or its timeout)."""
        await self._events.aclose()  # type: ignore[attr-defined]


class AsyncRemoteSandbox:
    """A sandbox of a remote server for asyncio; ``async with`` destroys it at the end."""

    def __init__(self, client: AsyncClient, status: SandboxStatus) -> None:
        self._client = client
        self._status = status
        self._destroyed = False
        # the file primitives (E2B's sb.files), through the same client
        self.files = AsyncRemoteFiles(status.id, client._send, self._alive)
        # background commands by pid (sb.commands: list, connect, send_stdin, close_stdin, kill)
        self.commands = AsyncRemoteCommands(self, client._send, self._alive)

    @property
    def id(self) -> str:
        return self._status.id

    @property
    def hostname(self) -> str:
        return self._status.hostname

    @property
    def ip(self) -> str:
        return self._status.ip

    @property
    def labels(self) -> dict[str, str]:
        return dict(self._status.labels)

    @property
    def expires_at(self) -> float | None:
        return self._status.expires_at

    def __repr__(self) -> str:
        return f"<AsyncRemoteSandbox {self.id} {self.ip} via {self._client.url}>"

    def _alive(self) -> None:
        if self._destroyed:
            raise SandboxError(f"sandbox {self.id} was destroyed")

    @overload
    async def exec(
        self,
        command: Command,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        check: bool = False,
        background: Literal[False] = False,
        max_output: int = DEFAULT_MAX_OUTPUT,
        user: str | None = None,
    ) -> ExecResult: ...

    @overload
    async def exec(
        self,
        command: Command,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        check: bool = False,
        background: Literal[True],
        max_output: int = DEFAULT_MAX_OUTPUT,
        user: str | None = None,
    ) -> AsyncRemoteProcess: ...

    async def exec(
        self,
        command: Command,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        check: bool = False,
        background: bool = False,
        max_output: int = DEFAULT_MAX_OUTPUT,
        user: str | None = None,
    ) -> ExecResult | AsyncRemoteProcess:
        """See :meth:`remote.RemoteSandbox.exec` (``background=True``: an
        :class:`~sandbox_rt.remote.AsyncRemoteProcess`)."""
        self._alive()
        if background:
            call = start_call(
                self.id,
                command,
                timeout=timeout,
                cwd=cwd,
                env=env,
                stdin=stdin,
                check=check,
                max_output=max_output,
                user=user,
            )
            info = await self._client._send(call)
            return AsyncRemoteProcess(self.id, info, self._client._send, self._alive)
        body = wire.exec_body(
            command,
            timeout=timeout,
            cwd=cwd,
            env=env,
            stdin=stdin,
            max_output=max_output,
            stream=False,
            user=user,
        )
        text = wire.command_text(command)
        result = await self._client._send(calls.exec_json(self.id, body, timeout, max_output, text))
        return wire.check_exec_result(result, check)

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
    ) -> AsyncRemoteExecStream:
        """For ``async for``; nothing is sent until the iteration starts."""
        self._alive()
        body = wire.exec_body(
            command,
            timeout=timeout,
            cwd=cwd,
            env=env,
            stdin=stdin,
            max_output=max_output,
            stream=True,
            user=user,
        )
        text = wire.command_text(command)
        ctx = ErrorContext(sandbox_id=self.id, command=text, max_output=max_output)
        call: Call[None] = Call(
            "POST",
            wire.sandbox_path(self.id, "/exec"),
            200,
            lambda _raw: None,
            ctx,
            json=body,
            max_bytes=wire.exec_answer_bytes(max_output),
            read_timeout=wire.exec_wait(timeout),
        )
        state = events.ExecState(text, max_output, ctx)
        return AsyncRemoteExecStream(self._client._stream(call), state, check)

    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        self._alive()
        await self._client._send(calls.write_file(self.id, path, data, mode))

    async def read_file(self, path: str, *, max_bytes: int = DEFAULT_READ_MAX_BYTES) -> bytes:
        self._alive()
        return await self._client._send(calls.read_file(self.id, path, max_bytes))

    async def read_text(
        self, path: str, encoding: str = "utf-8", *, max_bytes: int = DEFAULT_READ_MAX_BYTES
    ) -> str:
        return (await self.read_file(path, max_bytes=max_bytes)).decode(encoding, "replace")

    async def set_internet(self, enabled: bool) -> None:
        self._alive()
        await self._client._send(calls.internet(self.id, enabled))

    async def set_egress(self, egress: Sequence[str]) -> tuple[str, ...]:
        self._alive()
        return await self._client._send(calls.egress(self.id, egress))

    async def status(self) -> SandboxStatus:
        self._alive()
        self._status = await self._client._send(calls.status(self.id))
        return self._status

    async def snapshot(self, name: str) -> SnapshotInfo:
        self._alive()
        return await self._client._send(calls.snapshot(self.id, name))

    async def extend(self, ttl_s: int) -> None:
        """Let the sandbox live ``ttl_s`` seconds from now (``Sandbox.extend``)."""
        self._alive()
        self._status = await self._client._send(calls.extend(self.id, ttl_s))

    def is_connected(self) -> bool:
        return not self._destroyed and not self._client._closed

    async def close(self) -> None:
        """Nothing to drop per sandbox; the sandbox keeps running."""

    async def destroy(self) -> None:
        if self._destroyed:
            return
        with contextlib.suppress(SandboxNotFound):
            await self._client.destroy(self.id)
        self._destroyed = True

    async def __aenter__(self) -> AsyncRemoteSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.destroy()
