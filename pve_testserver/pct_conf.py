"""A CT's config file as pve-container reads and writes it (``/etc/pve/lxc/<vmid>.conf``), as far as
root's raw ``lxc.*`` lines go (PVE::LXC::Config, pve-container 94f5585).

* Raw lines are ``lxc.<key>: <value>`` (``=`` is read too). pve-container keeps only the keys of its
  whitelist (``$valid_lxc_conf_keys``) plus any ``lxc.cgroup.*``, ``lxc.cgroup2.*``, ``lxc.prlimit.*``
  and ``lxc.net.*``; every other key (``lxc.no_new_privs``, ``lxc.hook.start-host``,
  ``lxc.rootfs.*``, ...) is refused with a warning and never reaches LXC.
* The kept entries are the config's ``lxc`` list of ``[key, value]`` pairs (``GET .../config``
  returns it so); ``pct clone`` copies it like any other key; at start pve-container appends them,
  in order, after the LXC keys it generates, so a single-valued key (``lxc.seccomp.profile``,
  ``lxc.init.cmd``) overrides its own and list keys (``lxc.cap.drop``, hooks, mount entries) add up.
* The file: the description as ``#`` comment lines, the options (``key: value``, sorted), then the raw
  lines; each snapshot follows as a ``[name]`` section.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

# PVE::LXC::Config's $valid_lxc_conf_keys entries that are allowed (value 1). Keys it lists with an
# error text (lxc.rootfs.path, lxc.rootfs.options, ...) and keys it does not list are refused.
VALID_KEYS = frozenset(
    {
        "lxc.apparmor.profile",
        "lxc.apparmor.allow_incomplete",
        "lxc.apparmor.allow_nesting",
        "lxc.apparmor.raw",
        "lxc.selinux.context",
        "lxc.include",
        "lxc.arch",
        "lxc.uts.name",
        "lxc.signal.halt",
        "lxc.signal.reboot",
        "lxc.signal.stop",
        "lxc.init.cmd",
        "lxc.pty.max",
        "lxc.console.logfile",
        "lxc.console.path",
        "lxc.tty.max",
        "lxc.devtty.dir",
        "lxc.hook.autodev",
        "lxc.autodev",
        "lxc.kmsg",
        "lxc.mount.fstab",
        "lxc.mount.entry",
        "lxc.mount.auto",
        "lxc.cap.drop",
        "lxc.cap.keep",
        "lxc.seccomp.profile",
        "lxc.seccomp.notify.proxy",
        "lxc.seccomp.notify.cookie",
        "lxc.idmap",
        "lxc.hook.pre-start",
        "lxc.hook.pre-mount",
        "lxc.hook.mount",
        "lxc.hook.start",
        "lxc.hook.stop",
        "lxc.hook.post-stop",
        "lxc.hook.clone",
        "lxc.hook.destroy",
        "lxc.hook.version",
        "lxc.log.level",
        "lxc.log.file",
        "lxc.start.auto",
        "lxc.start.delay",
        "lxc.start.order",
        "lxc.group",
        "lxc.environment",
        # namespaced by CLONE_NEWIPC (the only sysctls it allows)
        "lxc.sysctl.fs.mqueue",
        "lxc.sysctl.kernel.msgmax",
        "lxc.sysctl.kernel.msgmnb",
        "lxc.sysctl.kernel.msgmni",
        "lxc.sysctl.kernel.sem",
        "lxc.sysctl.kernel.shmall",
        "lxc.sysctl.kernel.shmmax",
        "lxc.sysctl.kernel.shmmni",
        "lxc.sysctl.kernel.shm_rmid_forced",
    }
)
_ANY_OF = re.compile(r"^lxc\.(?:cgroup2?|prlimit|net)\.")
_RAW_LINE = re.compile(r"^(lxc\.[a-z0-9_\-.]+)(?::|\s*=)\s*(.*?)\s*$")


def key_allowed(key: str) -> bool:
    """pve-container's is_valid_lxc_conf_key."""
    return key in VALID_KEYS or bool(_ANY_OF.match(key))


def parse_raw(text: str) -> tuple[list[list[str]], list[str]]:
    """The CT's own section (up to the first ``[snapshot]``): its kept raw entries and the warnings
    for the refused ones (PVE warns and drops them; the CT starts without them)."""
    kept: list[list[str]] = []
    warnings: list[str] = []
    for line in text.splitlines():
        if line.startswith("["):
            break
        m = _RAW_LINE.match(line)
        if not m:
            continue
        key, value = m.group(1), m.group(2)
        if key_allowed(key):
            kept.append([key, value])
        else:
            warnings.append(f"{key}: unknown key (not in pve-container's whitelist), ignored")
    return kept, warnings


def raw_entries(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The whitelisted ``lxc`` entries of a stored config, in order."""
    out: list[tuple[str, str]] = []
    for entry in config.get("lxc") or ():
        if isinstance(entry, (list, tuple)) and len(entry) == 2:
            key, value = str(entry[0]), str(entry[1])
            if key_allowed(key) and "\n" not in value:
                out.append((key, value))
    return out


def _options(config: Mapping[str, Any]) -> Iterable[str]:
    for key in sorted(config):
        if key in ("description", "lxc", "digest") or key.startswith("_"):
            continue
        value = config[key]
        if isinstance(value, (dict, list)):
            continue
        yield f"{key}: {value}"
    for key, value in raw_entries(config):
        yield f"{key}: {value}"


def render(config: Mapping[str, Any], snapshots: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The file pve-container writes for ``config`` (write_pct_config)."""
    lines = [
        "#" + urllib.parse.quote(line, safe=" :/=@,.-_+'()!~*")
        for line in str(config.get("description") or "").splitlines()
    ]
    lines += _options(config)
    for name in sorted(snapshots or {}):
        lines += ["", f"[{name}]", *_options((snapshots or {})[name].get("config", {}))]
    return "\n".join(lines) + "\n"
