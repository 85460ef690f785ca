"""In-memory engine: containers are records; start "generates" a host key; nothing runs."""

from __future__ import annotations

import re
import threading
from typing import Any

from .ctconfig import parse_kv
from .engine import CTConfig, EngineError
from .hookcaps import Published, bookkept
from .hostkey import generate_ed25519


class MemoryEngine:
    name = "memory"

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._exists: set[int] = set()
        self._running: set[int] = set()
        self._hostkeys: dict[int, str] = {}
        self._snapshots: set[tuple[int, str]] = set()

    def unavailable_reason(self) -> str | None:
        return None

    def restore(self, vmid: int, config: CTConfig, running: bool) -> None:
        with self._mutex:
            self._exists.add(vmid)
            if running:
                self._running.add(vmid)

    def create(self, vmid: int, config: CTConfig, ostemplate: str = "", ssh_public_keys: str = "") -> None:
        with self._mutex:
            if vmid in self._exists:
                raise EngineError(f"container for CT {vmid} already exists")
            self._exists.add(vmid)

    def clone(self, source_vmid: int, vmid: int, config: CTConfig) -> None:
        self.create(vmid, config)

    def apply_config(self, vmid: int, config: CTConfig) -> None:
        self._require(vmid)

    def start(self, vmid: int, config: CTConfig) -> str:
        self._require(vmid)
        with self._mutex:
            self._running.add(vmid)
            if vmid not in self._hostkeys:
                host = str(config.get("hostname") or f"CT{vmid}")
                self._hostkeys[vmid] = generate_ed25519(f"root@{host}")[1]
            return self._hostkeys[vmid]

    def post_start(self, vmid: int, config: CTConfig) -> Published:
        """The caps are bookkeeping here (hookcaps.bookkept): nothing to enforce them on."""
        return Published(bookkept(str(config.get("description") or "")))

    def stop(self, vmid: int) -> None:
        with self._mutex:
            self._running.discard(vmid)

    def shutdown(self, vmid: int, timeout: float) -> None:
        self.stop(vmid)

    def destroy(self, vmid: int) -> None:
        with self._mutex:
            self._running.discard(vmid)
            self._exists.discard(vmid)
            self._hostkeys.pop(vmid, None)
            self._snapshots = {s for s in self._snapshots if s[0] != vmid}

    def is_running(self, vmid: int) -> bool:
        with self._mutex:
            return vmid in self._running

    def memory_used(self, vmid: int) -> int:
        """A record has no memory; a plausible constant for a running one."""
        return 32 * 1024 * 1024 if self.is_running(vmid) else 0

    def interfaces(self, vmid: int, config: CTConfig) -> list[dict[str, Any]] | None:
        """Interfaces as the config says a real CT would have them (None when stopped)."""
        if not self.is_running(vmid):
            return None
        out = [_iface("lo", "00:00:00:00:00:00", "127.0.0.1/8")]
        for key in sorted(k for k in config if re.fullmatch(r"net\d+", k)):
            net = parse_kv(str(config[key]))
            ip = net.get("ip", "")
            out.append(
                _iface(net.get("name", "eth0"), net.get("hwaddr", "").lower(), ip if "/" in ip else None)
            )
        return out

    def disk_used(self, vmid: int) -> int:
        """A record writes nothing; a plausible constant for a running one."""
        return 8 * 1024 * 1024 if self.is_running(vmid) else 0

    def snapshot(self, vmid: int, snapname: str) -> None:
        self._require(vmid)
        with self._mutex:
            self._snapshots.add((vmid, snapname))

    def delete_snapshot(self, vmid: int, snapname: str) -> None:
        with self._mutex:
            self._snapshots.discard((vmid, snapname))

    def clone_snapshot(self, source_vmid: int, snapname: str, vmid: int, config: CTConfig) -> None:
        with self._mutex:
            if (source_vmid, snapname) not in self._snapshots:
                raise EngineError(f"no snapshot {snapname!r} of CT {source_vmid}")
        self.create(vmid, config)

    def _require(self, vmid: int) -> None:
        with self._mutex:
            if vmid not in self._exists:
                raise EngineError(f"no container for CT {vmid}")


def _iface(name: str, mac: str, cidr: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "hwaddr": mac, "hardware-address": mac, "ip-addresses": []}
    if cidr:
        addr, _, prefix = cidr.partition("/")
        entry["inet"] = cidr
        entry["ip-addresses"].append({"ip-address": addr, "prefix": int(prefix), "ip-address-type": "inet"})
    return entry
