"""The one SSH/SFTP executor every backend uses (paramiko).

- Key auth only; the sandbox's host key is pinned before the first contact (the backend reads it
  from a channel we trust) and any other key is refused (``RejectPolicy``; never AutoAdd).
- One persistent transport per sandbox with ``TCP_NODELAY`` and ``TCP_QUICKACK`` re-armed before
  every read (see :class:`_QuickAckSocket`); a channel per command.
- AEAD ciphers first (AES-GCM: one pass for secrecy and integrity, ~25% faster SFTP than
  aes-ctr + HMAC in paramiko); no CBC, 3DES, SHA-1 or MD5 offered. Key exchange stays paramiko's
  (ML-KEM/X25519 hybrid, then curve25519); the pinned host key's type is asked for first.
- Every command runs in its own session (``setsid``): a timeout kills the whole process group.
- Completion is decided by end markers the wrapper prints after the command, not by EOF, so a
  command that leaves a background process holding stdout (``sleep 100 &``) returns at once.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import functools
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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Literal

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
# Offered in this order, each only if this paramiko has it (a server may pick any it shares).
PREFERRED_CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "aes128-ctr",
    "aes192-ctr",
    "aes256-ctr",
)
PREFERRED_MACS = (  # only used with the -ctr ciphers (GCM authenticates itself)
    "hmac-sha2-256-etm@openssh.com",
    "hmac-sha2-512-etm@openssh.com",
    "hmac-sha2-256",
    "hmac-sha2-512",
)
_PORT_POLL_S = 0.002  # while sshd of a just-started sandbox is not listening yet (refused at once)
_PORT_POLL_FAST_FOR_S = 2.0  # then, and after any other failure, back off from 0.01 to 0.2 s
# A SYN that gets no answer is sent again by the kernel only after 1 s (the initial RTO). While a
# sandbox boots, a first SYN can be lost (seen in about 1 of 30 concurrent creates): give each
# attempt this long, then try with a new socket (a SYN-ACK comes from the kernel: milliseconds).
_SYN_TIMEOUT_S = 0.2
_READ_SIZE = 65536
_SFTP_CHUNK = 1 << 20
# Channels that carry a file: a 16 MiB window and 256 KiB packets (paramiko's defaults are 2 MiB and
# 32 KiB) take the read from ~580 to ~700 MB/s: fewer packets for paramiko to handle in Python.
_BULK_WINDOW = 16 << 20
_BULK_PACKET = 256 << 10
_MARKER_MAX = 64  # longer than any marker: a partial marker can only sit in the last 64 bytes

# Exit codes of the read script (see SSHExecutor.get_stream), and cat's own errors, and what they mean.
_READ_EISDIR, _READ_EINVAL = 67, 68
_READ_ERRORS = {
    _READ_EISDIR: (errno.EISDIR, "is a directory"),
    _READ_EINVAL: (errno.EINVAL, "not a regular file (a pipe or socket would block)"),
}
_CAT_ERRORS = {
    "No such file or directory": (errno.ENOENT, "no such file in the sandbox"),
    "Permission denied": (errno.EACCES, "permission denied in the sandbox"),
    "Not a directory": (errno.ENOTDIR, "a parent is not a directory"),
    "Is a directory": (errno.EISDIR, "is a directory"),
}

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


class _SynTimeout(OSError):
    """The TCP connect got no answer in time (retried at once with a new SYN)."""


class _QuickAckSocket(socket.socket):
    """A TCP socket that asks the kernel to ACK every segment at once (``TCP_QUICKACK``).

    sshd does not set ``TCP_NODELAY`` on non-interactive sessions, so Nagle holds a small reply
    while an earlier small packet of its own is unacknowledged. After authentication sshd sends a
    ``hostkeys-00@openssh.com`` notice the client does not answer; with delayed ACKs (40 ms on
    Linux) the confirmation of the first channel then waited ~40 ms for our ACK. Linux clears
    quick-ack mode by itself, hence the re-arm before each read (one cheap setsockopt).
    """

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        with contextlib.suppress(OSError):
            self.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return super().recv(bufsize, flags)


def _tcp_connect(host: str, port: int, timeout: float) -> socket.socket:
    """A connected TCP socket with ``TCP_NODELAY`` (and quick ACKs where the kernel has them)."""
    sock = socket.create_connection((host, port), timeout=timeout)
    if hasattr(socket, "TCP_QUICKACK"):
        quick = _QuickAckSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
        quick.settimeout(timeout)
        sock = quick
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except BaseException:
        sock.close()
        raise
    return sock


def _transport(
    sock: Any,
    /,
    *,
    gss_kex: bool = False,  # in the stubs' factory protocol; GSS-API is never used here
    gss_deleg_creds: bool = True,
    disabled_algorithms: Mapping[str, Iterable[str]] | None = None,
) -> paramiko.Transport:
    """paramiko's transport with our algorithm preferences (``SSHClient.connect(transport_factory=)``)."""
    transport = paramiko.Transport(sock, disabled_algorithms=disabled_algorithms)
    opts = transport.get_security_options()
    opts.ciphers = tuple(c for c in PREFERRED_CIPHERS if c in opts.ciphers)
    opts.digests = tuple(m for m in PREFERRED_MACS if m in opts.digests)
    return transport


