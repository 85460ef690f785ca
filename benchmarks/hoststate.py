"""What sandboxes leave on the host, before and after a benchmark step: the leak check.

A snapshot holds the LXC containers (dirs with a config), the addresses their configs hold (the
local IPAM state is exactly that), the members of the nft ``internet_allowed`` set, the create
markers and the ``sbx*`` host interfaces. New items after a step are *leaked* when they are this
run's (its sandbox ids, its addresses, its pid in a record or marker, its raw containers) or when
nobody can be named as their owner; items another live process owns (another test run on the same
host) are reported as *foreign*, not as leaks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time

from sandbox_rt import Settings
from sandbox_rt.backends.lxc.nft import NftInternetSet

from .raw import RAW_PREFIX

__all__ = ["HostState", "Leaks", "find_leaks", "snapshot"]

RECORD_FILE = "sandbox_rt.json"


@dataclasses.dataclass(frozen=True)
class HostState:
    containers: frozenset[str]
    addresses: dict[str, str]  # ip -> container
    internet: frozenset[str]
    markers: frozenset[str]
    links: frozenset[str]


@dataclasses.dataclass
class Leaks:
    leaked: list[str] = dataclasses.field(default_factory=list)
    foreign: list[str] = dataclasses.field(default_factory=list)


def snapshot(settings: Settings) -> HostState:
    path = settings.lxc_path
    containers: set[str] = set()
    addresses: dict[str, str] = {}
    for cfg in path.glob("*/config"):
        containers.add(cfg.parent.name)
        with contextlib.suppress(OSError):
            for line in cfg.read_text().splitlines():
                key, sep, value = line.partition("=")
                if sep and key.strip() == "lxc.net.0.ipv4.address":
                    addresses[value.strip().split("/")[0]] = cfg.parent.name
    markers = frozenset(p.stem for p in (path / ".runtime" / "creating").glob("*.json"))
    internet = frozenset(
        NftInternetSet(settings.nft_family, settings.nft_table, settings.nft_internet_set).members()
    )
    links = frozenset(n for n in os.listdir("/sys/class/net") if n.startswith("sbx"))
    return HostState(frozenset(containers), addresses, internet, markers, links)


def _owner_pid(settings: Settings, name: str) -> int | None:
    """The pid a container's record or create marker names, if any."""
    for f in (
        settings.lxc_path / name / RECORD_FILE,
        settings.lxc_path / ".runtime" / "creating" / f"{name}.json",
    ):
        with contextlib.suppress(OSError, ValueError, TypeError):
            data = json.loads(f.read_text())
            return int(data.get("owner_pid", data.get("pid")))
    return None


def _classify(
    settings: Settings, state: HostState, name: str, ours: set[str], our_ips: set[str]
) -> str | None:
    """'ours', 'foreign' or None (unknown) for a container name."""
    me = os.getpid()
    if name in ours or name.startswith(f"{RAW_PREFIX}{me}-"):
        return "ours"
    if name.startswith((RAW_PREFIX, "pve")):
        return "foreign"  # another benchmark run, or a PVE test server's CT
    pid = _owner_pid(settings, name)
    if pid is not None and pid not in (0, me):
        return "foreign"  # before the address: another process may reuse an address we freed
    ip = next((a for a, n in state.addresses.items() if n == name), None)
    if ip is not None and ip in our_ips:
        return "ours"
    return "ours" if pid == me else None


def _diff(
    settings: Settings, before: HostState, after: HostState, ours: set[str], our_ips: set[str]
) -> Leaks:
    out = Leaks()

    def put(kind: str, item: str, verdict: str | None) -> None:
        (out.foreign if verdict == "foreign" else out.leaked).append(f"{kind}:{item}")

    for name in sorted(after.containers - before.containers):
        put("container", name, _classify(settings, after, name, ours, our_ips))
    for ip in sorted(set(after.addresses) - set(before.addresses)):
        holder = after.addresses[ip]
        put("address", ip, _classify(settings, after, holder, ours, our_ips))  # the holder's verdict
    for ip in sorted(after.internet - before.internet):
        member = after.addresses.get(ip)
        verdict = "ours" if ip in our_ips else None
        if member is not None:
            verdict = _classify(settings, after, member, ours, our_ips) or verdict
        put("internet", ip, verdict)
    for sid in sorted(after.markers - before.markers):
        put("marker", sid, _classify(settings, after, sid, ours, our_ips))
    for link in sorted(after.links - before.links):
        put("link", link, _classify(settings, after, "sbx-" + link[3:], ours, our_ips))
    return out


def find_leaks(
    settings: Settings, before: HostState, ours: set[str], our_ips: set[str], recheck_s: float = 2.0
) -> Leaks:
    """Compare the host now with ``before``. Items nobody owns get one second look after
    ``recheck_s`` (another process's create may have been between two of its steps)."""
    first = _diff(settings, before, snapshot(settings), ours, our_ips)
    if not first.leaked:
        return first
    time.sleep(recheck_s)  # let a concurrent create elsewhere finish writing its record
    return _diff(settings, before, snapshot(settings), ours, our_ips)
