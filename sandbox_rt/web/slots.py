"""The connection slots of an HTTP service (all its sites together) and who gives way when they
run out, so that clients without the token cannot keep out a client with it.

A connection takes a slot when it is accepted and is *pending* until it delivers a request head
with valid credentials (the site's check); then it is *held* until it closes. The table keeps at
most ``max_connections`` slots:

- table full, a new connection takes the slot of the oldest pending one, which is evicted (the
  transport answers it 503 ``server_busy`` or closes it). Only with every slot held is the new
  connection itself refused. However many connections one client opens and re-opens, each new
  connection of an authorized client gets a slot, and keeps it while ``max_connections - 1`` newer
  ones arrive: time enough to send its head (a client sends it at once; the head deadline is for
  slow networks, not for a full table).
- one client address (an IPv4 address, or an IPv6 /64: one host may own all of one) has at most
  ``max_pending_per_address`` pending connections: its next one evicts its own oldest pending one,
  never another client's, so a remote client cannot fill the table at all. Loopback is exempt:
  every local client has that address, a bound would be shared by them all.

Held connections are never evicted: they have shown the token, and what they may cost is what the
operator's own clients may (idle keep-alive ends after ``idle_timeout_s``).
"""

from __future__ import annotations

import ipaddress
import logging
import time
from typing import Protocol

from .limits import HttpLimits

__all__ = ["Occupant", "Slots"]

log = logging.getLogger(__name__)

_WARN_EVERY_S = 60.0  # a full table is logged at most this often (an attack fills it for hours)


class Occupant(Protocol):
    """What holds a slot: a connection that can be made to give it up."""

    def evict(self) -> None:
        """Called once its slot is taken away: answer or close the connection."""


class Slots:
    """The table of one service (see the module's docstring)."""

    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self.refused = 0  # new connections turned away: every slot held
        self.evicted = 0  # pending connections that gave way to a newer one
        self._pending: dict[Occupant, str | None] = {}  # oldest first -> its address key (None: exempt)
        self._by_address: dict[str, dict[Occupant, None]] = {}  # the same, per address key
        self._held: set[Occupant] = set()
        self._warned_at: float | None = None  # time.monotonic() of the last warning of a full table

    @property
    def open(self) -> int:
        return len(self._pending) + len(self._held)

    def admit(self, occupant: Occupant, peer: object) -> bool:
        """Give ``occupant`` (a new connection from ``peer``, its peername) a slot, evicting a
        pending one if need be; False if every slot is held."""
        key = address_key(peer)
        own = self._by_address.get(key, {}) if key is not None else {}
        if len(own) >= self.limits.max_pending_per_address:
            self._evict(next(iter(own)))
        if self.open >= self.limits.max_connections:
            if not self._pending:
                self.refused += 1
                self._warn_full()
                return False
            self._evict(next(iter(self._pending)))
            self._warn_full()
        self._pending[occupant] = key
        if key is not None:
            self._by_address.setdefault(key, {})[occupant] = None
        return True

    def hold(self, occupant: Occupant) -> None:
        """``occupant`` delivered an authorized head: it keeps its slot until it closes."""
        if occupant in self._pending:
            self._forget(occupant)
            self._held.add(occupant)

    def release(self, occupant: Occupant) -> None:
        """``occupant`` closed (or was evicted): its slot is free. Idempotent."""
        self._forget(occupant)
        self._held.discard(occupant)

    def _evict(self, occupant: Occupant) -> None:
        self.release(occupant)
        self.evicted += 1
        occupant.evict()

    def _forget(self, occupant: Occupant) -> None:
        if occupant not in self._pending:
            return
        key = self._pending.pop(occupant)
        if key is not None:
            own = self._by_address[key]
            del own[occupant]
            if not own:
                del self._by_address[key]

    def _warn_full(self) -> None:
        now = time.monotonic()
        if self._warned_at is None or now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning(
                "%d connections open, the limit: the oldest without an authorized request give way "
                "to new ones (%d so far), a new one gets 503 when every open one has (%d so far)",
                self.limits.max_connections,
                self.evicted,
                self.refused,
            )


def address_key(peer: object) -> str | None:
    """Under what a client's pending connections are counted: its IPv4 address (also when mapped
    into IPv6), its IPv6 /64; None (no bound) for loopback and anything that is no IP address."""
    try:
        ip = ipaddress.ip_address(peer[0])  # type: ignore[index]
    except (TypeError, ValueError, IndexError, KeyError):
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
