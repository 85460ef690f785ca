"""Background processes in a sandbox: start, wait, kill, read logs incrementally.

A background command runs in its own session (``setsid``), detached from the SSH channel
(stdin ``/dev/null``, stdout/stderr to files), so it survives the channel and the caller's
connection. Its state lives in ``~/.sandbox_rt/bg/<handle>.{pid,out,err,rc}`` inside the sandbox.
"""

from __future__ import annotations

import secrets
import shlex
import signal as _signal
import time
from collections.abc import Mapping
from typing import Protocol

from .errors import CommandTimeout, ConfigError, SandboxError
from .models import ExecResult

__all__ = ["BackgroundProcess", "CommandRunner"]

BG_DIR = "$HOME/.sandbox_rt/bg"
_MAX_NUMBER_DIGITS = 10  # pids and exit codes the sandbox reports are read as at most this many digits


class CommandRunner(Protocol):
    """What a background process needs of its sandbox: run a command and wait (``Sandbox``)."""

    def exec(self, command: str, *, timeout: float | None = None) -> ExecResult: ...


def _small_int(text: str) -> int | None:
    """``text`` as an int if it is a (signed) number of at most 10 digits (sandbox output is hostile)."""
    digits = text.removeprefix("-")
    if not digits.isascii() or not digits.isdigit() or len(digits) > _MAX_NUMBER_DIGITS:
        return None
    return int(text)


class BackgroundProcess:
    """A handle on a command started with ``Sandbox.exec(..., background=True)``."""

    def __init__(self, sandbox: CommandRunner, handle: str, pid: int, command: str) -> None:
        self.sandbox = sandbox
        self.handle = handle
        self.pid = pid
        self.command = command
        self._offsets = {"out": 0, "err": 0}

    @classmethod
    def start(
        cls, sandbox: CommandRunner, command: str, *, cwd: str | None, env: Mapping[str, str]
    ) -> BackgroundProcess:
        handle = secrets.token_hex(8)
        base = f"{BG_DIR}/{handle}"
        # the session leader runs the command, then records its exit status atomically
        # the session leader records its own pid (= process group), runs the command, then
        # records its exit status atomically
        runner = (
            f'echo $$ > {base}.pid.tmp && mv {base}.pid.tmp {base}.pid; /bin/bash -c "$0"; '
            f"echo $? > {base}.rc.tmp && mv {base}.rc.tmp {base}.rc"
        )
        env_words = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        cd = f"cd -- {shlex.quote(cwd)} || exit 1; " if cwd else ""
        script = (
            f"mkdir -p -m 700 {BG_DIR} || exit 1; {cd}"
            f"env {env_words} setsid /bin/bash -c {shlex.quote(runner)} {shlex.quote(command)} "
            f"</dev/null >{base}.out 2>{base}.err & "
            f"for i in $(seq 200); do [ -e {base}.pid ] && break; sleep 0.01; done; cat {base}.pid"
        )
        r = sandbox.exec(script, timeout=30)
        pid = _small_int(r.text.strip())
        if r.exit_code != 0 or pid is None or pid < 2:
            why = r.stderr_text.strip()[:500]
            raise SandboxError(f"could not start {command!r} in the background: {why}")
        return cls(sandbox, handle, pid, command)

    def _path(self, kind: str) -> str:
        return f"{BG_DIR}/{self.handle}.{kind}"

    def exit_code(self) -> int | None:
        """The exit status once the command ended, None while it runs."""
        r = self.sandbox.exec(f"cat {self._path('rc')} 2>/dev/null", timeout=30)
        return _small_int(r.text.strip())

    def is_running(self) -> bool:
        return self.exit_code() is None and (
            self.sandbox.exec(f"kill -0 {self.pid} 2>/dev/null", timeout=30).exit_code == 0
        )

    def wait(self, timeout: float | None = None) -> int:
        """Block until the command ends; its exit status. CommandTimeout if it outlives ``timeout``."""
        if timeout is not None and timeout <= 0:
            raise ConfigError(f"timeout={timeout!r} must be > 0")
        deadline = None if timeout is None else time.monotonic() + timeout
        rc_path = self._path("rc")
        while True:
            left = 60.0 if deadline is None else max(0.05, deadline - time.monotonic())
            # wait inside the sandbox (one round trip), in slices so a dead connection is noticed
            slices = max(1, int(left / 0.05))
            r = self.sandbox.exec(
                f"for i in $(seq {slices}); do [ -e {rc_path} ] && break; sleep 0.05; done; "
                f"cat {rc_path} 2>/dev/null",
                timeout=left + 10,
            )
            code = _small_int(r.text.strip())
            if code is not None:
                return code
            if deadline is not None and time.monotonic() >= deadline:
                out, err = self.logs()
                raise CommandTimeout(self.command, timeout or 0.0, out, err)

    def kill(self, sig: int = _signal.SIGKILL) -> None:
        """Send ``sig`` to the command's whole process group."""
        rc = self._path("rc")
        n = int(sig)
        # the runner that records the exit status dies with its group: record 128+sig for it
        self.sandbox.exec(
            f"kill -{n} -- -{self.pid} 2>/dev/null; "
            f"for i in $(seq 40); do kill -0 {self.pid} 2>/dev/null || break; sleep 0.05; done; "
            f"kill -0 {self.pid} 2>/dev/null || [ -e {rc} ] || echo {128 + n} > {rc}; true",
            timeout=30,
        )

    def logs(self) -> tuple[bytes, bytes]:
        """What the command printed since the last call: (stdout, stderr)."""
        out: list[bytes] = []
        for kind in ("out", "err"):
            start = self._offsets[kind] + 1
            data = self.sandbox.exec(f"tail -c +{start} {self._path(kind)} 2>/dev/null", timeout=60).stdout
            self._offsets[kind] += len(data)
            out.append(data)
        return out[0], out[1]

    def __repr__(self) -> str:
        return f"<BackgroundProcess {self.handle} pid={self.pid} {self.command!r}>"
