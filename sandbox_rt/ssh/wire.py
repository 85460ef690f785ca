"""The SSH wire under the executor: sockets, paramiko's transport with our algorithms, and fixes to
how paramiko sends and receives channel data.

- TCP with ``TCP_NODELAY`` and ``TCP_QUICKACK`` re-armed before every read (:class:`QuickAckSocket`).
- AEAD ciphers first (AES-GCM: one pass for secrecy and integrity, ~25% faster SFTP than
  aes-ctr + HMAC in paramiko); no CBC, 3DES, SHA-1 or MD5 offered. Key exchange stays paramiko's.
- Channel DATA/EOF sent under the transport's send lock, never after the channel closed
  (:func:`send_locked`: paramiko's own ``sendall``/``shutdown_write`` race a concurrent CLOSE).
- The server must respect the receive window we advertise: paramiko buffers whatever arrives, so a
  lying server could fill the host's memory. :class:`BoundedTransport` drops the connection instead.
- SFTP replies are bounded in size (:class:`BoundedSFTPClient`).
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import paramiko
from paramiko.common import MSG_CHANNEL_DATA, MSG_CHANNEL_EXTENDED_DATA

from ..limits import SFTP_MAX_PACKET

__all__ = [
    "PREFERRED_CIPHERS",
    "PREFERRED_MACS",
    "BoundedSFTPClient",
    "BoundedTransport",
    "WindowViolation",
    "close_quietly",
    "make_transport",
    "send_data",
    "send_eof",
    "send_input",
    "tcp_connect",
]

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


class QuickAckSocket(socket.socket):
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


def tcp_connect(host: str, port: int, timeout: float) -> socket.socket:
    """A connected TCP socket with ``TCP_NODELAY`` (and quick ACKs where the kernel has them)."""
    sock = socket.create_connection((host, port), timeout=timeout)
    if hasattr(socket, "TCP_QUICKACK"):
        quick = QuickAckSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
        quick.settimeout(timeout)
        sock = quick
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except BaseException:
        sock.close()
        raise
    return sock


# -- receiving: the window is a promise the server must keep ----------------------------------------
class WindowViolation(paramiko.SSHException):
    """The server sent more channel data than the window we advertised allows."""


def _unread(chan: paramiko.Channel) -> int:
    return len(chan.in_buffer) + len(chan.in_stderr_buffer)


def _check_window(chan: paramiko.Channel, size: int) -> None:
    """Bytes received and not yet acknowledged by a WINDOW_ADJUST (buffered, or read and not yet
    re-advertised: ``in_window_sofar``) never exceed the window; an honest server cannot send more."""
    with chan.lock:
        if _unread(chan) + chan.in_window_sofar + size > chan.in_window_size:
            raise WindowViolation(
                f"the server sent {size} bytes on channel {chan.chanid} past its window "
                f"({chan.in_window_size} bytes): dropping the connection"
            )


def _feed_in_window(chan: paramiko.Channel, m: paramiko.Message) -> None:
    data = m.get_binary()
    _check_window(chan, len(data))
    chan.in_buffer.feed(data)  # what Channel._feed does


def _feed_extended_in_window(chan: paramiko.Channel, m: paramiko.Message) -> None:
    code = m.get_int()
    data = m.get_binary()
    _check_window(chan, len(data))
    if code == 1:  # stderr (paramiko also drops other types)
        (chan.in_buffer if chan.combine_stderr else chan.in_stderr_buffer).feed(data)


class BoundedTransport(paramiko.Transport):
    """paramiko's transport, fixed in two places:

    - channel data beyond the advertised window is refused (a violation raises in the reader
      thread, which ends the transport: the caller sees ConnectionLost);
    - the reader thread never waits for a key re-exchange. paramiko answers a channel's CLOSE (and
      a request wanting a reply) from the reader thread through ``_send_user_message``, which
      waits while a re-exchange runs; but only the reader thread can finish the re-exchange, so a
      CLOSE that arrived just after our KEXINIT hung the connection for 30 s and then killed it
      ("Key-exchange timed out waiting for key negotiation": every ~512 MiB, paramiko's re-key
      interval, with commands ending meanwhile). Here such a message waits in a queue and goes out
      as soon as the new keys are in force.
    """

    _channel_handler_table = {  # noqa: RUF012 (paramiko's own class-level dispatch table)
        **paramiko.Transport._channel_handler_table,  # type: ignore[attr-defined]
        MSG_CHANNEL_DATA: _feed_in_window,
        MSG_CHANNEL_EXTENDED_DATA: _feed_extended_in_window,
    }

    def __init__(self, sock: Any, **kwargs: Any) -> None:
        self._deferred: list[paramiko.Message] = []  # the reader's messages held during a re-key
        super().__init__(sock, **kwargs)

    def _send_user_message(self, data: paramiko.Message) -> None:
        if threading.current_thread() is self:
            with self.clear_to_send_lock:
                if not self.clear_to_send.is_set():
                    self._deferred.append(data)
                    return
                self._send_message(data)  # type: ignore[attr-defined]
                return
        super()._send_user_message(data)  # type: ignore[misc]

    def _parse_newkeys(self, m: paramiko.Message) -> None:
        super()._parse_newkeys(m)  # type: ignore[misc]
        with self.clear_to_send_lock:
            if self.clear_to_send.is_set():
                held, self._deferred = self._deferred, []
                for message in held:
                    self._send_message(message)  # type: ignore[attr-defined]


def make_transport(
    sock: Any,
    /,
    *,
    gss_kex: bool = False,  # in the stubs' factory protocol; GSS-API is never used here
    gss_deleg_creds: bool = True,
    disabled_algorithms: Mapping[str, Iterable[str]] | None = None,
) -> paramiko.Transport:
    """Our transport with our algorithm preferences (``SSHClient.connect(transport_factory=)``)."""
    transport = BoundedTransport(sock, disabled_algorithms=disabled_algorithms)
    opts = transport.get_security_options()
    opts.ciphers = tuple(c for c in PREFERRED_CIPHERS if c in opts.ciphers)
    opts.digests = tuple(m for m in PREFERRED_MACS if m in opts.digests)
    return transport


class BoundedSFTPClient(paramiko.SFTPClient):
    """An SFTP client that refuses replies larger than :data:`~sandbox_rt.limits.SFTP_MAX_PACKET`
    (paramiko reads any size below 16 MiB into memory)."""

    def _read_packet(self) -> tuple[int, bytes]:
        head = self._read_all(4)  # type: ignore[attr-defined]
        size = int.from_bytes(head, "big")
        if size > SFTP_MAX_PACKET:
            raise paramiko.SFTPError(f"SFTP reply of {size} bytes refused (at most {SFTP_MAX_PACKET})")
        data: bytes = self._read_all(size)  # type: ignore[attr-defined]
        if size == 0:
            return 0, b""
        return data[0], data[1:]


# -- sending: never after the channel closed -----------------------------------------------------
def send_input(chan: paramiko.Channel, stdin: bytes | None) -> None:
    """Send ``stdin`` then EOF; a command that ended without reading its input is not an error."""
    if stdin and not send_data(chan, stdin):
        return  # the command exited and sshd closed the channel: nothing left to send
    send_eof(chan)


def send_eof(chan: paramiko.Channel) -> None:
    """``chan.shutdown_write()`` without its race (see :func:`send_locked`)."""
    send_locked(chan, functools.partial(_eof_message, chan))


def close_quietly(chan: paramiko.Channel) -> None:
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
def send_locked(
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


def send_data(chan: paramiko.Channel, data: bytes) -> bool:
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
        if not send_locked(chan, functools.partial(_data_message, chan, view, taken)):
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
