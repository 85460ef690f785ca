"""Hardening controls a build could break, checked on the build's overlay delta (its upper dir) from
the host after the build sandbox stopped: what the build wrote is hostile input, so nothing here runs
inside the sandbox or follows a link it made. A failed control is a TemplateBuildError naming it.

Before the checks, what the build sandbox got of its own identity and its root access (host keys,
machine-id, names, resolver, root's authorized key and sshd drop-in written by ``sandbox-init`` for
``root=True``) and caches (apt lists, /tmp, /run) are dropped from the delta: the template keeps the
base's versions, and every sandbox made from it gets its own identity as usual.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from ..errors import TemplateBuildError

__all__ = ["BUILD_STATE", "PROTECTED", "check_layer", "raise_if_broken", "strip_build_state"]

# dropped from the delta before it becomes a template (paths relative to the container's /)
BUILD_STATE = (
    "etc/ssh/ssh_host_ed25519_key",
    "etc/ssh/ssh_host_ed25519_key.pub",
    "etc/machine-id",
    "etc/hostname",
    "etc/hosts",
    "etc/resolv.conf",
    "etc/ssh/authorized_keys/root",
    "etc/ssh/authorized_keys/.root.tmp",
    "etc/ssh/sshd_config.root",
    "root/.bash_history",
    "var/lib/apt/lists",
    "var/cache/apt",
    "tmp",
    "run",
    "var/tmp",
)
_HOST_KEY_PREFIX = "etc/ssh/ssh_host_"

# (path prefix, control): a build must not change these at all
PROTECTED = (
    ("etc/ssh/sshd_config", "SBX-SSH-01..04,06 sshd configuration"),
    ("etc/ssh/authorized_keys", "SBX-USER-04 root-owned authorized keys"),
    ("etc/pam.d/sshd", "SBX-SSH-01..04,06 sshd configuration"),
    ("sbin/sandbox-init", "SBX-INIT-01 sandbox init (root login only on request)"),
    ("etc/sudoers", "SBX-USER-02 no sudo for the sandbox user"),
    ("etc/security/limits.conf", "SBX-LIM-01 process and file limits"),
    ("etc/security/limits.d", "SBX-LIM-01 process and file limits"),
)
_CAPABILITY_XATTR = "security.capability"
_MAX_REPORTED = 20


def _remove(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def strip_build_state(upper: Path) -> None:
    """Drop the build sandbox's own identity, root access and caches from its delta."""
    for rel in BUILD_STATE:
        _remove(upper / rel)
    ssh = upper / "etc/ssh"
    if ssh.is_dir() and not ssh.is_symlink():
        for entry in ssh.iterdir():
            if f"etc/ssh/{entry.name}".startswith(_HOST_KEY_PREFIX):
                _remove(entry)


def _walk(upper: Path) -> list[tuple[str, os.stat_result]]:
    out: list[tuple[str, os.stat_result]] = []
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(upper / rel if rel else upper) as entries:
            for entry in entries:
                sub = f"{rel}/{entry.name}" if rel else entry.name
                st = entry.stat(follow_symlinks=False)
                out.append((sub, st))
                if stat.S_ISDIR(st.st_mode):
                    stack.append(sub)
    return out


def _passwd(path: Path) -> dict[str, list[str]]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return {}
    return {ln.split(":", 1)[0]: ln.split(":") for ln in lines if ln and not ln.startswith("#")}


def _groups_of(groups: dict[str, list[str]], user: str) -> set[str]:
    return {name for name, f in groups.items() if len(f) > 3 and user in f[3].split(",")}


def check_layer(upper: Path, base_rootfs: Path, *, user: str = "sandbox") -> None:
    """TemplateBuildError naming each broken control (and the paths) if the delta breaks any."""
    problems: list[str] = []
    entries = _walk(upper)
    for rel, st in entries:
        is_whiteout = stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
        # a directory in the delta is only a parent of a change (copied up): its entries tell
        copied_up = stat.S_ISDIR(st.st_mode) and (base_rootfs / rel).is_dir()
        for prefix, control in PROTECTED:
            if not copied_up and (rel == prefix or rel.startswith((prefix + "/", prefix + "."))):
                problems.append(f"{control}: the build changed /{rel}")
        if is_whiteout:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
            try:
                before = os.lstat(base_rootfs / rel)
                same = stat.S_ISREG(before.st_mode) and (before.st_mode & 0o7777) == (st.st_mode & 0o7777)
            except OSError:
                same = False
            if not same:
                problems.append(f"SBX-ESC-05 no new setuid/setgid programs: /{rel} ({st.st_mode & 0o7777:o})")
        if stat.S_ISREG(st.st_mode):
            try:
                names = os.listxattr(upper / rel, follow_symlinks=False)
            except OSError:
                names = []
            if _CAPABILITY_XATTR in names:
                problems.append(f"SBX-ESC-26 no file capabilities: /{rel}")
        if stat.S_ISBLK(st.st_mode) or (stat.S_ISCHR(st.st_mode) and not is_whiteout):
            problems.append(f"SBX-ESC-04 no device nodes: /{rel}")
    # the sandbox user keeps its identity and gains no group (sudo, adm, disk, ...)
    if (upper / "etc/passwd").exists() or (upper / "etc/group").exists():
        view = {
            p: (upper / p if (upper / p).exists() else base_rootfs / p) for p in ("etc/passwd", "etc/group")
        }
        old_user = _passwd(base_rootfs / "etc/passwd").get(user)
        new_users = _passwd(view["etc/passwd"])
        if new_users.get(user) != old_user:
            problems.append(f"SBX-USER-01 the sandbox user's account changed: {new_users.get(user)}")
        for name, fields in new_users.items():
            if len(fields) > 2 and fields[2] == "0" and name != "root":
                problems.append(f"SBX-USER-01 a second uid-0 account: {name}")
        gained = _groups_of(_passwd(view["etc/group"]), user) - _groups_of(
            _passwd(base_rootfs / "etc/group"), user
        )
        if gained:
            problems.append(f"SBX-USER-01 the sandbox user joined groups: {', '.join(sorted(gained))}")
    raise_if_broken(problems)


def raise_if_broken(problems: list[str]) -> None:
    """TemplateBuildError listing ``problems`` (each "<control>: <what>"), if there are any."""
    if problems:
        shown = problems[:_MAX_REPORTED] + (
            [f"... {len(problems) - _MAX_REPORTED} more"] if len(problems) > _MAX_REPORTED else []
        )
        raise TemplateBuildError(
            f"the build broke {len(problems)} hardening control(s)",
            step="hardening checks",
            detail="\n".join(shown),
        )
