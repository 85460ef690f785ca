"""A runtime fake for execd's unit tests whose sandboxes run their commands with the local bash, as
the test's user, in the test's own directories: what execd sends (``find -printf``, ``tail | head``,
the interrupt's /proc scan, a session's EXIT trap, a background process) really runs, without LXC.

It subclasses test_http_api's FakeManager/FakeSandbox; ``mgr.lies`` scripts what a lying sandbox
answers instead (command text -> ExecResult) for the hostile-input tests.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sandbox_rt import (
    CommandTimeout,
    ExecResult,
    FileOperationError,
    OutputChunk,
    ResourceUsage,
    SandboxStatus,
)
from sandbox_rt.background import BackgroundProcess, list_processes
from sandbox_rt.execution import command_text
from sandbox_rt.models import EntryInfo, ProcessInfo
from sandbox_rt.validation import check_egress
from tests.unit.test_http_api import Container, FakeManager, FakeSandbox

__all__ = ["LocalManager", "LocalSandbox"]

_RUN = 'cd -- "$1" || exit 1; exec /bin/bash -c "$2"'
DEFAULT_MAX = 64 << 20


def _error(exc: OSError, what: str, path: str) -> FileOperationError:
    return FileOperationError(exc.errno or errno.EIO, f"{what}: {exc.strerror}", path)


class LocalFiles:
    def __init__(self, sb: LocalSandbox) -> None:
        self.sb = sb

    def _info(self, path: str, st: os.stat_result) -> EntryInfo:
        kind = (
            "file"
            if stat.S_ISREG(st.st_mode)
            else "dir"
            if stat.S_ISDIR(st.st_mode)
            else "symlink"
            if stat.S_ISLNK(st.st_mode)
            else "other"
        )
        return EntryInfo(
            os.path.basename(path) or "/", path, kind, st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime
        )

    def stat(self, path: str, *, follow_symlinks: bool = True) -> EntryInfo:
        self.sb.calls.append(("files.stat", path))
        try:
            return self._info(path, os.stat(path) if follow_symlinks else os.lstat(path))
        except OSError as exc:
            raise _error(exc, "stat", path) from None

    def list(self, path: str, depth: int = 1) -> list[EntryInfo]:
        raise AssertionError("execd lists with find, not sb.files.list")

    def remove(self, path: str, *, recursive: bool = False) -> None:
        self.sb.calls.append(("files.remove", path))
        assert path != "/"
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        try:
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(path)
            elif recursive:
                shutil.rmtree(path)
            else:
                os.rmdir(path)
        except OSError as exc:
            raise _error(exc, "remove", path) from None

    def mkdir(self, path: str, *, parents: bool = True, mode: int = 0o755) -> bool:
        if os.path.isdir(path):
            return False
        try:
            os.makedirs(path) if parents else os.mkdir(path, mode)
        except OSError as exc:
            raise _error(exc, "mkdir", path) from None
        return True

    def rename(self, src: str, dst: str) -> EntryInfo:
        try:
            os.rename(src, dst)
        except OSError as exc:
            raise _error(exc, "rename", src) from None
        return self.stat(dst, follow_symlinks=False)


class LocalCommands:
    def __init__(self, sb: LocalSandbox) -> None:
        self.sb = sb

    def run(
        self,
        command: str | list[str],
        *,
        background: bool,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> BackgroundProcess:
        assert background
        self.sb.calls.append(("bg", {"command": command, "cwd": cwd, "env": dict(env or {})}))
        return BackgroundProcess.start(self.sb, command_text(command), cwd=cwd, env=dict(env or {}))

    def list(self) -> list[ProcessInfo]:
        return list_processes(self.sb)

    def connect(self, pid: int) -> BackgroundProcess:
        return BackgroundProcess.connect(self.sb, pid)


class LocalStream:
    """exec_stream with the local bash: chunks as they come, then ``result``."""

    def __init__(self, proc: subprocess.Popen[bytes], text: str, timeout: float | None, cap: int) -> None:
        self.proc, self.text, self.timeout, self.cap = proc, text, timeout, cap
        self.result: ExecResult | None = None

    def __iter__(self) -> Iterator[OutputChunk]:
        proc = self.proc
        assert proc.stdout is not None and proc.stderr is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
        sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
        kept = {"stdout": b"", "stderr": b""}
        started = time.monotonic()
        deadline = None if self.timeout is None else started + self.timeout
        open_streams = 2
        try:
            while open_streams:
                if deadline is not None and time.monotonic() > deadline:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    raise CommandTimeout(self.text, self.timeout or 0.0, kept["stdout"], kept["stderr"])
                for key, _ in sel.select(0.05):
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        open_streams -= 1
                        continue
                    name = key.data
                    kept[name] = (kept[name] + data)[: self.cap]
                    yield OutputChunk(name, data)
                if proc.poll() is not None and not sel.select(0):
                    break  # ended; a background child may hold the pipes: do not wait for their EOF
        finally:
            sel.close()
        code = proc.wait()
        code = 128 - code if code < 0 else code  # as a shell reports a signal
        self.result = ExecResult(self.text, kept["stdout"], kept["stderr"], code, time.monotonic() - started)


class LocalSandbox(FakeSandbox):
    mgr: LocalManager

    def __init__(self, mgr: LocalManager, box: Container) -> None:
        super().__init__(mgr, box)
        self.home = mgr.root / box.id / "home"
        self.home.mkdir(parents=True, exist_ok=True)

    @property
    def commands(self) -> LocalCommands:  # type: ignore[override]
        return LocalCommands(self)

    @property
    def files(self) -> LocalFiles:
        return LocalFiles(self)

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home), **(env or {})}

    def _argv(self, text: str, cwd: str | None) -> list[str]:
        return ["/bin/sh", "-c", _RUN, "sh", cwd or str(self.home), text]

    def exec(  # type: ignore[override]
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        max_output: int = DEFAULT_MAX,
        user: str | None = None,
        check: bool = False,
    ) -> ExecResult:
        text = command_text(command)
        self.calls.append(("exec", {"command": text, "user": user, "env": dict(env or {})}))
        lie = self.mgr.lies(text)
        if lie is not None:
            dropped = max(lie.stdout_dropped, len(lie.stdout) - max_output)
            return ExecResult(text, lie.stdout[:max_output], lie.stderr, lie.exit_code, 0.0, dropped)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                self._argv(text, cwd),
                stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=self._env(env),
                start_new_session=True,
            )
            if data is not None:
                assert proc.stdin is not None
                proc.stdin.write(data)
                proc.stdin.close()
            try:
                code = proc.wait(timeout)
                code = 128 - code if code < 0 else code
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise CommandTimeout(text, timeout or 0.0, b"", b"") from None
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        return ExecResult(
            text, stdout[:max_output], stderr[:max_output], code, 0.0, max(0, len(stdout) - max_output)
        )

    def exec_stream(  # type: ignore[override]
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        max_output: int = DEFAULT_MAX,
        user: str | None = None,
    ) -> LocalStream:
        text = command_text(command)
        self.calls.append(
            (
                "exec_stream",
                {"command": text, "cwd": cwd, "env": dict(env or {}), "user": user, "timeout": timeout},
            )
        )
        if cwd is not None and not cwd.startswith("/"):
            raise AssertionError("the runtime checks cwd")
        proc = subprocess.Popen(
            self._argv(text, cwd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._env(env),
            start_new_session=True,
        )
        return LocalStream(proc, text, timeout, max_output)

    def read_file(self, path: str, *, max_bytes: int = DEFAULT_MAX) -> bytes:  # type: ignore[override]
        try:
            if os.path.getsize(path) > max_bytes:
                raise FileOperationError(errno.EFBIG, f"read: larger than {max_bytes} bytes", path)
            return Path(path).read_bytes()
        except OSError as exc:
            if isinstance(exc, FileOperationError):
                raise
            raise _error(exc, "read", path) from None

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        self.calls.append(("write_file", {"path": path, "mode": mode}))
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            Path(path).write_bytes(data if isinstance(data, bytes) else data.encode())
            if mode is not None:
                os.chmod(path, mode)
        except OSError as exc:
            raise _error(exc, "write", path) from None

    def set_egress(self, egress: Sequence[str]) -> tuple[str, ...]:
        entries = check_egress(egress)
        self.box.kwargs["egress"] = entries
        return entries

    def status(self) -> SandboxStatus:
        base = super().status()
        self.mgr.cpu_time += 0.05
        usage = ResourceUsage(
            memory_bytes=256 << 20, memory_peak_bytes=300 << 20, cpu_time_s=self.mgr.cpu_time, pids=3
        )
        return SandboxStatus(
            **{**base.__dict__, "usage": usage, "egress": tuple(self.box.kwargs.get("egress") or ())}
        )


class LocalManager(FakeManager):
    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.cpu_time = 0.0
        self.lies: Callable[[str], ExecResult | None] = lambda text: None

    def create(self, **kwargs: Any) -> LocalSandbox:
        sb = super().create(**kwargs)
        return LocalSandbox(self, sb.box)

    def attach(self, sandbox_id: str) -> LocalSandbox:
        sb = super().attach(sandbox_id)
        local = LocalSandbox(self, sb.box)
        self.handed.append(local)
        return local
