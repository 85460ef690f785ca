"""The one SSH/SFTP executor every backend uses (paramiko).

- Key auth only; the sandbox's host key is pinned before the first contact (the backend reads it
  from a channel we trust) and any other key is refused (``RejectPolicy``; never AutoAdd).
- One persistent transport per sandbox with ``TCP_NODELAY``; a channel per command.
- Every command runs in its own session (``setsid``): a timeout kills the whole process group.
- Completion is decided by end markers the wrapper prints after the command, not by EOF, so a
  command that leaves a background process holding stdout (``sleep 100 &``) returns at once.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import io
import posixpath
import re
import secrets
import select
import shlex
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Literal

import paramiko

from .errors import (
    CommandTimeout,
    ConnectionLost,
    FileOperationError,
    HostKeyMismatch,
    SandboxNotReady,
)
from .models import OutputChunk

__all__ = ["RawResult", "SSHExecutor", "load_private_key", "parse_public_key"]

MAX_PARALLEL_CHANNELS = 64  # below sshd's MaxSessions (100 in the template)
_READ_SIZE = 65536
_SFTP_CHUNK = 1 << 20
_MARKER_MAX = 64  # longer than any marker: a partial marker can only sit in the last 64 bytes

StreamName = Literal["stdout", "stderr"]
ChunkSink = Callable[[OutputChunk], None]


def load_private_key(path: Path) -> paramiko.PKey:
    """Load the runtime's private key (ed25519, RSA or ECDSA). Never logs its content."""
    try:
        return paramiko.PKey.from_path(path)
    except FileNotFoundError as exc:
        raise ConnectionLost(f"SSH key {path} does not exist (run the site.yml playbook)") from exc
    except (OSError, paramiko.SSHException, ValueError) as exc:
        raise ConnectionLost(f"cannot load SSH key {path}: {type(exc).__name__}") from exc


def parse_public_key(line: str) -> paramiko.PKey:
    """``"ssh-ed25519 AAAA... comment"`` → a paramiko public key."""
    parts = line.split()
    if len(parts) < 2:
        raise HostKeyMismatch(f"not an OpenSSH public key: {line[:40]!r}")
    try:
        return paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1]))
    except (paramiko.SSHException, ValueError, binascii.Error) as exc:
        raise HostKeyMismatch(f"cannot parse host key {line[:40]!r}: {exc}") from exc


class RawResult:
    """Output and status of one finished command (the executor's own, before timing)."""

    __slots__ = ("exit_code", "stderr", "stdout")

    def __init__(self, stdout: bytes, stderr: bytes, exit_code: int) -> None:
        self.stdout = stdout
        self.stderr = stderr
        self.exit_code = exit_code


