"""``sb.commands``: running commands, as E2B users expect it (run, stream, background processes:
list, connect by pid, stdin, kill). The flat ``Sandbox.exec`` / ``exec_stream`` stay as they are."""

from __future__ import annotations

import signal as _signal
from collections.abc import Mapping
from typing import Literal, Protocol, overload

from .background import BackgroundProcess, list_processes
from .execution import Command, ExecStream
from .models import ExecResult, ProcessInfo
from .output_limits import DEFAULT_MAX_OUTPUT

__all__ = ["Commands", "Runs"]


class Runs(Protocol):
    """What ``sb.commands`` needs of its sandbox (``Sandbox`` is one)."""

    @overload
    def exec(
        self,
        command: Command,
        *,
        timeout: float | None = ...,
        cwd: str | None = ...,
        env: Mapping[str, str] | None = ...,
        stdin: bytes | str | None = ...,
        check: bool = ...,
        background: Literal[False] = ...,
        max_output: int = ...,
    ) -> ExecResult: ...

    @overload
    def exec(
        self,
        command: Command,
        *,
        timeout: float | None = ...,
        cwd: str | None = ...,
        env: Mapping[str, str] | None = ...,
        stdin: bytes | str | None = ...,
        check: bool = ...,
        background: Literal[True],
        max_output: int = ...,
    ) -> BackgroundProcess: ...

    def exec_stream(
        self,
        command: Command,
        *,
        timeout: float | None = ...,
        cwd: str | None = ...,
        env: Mapping[str, str] | None = ...,
        stdin: bytes | str | None = ...,
        check: bool = ...,
        max_output: int = ...,
    ) -> ExecStream: ...


class Commands:
    """The commands of one sandbox (``sb.commands``)."""

    def __init__(self, sandbox: Runs) -> None:
        self._sb = sandbox

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
    ) -> BackgroundProcess: ...

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
    ) -> ExecResult | BackgroundProcess:
        """``Sandbox.exec``: wait for the result, or with ``background=True`` a handle at once (its
        stdin then is a pipe: ``send_stdin`` / ``close_stdin``; ``stdin=`` is for foreground runs)."""
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
    ) -> ExecStream:
        """``Sandbox.exec_stream``: output chunks while the command runs."""
        return self._sb.exec_stream(
            command, timeout=timeout, cwd=cwd, env=env, stdin=stdin, check=check, max_output=max_output
        )

    def list(self) -> list[ProcessInfo]:
        """The sandbox's background commands, running and ended (newest first)."""
        return list_processes(self._sb)

    def connect(self, pid: int) -> BackgroundProcess:
        """A handle on the background command ``pid`` (started by this or any other process)."""
        return BackgroundProcess.connect(self._sb, pid)

    def send_stdin(self, pid: int, data: bytes | str) -> None:
        self.connect(pid).send_stdin(data)

    def close_stdin(self, pid: int) -> None:
        self.connect(pid).close_stdin()

    def kill(self, pid: int, sig: int = _signal.SIGKILL) -> None:
        self.connect(pid).kill(sig)
