"""The caps half of the node's hookscript (roles/proxmox_hookscript/files/sandbox-rt-hookscript.pl),
as the test server's engines play it after a CT's start (PVE's ``post-start`` phase).

The runtime asks for caps PVE's CT config has no option for with one description line, and the
hookscript publishes what it applied as another::

    sandbox-rt-caps: pids_max=<n> disk_mbps=<n> disk_iops=<n>
    sandbox-rt-caps-applied: pids_max=<n> disk_mbps=<n> disk_iops=<n> device=<major:minor|->

The node engine runs the real hookscript inside the emulated node (engine_node.py), which writes the
CT's cgroup files. The memory and LXC engines only keep the books: :func:`bookkept` bounds the request
by the role's default ceilings, as the script does, and says what the script would publish; they
enforce nothing (docs/pve-test-server.md).
"""

from __future__ import annotations

import dataclasses
import re

__all__ = [
    "APPLIED_PREFIX",
    "CAPS_PREFIX",
    "DEFAULT_CEILINGS",
    "REFUSED_PREFIX",
    "Published",
    "applied_of",
    "bookkept",
    "published_line",
    "with_applied",
]

CAPS_PREFIX = "sandbox-rt-caps: "
APPLIED_PREFIX = "sandbox-rt-caps-applied: "
REFUSED_PREFIX = "sandbox-rt-caps-refused: "  # the node refused the caps (its pids budget): why


@dataclasses.dataclass(frozen=True)
class Published:
    """What a post-start published in the CT's description: the caps applied, or why they were
    refused (a failed script publishes at most the latter)."""

    applied: str | None = None
    refused: str | None = None


# roles/proxmox_hookscript/defaults/main.yml (proxmox_hookscript_*_ceiling) and the script's defaults
DEFAULT_CEILINGS = {"pids_max": 65536, "disk_mbps": 10000, "disk_iops": 1000000}
_CAPS = re.compile(r"pids_max=(\d{1,9}) disk_mbps=(\d{1,9}) disk_iops=(\d{1,9})\s*")


def bookkept(description: str | None, ceilings: dict[str, int] | None = None) -> str | None:
    """What the hookscript would publish as applied for ``description``'s caps line (no device: these
    engines have none to throttle), or None where it would fail (a malformed or repeated line)."""
    ceil = ceilings or DEFAULT_CEILINGS
    lines = [ln for ln in (description or "").splitlines() if ln.startswith(CAPS_PREFIX)]
    if len(lines) > 1:
        return None
    want = dict.fromkeys(DEFAULT_CEILINGS, 0)
    if lines:
        m = _CAPS.fullmatch(lines[0][len(CAPS_PREFIX) :])
        if m is None:
            return None
        want = dict(zip(DEFAULT_CEILINGS, (int(g) for g in m.groups()), strict=True))
    eff = {n: ceil[n] if ceil[n] > 0 and (w == 0 or w > ceil[n]) else w for n, w in want.items()}
    return " ".join([*(f"{n}={v}" for n, v in eff.items()), "device=-"])


def published_line(description: str | None, prefix: str = APPLIED_PREFIX) -> str | None:
    """The value of ``description``'s line that starts with ``prefix`` (None without one)."""
    for line in (description or "").splitlines():
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    return None


def applied_of(description: str | None) -> str | None:
    """The applied line's value in ``description`` (None without one)."""
    return published_line(description, APPLIED_PREFIX)


def with_applied(description: str | None, applied: str | None, prefix: str = APPLIED_PREFIX) -> str:
    """``description`` with its ``prefix`` line (the applied one) set to ``applied`` (None: removed);
    other lines kept."""
    lines = [ln for ln in (description or "").splitlines() if not ln.startswith(prefix)]
    if applied is not None:
        lines.append(prefix + applied)
    return "\n".join(lines) + "\n" if lines else ""
