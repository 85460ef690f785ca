"""Static addresses for sandboxes: the lowest free address of the pool, chosen under a host-wide lock.

The lock is an ``flock`` on a file, so threads and processes (and the PVE test server) that share a
host never hand out one address twice; what is "in use" is read from the engine's own configs
inside the lock, so a crashed caller leaks nothing: its address is free once its container is gone.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Callable
from pathlib import Path

from .errors import BackendError
from .filelock import file_lock

__all__ = ["IpPool", "mac_for_ip"]


def mac_for_ip(ip: str) -> str:
    """A stable, locally administered MAC derived from the address (no stale ARP on reuse)."""
    b = ipaddress.IPv4Address(ip).packed
    return "02:5b:" + ":".join(f"{x:02x}" for x in b)


class IpPool:
    def __init__(self, start: str, end: str, network: str, lock_path: Path, reserved: set[str] | None = None):
        self.start = int(ipaddress.IPv4Address(start))
        self.end = int(ipaddress.IPv4Address(end))
        net = ipaddress.IPv4Network(network)
        self.network = net
        self.reserved = {int(net.network_address), int(net.broadcast_address)}
        self.reserved |= {int(ipaddress.IPv4Address(a)) for a in reserved or set()}
        self.lock_path = lock_path

    def locked(self) -> contextlib.AbstractContextManager[None]:
        return file_lock(self.lock_path)

    def allocate(self, in_use: Callable[[], set[str]], commit: Callable[[str], None]) -> str:
        """Pick the lowest free address and ``commit`` it (e.g. write it into a config) under the lock."""
        with self.locked():
            used = {int(ipaddress.IPv4Address(a)) for a in in_use()} | self.reserved
            for value in range(self.start, self.end + 1):
                if value not in used:
                    ip = str(ipaddress.IPv4Address(value))
                    commit(ip)
                    return ip
        raise BackendError(
            f"no free address left in {ipaddress.IPv4Address(self.start)}-{ipaddress.IPv4Address(self.end)}",
            step="address",
        )