class _Markers:
    """The per-command random markers the wrapper prints, and how to find them."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(12)
        self.pgid_re = re.compile(rb"\x1e" + self.token.encode() + rb"P(\d+)\x1e")
        self.end_out_re = re.compile(rb"\x1e" + self.token.encode() + rb"E(\d+)\x1e")
        self.end_err = b"\x1e" + self.token.encode() + b"E\x1e"

    def wrap(self, command: str, cwd: str | None, env: Mapping[str, str]) -> str:
        """The shell text sshd runs: the command in a new session, then the end markers."""
        tok = self.token
        inner = 'printf "\\036%sP%s\\036" "$0" "$$" >&2; '
        if cwd is not None:
            inner += 'cd -- "$1" || exit 1; '
        inner += 'shift; exec "$@"'
        argv = ["env", *(f"{k}={v}" for k, v in env.items()), "/bin/bash", "-c", command]
        # The brace group's own stderr is /dev/null so the shell's job notices ("Killed ...") stay
        # out of the output; the command itself gets the real stderr through fd 3.
        return (
            f"{{ setsid -w /bin/sh -c {shlex.quote(inner)} {tok} {shlex.quote(cwd or '/')} "
            f"{shlex.join(argv)} 2>&3 3>&-; }} 3>&2 2>/dev/null; "
            f"printf '\\036%sE%s\\036' {tok} \"$?\"; printf '\\036%sE\\036' {tok} >&2"
        )


class _Demux:
    """Splits a channel's two streams into user output and markers."""

    def __init__(self, markers: _Markers, sink: ChunkSink | None) -> None:
        self.m = markers
        self.sink = sink
        self.out = bytearray()
        self.err = bytearray()
        self.pending_out = bytearray()  # bytes not yet known to be free of a marker prefix
        self.pending_err = bytearray()
        self.pgid: int | None = None
        self.exit_code: int | None = None
        self.err_done = False

    @property
    def done(self) -> bool:
        return self.exit_code is not None and self.err_done

    def feed(self, stream: StreamName, data: bytes) -> None:
        if stream == "stdout":
            if self.exit_code is not None:
                return  # output after the end marker comes from background processes
            buf = self.pending_out
            buf += data
            m = self.m.end_out_re.search(buf)
            if m:
                self.exit_code = int(m.group(1))
                self._emit("stdout", bytes(buf[: m.start()]))
                buf.clear()
                return
            self._emit("stdout", self._release(buf))
        else:
            if self.err_done:
                return
            buf = self.pending_err
            buf += data
            if self.pgid is None:
                m = self.m.pgid_re.search(buf)
                if m:
                    self.pgid = int(m.group(1))
                    del buf[m.start() : m.end()]
            idx = buf.find(self.m.end_err)
            if idx >= 0:
                self.err_done = True
                self._emit("stderr", bytes(buf[:idx]))
                buf.clear()
                return
            if self.pgid is not None:
                self._emit("stderr", self._release(buf))

    def flush(self) -> None:
        """The channel ended without markers: everything pending is output."""
        self._emit("stdout", bytes(self.pending_out))
        self._emit("stderr", bytes(self.pending_err))
        self.pending_out.clear()
        self.pending_err.clear()

    @staticmethod
    def _release(buf: bytearray) -> bytes:
        """Emit all of ``buf`` except a tail that could be the start of a marker."""
        cut = buf.rfind(b"\x1e", max(0, len(buf) - _MARKER_MAX))
        if cut < 0:
            cut = len(buf)
        out = bytes(buf[:cut])
        del buf[:cut]
        return out

    def _emit(self, stream: StreamName, data: bytes) -> None:
        if not data:
            return
        (self.out if stream == "stdout" else self.err).extend(data)
        if self.sink is not None:
            self.sink(OutputChunk(stream, data))


