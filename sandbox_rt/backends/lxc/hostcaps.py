"""What the LXC backend needs to share one host fairly (issue 26): the block device the sandboxes
write to (for their disk caps), which CPUs a new sandbox is pinned to, and the host's pids budget.

All of it is read from the host (``/proc/self/mountinfo``, ``/sys``, ``/proc/sys/kernel/pid_max``)
and from the sandboxes' own LXC configs, the same configs the address pool reads under its lock,
so two creates never decide from the same stale picture.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from ...caps import pid_budget, read_pid_max
from ...errors import ConfigError, StateConflict
from ...validation import SANDBOX_ID

__all__ = [
    "HostLoad",
    "allowed_cpus",
    "check_pids_budget",
    "cpu_list",
    "parse_cpu_list",
    "pick_cpus",
    "read_pid_max",
    "storage_device",
]

_SYS_BLOCK = Path("/sys/dev/block")


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (``\\040``)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mount_source(path: Path, mountinfo: str) -> str | None:
    """The source of the mount that holds ``path`` (the longest mount point above it)."""
    target = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 2:
            continue
        point = _unescape(fields[4])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > best[0]):
            best = (len(point), _unescape(rest[1]))
    return best[1] if best else None


def storage_device(path: Path, mountinfo: str | None = None) -> str | None:
    """``major:minor`` of the whole disk (a partition's parent) that holds ``path``, or None when
    it is on no block device (tmpfs, overlay, ...). btrfs reports an anonymous device number for
    its files, so the mount's source device is used, not ``st_dev``."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return None
    source = _mount_source(path, mountinfo)
    if not source or not source.startswith("/dev/"):
        return None
    try:
        rdev = os.stat(source).st_rdev
    except OSError:
        return None
    if not rdev:
        return None
    dev = f"{os.major(rdev)}:{os.minor(rdev)}"
    node = _SYS_BLOCK / dev
    if (node / "partition").exists():  # blkio/io.max take whole disks only
        with contextlib.suppress(OSError):
            dev = (node.resolve().parent / "dev").read_text().strip()
    return dev


def parse_cpu_list(text: str) -> list[int]:
    """``0-2,5`` -> ``[0, 1, 2, 5]`` (the kernel's cpu list format); a bad list is empty."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            return []
        if first > last or last > 1 << 16:
            return []
        out.update(range(first, last + 1))
    return sorted(out)


def cpu_list(cpus: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    ranges: list[list[int]] = []
    for c in sorted(set(cpus)):
        if ranges and c == ranges[-1][1] + 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def allowed_cpus(cgroup_root: Path, v1: bool) -> list[int]:
    """The CPUs the sandboxes' parent cgroup may use (else this process's affinity)."""
    path = cgroup_root / "cpuset" / "cpuset.cpus" if v1 else cgroup_root / "cpuset.cpus.effective"
    with contextlib.suppress(OSError):
        cpus = parse_cpu_list(path.read_text())
        if cpus:
            return cpus
    return sorted(os.sched_getaffinity(0))


@dataclasses.dataclass
class HostLoad:
    """What the sandboxes of one LXC path hold, read from their configs: addresses, the sum of their
    pids limits, and each CPU's share of the sandboxes pinned to it (cpus / CPUs of its set)."""

    addresses: set[str] = dataclasses.field(default_factory=set)
    pids: int = 0
    cpu_load: dict[int, float] = dataclasses.field(default_factory=dict)

    def add_sandbox(self, values: Mapping[str, str]) -> None:
        """Count one sandbox from its config values (key -> last value)."""
        for key in ("lxc.cgroup.pids.max", "lxc.cgroup2.pids.max"):
            text = values.get(key, "")
            if text.isdigit():
                self.pids += int(text)
        cpuset = values.get("lxc.cgroup.cpuset.cpus") or values.get("lxc.cgroup2.cpuset.cpus") or ""
        pinned = parse_cpu_list(cpuset)
        if not pinned:
            return
        share = _cpus_of(values) / len(pinned)
        for c in pinned:
            self.cpu_load[c] = self.cpu_load.get(c, 0.0) + share


def _cpus_of(values: Mapping[str, str]) -> float:
    """The sandbox's CPU quota in CPUs (1.0 when its config has none)."""
    with contextlib.suppress(ValueError, ZeroDivisionError):
        if "lxc.cgroup2.cpu.max" in values:
            quota, period = values["lxc.cgroup2.cpu.max"].split()
            return int(quota) / int(period)
        if "lxc.cgroup.cpu.cfs_quota_us" in values:
            period_us = int(values.get("lxc.cgroup.cpu.cfs_period_us", "100000"))
            return max(0, int(values["lxc.cgroup.cpu.cfs_quota_us"])) / period_us
    return 1.0


def pick_cpus(cpus: float, allowed: list[int], load: Mapping[int, float]) -> list[int]:
    """ceil(``cpus``) of ``allowed``, the least loaded first (ties: the lowest number), so that
    ``nproc`` in the sandbox says what it may use and sandboxes spread over the cores (what Proxmox
    VE does for a CT's ``cores``)."""
    if not allowed:
        return []
    want = max(1, min(len(allowed), math.ceil(cpus - 1e-9)))
    ranked = sorted(allowed, key=lambda c: (round(load.get(c, 0.0), 6), c))
    return sorted(ranked[:want])


def check_pids_budget(wanted: int, others: int, pid_max: int) -> None:
    """The sandboxes' pids limits together must leave the host its share of ``pid_max``
    (:func:`sandbox_rt.caps.pid_budget`): ``wanted`` for the new one, ``others`` already taken."""
    budget = pid_budget(pid_max)
    if wanted > budget:
        raise ConfigError(
            f"pids_max={wanted} is more than this host gives all sandboxes together ({budget} of "
            f"kernel.pid_max={pid_max}; the lxc_host role raises pid_max)"
        )
    if others + wanted > budget:  # a state of the host, not a fault of the engine (HTTP: 409)
        raise StateConflict(
            f"the host's pids budget is spent: the sandboxes hold {others} of {budget} "
            f"(kernel.pid_max={pid_max} less its reserve), pids_max={wanted} does not fit; "
            "destroy sandboxes or ask for a smaller pids_max"
        )


def host_load(lxc_path: Path, skip: str = "") -> HostLoad:
    """Addresses, pids limits and pinned CPUs of every container of ``lxc_path`` (a template has no
    address; only sandboxes count for pids and CPUs), except ``skip``."""
    load = HostLoad()
    if not lxc_path.is_dir():
        return load
    for cfg in lxc_path.glob("*/config"):
        try:
            lines = cfg.read_text().splitlines()
        except OSError:
            continue
        values: dict[str, str] = {}  # key -> its last value (what LXC applies)
        address = ""  # the first address line (as the runtime writes it)
        for line in lines:
            k, sep, v = line.partition("=")
            if sep:
                values[k.strip()] = v.strip()
                if not address and k.strip() == "lxc.net.0.ipv4.address":
                    address = v.strip()
        if address:
            with contextlib.suppress(ValueError):
                load.addresses.add(str(ipaddress.IPv4Interface(address).ip))
        name = cfg.parent.name
        if SANDBOX_ID.match(name) and name != skip:
            load.add_sandbox(values)
    return load
