"""Bounds on what the host accepts from a sandbox, in one place every front door reads.

Everything a sandbox sends back (command output, file bytes, directory listings, names) is hostile
input: the sandbox may run a lying SSH/SFTP server. These caps bound the host's memory and disk
whatever it sends. Each is a default: the calls that take one (``exec(max_output=)``,
``read_file(max_bytes=)``, ``download(max_bytes=)``) accept another value per call.
"""

from __future__ import annotations

import dataclasses

from .errors import ConfigError

__all__ = [
    "DEFAULT_DOWNLOAD_MAX_BYTES",
    "DEFAULT_MAX_OUTPUT",
    "DEFAULT_READ_MAX_BYTES",
    "DOWNLOAD_MAX_DEPTH",
    "DOWNLOAD_MAX_ENTRIES",
    "FILE_IDLE_TIMEOUT_S",
    "HTTP_LIMITS",
    "MAX_NAME_BYTES",
    "SFTP_MAX_PACKET",
    "STREAM_QUEUE_CHUNKS",
    "HttpLimits",
]

# exec: bytes kept per stream (stdout, stderr); the rest is dropped and the result says so.
DEFAULT_MAX_OUTPUT = 64 << 20
# read_file: the largest file read into memory (its apparent size: a sparse file counts in full).
DEFAULT_READ_MAX_BYTES = 256 << 20
# download: the most bytes one download writes on the host (a file, or all files of a tree).
DEFAULT_DOWNLOAD_MAX_BYTES = 8 << 30
# download of a directory tree: entries listed in all, and directory levels below the top.
DOWNLOAD_MAX_ENTRIES = 100_000
DOWNLOAD_MAX_DEPTH = 64
# a name that comes back from a sandbox (one path component), in UTF-8 bytes (Linux's NAME_MAX).
MAX_NAME_BYTES = 255
# a file read or download that sends nothing for this long has failed (a FIFO swapped in, a mute server).
FILE_IDLE_TIMEOUT_S = 60.0
# the largest SFTP reply accepted (OpenSSH's sftp-server sends at most 256 KiB; a READDIR reply is small).
SFTP_MAX_PACKET = 4 << 20
# exec_stream: output chunks buffered between the SSH reader and a slow consumer; beyond, reading
# pauses, the SSH window closes and the command blocks on its output (bounded memory, no loss).
STREAM_QUEUE_CHUNKS = 64


# -- the HTTP front door (``sandbox-rt serve`` today, the framework app of #18 tomorrow) -------------------
@dataclasses.dataclass(frozen=True)
class HttpLimits:
    """What one client may cost the HTTP API's host. ``sandbox-rt serve`` sets some from the command line.

    A request head (the request line and every header) must arrive within ``header_timeout_s``
    and be at most ``max_head_bytes`` (else 408 / 414 / 431). Until the bearer token is checked, a
    body may be at most ``max_unauth_body_bytes`` and must arrive within the same deadline; with a
    valid token, up to ``max_body_bytes``, each read stalling at most ``io_timeout_s`` (413 / 408).
    Between two requests a keep-alive connection waits at most ``idle_timeout_s``. At most
    ``max_connections`` connections are open: a new one takes the slot of the oldest that has not
    sent a request with a valid token (that one gets a 503 and is closed), and gets a 503 itself
    only when every open one has; one client address keeps at most ``max_pending_per_address``
    connections without a valid token (loopback excepted). A running command
    (a JSON exec or an SSE stream) is bounded by its own timeout, not by these: a silent command
    sends and reads nothing, so no timeout here runs out.
    """

    # a request body with a valid bearer token (file uploads, exec stdin)
    max_body_bytes: int = 64 << 20
    # a body before (or without) a valid token: the public routes, and a 401 that is drained, not closed
    max_unauth_body_bytes: int = 4 << 10
    # the request line plus every header line
    max_head_bytes: int = 8 << 10
    # an authenticated request's body that is skipped after an early error to keep the connection
    max_drain_bytes: int = 64 << 10
    # open connections (each holds a thread): when all are open, a new one takes the slot of the oldest
    # that has not sent a request with a valid token (sandbox_rt/web/slots.py); with none such, 503
    max_connections: int = 128
    # connections from one client address (IPv6: a /64) that have not sent a valid token yet; its next
    # one takes the slot of its own oldest. Not for loopback (every local client has that address)
    max_pending_per_address: int = 32
    # from accepting a connection (or a request's first byte) to the end of its head and small body
    header_timeout_s: float = 10.0
    # a keep-alive connection between two requests
    idle_timeout_s: float = 30.0
    # one read or write that makes no progress (a stalled upload, a client that stops reading)
    io_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_s"):
                ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 1e6
                what = "a positive number of seconds"
            else:
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
                what = "a positive whole number"
            if not ok:
                raise ConfigError(f"HTTP limit {f.name}={value!r} must be {what}")


HTTP_LIMITS = HttpLimits()
