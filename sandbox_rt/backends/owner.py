"""Is the process that owns a sandbox (or a create in progress) still alive?"""

from __future__ import annotations

import socket
from pathlib import Path

__all__ = ["owner_alive", "process_start_time"]


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (guards against pid reuse), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def owner_alive(pid: int, start_time: int | None, host: str) -> bool:
    if pid == 0:
        return True  # a detached sandbox has no owner process to outlive
    if host != socket.gethostname():
        return True  # another machine's process: we cannot tell, so never treat it as dead
    current = process_start_time(pid)
    return current is not None and (start_time is None or current == start_time)
