"""The runtime process's own limits: the open files it may hold.

Every attached sandbox holds one socket (its SSH transport), and a command adds its channel's wake-up
pipe while it runs. The common soft ``RLIMIT_NOFILE`` of 1024 therefore stops a process at about
1,000 attached sandboxes (docs/benchmarks.md, "Density"). :func:`raise_open_files_limit` raises the
soft limit to the hard one, as Go's runtime does for every program at start; it never lowers a
limit and never touches the hard one (that is the operator's: systemd's ``LimitNOFILE=``, PAM's
limits.conf). ``Manager`` calls it once per process.
"""

from __future__ import annotations

import resource
import threading

__all__ = ["raise_open_files_limit"]

_lock = threading.Lock()
_done = False


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit (once per process; later calls
    do nothing). Returns the soft limit (before, after); a refusal leaves it as it was."""
    global _done
    with _lock:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if _done or hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
            _done = True
            return soft, soft
        _done = True
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft, soft
        return soft, hard
