"""What one client may cost the host of an HTTP front door (``sandbox-rt serve``: the native API and
the OpenSandbox dialect; ``sandbox-rt mcp --transport http``): one :class:`HttpLimits`, its defaults in
:data:`HTTP_LIMITS`, kept by the transport (:mod:`.transport`, :mod:`.slots`) and the gate."""

from __future__ import annotations

import dataclasses

from ..errors import ConfigError

__all__ = ["HTTP_LIMITS", "HttpLimits"]


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
