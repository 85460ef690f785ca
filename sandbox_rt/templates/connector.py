"""A pyinfra connector over the runtime's own SSH executor (the build sandbox's root connection).

Why not pyinfra's ``ssh`` connector: ours already holds the sandbox's pinned host key (read from its
filesystem before it started, ``RejectPolicy`` after), its key never leaves the process (no key file,
no known_hosts file to write), commands run in their own session and a timeout kills the whole
process group, and the output streams to the build's log as it comes. pyinfra only sees a connector:
``run_shell_command`` / ``put_file`` / ``get_file``.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator
from io import IOBase
from typing import Any, cast

from pyinfra.api.command import StringCommand
from pyinfra.api.util import get_file_io
from pyinfra.connectors.base import BaseConnector
from pyinfra.connectors.util import CommandOutput, OutputLine, make_unix_command_for_host

from ..errors import SandboxError
from ..sandbox import Sandbox

__all__ = ["SandboxConnector"]

_MAX_LOG_LINE = 400  # characters of one output line that reach on_log


class SandboxConnector(BaseConnector):
    """Runs pyinfra's commands as root in one sandbox (bound with :meth:`bind` before connecting)."""

    handles_execution = True
    sandbox: Sandbox | None = None
    log: Callable[[str], None] = staticmethod(lambda _line: None)
    timeout_s: float = 1800.0

    @staticmethod
    def make_names_data(name: str) -> Iterator[tuple[str, dict[str, Any], list[str]]]:
        yield name, {}, []

    def bind(self, sandbox: Sandbox, log: Callable[[str], None], timeout_s: float) -> None:
        self.sandbox = sandbox
        self.log = log
        self.timeout_s = timeout_s

    def _box(self) -> Sandbox:
        if self.sandbox is None:
            raise RuntimeError("SandboxConnector used before bind()")
        return self.sandbox

    def run_shell_command(
        self,
        command: StringCommand,
        print_output: bool = False,
        print_input: bool = False,
        **arguments: Any,
    ) -> tuple[bool, CommandOutput]:
        stdin = arguments.pop("_stdin", None)
        timeout = arguments.pop("_timeout", None) or self.timeout_s
        success = arguments.pop("_success_exit_codes", None) or (0,)
        arguments.pop("_get_pty", None)
        unix = make_unix_command_for_host(self.state, self.host, command, **arguments)
        text = str(unix.get_raw_value())
        data: bytes | None = None
        if stdin is not None:
            items = stdin if isinstance(stdin, list | tuple) else [stdin]
            data = b"".join(i.encode() if isinstance(i, str) else bytes(i) for i in items)
        lines: list[OutputLine] = []
        pending = {"stdout": b"", "stderr": b""}

        def emit(stream: str, raw: bytes) -> None:
            line = raw.decode("utf-8", "replace").rstrip("\r")
            lines.append(OutputLine(stream, line))
            self.log(line if len(line) <= _MAX_LOG_LINE else line[:_MAX_LOG_LINE] + "...")

        try:
            run = self._box().exec_stream(text, user="root", timeout=timeout, stdin=data)
            for chunk in run:
                buf = pending[chunk.stream] + chunk.data
                *complete, pending[chunk.stream] = buf.split(b"\n")
                for raw in complete:
                    emit(chunk.stream, raw)
            for stream, rest in pending.items():
                if rest:
                    emit(stream, rest)
            assert run.result is not None
            code = run.result.exit_code
        except SandboxError as exc:  # a timeout, a lost connection: the op fails with the reason
            emit("stderr", f"sandbox-rt: {type(exc).__name__}: {exc}".encode())
            return False, CommandOutput(lines)
        return code in success, CommandOutput(lines)

    def put_file(
        self,
        filename_or_io: str | IOBase,
        remote_filename: str,
        remote_temp_filename: str | None = None,
        print_output: bool = False,
        print_input: bool = False,
        **arguments: Any,
    ) -> bool:
        with get_file_io(cast(Any, filename_or_io)) as fh:  # pyinfra's: rewinds an IO it hashed
            raw = fh.read()
        data = raw.encode() if isinstance(raw, str) else bytes(raw)
        # written as root through a temp name beside it, then moved over (a reader never sees half)
        tmp = f"{remote_filename}.sandbox-rt-tmp"
        cmd = f"cat > {shlex.quote(tmp)} && mv -f {shlex.quote(tmp)} {shlex.quote(remote_filename)}"
        try:
            result = self._box().exec(cmd, user="root", stdin=data, timeout=self.timeout_s)
        except SandboxError as exc:
            self.log(f"upload of {remote_filename} failed: {exc}")
            return False
        if result.exit_code != 0:
            self.log(f"upload of {remote_filename} failed: {result.stderr.decode('utf-8', 'replace')}")
        return result.exit_code == 0

    def get_file(
        self,
        remote_filename: str,
        filename_or_io: str | IOBase,
        remote_temp_filename: str | None = None,
        print_output: bool = False,
        print_input: bool = False,
        **arguments: Any,
    ) -> bool:
        try:
            result = self._box().exec(
                f"cat -- {shlex.quote(remote_filename)}", user="root", timeout=self.timeout_s
            )
        except SandboxError:
            return False
        if result.exit_code != 0:
            return False
        if isinstance(filename_or_io, str):
            with open(filename_or_io, "wb") as fh:
                fh.write(result.stdout)
        else:
            filename_or_io.write(result.stdout)
        return True
