"""A sandbox's cgroup: its limits as cgroup files (config lines before start, live writes after),
its usage, and the freezer (snapshots freeze a sandbox while its files are copied; pause freezes it
until resume)."""

from __future__ import annotations

import builtins
import contextlib
import time
from pathlib import Path

from ...errors import BackendError
from ...models import ResourceUsage, SandboxSpec

__all__ = [
    "CGROUP_MOUNT",
    "CGROUP_ROOT",
    "CPU_PERIOD_US",
    "Cgroups",
    "cgroup_limit_lines",
    "cgroup_limits",
    "cgroup_v1",
]

CPU_PERIOD_US = 100_000
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Every clone's cgroup mount, after the template's lxc.mount.auto (LXC replaces its cgroup part, keeps
# proc/sys): read-only, so root inside cannot make a child group and move into it (cgroup v1's blkio
# throttle binds no child: SBX-RES-13). Also for templates built before the template said so.
CGROUP_MOUNT = "lxc.mount.auto = cgroup:ro"


def cgroup_v1() -> bool:
    return (CGROUP_ROOT / "memory" / "memory.limit_in_bytes").exists()


def cgroup_limits(
    spec: SandboxSpec,
    *,
    v1: bool,
    memsw: bool,
    disk_device: str | None = None,
    cpuset: str | None = None,
) -> builtins.list[tuple[str, str]]:
    """(cgroup file, value) pairs that apply ``spec``'s limits on a v1 or v2 host (swap always 0).

    The same pairs go into the config before start (``lxc.cgroup[2].<file> = <value>``) and into the
    live cgroup files when a running sandbox changes (warm pool). ``disk_device`` (``major:minor`` of
    the disk that holds the sandboxes) gets ``disk_mbps``/``disk_iops`` (0: the cap is lifted);
    ``cpuset`` pins the sandbox to those CPUs.
    """
    mem = str(spec.memory_mb * 1024 * 1024)
    quota = max(1000, int(spec.cpus * CPU_PERIOD_US))
    bps, iops = spec.disk_mbps << 20, spec.disk_iops
    if v1:
        pairs = [("memory.limit_in_bytes", mem)]
        if memsw:
            pairs.append(("memory.memsw.limit_in_bytes", mem))
        pairs += [
            ("pids.max", str(spec.pids_max)),
            ("cpu.cfs_period_us", str(CPU_PERIOD_US)),
            ("cpu.cfs_quota_us", str(quota)),
        ]
        if cpuset:
            pairs.append(("cpuset.cpus", cpuset))
        if disk_device:
            pairs += [
                ("blkio.throttle.read_bps_device", f"{disk_device} {bps}"),
                ("blkio.throttle.write_bps_device", f"{disk_device} {bps}"),
                ("blkio.throttle.read_iops_device", f"{disk_device} {iops}"),
                ("blkio.throttle.write_iops_device", f"{disk_device} {iops}"),
            ]
        return pairs
    pairs = [
        ("memory.max", mem),
        ("memory.swap.max", "0"),
        ("pids.max", str(spec.pids_max)),
        ("cpu.max", f"{quota} {CPU_PERIOD_US}"),
    ]
    if cpuset:
        pairs.append(("cpuset.cpus", cpuset))
    if disk_device:
        b, i = (str(bps) if bps else "max"), (str(iops) if iops else "max")
        pairs.append(("io.max", f"{disk_device} rbps={b} wbps={b} riops={i} wiops={i}"))
    return pairs


def cgroup_limit_lines(
    spec: SandboxSpec,
    *,
    v1: bool,
    memsw: bool,
    disk_device: str | None = None,
    cpuset: str | None = None,
) -> builtins.list[str]:
    """LXC config lines for ``spec``'s limits (see :func:`cgroup_limits`)."""
    prefix = "lxc.cgroup." if v1 else "lxc.cgroup2."
    pairs = cgroup_limits(spec, v1=v1, memsw=memsw, disk_device=disk_device, cpuset=cpuset)
    return [f"{prefix}{key} = {value}" for key, value in pairs]


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class Cgroups:
    """The cgroups LXC made for this host's sandboxes (``lxc.payload.<id>``), v1 (hybrid) or v2,
    and the disk whose bandwidth the limits cap."""

    def __init__(self, disk_device: str | None) -> None:
        self.v1 = cgroup_v1()
        self.memsw = (CGROUP_ROOT / "memory" / "memory.memsw.limit_in_bytes").exists()
        self.disk_device = disk_device

    def limits(self, spec: SandboxSpec, cpuset: str) -> builtins.list[tuple[str, str]]:
        return cgroup_limits(
            spec, v1=self.v1, memsw=self.memsw, disk_device=self.disk_device, cpuset=cpuset or None
        )

    def limit_lines(self, spec: SandboxSpec, cpuset: str) -> builtins.list[str]:
        return cgroup_limit_lines(
            spec, v1=self.v1, memsw=self.memsw, disk_device=self.disk_device, cpuset=cpuset or None
        )

    def _dir(self, sandbox_id: str, controller: str) -> Path:
        group = f"lxc.payload.{sandbox_id}"
        return CGROUP_ROOT / controller / group if self.v1 else CGROUP_ROOT / group

    def apply_live(self, sandbox_id: str, spec: SandboxSpec, cpuset: str) -> None:
        """Write ``spec``'s limits into the running sandbox's cgroup files."""
        pending = self.limits(spec, cpuset)
        # v1 refuses memory > memsw and memsw < memory: retry the order that the kernel accepts
        for _round in range(2):
            failed = []
            for key, value in pending:
                try:
                    (self._dir(sandbox_id, key.split(".", 1)[0]) / key).write_text(value)
                except OSError:
                    failed.append((key, value))
            if not failed:
                return
            pending = failed
        raise BackendError(f"cannot apply limits {pending} to {sandbox_id}", step="update")

    def usage(self, sandbox_id: str, disk_bytes: int | None) -> ResourceUsage:
        if self.v1:
            mem = self._dir(sandbox_id, "memory")
            cpu_ns = _read_int(self._dir(sandbox_id, "cpuacct") / "cpuacct.usage")
            return ResourceUsage(
                memory_bytes=_read_int(mem / "memory.usage_in_bytes"),
                memory_peak_bytes=_read_int(mem / "memory.max_usage_in_bytes"),
                cpu_time_s=cpu_ns / 1e9 if cpu_ns is not None else None,
                pids=_read_int(self._dir(sandbox_id, "pids") / "pids.current"),
                disk_bytes=disk_bytes,
            )
        g = self._dir(sandbox_id, "")
        cpu_us: int | None = None
        with contextlib.suppress(OSError):
            for line in (g / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec"):
                    cpu_us = int(line.split()[1])
        return ResourceUsage(
            memory_bytes=_read_int(g / "memory.current"),
            memory_peak_bytes=_read_int(g / "memory.peak"),
            cpu_time_s=cpu_us / 1e6 if cpu_us is not None else None,
            pids=_read_int(g / "pids.current"),
            disk_bytes=disk_bytes,
        )

    # -- the freezer -----------------------------------------------------------------------------
    def set_frozen(self, sandbox_id: str, frozen: bool) -> None:
        if self.v1:
            (self._dir(sandbox_id, "freezer") / "freezer.state").write_text("FROZEN" if frozen else "THAWED")
        else:
            (self._dir(sandbox_id, "") / "cgroup.freeze").write_text("1" if frozen else "0")

    def freezer_state(self, sandbox_id: str) -> str:
        """``thawed``, ``freezing`` or ``frozen`` (what ``lxc-info`` does not say of a freeze it did
        not make itself); ``thawed`` when the sandbox has no cgroup (it is not running)."""
        try:
            if self.v1:
                text = (self._dir(sandbox_id, "freezer") / "freezer.state").read_text().strip().lower()
                return text if text in ("freezing", "frozen") else "thawed"
            if "frozen 1" in (self._dir(sandbox_id, "") / "cgroup.events").read_text().splitlines():
                return "frozen"
            asked = (self._dir(sandbox_id, "") / "cgroup.freeze").read_text().strip() == "1"
        except OSError:
            return "thawed"
        return "freezing" if asked else "thawed"

    def is_frozen(self, sandbox_id: str) -> bool:
        if self.v1:
            return (self._dir(sandbox_id, "freezer") / "freezer.state").read_text().strip() == "FROZEN"
        return "frozen 1" in (self._dir(sandbox_id, "") / "cgroup.events").read_text().splitlines()

    def freeze(self, sandbox_id: str, attempts: int = 5, *, step: str = "snapshot") -> None:
        """Freeze every process of a running sandbox (the cgroup freezer; what ``lxc-freeze`` does,
        without its 1 s polling and its endless wait). A freeze that does not settle - the v1
        freezer stalls in FREEZING when it catches a task in ``vfork`` whose child it froze - is
        thawed and tried again."""
        for attempt in range(attempts):
            self.set_frozen(sandbox_id, True)
            deadline = time.monotonic() + 0.5 * (attempt + 1)
            while time.monotonic() < deadline:
                if self.is_frozen(sandbox_id):
                    return
                time.sleep(0.002)
            self.set_frozen(sandbox_id, False)
            time.sleep(0.02 * (attempt + 1))
        raise BackendError(
            f"the processes of {sandbox_id} did not freeze (tried {attempts} times)", step=step
        )
