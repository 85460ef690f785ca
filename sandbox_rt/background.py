"""Background processes in a sandbox: start, list, reattach, stdin, wait, kill, read logs incrementally.

A background command runs in its own session (``setsid``), detached from the SSH channel, so it
survives the channel and the caller's connection. Its state lives in
``~/.sandbox_rt/bg/<handle>.*`` inside the sandbox:

- ``pid`` (the session leader = process group), ``rc`` (exit status, once it ended), ``cmd``;
- ``out`` / ``err``: what it printed (``logs()`` reads what is new, bounded like any exec output);
- ``in``: a FIFO that is its stdin. A holder process (pid in ``hold``) keeps a writer open, so the
  command sees no EOF until ``close_stdin()`` (or the command's end) stops the holder; ``send_stdin``
  writes into the FIFO.

Everything read back (pids, statuses, handles, command texts) comes from the sandbox and is parsed
strictly and bounded: this module never trusts it.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
import shlex
import signal as _signal
import time
from collections.abc import Mapping
from typing import Protocol

from .errors import CommandTimeout, ConfigError, ProcessNotFound, SandboxError
from .models import ExecResult, ProcessInfo
from .validation import check_max_bytes, check_signal

__all__ = ["BackgroundProcess", "CommandRunner", "list_processes"]

BG_DIR = "$HOME/.sandbox_rt/bg"
_MAX_NUMBER_DIGITS = 10  # pids and exit codes the sandbox reports are read as at most this many digits
_HANDLE = re.compile(r"[0-9a-f]{16}")
_LIST_MAX = 1000  # processes list() reports at most
_CMD_SHOWN = 1024  # bytes of a command's text list() reports


class CommandRunner(Protocol):
    """What a background process needs of its sandbox: run a command and wait (``Sandbox``)."""

    def exec(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        max_output: int = ...,
    ) -> ExecResult: ...


def _small_int(text: str) -> int | None:
    """``text`` as an int if it is a (signed) number of at most 10 digits (sandbox output is hostile)."""
    digits = text.removeprefix("-")
    if not digits.isascii() or not digits.isdigit() or len(digits) > _MAX_NUMBER_DIGITS:
        return None
    return int(text)


def _check_pid(pid: object) -> int:
    if isinstance(pid, bool) or not isinstance(pid, int) or not 1 < pid < 1 << 22:
        raise ConfigError(f"pid={pid!r} is not a process id")
    return pid


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
        # the session leader records its own pid (= process group), runs the command, records its
        # exit status atomically, then ends the stdin holder (waiting a moment for its pid file)
        runner = (
            f'echo $$ > {base}.pid.tmp && mv {base}.pid.tmp {base}.pid; /bin/bash -c "$0"; '
            f"echo $? > {base}.rc.tmp && mv {base}.rc.tmp {base}.rc; "
            f"for i in $(seq 100); do [ -e {base}.hold ] && break; sleep 0.01; done; "
            f'kill "$(cat {base}.hold 2>/dev/null)" 2>/dev/null; true'
        )
        holder = f"echo $$ > {base}.hold.tmp && mv {base}.hold.tmp {base}.hold; exec sleep infinity"
        env_words = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        cd = f"cd -- {shlex.quote(cwd)} || exit 1; " if cwd else ""
        script = (
            f"mkdir -p -m 700 {BG_DIR} || exit 1; {cd}"
            f"mkfifo -m 600 {base}.in || exit 1; printf %s {shlex.quote(command)} > {base}.cmd; "
            # opening the FIFO blocks each side until the other opens it: both start in the background
            f"setsid /bin/sh -c {shlex.quote(holder)} > {base}.in & "
            f"env {env_words} setsid /bin/bash -c {shlex.quote(runner)} {shlex.quote(command)} "
            f"<{base}.in >{base}.out 2>{base}.err & "
            f"for i in $(seq 200); do [ -e {base}.pid ] && break; sleep 0.01; done; cat {base}.pid"
        )
        r = sandbox.exec(script, timeout=30)
        pid = _small_int(r.text.strip())
        if r.exit_code != 0 or pid is None or pid < 2:
            why = r.stderr_text.strip()[:500]
            raise SandboxError(f"could not start {command!r} in the background: {why}")
        return cls(sandbox, handle, pid, command)

    @classmethod
    def connect(cls, sandbox: CommandRunner, pid: int) -> BackgroundProcess:
        """The background command whose process group is ``pid`` (started by any process)."""
        pid = _check_pid(pid)
        r = sandbox.exec(
            f"cd {BG_DIR} 2>/dev/null || exit 3; for f in *.pid; do "
            f'[ "$(cat "$f" 2>/dev/null)" = {pid} ] && {{ h=${{f%.pid}}; echo "$h"; '
            f'head -c {_CMD_SHOWN} "$h.cmd" 2>/dev/null | base64 -w0; exit 0; }}; done; exit 3',
            timeout=30,
            max_output=1 << 16,
        )
        lines = r.text.splitlines()
        if r.exit_code != 0 or not lines or not _HANDLE.fullmatch(lines[0]):
            raise ProcessNotFound(pid)
        return cls(sandbox, lines[0], pid, _b64_text(lines[1] if len(lines) > 1 else ""))

    def _path(self, kind: str) -> str:
        return f"{BG_DIR}/{self.handle}.{kind}"

    def exit_code(self) -> int | None:
        """The exit status once the command ended, None while it runs."""
        r = self.sandbox.exec(f"cat {self._path('rc')} 2>/dev/null", timeout=30, max_output=64)
        return _small_int(r.text.strip())

    def is_running(self) -> bool:
        return self.exit_code() is None and (
            self.sandbox.exec(f"kill -0 {self.pid} 2>/dev/null", timeout=30).exit_code == 0
        )

    def info(self) -> ProcessInfo:
        """Its state in one round trip: running (no exit status yet and alive) and the exit status."""
        r = self.sandbox.exec(
            f"rc=$(head -c 12 {self._path('rc')} 2>/dev/null); "
            f'kill -0 {self.pid} 2>/dev/null && up=1 || up=0; printf "%s %s" "${{rc:--}}" "$up"',
            timeout=30,
            max_output=64,
        )
        words = r.text.split()
        code = _small_int(words[0]) if len(words) == 2 and words[0] != "-" else None
        running = code is None and len(words) == 2 and words[1] == "1"
        return ProcessInfo(
            pid=self.pid, handle=self.handle, command=self.command, running=running, exit_code=code
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
                max_output=64,
            )
            code = _small_int(r.text.strip())
            if code is not None:
                return code
            if deadline is not None and time.monotonic() >= deadline:
                out, err = self.logs()
                raise CommandTimeout(self.command, timeout or 0.0, out, err)

    def send_stdin(self, data: bytes | str, *, timeout: float = 30.0) -> None:
        """Write ``data`` to the command's stdin (it reads it as it likes; a command that does not
        read blocks the write once the pipe is full, up to ``timeout``)."""
        if not isinstance(data, bytes | str):
            raise ConfigError(f"data must be bytes or str, not {type(data).__name__}")
        fifo, hold = self._path("in"), self._path("hold")
        r = self.sandbox.exec(
            f"[ -p {fifo} ] || exit 5; [ -e {self._path('rc')} ] && exit 4; "
            f'kill -0 "$(cat {hold} 2>/dev/null)" 2>/dev/null || exit 3; '
            f"exec timeout {max(1, int(timeout))} cat > {fifo}",
            timeout=timeout + 10,
            stdin=data,
            max_output=4096,
        )
        why = {
            3: "its stdin was closed",
            4: "it has ended",
            5: "it has no stdin pipe (started by an older runtime)",
        }
        if r.exit_code in why:
            raise SandboxError(f"cannot write to the stdin of {self.command!r}: {why[r.exit_code]}")
        if r.exit_code != 0:
            raise SandboxError(f"writing to the stdin of {self.command!r} failed (exit {r.exit_code})")

    def close_stdin(self) -> None:
        """End the command's input: it reads EOF once it has read what was sent. Idempotent."""
        hold = self._path("hold")
        self.sandbox.exec(
            f'kill "$(cat {hold} 2>/dev/null)" 2>/dev/null; rm -f {hold}; true', timeout=30, max_output=64
        )

    def kill(self, sig: int = _signal.SIGKILL) -> None:
        """Send ``sig`` to the command's whole process group."""
        rc = self._path("rc")
        n = check_signal(sig)
        # the runner that records the exit status dies with its group: record 128+sig for it
        self.sandbox.exec(
            f"kill -{n} -- -{self.pid} 2>/dev/null; "
            f"for i in $(seq 40); do kill -0 {self.pid} 2>/dev/null || break; sleep 0.05; done; "
            f"kill -0 {self.pid} 2>/dev/null || [ -e {rc} ] || echo {128 + n} > {rc}; "
            f"kill -0 {self.pid} 2>/dev/null || "
            f'kill "$(cat {self._path("hold")} 2>/dev/null)" 2>/dev/null; true',
            timeout=30,
            max_output=64,
        )

    def logs(self) -> tuple[bytes, bytes]:
        """What the command printed since the last call: (stdout, stderr)."""
        out, err = self.logs_from(self._offsets["out"], self._offsets["err"])
        self._offsets["out"] += len(out)
        self._offsets["err"] += len(err)
        return out, err

    def logs_from(
        self, stdout_offset: int, stderr_offset: int, *, max_bytes: int | None = None
    ) -> tuple[bytes, bytes]:
        """What the command printed from these byte offsets on (a stateless reader keeps its own
        offsets, e.g. over HTTP): (stdout, stderr), each at most ``max_bytes`` (None: no cap
        beyond an exec's own)."""
        out: list[bytes] = []
        for kind, offset in (("out", stdout_offset), ("err", stderr_offset)):
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ConfigError(f"{kind} offset={offset!r} must be a whole number of bytes, at least 0")
            cap = "" if max_bytes is None else f" | head -c {check_max_bytes(max_bytes)}"
            r = self.sandbox.exec(f"tail -c +{offset + 1} {self._path(kind)} 2>/dev/null{cap}", timeout=60)
            out.append(r.stdout if max_bytes is None else r.stdout[:max_bytes])  # the sandbox may lie
        return out[0], out[1]

    def __repr__(self) -> str:
        return f"<BackgroundProcess {self.handle} pid={self.pid} {self.command!r}>"


