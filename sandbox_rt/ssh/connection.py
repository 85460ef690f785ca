"""One pinned, key-authenticated SSH connection to one sandbox: what :class:`.executor.SSHExecutor`
runs commands and file transfers on.

- Key auth only; the sandbox's host key is pinned before the first contact (the backend reads it
  from a channel we trust) and any other key is refused (``RejectPolicy``; never AutoAdd).
- One persistent transport per sandbox (see :mod:`.wire` for the socket, algorithms and the
  send/receive fixes), connected with retries while a booting sandbox's sshd comes up; a session
  channel per command (at most :data:`MAX_PARALLEL_CHANNELS` at once) and one SFTP session, whose
  failures become typed errors here.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import paramiko

from ..errors import ConnectionLost, FileOperationError, HostKeyMismatch, SandboxNotReady
from . import wire
from .files import name_too_long

__all__ = ["MAX_PARALLEL_CHANNELS", "SSHConnection", "load_private_key", "parse_public_key"]

MAX_PARALLEL_CHANNELS = 64  # below sshd's MaxSessions (100 in the template)
_PORT_POLL_S = 0.002  # while sshd of a just-started sandbox is not listening yet (refused at once)
_PORT_POLL_FAST_FOR_S = 2.0  # then, and after any other failure, back off from 0.01 to 0.2 s
# A SYN that gets no answer is sent again by the kernel only after 1 s (the initial RTO). While a
# sandbox boots, a first SYN can be lost (seen in about 1 of 30 concurrent creates): give each
# attempt this long, then try with a new socket (a SYN-ACK comes from the kernel: milliseconds).
_SYN_TIMEOUT_S = 0.2
SFTP_REPLY_TIMEOUT_S = 60.0  # one SFTP reply at most this late (a FIFO would block an open for ever)


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


class SSHConnection:
    """A persistent SSH transport to one sandbox, its channels and its SFTP session; thread-safe."""

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
        self.sftp_reply_timeout_s = SFTP_REPLY_TIMEOUT_S
        self._client: paramiko.SSHClient | None = None
        self._sftp: wire.BoundedSFTPClient | None = None
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
                sock = wire.tcp_connect(self.host, self.port, min(timeout, syn_timeout))
            except TimeoutError as exc:
                why = f"no answer from {self.host}:{self.port} within {syn_timeout:.2f} s"
                raise _SynTimeout(why) from exc
            sock.settimeout(timeout)
            client = paramiko.SSHClient()
            try:
                known = self.host if self.port == 22 else f"[{self.host}]:{self.port}"  # OpenSSH's form
                client.get_host_keys().add(known, self._host_key.get_name(), self._host_key)
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
                    transport_factory=wire.make_transport,
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
                wire.close_quietly(chan)
                if attempt == attempts - 1 or not self.is_connected():
                    self._drop_broken()
                    raise ConnectionLost(f"{self.host} refused to start a command: {exc}") from exc
            time.sleep(0.05 * (attempt + 1))  # back-off before asking sshd again
        raise AssertionError("unreachable")

    def _drop_broken(self) -> None:
        with self._lock:
            if not self.is_connected():
                self._close_locked()

    # -- the SFTP session ---------------------------------------------------------------------
    @contextlib.contextmanager
    def _sftp_client(self, what: str, path: str) -> Iterator[wire.BoundedSFTPClient]:
        with self._sftp_lock:
            try:
                if self._sftp is None or not self.is_connected():
                    sftp = wire.BoundedSFTPClient.from_transport(self._transport())
                    if sftp is None:
                        raise paramiko.SSHException("the sandbox refused the SFTP subsystem")
                    self._sftp = sftp
                # every reply within a bound: a write opened on a FIFO the sandbox planted would
                # otherwise block (and hold this lock, and the caller's thread) for ever
                channel = self._sftp.get_channel()
                if channel is not None:
                    channel.settimeout(self.sftp_reply_timeout_s)
                yield self._sftp
            except TimeoutError as exc:
                self._reset_sftp()  # a request is still pending on that session: never reuse it
                why = f"{what}: no answer from the sandbox within {self.sftp_reply_timeout_s:g} s"
                why += " (a FIFO, or a stuck file system?)"
                raise FileOperationError(errno.ETIMEDOUT, why, path) from exc
            except FileNotFoundError as exc:
                raise FileOperationError(errno.ENOENT, f"{what}: no such file in the sandbox", path) from exc
            except PermissionError as exc:
                raise FileOperationError(
                    errno.EACCES, f"{what}: permission denied in the sandbox", path
                ) from exc
            except OSError as exc:
                if isinstance(exc, FileOperationError):
                    raise
                if exc.errno is None and name_too_long(path):  # OpenSSH: "Bad message"
                    raise FileOperationError(errno.ENAMETOOLONG, f"{what}: a name is too long", path) from exc
                code = exc.errno or errno.EIO
                raise FileOperationError(code, f"{what}: {exc.strerror or exc}", path) from exc
            except (paramiko.SSHException, paramiko.SFTPError, EOFError, UnicodeError) as exc:
                # a protocol error (or a name that is not UTF-8) leaves the session in an unknown state
                self._reset_sftp()
                if isinstance(exc, UnicodeError):
                    why = f"{what}: the sandbox sent a name that is not UTF-8"
                    raise FileOperationError(errno.EILSEQ, why, path) from exc
                raise ConnectionLost(f"{what} {path}: SFTP connection failed: {exc}") from exc

    def _reset_sftp(self) -> None:
        if self._sftp is not None:
            with contextlib.suppress(Exception):
                self._sftp.close()
            self._sftp = None
