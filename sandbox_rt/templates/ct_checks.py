"""Hardening controls a build could break, checked inside the build CT where there is no overlay
delta on this machine to read (Proxmox VE): a snapshot of what the controls protect is taken as
root over SSH before the steps and again after them, and any difference is a TemplateBuildError
naming the control (the rules and messages of :mod:`.checks`).

What a snapshot holds: every setuid/setgid file and every file with capabilities on the root
filesystem, device nodes outside /dev, each protected path of :data:`.checks.PROTECTED` (its mode,
owner and content hash, links by target, directories walked), the sandbox user's passwd line and
groups, the uid-0 accounts, and the effective sshd configuration (``sshd -T``).

The snapshot runs in the CT the steps ran in as root, so it guards against a definition's mistakes
(a package that adds a setuid helper, a deploy that edits sshd_config), not against a definition
written to defeat it: the steps are the operator's own code. The embedded default reads the delta
from the host instead (:mod:`.checks`).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import TemplateBuildError
from ..sandbox import Sandbox
from .checks import PROTECTED, raise_if_broken

__all__ = ["CLEANUP_SCRIPT", "compare_controls", "controls_of"]

# run with `python3 -I - <json args>` as root in the CT; prints one JSON object
_SNAPSHOT = r"""
import hashlib, json, os, stat, subprocess, sys
args = json.loads(sys.argv[1])
user, prefixes = args["user"], args["prefixes"]
out = {"setid": {}, "caps": [], "devices": [], "protected": {}, "sshd": "", "user": None,
       "uid0": [], "groups": []}

def describe(path, st):
    d = {"mode": stat.S_IMODE(st.st_mode), "type": stat.S_IFMT(st.st_mode),
         "uid": st.st_uid, "gid": st.st_gid}
    if stat.S_ISREG(st.st_mode):
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        d["sha256"] = h.hexdigest()
    elif stat.S_ISLNK(st.st_mode):
        d["target"] = os.readlink(path)
    return d

def walk_protected(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    out["protected"][path] = describe(path, st)
    if stat.S_ISDIR(st.st_mode):
        for name in sorted(os.listdir(path)):
            walk_protected(os.path.join(path, name))

for prefix in prefixes:
    parent, base = os.path.split("/" + prefix)
    try:
        names = os.listdir(parent)
    except OSError:
        continue
    for name in sorted(names):
        if name == base or name.startswith(base + "."):
            walk_protected(os.path.join(parent, name))

root_dev = os.lstat("/").st_dev
stack = ["/"]
while stack:
    top = stack.pop()
    try:
        entries = list(os.scandir(top))
    except OSError:
        continue
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            if st.st_dev == root_dev:
                stack.append(e.path)
            continue
        if stat.S_ISREG(st.st_mode):
            if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                out["setid"][e.path] = stat.S_IMODE(st.st_mode)
            try:
                if "security.capability" in os.listxattr(e.path, follow_symlinks=False):
                    out["caps"].append(e.path)
            except OSError:
                pass
        elif (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)) and not e.path.startswith("/dev/"):
            out["devices"].append(e.path)

def table(path):
    try:
        with open(path, errors="replace") as fh:
            return [ln.rstrip("\n").split(":") for ln in fh if ln.strip() and not ln.startswith("#")]
    except OSError:
        return []

for f in table("/etc/passwd"):
    if f[0] == user:
        out["user"] = ":".join(f)
    if len(f) > 2 and f[2] == "0" and f[0] != "root":
        out["uid0"].append(f[0])