class SSHExecutor:
    """A persistent SSH transport to one sandbox, with SFTP; thread-safe."""

    def __init__(
        self,
        host: str,
        *,
        user: str,
        key: paramiko.PKey,
        host_key: paramiko.PKey,
        port: int = 22,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.host = host
        self.port = port
        self.user = user
        self._key = key
        self._host_key = host_key
        self._connect_timeout = connect_timeout_s
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.RLock()
        self._sftp_lock = threading.Lock()
        self._channels = threading.BoundedSemaphore(MAX_PARALLEL_CHANNELS)

    # -- connection ------------------------------------------------------------------------------
    def connect(self, timeout_s: float | None = None) -> None:
        """Connect (retrying while sshd is not up yet) within ``timeout_s`` seconds."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self._connect_timeout)
        last: Exception | None = None
        delay = 0.01
        while True:
            try:
                self._connect_once(max(0.2, deadline - time.monotonic()))
                return
            except HostKeyMismatch:
                raise
            except (OSError, paramiko.SSHException, EOFError) as exc:
                last = exc
            if time.monotonic() + delay >= deadline:
                break
            time.sleep(delay)  # back-off between connection attempts to a booting sandbox
            delay = min(delay * 2, 0.2)
        raise SandboxNotReady(f"SSH to {self.user}@{self.host}:{self.port} not ready: {last}")

    def _connect_once(self, timeout: float) -> None:
        with self._lock:
            if self._client is not None and self.is_connected():
                return
            self._close_locked()
            sock = socket.create_connection((self.host, self.port), timeout=min(timeout, 5.0))
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                client = paramiko.SSHClient()
                client.get_host_keys().add(self.host, self._host_key.get_name(), self._host_key)
                client.set_missing_host_key_policy(paramiko.RejectPolicy())
                client.connect(
                    self.host,
                    port=self.port,
                    username=self.user,
                    pkey=self._key,
                    sock=sock,
                    timeout=timeout,
                    banner_timeout=timeout,
                    auth_timeout=timeout,
                    allow_agent=False,
                    look_for_keys=False,
                )
            except paramiko.BadHostKeyException as exc:
                sock.close()
                raise HostKeyMismatch(
                    f"{self.host} presented host key {exc.key.get_fingerprint().hex()} "
                    f"but {exc.expected_key.get_fingerprint().hex()} is pinned: refusing to connect"
                ) from exc
            except BaseException:
                sock.close()
                raise
            transport = client.get_transport()
            assert transport is not None
            transport.set_keepalive(15)
            self._client = client

    def is_connected(self) -> bool:
        client = self._client
        transport = client.get_transport() if client is not None else None
        return bool(transport is not None and transport.is_active() and transport.is_authenticated())

    def _transport(self) -> paramiko.Transport:
        with self._lock:
            if not self.is_connected():
                self.connect()
            assert self._client is not None
            transport = self._client.get_transport()
            assert transport is not None
            return transport

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._sftp is not None:
            with contextlib.suppress(Exception):
                self._sftp.close()
            self._sftp = None
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    def __enter__(self) -> SSHExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- commands --------------------------------------------------------------------------------
    def run(
        self,
        command: str,
        *,
        timeout: float | None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        sink: ChunkSink | None = None,
    ) -> RawResult:
        """Run ``command`` with bash in a new session; stream chunks to ``sink`` as they come."""
        markers = _Markers()
        demux = _Demux(markers, sink)
        with self._channels:
            chan = self._start_channel(markers.wrap(command, cwd, env or {}))
            try:
                if stdin:
                    chan.sendall(stdin)
                chan.shutdown_write()
                self._pump(chan, demux, command, timeout)
            except CommandTimeout:
                raise
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self._drop_broken()
                raise ConnectionLost(f"connection to {self.host} lost during {command!r}: {exc}") from exc
            finally:
                chan.close()
        if demux.exit_code is None:
            demux.flush()
            if not self.is_connected():
                raise ConnectionLost(f"connection to {self.host} lost during {command!r}")
            code = chan.recv_exit_status() if chan.exit_status_ready() else -1
            return RawResult(bytes(demux.out), bytes(demux.err), code)
        return RawResult(bytes(demux.out), bytes(demux.err), demux.exit_code)

    def _start_channel(self, wrapped: str, attempts: int = 4) -> paramiko.Channel:
        """Open a session channel and start ``wrapped`` in it.

        sshd may refuse a session request under load (a failed fork answers "Channel closed"):
        nothing ran then, so it is safe to ask again, with a short back-off.
        """
        for attempt in range(attempts):
            try:
                chan = self._transport().open_session(timeout=self._connect_timeout)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self._drop_broken()
                raise ConnectionLost(f"cannot open a channel to {self.host}: {exc}") from exc
            try:
                chan.exec_command(wrapped)
                return chan
            except (paramiko.SSHException, OSError, EOFError) as exc:
                chan.close()
                if attempt == attempts - 1 or not self.is_connected():
                    self._drop_broken()
                    raise ConnectionLost(f"{self.host} refused to start a command: {exc}") from exc
            time.sleep(0.05 * (attempt + 1))  # back-off before asking sshd again
        raise AssertionError("unreachable")

    def _pump(self, chan: paramiko.Channel, demux: _Demux, command: str, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not demux.done:
            wait = 1.0 if deadline is None else deadline - time.monotonic()
            if wait <= 0:
                self._kill_group(demux)
                demux.flush()
                raise CommandTimeout(command, timeout or 0.0, bytes(demux.out), bytes(demux.err))
            select.select([chan], [], [], min(wait, 1.0))
            progressed = False
            while chan.recv_stderr_ready():
                demux.feed("stderr", chan.recv_stderr(_READ_SIZE))
                progressed = True
            while chan.recv_ready():
                data = chan.recv(_READ_SIZE)
                if not data:
                    break
                demux.feed("stdout", data)
                progressed = True
            ended = chan.closed or (chan.eof_received and chan.exit_status_ready())
            if not progressed and ended and not chan.recv_stderr_ready():
                return
            if not chan.get_transport() or not self.is_connected():
                return

    def _kill_group(self, demux: _Demux) -> None:
        """Kill the timed-out command's whole process group through a second channel."""
        if demux.pgid is None:
            return
        with contextlib.suppress(paramiko.SSHException, OSError, EOFError):
            chan = self._transport().open_session(timeout=self._connect_timeout)
            try:
                chan.exec_command(f"kill -KILL -- -{demux.pgid} 2>/dev/null; true")
                chan.recv_exit_status()
            finally:
                chan.close()

    def stream(
        self,
        command: str,
        *,
        timeout: float | None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> Iterator[OutputChunk | RawResult]:
        """Yield output chunks as they arrive, then the final :class:`RawResult`."""
        chunks: list[OutputChunk | RawResult | BaseException] = []
        cond = threading.Condition()

        def sink(chunk: OutputChunk) -> None:
            with cond:
                chunks.append(chunk)
                cond.notify()

        def worker() -> None:
            item: RawResult | BaseException
            try:
                item = self.run(command, timeout=timeout, cwd=cwd, env=env, stdin=stdin, sink=sink)
            except BaseException as exc:  # handed to the consumer below
                item = exc
            with cond:
                chunks.append(item)
                cond.notify()

        thread = threading.Thread(target=worker, name=f"exec-stream-{self.host}", daemon=True)
        thread.start()
        while True:
            with cond:
                while not chunks:
                    cond.wait()
                batch = chunks[:]
                chunks.clear()
            for item in batch:
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, RawResult):
                    thread.join()
                    return

    def _drop_broken(self) -> None:
        with self._lock:
            if not self.is_connected():
                self._close_locked()

    # -- files -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _sftp_client(self, what: str, path: str) -> Iterator[paramiko.SFTPClient]:
        with self._sftp_lock:
            try:
                if self._sftp is None or not self.is_connected():
                    self._sftp = self._transport().open_sftp_client()
                yield self._sftp
            except FileNotFoundError as exc:
                raise FileOperationError(errno.ENOENT, f"{what}: no such file in the sandbox", path) from exc
            except PermissionError as exc:
                raise FileOperationError(
                    errno.EACCES, f"{what}: permission denied in the sandbox", path
                ) from exc
            except OSError as exc:
                if isinstance(exc, FileOperationError):
                    raise
                code = exc.errno or errno.EIO
                raise FileOperationError(code, f"{what}: {exc.strerror or exc}", path) from exc
            except (paramiko.SSHException, EOFError) as exc:
                self._sftp = None
                raise ConnectionLost(f"{what} {path}: SFTP connection failed: {exc}") from exc

    def write_bytes(self, path: str, data: bytes, mode: int | None = None) -> None:
        self.put_stream(io.BytesIO(data), path, mode)

    def read_bytes(self, path: str) -> bytes:
        buf = io.BytesIO()
        self.get_stream(path, buf)
        return buf.getvalue()

    def put_stream(self, src: IO[bytes], path: str, mode: int | None = None) -> int:
        """Copy a local stream into ``path`` in chunks (never the whole file in memory)."""
        total = 0
        with self._sftp_client("write", path) as sftp, sftp.open(path, "wb") as remote:
            remote.set_pipelined(True)
            while chunk := src.read(_SFTP_CHUNK):
                remote.write(chunk)
                total += len(chunk)
            if mode is not None:
                remote.chmod(mode)
        return total

    def get_stream(self, path: str, dst: IO[bytes]) -> int:
        total = 0
        with self._sftp_client("read", path) as sftp, sftp.open(path, "rb") as remote:
            size = remote.stat().st_size or 0
            if size:
                remote.prefetch(size)
            while chunk := remote.read(_SFTP_CHUNK):
                dst.write(chunk)
                total += len(chunk)
        return total

    def stat(self, path: str) -> paramiko.SFTPAttributes | None:
        try:
            with self._sftp_client("stat", path) as sftp:
                return sftp.stat(path)
        except FileOperationError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise

    def makedirs(self, path: str) -> None:
        with self._sftp_client("mkdir", path) as sftp:
            parts: list[str] = []
            head = path
            while head not in ("", "/"):
                parts.append(head)
                head = posixpath.dirname(head)
            for directory in reversed(parts):
                try:
                    attrs = sftp.stat(directory)
                except FileNotFoundError:
                    sftp.mkdir(directory)
                    continue
                if not stat.S_ISDIR(attrs.st_mode or 0):
                    raise FileOperationError(errno.ENOTDIR, "mkdir: not a directory", directory)

    def listdir(self, path: str) -> Sequence[paramiko.SFTPAttributes]:
        with self._sftp_client("list", path) as sftp:
            return sftp.listdir_attr(path)
