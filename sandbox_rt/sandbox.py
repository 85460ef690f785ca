"""One running sandbox: commands, files, internet, status, destroy."""

from __future__ import annotations

import dataclasses
import os
import posixpath
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

from . import logs
from .backends.base import snapshot_backend
from .background import BackgroundProcess
from .commands import Commands
from .download import download_file, download_tree
from .errors import ConfigError, ExecError, FileOperationError, SandboxError
from .execution import Command, ExecStream, command_text, result_of
from .files import Files
from .forward import PortForward
from .models import ExecResult, SandboxRecord, SandboxStatus, SnapshotInfo
from .output_limits import DEFAULT_DOWNLOAD_MAX_BYTES, DEFAULT_MAX_OUTPUT, DEFAULT_READ_MAX_BYTES
from .pty import Pty
from .ssh import SSHExecutor
from .validation import (
    check_egress,
    check_env,
    check_max_bytes,
    check_remote_path,
    check_snapshot_name,
    check_timeout,
    check_user,
    respec,
)

if TYPE_CHECKING:
    from .backends.base import Backend

__all__ = ["ExecStream", "Sandbox"]


class Sandbox:
    """A sandbox the caller holds. Use it as a context manager: leaving the block destroys it."""

    def __init__(
        self,
        record: SandboxRecord,
        backend: Backend,
        executor: SSHExecutor,
        default_timeout_s: float,
        connect_as: Callable[[str], SSHExecutor] | None = None,
    ) -> None:
        self.record = record
        self._backend = backend
        self._ssh = executor
        # a second connection for commands as root (root=True sandboxes), opened when first needed
        self._connect_as = connect_as
        self._root_ssh: SSHExecutor | None = None
        self._default_timeout = default_timeout_s
        self._destroyed = False
        self._lock = threading.Lock()
        self._forwards: list[PortForward] = []
        self.files = Files(self, executor, self._check_alive)
        """File operations: ``list``, ``stat``, ``exists``, ``remove``, ``mkdir``, ``rename``,
        ``read``, ``write``, ``upload``, ``download`` (see :class:`~sandbox_rt.files.Files`)."""
        self.commands = Commands(self)
        """Commands: ``run``, ``stream``, and background processes: ``list``, ``connect(pid)``,
        ``send_stdin``, ``close_stdin``, ``kill`` (see :class:`~sandbox_rt.commands.Commands`)."""

    # -- identity --------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.record.id

    @property
    def hostname(self) -> str:
        return self.record.hostname

    @property
    def ip(self) -> str:
        return self.record.ip

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.record.spec.labels)

    @property
    def expires_at(self) -> float | None:
        return self.record.expires_at

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.ip} backend={self.record.backend}>"

    # -- commands --------------------------------------------------------------------------------
    def _timeout(self, timeout: float | None) -> float:
        t = check_timeout(timeout)
        return self._default_timeout if t is None else t

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
    ) -> BackgroundProcess: ...

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
    ) -> ExecResult | BackgroundProcess:
        """Run a command as the sandbox user and wait for it (``user="root"``: as root, in a sandbox
        made with ``root=True``; otherwise a ConfigError).

        A non-zero exit is a result (``exit_code``), unless ``check=True`` (then ExecError).
        On timeout the whole process group is killed and CommandTimeout carries the output so far.
        Background processes (``cmd &``) keep running and do not hold the call.
        With ``background=True`` it returns at once a :class:`BackgroundProcess` handle (pid,
        ``wait``, ``kill``, ``logs``); the command survives the SSH channel.
        At most ``max_output`` bytes of each stream are kept (default 64 MiB); the rest is dropped
        and counted (``result.truncated``, ``stdout_dropped``, ``stderr_dropped``).
        """
        text, t, cwd_, env_, data = self._prepare(command, timeout, cwd, env, stdin)
        cap = check_max_bytes(max_output, "max_output")
        ssh = self._executor_for(user)
        if background:
            if stdin is not None or check:
                raise ConfigError("background=True takes neither stdin nor check")
            if ssh is not self._ssh:
                raise ConfigError("background processes run as the sandbox user (user=None)")
            return BackgroundProcess.start(self, text, cwd=cwd_, env=env_)
        started = time.monotonic()
        raw = ssh.run(text, timeout=t, cwd=cwd_, env=env_, stdin=data, max_output=cap)
        result = result_of(text, raw, time.monotonic() - started)
        if check and result.exit_code != 0:
            raise ExecError(text, result.exit_code, result.stdout, result.stderr)
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
    ) -> ExecStream:
        """Like :meth:`exec`, but yields output chunks while the command runs.

        Every chunk is yielded; ``max_output`` bounds only what the final ``result`` keeps.
        """
        text, t, cwd_, env_, data = self._prepare(command, timeout, cwd, env, stdin)
        cap = check_max_bytes(max_output, "max_output")
        ssh = self._executor_for(user)
        chunks = ssh.stream(text, timeout=t, cwd=cwd_, env=env_, stdin=data, max_output=cap)
        return ExecStream(chunks, text, check)

    def _prepare(
        self,
        command: Command,
        timeout: float | None,
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdin: bytes | str | None,
    ) -> tuple[str, float, str | None, dict[str, str], bytes | None]:
        self._check_alive()
        text = command_text(command)
        t = self._timeout(timeout)
        if cwd is not None:
            check_remote_path(cwd, "cwd")
        if stdin is not None and not isinstance(stdin, bytes | str):
            raise ConfigError(f"stdin must be bytes or str, not {type(stdin).__name__}")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        return text, t, cwd, check_env(env), data

    def pty(
        self,
        cols: int = 80,
        rows: int = 24,
        *,
        command: str | None = None,
        term: str = "xterm-256color",
        user: str | None = None,
    ) -> Pty:
        """An interactive terminal running the sandbox user's login shell (or ``command``): write
        keys, read output, resize; close it when done (``with sb.pty() as t: ...``).
        ``user="root"``: root's shell, in a sandbox made with ``root=True``."""
        self._check_alive()
        return Pty(self._executor_for(user), cols=cols, rows=rows, command=command, term=term)

    @property
    def root(self) -> bool:
        """Whether commands may run as root here (the sandbox was made with ``root=True``)."""
        return self.record.spec.root

    def _executor_for(self, user: str | None) -> SSHExecutor:
        """The connection for commands as ``user``: the sandbox user's, or root's (opened once)."""
        who = check_user(user, default=self._ssh.user, root_allowed=self.record.spec.root)
        if who == self._ssh.user:
            return self._ssh
        with self._lock:
            self._check_alive()
            if self._root_ssh is None or not self._root_ssh.is_connected():
                if self._connect_as is None:
                    raise ConfigError("this handle cannot open a root connection (made without a manager)")
                self._root_ssh = self._connect_as(who)
            return self._root_ssh

    # -- files -----------------------------------------------------------------------------------
    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        """Write ``data`` to ``path`` (parent directories are created), as the sandbox user."""
        self._check_alive()
        check_remote_path(path)
        if not isinstance(data, bytes | str):
            raise ConfigError(f"data must be bytes or str, not {type(data).__name__}")
        parent = posixpath.dirname(path)
        if parent and parent != "/" and self._ssh.stat(parent) is None:
            self._ssh.makedirs(parent)
        self._ssh.write_bytes(path, data.encode() if isinstance(data, str) else data, mode)

    def read_file(self, path: str, *, max_bytes: int = DEFAULT_READ_MAX_BYTES) -> bytes:
        """The bytes of the regular file ``path`` (a symlink is followed inside the sandbox; a
        device, FIFO or socket is refused with EINVAL). A file larger than ``max_bytes`` (its
        apparent size: a sparse file counts in full; default 256 MiB) is refused at once with
        ``FileOperationError(EFBIG)``."""
        self._check_alive()
        cap = check_max_bytes(max_bytes, "max_bytes")
        return self._ssh.read_bytes(check_remote_path(path), cap)

    def read_text(
        self, path: str, encoding: str = "utf-8", *, max_bytes: int = DEFAULT_READ_MAX_BYTES
    ) -> str:
        return self.read_file(path, max_bytes=max_bytes).decode(encoding, "replace")

    def upload(self, local: str | os.PathLike[str], remote: str) -> int:
        """Copy a local file or directory tree to ``remote``; returns bytes sent. Streams, never slurps."""
        self._check_alive()
        check_remote_path(remote, "remote")
        src = Path(local)
        if not src.exists():
            raise ConfigError(f"local path {str(src)!r} does not exist")
        total = 0
        if src.is_dir():
            self._ssh.makedirs(remote)
            for root, dirs, files in os.walk(src):
                rel = Path(root).relative_to(src)
                target_dir = posixpath.join(remote, rel.as_posix()) if str(rel) != "." else remote
                for d in sorted(dirs):
                    self._ssh.makedirs(posixpath.join(target_dir, d))
                for f in sorted(files):
                    total += self._upload_file(Path(root) / f, posixpath.join(target_dir, f))
            return total
        parent = posixpath.dirname(remote)
        if parent and parent != "/" and self._ssh.stat(parent) is None:
            self._ssh.makedirs(parent)
        return self._upload_file(src, remote)

    def _upload_file(self, src: Path, remote: str) -> int:
        with src.open("rb") as fh:
            return self._ssh.put_stream(fh, remote, stat.S_IMODE(src.stat().st_mode))

    def download(
        self, remote: str, local: str | os.PathLike[str], *, max_bytes: int = DEFAULT_DOWNLOAD_MAX_BYTES
    ) -> int:
        """Copy a file or directory tree from the sandbox to ``local``; returns bytes received.

        Nothing is written outside ``local`` whatever the sandbox lists (see
        :mod:`sandbox_rt.download`). Regular files and directories are copied, other types skipped.
        The whole download writes at most ``max_bytes`` (default 8 GiB): a file that would pass it
        ends the download with ``FileOperationError(EFBIG)``.
        """
        self._check_alive()
        check_remote_path(remote, "remote")
        cap = check_max_bytes(max_bytes, "max_bytes")
        attrs = self._ssh.stat(remote)
        if attrs is None:
            raise FileOperationError(2, "download: no such file in the sandbox", remote)
        if stat.S_ISDIR(attrs.st_mode or 0):
            return download_tree(self._ssh, remote, local, cap)
        return download_file(self._ssh, remote, local, cap)

    # -- network, state --------------------------------------------------------------------------
    def set_internet(self, enabled: bool) -> None:
        """Allow (True) or forbid (False) this sandbox's traffic to the internet (HTTP/HTTPS)."""
        self._check_alive()
        if not isinstance(enabled, bool):
            raise ConfigError(f"enabled={enabled!r} must be True or False")
        self._backend.set_internet(self.record, enabled)

    def set_egress(self, egress: Sequence[str]) -> tuple[str, ...]:
        """Replace the egress allow-list (what is reachable while internet is off): IPv4 addresses,
        networks and domain names; ``[]`` closes it again. Returns the normalised list."""
        self._check_alive()
        entries = check_egress(egress)
        self._backend.set_egress(self.record, entries)
        spec = dataclasses.replace(self.record.spec, egress=entries)
        self.record = dataclasses.replace(self.record, spec=spec)
        return entries

    def status(self) -> SandboxStatus:
        self.record = self._backend.get(self.id)  # labels and expiry as they are now, not as attached
        spec = self.record.spec
        state = self._backend.state(self.id)
        running = state == "running"
        return SandboxStatus(
            id=self.id,
            state=state,
            ip=self.ip,
            hostname=self.hostname,
            cpus=spec.cpus,
            memory_mb=spec.memory_mb,
            disk_gb=spec.disk_gb,
            internet=running and self._backend.internet_enabled(self.record),
            uptime_s=self._backend.uptime_s(self.id) if running else None,
            usage=self._backend.usage(self.id),
            labels=dict(spec.labels),
            expires_at=self.record.expires_at,
            egress=spec.egress,
            net_mbps=spec.net_mbps,
            disk_mbps=spec.disk_mbps,
            disk_iops=spec.disk_iops,
            template=spec.template,
        )

    def expose(self, port: int, *, host: str = "127.0.0.1", host_port: int = 0) -> PortForward:
        """Forward ``host:host_port`` (loopback and a free port by default) to ``port`` in the sandbox.

        The forward lives in this process and ends with :meth:`close`/:meth:`destroy`.
        """
        self._check_alive()
        for name, value in (("port", port), ("host_port", host_port)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
                raise ConfigError(f"{name}={value!r} must be a TCP port number")
        if port == 0:
            raise ConfigError("port=0 is not a port in the sandbox")
        try:
            fwd = PortForward((self.ip, port), (host, host_port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{host_port}: {exc.strerror}") from exc
        self._forwards.append(fwd)
        return fwd

    def _close_forwards(self) -> None:
        while self._forwards:
            self._forwards.pop().close()

    def snapshot(self, name: str) -> SnapshotInfo:
        """Save this sandbox's files as snapshot ``name``; ``Manager.create(from_snapshot=name)``
        forks new sandboxes from it. The sandbox is frozen while its files are copied (LXC) or
        snapshotted (PVE), then goes on. Names: a letter, then 1-39 letters, digits, ``_``, ``-``;
        an existing name is a ConfigError. On PVE the snapshot goes with this sandbox's CT.
        """
        self._check_alive()
        return snapshot_backend(self._backend).snapshot(self.id, check_snapshot_name(name))

    def extend(self, ttl_s: int) -> None:
        """Let the sandbox live ``ttl_s`` seconds from now (E2B's ``set_timeout``)."""
        self._check_alive()
        # the record as it is now: another process (or the API's other dialect) may have changed it
        record = self._backend.get(self.id)
        self.record = self._backend.update(record, respec(record.spec, ttl_s=ttl_s))

    def is_connected(self) -> bool:
        return not self._destroyed and self._ssh.is_connected()

    def close(self) -> None:
        """Drop the SSH connection and port forwards; the sandbox keeps running (see :meth:`destroy`)."""
        self._close_forwards()
        self._ssh.close()
        if self._root_ssh is not None:
            self._root_ssh.close()

    def destroy(self) -> None:
        """Stop and remove the sandbox and everything it holds. Idempotent."""
        with self._lock:
            if self._destroyed:
                return
            self._close_forwards()
            self._ssh.close()
            if self._root_ssh is not None:
                self._root_ssh.close()
            self._backend.destroy(self.id)
            self._destroyed = True
        logs.event("destroy", self.id, backend=self._backend.name)

    def _check_alive(self) -> None:
        if self._destroyed:
            raise SandboxError(f"sandbox {self.id} was destroyed")

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
