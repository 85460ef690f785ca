"""The SSH wire under the executor: sockets, paramiko's transport with our algorithms, and fixes to
how paramiko sends and receives channel data.

- TCP with ``TCP_NODELAY`` and ``TCP_QUICKACK`` re-armed before every read (:class:`QuickAckSocket`).
- AEAD ciphers first (AES-GCM: one pass for secrecy and integrity, ~25% faster SFTP than
  aes-ctr + HMAC in paramiko); no CBC, 3DES, SHA-1 or MD5 offered. Key exchange stays paramiko's.
- Channel DATA/EOF sent under the transport's send lock, never after the channel closed
  (:func:`send_locked`: paramiko's own ``sendall``/``shutdown_write`` race a concurrent CLOSE).
- The server must respect the receive window we advertise: paramiko buffers whatever arrives, so a
  lying server could fill the host's memory. :class:`BoundedTransport` drops the connection instead.
- SFTP replies are bounded in size, their counts checked against their bytes, status texts cut
  (:class:`BoundedSFTPClient`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import paramiko
from paramiko.common import MSG_CHANNEL_DATA, MSG_CHANNEL_EXTENDED_DATA
from paramiko.sftp import (
    CMD_ATTRS,
    CMD_CLOSE,
    CMD_HANDLE,
    CMD_NAME,
    CMD_OPENDIR,
    CMD_READDIR,
    SFTP_EOF,
    SFTP_NO_SUCH_FILE,
    SFTP_OK,
    SFTP_PERMISSION_DENIED,
)

from ..output_limits import SFTP_MAX_PACKET
from .mounts import MOUNTINFO, MOUNTINFO_MAX, Mount, parse_mountinfo

__all__ = [
    "PREFERRED_CIPHERS",
    "PREFERRED_MACS",
    "STATUS_TEXT_MAX",
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
    """paramiko's SFTP client, bounded against a lying server:

    - replies larger than :data:`~sandbox_rt.output_limits.SFTP_MAX_PACKET` are refused (paramiko reads
      any size below 16 MiB into memory);
    - a NAME or ATTRS reply whose counts promise more than its bytes hold is refused: paramiko pads
      a short reply with zeros, so an extended-attribute count of 2**32 - 1 in one ``stat`` answer
      kept it parsing empty strings for half an hour (measured: 0.46 s per million);
    - a status text is cut to :data:`STATUS_TEXT_MAX` characters, bad UTF-8 replaced (paramiko
      raised UnicodeDecodeError; it ends up in the messages of our errors).

    :meth:`has_entries` asks whether a directory is empty without reading its whole listing;
    :meth:`mounts` reads the mounts the server sees.
    """

    def _read_packet(self) -> tuple[int, bytes]:
        head = self._read_all(4)  # type: ignore[attr-defined]
        size = int.from_bytes(head, "big")
        if size > SFTP_MAX_PACKET:
            raise paramiko.SFTPError(f"SFTP reply of {size} bytes refused (at most {SFTP_MAX_PACKET})")
        data: bytes = self._read_all(size)  # type: ignore[attr-defined]
        if size == 0:
            return 0, b""
        kind, body = data[0], data[1:]
        if kind in (CMD_NAME, CMD_ATTRS) and not _counts_fit(kind, body):
            raise paramiko.SFTPError(f"SFTP reply refused: its counts promise more than its {size} bytes")
        return kind, body

    def _convert_status(self, msg: paramiko.Message) -> None:
        """paramiko's, with the text bounded: EOFError at the end of a listing or file,
        FileNotFoundError, PermissionError, or a plain OSError (no errno) for any other status."""
        code = msg.get_int()
        text = msg.get_string()[: STATUS_TEXT_MAX * 4].decode("utf-8", "replace")[:STATUS_TEXT_MAX]
        if code == SFTP_OK:
            return
        if code == SFTP_EOF:
            raise EOFError(text)
        if code == SFTP_NO_SUCH_FILE:
            raise FileNotFoundError(errno.ENOENT, text)
        if code == SFTP_PERMISSION_DENIED:
            raise PermissionError(errno.EACCES, text)
        raise OSError(text)

    def has_entries(self, path: str) -> bool:
        """Whether directory ``path`` lists a name besides ``.`` and ``..`` in its first READDIR
        reply (OpenSSH's sftp-server puts up to 100 names in one). Raises OSError as ``stat`` does."""
        kind, msg = self._request(CMD_OPENDIR, path)  # type: ignore[attr-defined]
        if kind != CMD_HANDLE:
            raise paramiko.SFTPError("Expected handle")
        handle = msg.get_binary()
        try:
            kind, msg = self._request(CMD_READDIR, handle)  # type: ignore[attr-defined]
        except (OSError, EOFError) as exc:  # a status (EOF: nothing listed at all)
            self._close_handle(handle)
            if isinstance(exc, EOFError):
                return False
            raise
        if kind != CMD_NAME:  # out of step: the caller drops the session, no CLOSE
            raise paramiko.SFTPError("Expected name response")
        self._close_handle(handle)
        count = msg.get_int()  # the reply's counts fit its bytes (_read_packet)
        if count > 2:  # a directory has only two names that are not entries
            return True
        for _ in range(count):
            name = msg.get_string()
            msg.get_string()  # the long name
            paramiko.SFTPAttributes._from_msg(msg)  # type: ignore[attr-defined]
            if name not in (b".", b".."):
                return True
        return False

    def mounts(self) -> list[Mount]:
        """The mounts the SFTP server sees (its ``/proc/self/mountinfo``, at most MOUNTINFO_MAX
        bytes: ValueError past that). Raises OSError as ``open`` does."""
        with self.open(MOUNTINFO, "rb") as f:
            data = f.read(MOUNTINFO_MAX + 1)
        if len(data) > MOUNTINFO_MAX:
            raise ValueError(f"{MOUNTINFO} is longer than {MOUNTINFO_MAX} bytes")
        return parse_mountinfo(data.decode("utf-8", "replace"))

    def _close_handle(self, handle: bytes) -> None:
        with contextlib.suppress(OSError, EOFError):
            self._request(CMD_CLOSE, handle)  # type: ignore[attr-defined]


STATUS_TEXT_MAX = 200  # characters of an SFTP status text kept
_U32 = struct.Struct(">I")
# the bytes after the flags of SFTP attributes by the flags' low 4 bits (size 8, uid and gid 8,
# permissions 4, atime and mtime 8); the extended pairs come after them
_ATTR_FIXED = tuple(8 * (low & 1) + 4 * (low & 2) + (low & 4) + (low & 8) for low in range(16))


def _counts_fit(kind: int, body: bytes) -> bool:
    """Whether every length and count in a NAME or ATTRS reply (after its type byte) fits in it."""
    size, u32 = len(body), _U32.unpack_from
    try:
        pos, count = 4, 1  # after the request id; an ATTRS reply holds one set of attributes
        if kind == CMD_NAME:
            (count,), pos = u32(body, 4), 8
            if count * 12 > size - pos:  # an entry takes at least 12 bytes (two empty strings, flags)
                return False
        for _ in range(count):
            if kind == CMD_NAME:
                for _ in (0, 1):  # the name and the long name
                    (n,) = u32(body, pos)
                    pos += 4 + n
            (flags,) = u32(body, pos)
            pos += 4 + _ATTR_FIXED[flags & 0xF]
            if flags & paramiko.SFTPAttributes.FLAG_EXTENDED:
                (pairs,) = u32(body, pos)
                pos += 4
                if pairs * 8 > size - pos:  # a pair takes at least 8 bytes (two empty strings)
                    return False
                for _ in range(2 * pairs):
                    (n,) = u32(body, pos)
                    pos += 4 + n
            if pos > size:
                return False
        return True
    except struct.error:  # a length or count past the end
        return False


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
