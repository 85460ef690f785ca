"""Who PID 1 of a sandbox is (SBX-ESC-28): the rule that no process of a sandbox made without root
runs as root. Its init starts as the sandbox user (``lxc.init.uid`` / ``lxc.init.gid``, LXC switches
before it executes anything of the sandbox's root), with the login limits as ``lxc.prlimit.*``
hard limits (what pam_limits set when sshd ran as root), so whatever a template built from code or a
root sandbox's snapshot planted (PAM and NSS modules, ``ld.so.preload``, a replaced sshd or init,
setuid binaries, ...) runs, if at all, as that user. A sandbox made with ``root=True`` gets none of
these lines: its init starts as root, as before.

The user's ids and the limits are read from the default template's root (built and hardened by
Ansible: trusted), never from the template a sandbox is cloned from, which a build step may have
changed (a sandbox user made uid 0 in its ``/etc/passwd`` would be root again).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ...errors import BackendError

__all__ = ["INIT_KEYS", "LIMITS_FILE", "SandboxUser", "init_lines", "read_limits", "read_user"]

# keys of these lines, dropped from a template's config before a clone gets its own
INIT_KEYS = ("lxc.init.uid", "lxc.init.gid", "lxc.init.groups", "lxc.prlimit.")
# the login limits of the sandbox user (roles/sandbox_template, SBX-LIM-01..03)
LIMITS_FILE = "etc/security/limits.d/sandbox.conf"
_LIMIT_ITEMS = ("nproc", "nofile", "core")
_VALUE = re.compile(r"[0-9]{1,19}|unlimited")


@dataclasses.dataclass(frozen=True)
class SandboxUser:
    """The sandbox user's numeric ids in the default template."""

    name: str
    uid: int
    gid: int


def read_user(rootfs: Path, name: str) -> SandboxUser:
    """``name``'s uid and gid from ``rootfs``'s ``/etc/passwd``; a BackendError when it has none, or
    root's (no sandbox may start its init as root by accident)."""
    passwd = rootfs / "etc" / "passwd"
    try:
        text = passwd.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise BackendError(
            f"cannot read the sandbox user from {passwd}: {exc.strerror}", step="clone"
        ) from exc
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 4 and fields[0] == name and fields[2].isdigit() and fields[3].isdigit():
            uid, gid = int(fields[2]), int(fields[3])
            if uid == 0 or gid == 0:
                raise BackendError(f"the sandbox user {name!r} is root in {passwd}", step="clone")
            return SandboxUser(name, uid, gid)
    raise BackendError(f"no user {name!r} in {passwd} (run site.yml)", step="clone")


def read_limits(rootfs: Path) -> dict[str, tuple[str, str]]:
    """{item: (soft, hard)} of the ``*`` lines of the template's limits file for nproc, nofile and
    core (``-`` sets both); items without a line, or a missing file, are left out."""
    out: dict[str, list[str]] = {}
    try:
        text = (rootfs / LIMITS_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if (
            len(words) != 4
            or words[0] != "*"
            or words[2] not in _LIMIT_ITEMS
            or not _VALUE.fullmatch(words[3])
        ):
            continue
        pair = out.setdefault(words[2], ["unlimited", "unlimited"])
        if words[1] in ("soft", "-"):
            pair[0] = words[3]
        if words[1] in ("hard", "-"):
            pair[1] = words[3]
    return {item: (soft, hard) for item, (soft, hard) in out.items()}


def init_lines(user: SandboxUser, limits: dict[str, tuple[str, str]]) -> list[str]:
    """The config lines that start a sandbox's init as ``user`` within ``limits``."""
    lines = [f"lxc.init.uid = {user.uid}", f"lxc.init.gid = {user.gid}"]
    lines += [f"lxc.prlimit.{item} = {soft}:{hard}" for item, (soft, hard) in sorted(limits.items())]
    return lines