def _send_input(chan: paramiko.Channel, stdin: bytes | None) -> None:
    """Send ``stdin`` then EOF; a command that ended without reading its input is not an error."""
    if stdin and not _send_data(chan, stdin):
        return  # the command exited and sshd closed the channel: nothing left to send
    _send_eof(chan)


def _send_eof(chan: paramiko.Channel) -> None:
    """``chan.shutdown_write()`` without its race (see :func:`_send_locked`)."""
    _send_locked(chan, functools.partial(_eof_message, chan))


def _close_quietly(chan: paramiko.Channel) -> None:
    """Close a channel whose transport may have died (its CLOSE cannot be sent then)."""
    with contextlib.suppress(paramiko.SSHException, OSError, EOFError):
        chan.close()


# paramiko's Channel.sendall and shutdown_write build a message under the channel lock but put
# it on the wire after releasing it. When a short command ends in between, the reader thread
# handles sshd's CLOSE and sends ours first; sshd has freed the channel when our DATA or EOF
# arrives and drops the whole connection ("... packet referred to nonexistent channel"): about
# 1 in 400 short commands under load. Here a message is built and sent while holding the
# transport's send lock (taken before the channel lock: none of paramiko's senders holds the
# channel lock while waiting for the send lock), and not at all once the channel is closed, so
# it always precedes our CLOSE.
def _send_locked(
    chan: paramiko.Channel, build: Callable[[], paramiko.Message | None], timeout_s: float = 30.0
) -> bool:
    """Send what ``build()`` makes (called under the channel lock); False if it made nothing
    (the channel closed) or the transport is gone."""
    transport = chan.get_transport()
    deadline = time.monotonic() + timeout_s
    while True:
        transport.clear_to_send.wait(0.1)  # not during a key re-exchange
        if not transport.is_active():
            return False
        with transport.clear_to_send_lock:
            if transport.clear_to_send.is_set():
                with chan.lock:
                    message = build()
                if message is None:
                    return False
                transport.packetizer.send_message(message)  # what Transport._send_message does
                return True
        if time.monotonic() > deadline:
            raise paramiko.SSHException("key re-exchange did not finish: cannot send")


def _eof_message(chan: paramiko.Channel) -> paramiko.Message | None:
    if chan.closed or chan.eof_sent:
        return None
    chan.eof_sent = True
    message = paramiko.Message()
    message.add_byte(paramiko.common.cMSG_CHANNEL_EOF)
    message.add_int(chan.remote_chanid)
    return message


def _send_data(chan: paramiko.Channel, data: bytes) -> bool:
    """``chan.sendall(data)`` that never sends after the channel closed; False if it closed first.

    Only this thread sends on the channel, so the window it waited for can only grow until the
    message takes it.
    """
    view = memoryview(data)
    while view:
        with chan.out_buffer_cv:  # the channel lock; the reader notifies on WINDOW_ADJUST and CLOSE
            while chan.out_window_size == 0 and not chan.closed:
                transport = chan.get_transport()
                if transport is None or not transport.is_active():
                    raise EOFError("the connection closed while sending input")
                chan.out_buffer_cv.wait(1.0)
        taken = [0]
        if not _send_locked(chan, functools.partial(_data_message, chan, view, taken)):
            return False
        view = view[taken[0] :]
    return True


