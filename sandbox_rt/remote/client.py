"""``remote.Client``: the HTTP API (``sandbox-rt serve``) from another process or machine, in the
shape of :class:`~sandbox_rt.Manager` / :class:`~sandbox_rt.Sandbox`, over httpx (blocking)."""

from __future__ import annotations

import builtins
import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar, Unpack, overload

import httpx

from ..errors import SandboxError, SandboxNotFound
from ..models import ExecResult, OutputChunk, SandboxRecord, SandboxStatus, SnapshotInfo
from ..options import CreateOptions
from ..output_limits import DEFAULT_MAX_OUTPUT, DEFAULT_READ_MAX_BYTES
from . import calls, error_map, events, wire
from .error_map import ErrorContext
from .files import RemoteFiles
from .processes import RemoteCommands, RemoteProcess, start_call
from .wire import Call

__all__ = ["Client", "RemoteExecStream", "RemoteSandbox"]

T = TypeVar("T")
Command = str | Sequence[str]


class Client:
    """The sandboxes of one ``sandbox-rt serve``, as :class:`~sandbox_rt.Manager` offers them.

    ``token`` as given, else the first line of ``token_file`` (mode 0600), else
    ``$SANDBOX_RT_API_TOKEN``. ``timeout`` bounds connecting and each quiet read of an ordinary
    answer; a command's answer is awaited as long as its own timeout (plus a grace). Errors are the
    runtime's own (:mod:`sandbox_rt.errors`); an unreachable server or a broken answer is
    :class:`~sandbox_rt.ConnectionLost`, a malformed one a :class:`~sandbox_rt.BackendError`.
    Use it as a context manager (or :meth:`close` it).
    """

    def __init__(
        self,
        url: str = calls.DEFAULT_URL,
        *,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        timeout: float = 30.0,
        verify: bool | str = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url, token = calls.endpoint(url, token, token_file)
        self._timeout = wire.check_client_timeout(timeout)
        self._http = httpx.Client(
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
        return f"<remote.Client {self.url}>"

    # -- plumbing --------------------------------------------------------------------------------
    def _request(self, call: Call[Any]) -> httpx.Request:
        content, headers = wire.request_parts(call)
        timeout = httpx.Timeout(self._timeout, read=call.read_timeout or self._timeout)
        params = httpx.QueryParams(list(call.params))
        return self._http.build_request(
            call.method, call.path, params=params, content=content, headers=headers, timeout=timeout
        )

    def _send(self, call: Call[T]) -> T:
        if self._closed:
            raise SandboxError("this remote.Client was closed")
        try:
            response = self._http.send(self._request(call), stream=True)
            try:
                ok = response.status_code == call.ok
                wire.check_length(call, response.headers.get("Content-Length"), ok)
                body = bytearray()
                for piece in response.iter_bytes():
                    body += piece
                    wire.overflow(call, len(body), ok)
            finally:
                response.close()
        except httpx.HTTPError as exc:
            raise wire.transport_error(exc, self.url) from None
        if ok:
            return call.parse(bytes(body))
        raise error_map.answer_error(response.status_code, bytes(body), call.context)

    def _stream(self, call: Call[Any]) -> Iterator[bytes]:
        """The body of a streamed answer (server-sent events), piece by piece as it arrives."""
        try:
            with self._http.stream(
                call.method,
                call.path,
                content=wire.json_body(call.json),
                headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
                timeout=httpx.Timeout(self._timeout, read=call.read_timeout),
            ) as response:
                if response.status_code != call.ok:
                    body = bytearray()
                    for piece in response.iter_bytes():
                        body += piece
                        wire.overflow(call, len(body), False)
                    raise error_map.answer_error(response.status_code, bytes(body), call.context)
                wire.check_event_stream(response.headers.get("Content-Type"))
                yield from response.iter_bytes()
        except httpx.HTTPError as exc:
            raise wire.transport_error(exc, self.url) from None

    # -- lifecycle -------------------------------------------------------------------------------
    def create(self, **options: Unpack[CreateOptions]) -> RemoteSandbox:
        """A new sandbox (all or nothing, on the server); the options are ``Manager.create``'s
        (:class:`~sandbox_rt.options.CreateOptions`). Left out: the server's defaults (``ttl_s``: its
        host's; ``detached``: true, it lives by its TTL, not by the server process)."""
        status = self._send(calls.create(**options))
        return RemoteSandbox(self, status)

    def attach(self, sandbox_id: str) -> RemoteSandbox:
        """An existing sandbox by id; SandboxNotFound if there is none, SandboxError if not running."""
        status = self._send(calls.status(sandbox_id))
        if status.state != "running":
            raise SandboxError(f"sandbox {sandbox_id} is {status.state}, not running")
        return RemoteSandbox(self, status)

    def destroy(self, sandbox_id: str) -> None:
        """Destroy a sandbox by id; SandboxNotFound if there is none."""
        self._send(calls.destroy(sandbox_id))

    def list(self, labels: Mapping[str, str] | None = None) -> builtins.list[SandboxRecord]:
        """The server's sandboxes carrying all of ``labels`` (records without host key or owner)."""
        return self._send(calls.list_sandboxes(labels))

    def templates(self) -> builtins.list[str]:
        """The template names ``create(template=...)`` takes on the server's host (``default`` first)."""
        return self._send(calls.templates())

    def snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo:
        return self._send(calls.snapshot(sandbox_id, name))

    def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        """The server's snapshots (``Manager.list_snapshots``)."""
        return self._send(calls.list_snapshots())

    def delete_snapshot(self, name: str) -> None:
        """Delete a snapshot by name; SnapshotNotFound if there is none."""
        self._send(calls.delete_snapshot(name))

    def close(self) -> None:
        """Close the HTTP connections; sandboxes keep running."""
        self._closed = True
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RemoteExecStream:
    """Iterate to get :class:`~sandbox_rt.OutputChunk` s as the command prints them (server-sent
    events); ``result`` when done, as :class:`~sandbox_rt.ExecStream`."""

    def __init__(self, pieces: Iterator[bytes], state: events.ExecState, check: bool) -> None:
        self._pieces = pieces
        self._state = state
        self._check = check
        self._chunks = self._events()
        self.result: ExecResult | None = None

    def _events(self) -> Iterator[OutputChunk]:
        decoder = events.SseDecoder()
        try:
            for piece in self._pieces:
                for name, data in decoder.feed(piece):
                    chunk = self._state.event(name, data)
                    if chunk is not None:
                        yield chunk
                if self._state.result is not None:
                    break
        finally:
            close = getattr(self._pieces, "close", None)
            if close is not None:
                close()
        self.result = wire.check_exec_result(self._state.finish(), self._check)

    def __iter__(self) -> Iterator[OutputChunk]:
        return self._chunks

    def wait(self) -> ExecResult:
        """Consume the rest of the output and return the result."""
        for _ in self._chunks:
            pass
        if self.result is None:
            raise SandboxError("the stream was closed before the command's result")
        return self.result

    def close(self) -> None:
        """Stop reading (the command runs on until it ends or its timeout)."""
        self._chunks.close()  # type: ignore[attr-defined]


class RemoteSandbox:
    """A sandbox of a remote server, as :class:`~sandbox_rt.Sandbox` offers what the API has.
    Leaving a ``with`` block destroys it."""

    def __init__(self, client: Client, status: SandboxStatus) -> None:
        self._client = client
        self._status = status
        self._destroyed = False
        # the file primitives (E2B's sb.files), through the same client
        self.files = RemoteFiles(status.id, client._send, self._alive)
        # background commands by pid (sb.commands: list, connect, send_stdin, close_stdin, kill)
        self.commands = RemoteCommands(self, client._send, self._alive)

    # -- identity --------------------------------------------------------------------------------
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
        return f"<RemoteSandbox {self.id} {self.ip} via {self._client.url}>"

    def _alive(self) -> None:
        if self._destroyed:
            raise SandboxError(f"sandbox {self.id} was destroyed")

    # -- commands --------------------------------------------------------------------------------
    @overload
    def exec(
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
    def exec(
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
    ) -> RemoteProcess: ...

    def exec(
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
    ) -> ExecResult | RemoteProcess:
        """Run a command and wait for it, as :meth:`sandbox_rt.Sandbox.exec` (the server keeps at
        most ``max_output`` bytes of each stream; the result says what was dropped). With
        ``background=True`` a :class:`~sandbox_rt.remote.RemoteProcess` at once (neither stdin nor
        check, the sandbox user only): the command outlives this client and the server's connection."""
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
            return RemoteProcess(self.id, self._client._send(call), self._client._send, self._alive)
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
        result = self._client._send(calls.exec_json(self.id, body, timeout, max_output, text))
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
    ) -> RemoteExecStream:
        """Like :meth:`exec`, yielding output chunks as they arrive; ``max_output`` bounds only what
        the final ``result`` keeps. Nothing is sent until the iteration starts."""
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
        return RemoteExecStream(self._client._stream(call), state, check)

    # -- files -----------------------------------------------------------------------------------
    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        """Write ``data`` to ``path`` (parent directories are created), as the sandbox user."""
        self._alive()
        self._client._send(calls.write_file(self.id, path, data, mode))

    def read_file(self, path: str, *, max_bytes: int = DEFAULT_READ_MAX_BYTES) -> bytes:
        """The bytes of the regular file ``path``; FileOperationError(EFBIG) past ``max_bytes``."""
        self._alive()
        return self._client._send(calls.read_file(self.id, path, max_bytes))

    def read_text(
        self, path: str, encoding: str = "utf-8", *, max_bytes: int = DEFAULT_READ_MAX_BYTES
    ) -> str:
        return self.read_file(path, max_bytes=max_bytes).decode(encoding, "replace")

    # -- network, state --------------------------------------------------------------------------
    def set_internet(self, enabled: bool) -> None:
        self._alive()
        self._client._send(calls.internet(self.id, enabled))

    def set_egress(self, egress: Sequence[str]) -> tuple[str, ...]:
        self._alive()
        return self._client._send(calls.egress(self.id, egress))

    def status(self) -> SandboxStatus:
        self._alive()
        self._status = self._client._send(calls.status(self.id))
        return self._status

    def snapshot(self, name: str) -> SnapshotInfo:
        self._alive()
        return self._client._send(calls.snapshot(self.id, name))

    def extend(self, ttl_s: int) -> None:
        """Let the sandbox live ``ttl_s`` seconds from now (``Sandbox.extend``)."""
        self._alive()
        self._status = self._client._send(calls.extend(self.id, ttl_s))

    def is_connected(self) -> bool:
        return not self._destroyed and not self._client._closed

    def close(self) -> None:
        """Nothing to drop per sandbox (the client holds the connections); the sandbox keeps running."""

    def destroy(self) -> None:
        """Stop and remove the sandbox. Idempotent."""
        if self._destroyed:
            return
        with contextlib.suppress(SandboxNotFound):
            self._client.destroy(self.id)
        self._destroyed = True

    def __enter__(self) -> RemoteSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
