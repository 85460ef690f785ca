"""What a volume mount may say: names, paths inside the sandbox, paths inside the source.

Pure checks (no file system access); the host side (does it exist, is it allowed, no link on the
way) is :mod:`sandbox_rt.volumes.store` and the LXC backend's ``volumes`` module.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

from ..errors import ConfigError
from ..models import VolumeMount

__all__ = [
    "ABSOLUTE_PATH",
    "MAX_MOUNTS",
    "MOUNT_PATH",
    "RELATIVE_PATH",
    "SYSTEM_DIRS",
    "check_host_path",
    "check_mount_path",
    "check_mounts",
    "check_sub_path",
    "check_volume_name",
]

# A volume's name: a DNS label (OpenSandbox's pvc.claimName and Docker's volume names agree).
VOLUME_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
# Paths in canonical form (what the HTTP API's document demands; the runtime normalises "//" and a
# trailing "/" first): components of plain characters (an LXC mount entry is an fstab line: no
# blanks, quotes, '#' or ','), never "." or "..".
_COMPONENT = r"(?!\.\.?(?:/|$))[A-Za-z0-9_@+=.-]{1,255}"
RELATIVE_PATH = re.compile(f"{_COMPONENT}(?:/{_COMPONENT})*")
ABSOLUTE_PATH = re.compile(f"/{RELATIVE_PATH.pattern}")
MAX_PATH = 1024
MAX_MOUNTS = 16
# Where nothing may be mounted: the root, the system's own directories (a volume over /etc would
# replace the root-owned authorized keys and sshd's configuration) and the kernel's file systems.
SYSTEM_DIRS = (
    "bin",
    "boot",
    "dev",
    "etc",
    "lib",
    "lib32",
    "lib64",
    "libx32",
    "proc",
    "run",
    "sbin",
    "sys",
    "usr",
)
_SYSTEM_PATHS = ("/var/run", "/var/lock", "/var/lib/dpkg", "/var/lib/apt")
_SYSTEM = "|".join([f"/(?:{'|'.join(SYSTEM_DIRS)})(?:/|$)", "/var$", *(f"{p}(?:/|$)" for p in _SYSTEM_PATHS)])
MOUNT_PATH = re.compile(f"(?!{_SYSTEM}){ABSOLUTE_PATH.pattern}")


def check_volume_name(name: object) -> str:
    if not isinstance(name, str) or not VOLUME_NAME.fullmatch(name):
        raise ConfigError(
            f"volume name {name!r} must be a DNS label: 1-63 of a-z, 0-9 and '-', "
            "not starting or ending with '-'"
        )
    return name


def _normal(path: str, what: str, *, absolute: bool) -> str:
    """``path`` without empty components, checked against the canonical form."""
    parts = [p for p in path.split("/") if p]
    normal = ("/" if absolute else "") + "/".join(parts)
    if len(normal) > MAX_PATH:
        raise ConfigError(f"{what} {path[:80]!r}... is longer than {MAX_PATH} characters")
    for part in parts:
        if not RELATIVE_PATH.fullmatch(part):
            raise ConfigError(
                f"{what} {path!r}: {part!r} is not allowed (components of A-Z a-z 0-9 _ @ + = . -, "
                "never '.' or '..')"
            )
    return normal


def check_mount_path(path: object) -> str:
    """An absolute path inside the sandbox, normalised (no trailing '/'), outside the system's dirs."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ConfigError(f"mount path {path!r} must be an absolute path")
    normal = _normal(path, "mount path", absolute=True)
    if not MOUNT_PATH.fullmatch(normal):
        raise ConfigError(
            f"mount path {path!r} is the root or a system directory "
            f"(/{', /'.join(SYSTEM_DIRS)}, /var, {', '.join(_SYSTEM_PATHS)}); "
            "mount volumes at /data, /workspace, /mnt/..., /home/... or similar"
        )
    return normal


def check_sub_path(path: object) -> str | None:
    """A relative path inside a volume or host directory, normalised; None for none."""
    if path is None:
        return None
    if not isinstance(path, str) or path.startswith("/") or not path.strip("/"):
        raise ConfigError(f"sub path {path!r} must be a relative path (None: the whole source)")
    return _normal(path, "sub path", absolute=False)


def check_host_path(path: object) -> str:
    """An absolute host path, normalised; whether it is allowed is the store's check."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ConfigError(f"host path {path!r} must be an absolute path")
    normal = _normal(path, "host path", absolute=True)
    if normal == "/":
        raise ConfigError("host path '/' cannot be mounted")
    return normal


def check_mounts(mounts: Sequence[VolumeMount] | None) -> tuple[VolumeMount, ...]:
    """Each mount checked and normalised, sorted by mount path (a mount inside another comes after
    it); at most :data:`MAX_MOUNTS`, no two at the same path, none inside a read-only one (its
    mount point would have to be made in the read-only source)."""
    if mounts is None:
        return ()
    if isinstance(mounts, str | bytes) or not isinstance(mounts, Sequence):
        raise ConfigError(f"volumes={mounts!r} must be a list of VolumeMount")
    if len(mounts) > MAX_MOUNTS:
        raise ConfigError(f"at most {MAX_MOUNTS} volumes may be mounted, not {len(mounts)}")
    out: list[VolumeMount] = []
    for mount in mounts:
        if not isinstance(mount, VolumeMount):
            raise ConfigError(f"volume {mount!r} must be a VolumeMount")
        if (mount.volume is None) == (mount.host_path is None):
            raise ConfigError(f"volume mount at {mount.mount_path!r} needs one of volume= and host_path=")
        if not isinstance(mount.read_only, bool):
            raise ConfigError(f"read_only={mount.read_only!r} must be True or False")
        out.append(
            VolumeMount(
                mount_path=check_mount_path(mount.mount_path),
                volume=check_volume_name(mount.volume) if mount.volume is not None else None,
                host_path=check_host_path(mount.host_path) if mount.host_path is not None else None,
                sub_path=check_sub_path(mount.sub_path),
                read_only=mount.read_only,
            )
        )
    # parents before what is mounted inside them (a mount inside a volume lands in that volume)
    out.sort(key=lambda m: m.mount_path)
    for first, second in itertools.pairwise(out):
        if first.mount_path == second.mount_path:
            raise ConfigError(f"two volumes are mounted at {first.mount_path!r}")
    for outer in (m for m in out if m.read_only):
        inner = next((m for m in out if m.mount_path.startswith(outer.mount_path + "/")), None)
        if inner is not None:
            raise ConfigError(
                f"volume mount at {inner.mount_path!r} lies inside the read-only mount at "
                f"{outer.mount_path!r}: its mount point would have to be made in that read-only "
                f"source, and nothing ever is; mount it outside {outer.mount_path!r}, or that one "
                "read-write"
            )
    return tuple(out)