def _data_message(chan: paramiko.Channel, view: memoryview, taken: list[int]) -> paramiko.Message | None:
    """A DATA message with as much of ``view`` as the window allows; ``taken[0]`` says how much."""
    if chan.closed or chan.eof_sent:
        return None
    taken[0] = min(len(view), chan.out_window_size, chan.out_max_packet_size - 64)
    chan.out_window_size -= taken[0]
    message = paramiko.Message()
    message.add_byte(paramiko.common.cMSG_CHANNEL_DATA)
    message.add_int(chan.remote_chanid)
    message.add_string(view[: taken[0]].tobytes())
    return message


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
        start = time.monotonic()
        deadline = start + (timeout_s if timeout_s is not None else self._connect_timeout)
        last: Exception | None = None
        backoff = 0.01
        while True:
            fast = time.monotonic() - start < _PORT_POLL_FAST_FOR_S
            remaining = max(0.2, deadline - time.monotonic())
            try:
                self._connect_once(remaining, syn_timeout=_SYN_TIMEOUT_S if fast else min(remaining, 5.0))
                return
            except HostKeyMismatch:
                raise
            except _SynTimeout as exc:  # no answer to the SYN: send a new one now, not in 1 s
                last = exc
                if time.monotonic() >= deadline:
                    break
                continue
            except ConnectionRefusedError as exc:
                # A booting sandbox's sshd listens ~10 ms after lxc-start returns, and a closed port
                # answers at once: poll it quickly for a while.
                last = exc
                delay = _PORT_POLL_S if fast else backoff
            except (OSError, paramiko.SSHException, EOFError) as exc:
                last = exc  # sshd answered but the handshake failed: back off
                delay = backoff
            if time.monotonic() + delay >= deadline:
                break
            time.sleep(delay)  # between connection attempts to a booting sandbox
            if delay == backoff:
                backoff = min(backoff * 2, 0.2)
        raise SandboxNotReady(f"SSH to {self.user}@{self.host}:{self.port} not ready: {last}")

    def _connect_once(self, timeout: float, syn_timeout: float = 5.0) -> None:
        with self._lock:
            if self._client is not None and self.is_connected():
                return
            self._close_locked()
            try:
                sock = _tcp_connect(self.host, self.port, min(timeout, syn_timeout))
            except TimeoutError as exc:
                why = f"no answer from {self.host}:{self.port} within {syn_timeout:.2f} s"
                raise _SynTimeout(why) from exc
            sock.settimeout(timeout)
            client = paramiko.SSHClient()
            try:
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
                    transport_factory=_transport,
                )
            except paramiko.BadHostKeyException as exc:
                client.close()
                sock.close()
                raise HostKeyMismatch(
                    f"{self.host} presented host key {exc.key.get_fingerprint().hex()} "
                    f"but {exc.expected_key.get_fingerprint().hex()} is pinned: refusing to connect"
                ) from exc
            except BaseException:
                client.close()  # stops paramiko's reader thread (else it logs EBADF once sock closes)
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
                _send_input(chan, stdin)
                self._pump(chan, demux, command, timeout)
            except CommandTimeout:
                raise
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self._drop_broken()
                raise ConnectionLost(f"connection to {self.host} lost during {command!r}: {exc}") from exc
            finally:
                _close_quietly(chan)
        if demux.exit_code is None:
            demux.flush()
            if not self.is_connected():
                raise ConnectionLost(f"connection to {self.host} lost during {command!r}")
            code = chan.recv_exit_status() if chan.exit_status_ready() else -1
            return RawResult(bytes(demux.out), bytes(demux.err), code)
        return RawResult(bytes(demux.out), bytes(demux.err), demux.exit_code)

    def _start_channel(
        self, wrapped: str, attempts: int = 4, *, window: int | None = None, packet: int | None = None
    ) -> paramiko.Channel:
        """Open a session channel and start ``wrapped`` in it.

        sshd may refuse a session request under load (a failed fork answers "Channel closed"):
        nothing ran then, so it is safe to ask again, with a short back-off.
        """
        for attempt in range(attempts):
            try:
                chan = self._transport().open_session(
                    window_size=window, max_packet_size=packet, timeout=self._connect_timeout
                )
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self._drop_broken()
                raise ConnectionLost(f"cannot open a channel to {self.host}: {exc}") from exc
            try:
                chan.exec_command(wrapped)
                return chan
            except (paramiko.SSHException, OSError, EOFError) as exc:
                _close_quietly(chan)
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
                _close_quietly(chan)

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
        """Copy the file at ``path`` into ``dst`` in chunks; returns its size.

        The bytes come from ``cat`` on a channel of their own, not SFTP: paramiko's SFTP read
        (request bookkeeping per 32 KiB block in Python) reaches about a third of OpenSSH sftp's
        speed, a plain channel about all of it. The shell checks the path first and answers with
        an exit code the error mapping below understands; the path is quoted, never interpolated.
        """
        quoted = shlex.quote(path)
        script = (
            f"f={quoted}; if [ -d \"$f\" ]; then exit {_READ_EISDIR}; fi; "
            f"if [ -p \"$f\" ] || [ -S \"$f\" ]; then exit {_READ_EINVAL}; fi; "
            'LC_ALL=C exec cat -- "$f"'
        )
        total = 0
        with self._channels:
            chan = self._start_channel(script, window=_BULK_WINDOW, packet=_BULK_PACKET)
            try:
                _send_eof(chan)
                while data := chan.recv(_SFTP_CHUNK):
                    dst.write(data)
                    total += len(data)
                code = chan.recv_exit_status()
                err = b""
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(_READ_SIZE)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                if isinstance(exc, OSError) and exc.errno is not None and not isinstance(exc, socket.timeout):
                    # the local destination failed (disk full...), not the connection
                    why = f"read: writing the copy failed: {exc.strerror}"
                    raise FileOperationError(exc.errno, why, path) from exc
                self._drop_broken()
                raise ConnectionLost(f"read {path}: connection to {self.host} lost: {exc}") from exc
            finally:
                _close_quietly(chan)
        if code == 0:
            return total
        if code == -1 or not self.is_connected():
            raise ConnectionLost(f"read {path}: connection to {self.host} lost")
        known = _READ_ERRORS.get(code)
        if known is not None:
            raise FileOperationError(known[0], f"read: {known[1]}", path)
        said = (err.decode("utf-8", "replace").strip().splitlines() or [f"cat exited with {code}"])[-1]
        for text, (number, meaning) in _CAT_ERRORS.items():  # cat runs with LC_ALL=C
            if said.endswith(text):
                raise FileOperationError(number, f"read: {meaning}", path)
        raise FileOperationError(errno.EIO, f"read: {said}", path)

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
