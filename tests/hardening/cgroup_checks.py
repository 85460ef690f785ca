"""SBX-RES-13: root in a ``root=True`` sandbox cannot leave its limits through the cgroup tree.

The attack (issue 35): root inside makes a child cgroup of its own and moves itself into it
(``mkdir /sys/fs/cgroup/blkio/x; echo $$ > /sys/fs/cgroup/blkio/x/cgroup.procs``). On cgroup v1 the
blkio throttle of the sandbox's group does not bind a child group: it wrote at 441 MB/s against a
100 MB/s cap. Each check here makes that move for one controller (blkio, cpu, memory, pids) as root
over the runtime's SSH, then runs what the cap must stop, in the same shell: the move is refused or
the cap still binds. Like checks.py: a check returns quietly when the control holds and raises
:class:`~tests.hardening.checks.Violation` when it does not; broken preconditions are plain asserts.
"""

from __future__ import annotations

import dataclasses
import errno
import shlex
import time
from pathlib import Path

from . import checks, hosts
from . import neighbour_checks as nc
from .checks import CGROUP_V1, Target, Violation, require, run_root, violated

C = "SBX-RES-13"
CONTROLLERS = ("blkio", "cpu", "memory", "pids")
ESCAPE_GROUP = "sandbox-rt-escape"  # the child group root tries to make


@dataclasses.dataclass(frozen=True)
class Caps:
    """The caps of the sandbox the check runs in (``Manager.create`` keywords)."""

    cpus: float = 0.5
    memory_mb: int = 256
    pids_max: int = 128
    disk_mbps: int = 20
    disk_iops: int = 200

    def create_kwargs(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def root_target(t: Target, workdir: Path) -> Target:
    """``t`` (made with ``root=True``) with root reached as an agent reaches it: the runtime's SSH."""
    assert t.sb.root, "precondition: a root=True sandbox"
    return checks.as_root_login(t, hosts.sandbox_host(t.sb, t.settings, workdir, user="root"))


def hierarchy(controller: str) -> str:
    """Where the sandbox sees ``controller``'s hierarchy: v1 one per controller, v2 the one tree."""
    return f"/sys/fs/cgroup/{controller}" if CGROUP_V1 else "/sys/fs/cgroup"


def escape(controller: str) -> str:
    """Shell text: make a child group under the sandbox's own and move this shell into it (errors
    silenced: whatever follows runs where the shell ended up)."""
    group = f"{hierarchy(controller)}/{ESCAPE_GROUP}"
    return f"{{ mkdir -p {group}; echo $$ > {group}/cgroup.procs; }} 2>/dev/null; "


def group_of(proc_cgroup: str, controller: str) -> str:
    """``controller``'s group in a ``/proc/<pid>/cgroup`` text (v2: the unified line)."""
    for line in proc_cgroup.splitlines():
        number, controllers, path = line.split(":", 2)
        if (controller in controllers.split(",")) if CGROUP_V1 else number == "0":
            return path
    raise AssertionError(f"no {controller} line in {proc_cgroup!r}")


def escaped_to(t: Target, controller: str) -> str:
    """The group root's shell is in after the attempt, as the sandbox sees it ("/": refused)."""
    r = run_root(t, escape(controller) + "cat /proc/self/cgroup")
    assert r.returncode == 0, f"precondition: root's shell ran ({r.stderr!r})"
    return group_of(r.stdout, controller)


def check_blkio_holds(t: Target, caps: Caps) -> tuple[float, float]:
    """O_DIRECT writes from the moved shell stay within disk_mbps and disk_iops (SBX-RES-10's
    measure, its margins)."""
    try:
        return nc.check_disk_rates(t, caps.disk_mbps, caps.disk_iops, root_first=escape("blkio"))
    except Violation as exc:
        violated(C, f"root moved to {escaped_to(t, 'blkio')!r} of blkio: {exc}")


# A bounded fork storm: forks until refused (or `bound` children), kills them, prints count and errno.
FORK_STORM = """
import os, time
kids, err = [], 0
try:
    for _ in range({bound}):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        kids.append(pid)
except OSError as exc:
    err = exc.errno
for pid in kids:
    os.kill(pid, 9)
for pid in kids:
    os.waitpid(pid, 0)
print(len(kids), err)
"""


def check_pids_hold(t: Target, caps: Caps) -> int:
    """A fork storm from the moved shell is refused (EAGAIN) before it reaches pids_max processes."""
    bound = caps.pids_max + 64
    storm = FORK_STORM.format(bound=bound)
    r = run_root(t, escape("pids") + f"python3 -c {shlex.quote(storm)}", timeout=60)
    assert r.returncode == 0, f"precondition: the storm ran ({r.stderr[-500:]!r})"
    forked, err = map(int, r.stdout.split()[-2:])
    where = escaped_to(t, "pids")
    require(C, forked < caps.pids_max, f"root in {where!r} of pids forked {forked}, pids_max={caps.pids_max}")
    assert err == errno.EAGAIN and forked > caps.pids_max // 2, (
        f"precondition: the limit stopped it ({r.stdout})"
    )
    return forked