out["groups"] = sorted(f[0] for f in table("/etc/group") if len(f) > 3 and user in f[3].split(","))
try:
    p = subprocess.run(["sshd", "-T"], capture_output=True, text=True, timeout=30,
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    lines = sorted(p.stdout.splitlines())
    out["sshd"] = "\n".join(lines) if p.returncode == 0 else "error: " + p.stderr[-300:]
except (OSError, subprocess.SubprocessError) as exc:
    out["sshd"] = "error: %s" % exc
out["caps"].sort()
out["devices"].sort()
print(json.dumps(out, sort_keys=True))
"""

# what the build CT got of its own identity, root access and caches, removed before it becomes a
# template (checks.BUILD_STATE's counterpart: there is no base layer to fall back to here, so caches
# are emptied, machine-id truncated as PVE's clone does, and the host keys removed: the node's
# hookscript writes a fresh one into each clone before its first start)
CLEANUP_SCRIPT = r"""set -eu
if [ -f /etc/hosts ]; then
  sed -i '/^# sandbox-rt build egress {$/,/^# sandbox-rt build egress }$/d' /etc/hosts
fi
rm -f /etc/ssh/authorized_keys/root /etc/ssh/authorized_keys/.root.tmp /etc/ssh/sshd_config.root \
  /root/.bash_history /etc/ssh/ssh_host_*
if [ -f /etc/machine-id ]; then : > /etc/machine-id; fi
if [ -d /var/lib/apt/lists ]; then
  find /var/lib/apt/lists -mindepth 1 -maxdepth 1 ! -name partial ! -name lock -exec rm -rf -- {} +
fi
if [ -d /var/cache/apt ]; then find /var/cache/apt -type f -name '*.bin' -delete; fi
if [ -d /var/cache/apt/archives ]; then
  find /var/cache/apt/archives -maxdepth 1 -type f -name '*.deb' -delete
fi
for d in /tmp /var/tmp; do
  if [ -d "$d" ]; then find "$d" -mindepth 1 -delete; fi
done
sync
"""


def controls_of(sandbox: Sandbox, *, user: str, timeout_s: float = 300.0) -> dict[str, Any]:
    """The controls' snapshot of the running build CT (TemplateBuildError if it cannot be taken)."""
    args = json.dumps({"user": user, "prefixes": [prefix for prefix, _control in PROTECTED]})
    result = sandbox.exec(
        ["python3", "-I", "-", args], user="root", stdin=_SNAPSHOT.encode(), timeout=timeout_s
    )
    try:
        if result.exit_code != 0:
            raise ValueError(f"exit code {result.exit_code}")
        data = json.loads(result.stdout)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        return data
    except ValueError as exc:
        raise TemplateBuildError(
            f"cannot read the hardening controls in the build sandbox ({exc}; needs python3)",
            step="hardening checks",
            detail=result.stderr.decode("utf-8", "replace")[-2000:],
        ) from None


def compare_controls(before: dict[str, Any], after: dict[str, Any], *, user: str) -> None:
    """TemplateBuildError naming each control the build broke (between the two snapshots)."""
    problems: list[str] = []
    old_setid, new_setid = before.get("setid", {}), after.get("setid", {})
    for path, mode in sorted(new_setid.items()):
        if old_setid.get(path) != mode:
            problems.append(f"SBX-ESC-05 no new setuid/setgid programs: {path} ({int(mode):o})")
    for path in sorted(set(after.get("caps", [])) - set(before.get("caps", []))):
        problems.append(f"SBX-ESC-26 no file capabilities: {path}")
    for path in sorted(set(after.get("devices", [])) - set(before.get("devices", []))):
        problems.append(f"SBX-ESC-04 no device nodes: {path}")
    old_p, new_p = before.get("protected", {}), after.get("protected", {})
    for path in sorted(set(old_p) | set(new_p)):
        if old_p.get(path) != new_p.get(path):
            rel = path.lstrip("/")
            control = next(
                (c for p, c in PROTECTED if rel == p or rel.startswith((p + "/", p + "."))),
                "protected files",
            )
            problems.append(f"{control}: the build changed {path}")
    if before.get("sshd") != after.get("sshd"):
        problems.append("SBX-SSH-01..04,06 sshd configuration: the effective configuration (sshd -T) changed")
    if before.get("user") != after.get("user"):
        problems.append(f"SBX-USER-01 the sandbox user's account changed: {after.get('user')}")
    for name in sorted(set(after.get("uid0", [])) - set(before.get("uid0", []))):
        problems.append(f"SBX-USER-01 a second uid-0 account: {name}")
    gained = sorted(set(after.get("groups", [])) - set(before.get("groups", [])))
    if gained:
        problems.append(f"SBX-USER-01 the sandbox user joined groups: {', '.join(gained)}")
    del user  # the snapshots were taken for it; kept in the signature for the callers' clarity
    raise_if_broken(problems)
