"""Helpers on stored CT configs (``/etc/pve/lxc/<vmid>.conf`` as a dict)."""

from __future__ import annotations

import hashlib
import secrets
import urllib.parse
from collections.abc import Mapping
from typing import Any

from .formats import parse_size, split_list

# Options whose values are integers / booleans in GET .../config (PVE returns them as numbers).
INT_OPTIONS = frozenset({"cores", "cpuunits", "memory", "swap", "tty"})
BOOL_OPTIONS = frozenset({"console", "debug", "onboot", "protection", "template", "unprivileged"})
NET_FIRST = ("name", "bridge")


def parse_kv(value: str, default_key: str | None = None) -> dict[str, str]:
    """Split an already validated property string into a dict."""
    out: dict[str, str] = {}
    for part in value.split(","):
        if not part.strip():
            continue
        key, sep, val = part.partition("=")
        if sep:
            out[key] = val
        elif default_key:
            out[default_key] = part
    return out


def print_kv(values: Mapping[str, Any], first: tuple[str, ...] = (), default_key: str | None = None) -> str:
    """Render a property string: ``default_key``'s value bare and first, then ``first``, then sorted."""
    keys = [k for k in first if k in values and k != default_key]
    keys += sorted(k for k in values if k not in first and k != default_key)
    parts = [f"{k}={values[k]}" for k in keys if values[k] is not None and values[k] != ""]
    if default_key and values.get(default_key):
        parts.insert(0, str(values[default_key]))
    return ",".join(parts)


def random_mac() -> str:
    """A MAC in Proxmox's OUI (BC:24:11), as PVE assigns to new interfaces."""
    return "BC:24:11:" + ":".join(f"{b:02X}" for b in secrets.token_bytes(3))


def normalize_net(value: str, new_mac: bool = False) -> str:
    """Complete a netN value the way PVE stores it: hwaddr assigned, ``type=veth``."""
    net = parse_kv(value)
    if new_mac or not net.get("hwaddr"):
        net["hwaddr"] = random_mac()
    net.setdefault("type", "veth")
    return print_kv(net, NET_FIRST)


def normalize_tags(value: str) -> str:
    """PVE::GuestHelpers::get_unique_tags (default tag style): lower-case, unique, sorted."""
    seen: list[str] = []
    for tag in sorted(split_list(value), key=str.lower):
        tag = tag.lower()
        if tag not in seen:
            seen.append(tag)
    return ";".join(seen)


def rootfs_info(conf: Mapping[str, Any]) -> tuple[str, str, int]:
    """(storage, volume name, size in bytes) of the rootfs; ("", "", 0) without one."""
    root = parse_kv(str(conf.get("rootfs", "")), "volume")
    volume = root.get("volume", "")
    storage, _, volname = volume.partition(":")
    return storage, volname, parse_size(root.get("size", "0")) or 0


def config_text(conf: Mapping[str, Any]) -> str:
    """The config file text (description as ``#`` comment lines first), for the digest."""
    lines = [f"#{urllib.parse.quote(ln, safe=' ')}" for ln in str(conf.get("description", "")).splitlines()]
    lines += [f"{k}: {conf[k]}" for k in sorted(conf) if k != "description"]
    return "\n".join(lines) + "\n"


def config_digest(conf: Mapping[str, Any]) -> str:
    return hashlib.sha1(config_text(conf).encode()).hexdigest()


def api_config(conf: Mapping[str, Any]) -> dict[str, Any]:
    """GET .../config: typed values plus ``digest``."""
    out: dict[str, Any] = {}
    for key, val in conf.items():
        if key in INT_OPTIONS or key in BOOL_OPTIONS:
            out[key] = int(val)
        elif key == "description" and val:
            # PVE keeps the description as '#' comment lines of the config file and reads each
            # line back with its newline: a description always ends in "\n".
            out[key] = "".join(line + "\n" for line in str(val).splitlines())
        else:
            out[key] = val
    out["digest"] = config_digest(conf)
    return out


def env_lines(conf: Mapping[str, Any]) -> list[str]:
    """``env`` (NUL-separated ``NAME=value``) -> the LXC keys of the CT's init environment.
    pve-container (PVE 9, LXC 6) writes ``lxc.environment.runtime``; this machine's LXC 5.0 knows
    only ``lxc.environment`` (init and attach alike), the same for what PID 1 sees."""
    raw = str(conf.get("env") or "")
    return [f"lxc.environment = {item}" for item in raw.split("\0") if item]