def check_memory_holds(t: Target, caps: Caps) -> int:
    """1 GiB asked for from the moved shell is OOM-killed; the sandbox's peak stays within memory_mb."""
    r = run_root(t, escape("memory") + "python3 -c 'b = bytearray(1 << 30); print(len(b))'", timeout=90)
    where = escaped_to(t, "memory")
    killed = r.returncode == 137 and "1073741824" not in r.stdout
    require(C, killed, f"root in {where!r} of memory allocated 1 GiB with memory_mb={caps.memory_mb}: {r}")
    peak = int(checks.cgroup_read(t, "memory", "memory.max_usage_in_bytes", "memory.peak"))
    require(C, peak <= caps.memory_mb << 20, f"the sandbox used {peak >> 20} MB, memory_mb={caps.memory_mb}")
    return peak


def check_cpu_holds(t: Target, caps: Caps, seconds: float = 3.0) -> float:
    """Two busy loops from the moved shell get at most the quota (SBX-RES-04's measure)."""
    before, t0 = checks.cpu_seconds(t), time.monotonic()
    hog = f"timeout {seconds} sh -c 'yes >/dev/null & yes >/dev/null & wait'"
    run_root(t, escape("cpu") + hog, timeout=seconds + 30)
    ratio = (checks.cpu_seconds(t) - before) / (time.monotonic() - t0)
    assert ratio > caps.cpus * 0.5, f"precondition: the hog ran ({ratio:.2f} CPU/s)"
    where = escaped_to(t, "cpu")
    require(C, ratio <= caps.cpus + 0.1, f"root in {where!r} of cpu got {ratio:.2f} CPU/s, cpus={caps.cpus}")
    return ratio


def check_caps_hold(t: Target, caps: Caps) -> dict[str, str]:
    """Root's move into a child group, for each controller, leaves every cap binding."""
    require(C, t.root_login and t.sb.root, "the target is not a root=True sandbox reached as root over SSH")
    rate, ops = check_blkio_holds(t, caps)
    forked = check_pids_hold(t, caps)
    peak = check_memory_holds(t, caps)
    ratio = check_cpu_holds(t, caps)
    require(C, checks._alive(t), "the sandbox did not survive")
    where = {ctl: escaped_to(t, ctl) for ctl in CONTROLLERS}
    return {
        "blkio": f"{rate:.1f} MB/s, {ops:.0f} IOPS (cap {caps.disk_mbps}, {caps.disk_iops})",
        "pids": f"{forked} forks before EAGAIN (pids_max {caps.pids_max})",
        "memory": f"1 GiB OOM-killed, peak {peak >> 20} MB (memory_mb {caps.memory_mb})",
        "cpu": f"{ratio:.2f} CPU/s (cpus {caps.cpus})",
        **{f"{ctl} group": group for ctl, group in where.items()},
    }


def check_cgroup_tree_read_only(t: Target) -> None:
    """Every cgroup hierarchy root sees is mounted read-only, and the move is refused in each."""
    mounts = run_root(t, "cat /proc/self/mounts").stdout.splitlines()
    cgroups = [m.split() for m in mounts if m.split()[2:3] in (["cgroup"], ["cgroup2"])]
    assert cgroups, "precondition: the sandbox sees its cgroups (lxc.mount.auto cgroup:...)"
    writable = [f[1] for f in cgroups if "ro" not in f[3].split(",")]
    require(C, not writable, f"cgroup hierarchies mounted read-write: {writable}")
    moved = {ctl: group for ctl in CONTROLLERS if (group := escaped_to(t, ctl)) != "/"}
    require(C, not moved, f"root moved itself into child groups: {moved}")
