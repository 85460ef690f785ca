"""Per-sandbox caps on what sandboxes share (issue 26): their defaults and bounds, in one place.

Three caps are options of ``create`` (per sandbox; the host's default from ``host.json``, see
:class:`~sandbox_rt.config.Settings`), because a sandbox may need more or less of them:

- ``net_mbps``: network bandwidth each way, Mbit/s (10^6 bit/s). LXC: a policer per direction on the
  sandbox's bridge port (``table bridge sandbox``, chains ``in_<hex>``/``out_<hex>``; nft's token
  bucket holds one second at the rate, so a burst of that size passes at once, then the rate holds);
  the runtime's own SSH session with the sandbox is not counted. Proxmox VE: the NIC's ``rate``
  (MB/s of 2^20 bytes, as PVE counts them), which counts everything, the runtime's SSH too.
- ``disk_mbps`` / ``disk_iops``: bandwidth (MB/s, 2^20 B) and operations per second, each of read and
  write, on the block device that holds the sandboxes (cgroup v1 ``blkio.throttle.*``, v2 ``io.max``).
  On cgroup v1 the kernel charges buffered writes to the flusher, not to the sandbox, so the cap holds
  for direct IO and reads; buffered writes are bounded by the sandbox's memory (its dirty pages) and
  the loop device's direct IO (docs/threat-model.md, noisy neighbours).

0 means no cap. The caps that protect tables of the host itself (conntrack entries, new connections
and DNS queries per second, per sandbox) are host-wide only: they are the sandbox network role's
(``sandbox_network_conntrack_per_sandbox``, ``_new_conn_rate``, ``_dns_rate``), since a sandbox that
could raise them would take the others' share. So is the pids budget: the sum of the sandboxes'
``pids_max`` stays below the host's ``kernel.pid_max`` less :data:`PID_RESERVE_FRACTION` of it.
"""

from __future__ import annotations

from pathlib import Path

from .errors import BackendError

__all__ = [
    "DEFAULT_DISK_IOPS",
    "DEFAULT_DISK_MBPS",
    "DEFAULT_NET_MBPS",
    "MAX_DISK_IOPS",
    "MAX_DISK_MBPS",
    "MAX_NET_MBPS",
    "PID_RESERVE_FRACTION",
    "net_bytes_per_s",
    "pid_budget",
    "read_pid_max",
]

# Measured on the build host (docs/benchmarks.md, group neighbours): with these, a neighbour's
# exec round trip, DNS, write+fsync latency and throughput stay within 1.5x of idle.
DEFAULT_NET_MBPS = 1000
DEFAULT_DISK_MBPS = 100
DEFAULT_DISK_IOPS = 2000

MAX_NET_MBPS = 100_000
MAX_DISK_MBPS = 100_000
MAX_DISK_IOPS = 10_000_000

# The part of kernel.pid_max the sandboxes' pids_max may never take together (the host's own share).
PID_RESERVE_FRACTION = 8  # 1/8


def net_bytes_per_s(mbps: int) -> int:
    """Mbit/s as bytes per second (what an nft ``limit rate`` in bytes takes)."""
    return mbps * 125_000


def pid_budget(pid_max: int) -> int:
    """How many pids the sandboxes' ``pids_max`` may add up to on a host with ``pid_max``."""
    return pid_max - pid_max // PID_RESERVE_FRACTION


def read_pid_max(path: Path = Path("/proc/sys/kernel/pid_max")) -> int:
    """This host's ``kernel.pid_max`` (the LXC backend's budget; the HTTP API's bound on pids_max)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError) as exc:
        raise BackendError(f"cannot read the host's pid_max ({path}): {exc}", step="limits") from exc