def _b64_text(text: str) -> str:
    try:
        return base64.b64decode(text, validate=True)[:_CMD_SHOWN].decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return ""


def list_processes(sandbox: CommandRunner) -> list[ProcessInfo]:
    """The sandbox's background commands (running and ended), newest first by pid file time."""
    r = sandbox.exec(
        f"cd {BG_DIR} 2>/dev/null || exit 0; ls -t -- *.pid 2>/dev/null | head -n {_LIST_MAX} | "
        'while read -r f; do h=${f%.pid}; p=$(head -c 12 "$f"); rc=$(head -c 12 "$h.rc" 2>/dev/null); '
        'kill -0 "$p" 2>/dev/null && up=1 || up=0; '
        'printf "%s %s %s %s %s\\n" "$h" "$p" "$up" "${rc:--}" '
        f'"$(head -c {_CMD_SHOWN} "$h.cmd" 2>/dev/null | base64 -w0)"; done',
        timeout=60,
        max_output=4 << 20,
    )
    out: list[ProcessInfo] = []
    for line in r.text.splitlines()[:_LIST_MAX]:
        words = line.split(" ")
        if len(words) != 5 or not _HANDLE.fullmatch(words[0]):
            continue
        pid = _small_int(words[1].strip())
        rc = None if words[3] == "-" else _small_int(words[3].strip())
        if pid is None or pid < 2 or words[2] not in ("0", "1"):
            continue
        running = words[2] == "1" and rc is None
        out.append(
            ProcessInfo(pid=pid, handle=words[0], command=_b64_text(words[4]), running=running, exit_code=rc)
        )
    return out
