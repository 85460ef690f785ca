"""Argument checks shared by every public call: fail early, name the bad value, change nothing."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError
from .models import SandboxSpec

__all__ = [
    "check_env",
    "check_hostname",
    "check_remote_path",
    "check_sandbox_id",
    "check_timeout",
    "make_spec",
]

_HOSTNAME_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_LABEL_KEY = re.compile(r"^[A-Za-z0-9_.\-/]{1,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SANDBOX_ID = re.compile(r"^sbx-[0-9a-f]{10}$")

MIN_MEMORY_MB = 64
MAX_DISK_GB = 4096
MAX_TTL_S = 30 * 24 * 3600


def check_hostname(hostname: str) -> str:
    """RFC 1123 host name (lower-cased), at most 63 characters (one label: it is also the CT name)."""
    if not isinstance(hostname, str) or not _HOSTNAME_LABEL.match(hostname.lower()):
        raise ConfigError(
            f"hostname={hostname!r} is not a valid RFC 1123 host name "
            "(1-63 of a-z, 0-9 and '-', not starting or ending with '-')"
        )
    return hostname.lower()


def _number(name: str, value: Any, *, integer: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name}={value!r} must be a number")
    if integer and not float(value).is_integer():
        raise ConfigError(f"{name}={value!r} must be a whole number")
    if value != value or value in (float("inf"), float("-inf")):
        raise ConfigError(f"{name}={value!r} must be finite")
    return float(value)


def make_spec(
    *,
    hostname: str | None = None,
    cpus: float = 1,
    memory_mb: int = 1024,
    disk_gb: int = 8,
    pids_max: int = 1024,
    internet: bool = False,
    labels: Mapping[str, str] | None = None,
    ttl_s: int | None = None,
    detached: bool = False,
    host_cpus: int | None = None,
) -> SandboxSpec:
    """Validate ``create`` arguments into a :class:`SandboxSpec` or raise ConfigError."""
    host_cpus = host_cpus or os.cpu_count() or 1
    c = _number("cpus", cpus, integer=False)
    if not 0 < c <= host_cpus:
        raise ConfigError(f"cpus={cpus!r} must be > 0 and <= the host's {host_cpus} cores")
    m = _number("memory_mb", memory_mb, integer=True)
    if m < MIN_MEMORY_MB:
        raise ConfigError(f"memory_mb={memory_mb!r} must be at least {MIN_MEMORY_MB}")
    if m > 1 << 30:
        raise ConfigError(f"memory_mb={memory_mb!r} is larger than any host")
    d = _number("disk_gb", disk_gb, integer=True)
    if not 1 <= d <= MAX_DISK_GB:
        raise ConfigError(f"disk_gb={disk_gb!r} must be between 1 and {MAX_DISK_GB}")
    p = _number("pids_max", pids_max, integer=True)
    if not 16 <= p <= 1 << 22:
        raise ConfigError(f"pids_max={pids_max!r} must be between 16 and {1 << 22}")
    for flag_name, flag in (("internet", internet), ("detached", detached)):
        if not isinstance(flag, bool):
            raise ConfigError(f"{flag_name}={flag!r} must be True or False")
    if ttl_s is not None:
        t = _number("ttl_s", ttl_s, integer=True)
        if not 0 < t <= MAX_TTL_S:
            raise ConfigError(f"ttl_s={ttl_s!r} must be > 0 and <= {MAX_TTL_S}")
    clean_labels: dict[str, str] = {}
    for key, value in (labels or {}).items():
        if not isinstance(key, str) or not _LABEL_KEY.match(key):
            raise ConfigError(f"label key {key!r} must be 1-63 of A-Z a-z 0-9 _ . - /")
        if not isinstance(value, str) or len(value) > 256 or "\x00" in value:
            raise ConfigError(f"label {key}={value!r} must be a string of at most 256 characters")
        clean_labels[key] = value
    return SandboxSpec(
        hostname=check_hostname(hostname) if hostname is not None else None,
        cpus=c,
        memory_mb=int(m),
        disk_gb=int(d),
        pids_max=int(p),
        internet=internet,
        labels=clean_labels,
        ttl_s=int(ttl_s) if ttl_s is not None else None,
        detached=detached,
    )


def check_sandbox_id(sandbox_id: str) -> str:
    if not isinstance(sandbox_id, str) or not SANDBOX_ID.match(sandbox_id):
        raise ConfigError(f"sandbox id {sandbox_id!r} is not of the form sbx-<10 hex digits>")
    return sandbox_id


def check_timeout(timeout: float | None, name: str = "timeout") -> float | None:
    if timeout is None:
        return None
    t = _number(name, timeout, integer=False)
    if t <= 0:
        raise ConfigError(f"{name}={timeout!r} must be > 0")
    return t


def check_remote_path(path: str, name: str = "path") -> str:
    """An absolute path inside the sandbox, without NUL bytes."""
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{name}={path!r} must be a non-empty string")
    if "\x00" in path:
        raise ConfigError(f"{name}={path!r} contains a NUL byte")
    if not path.startswith("/"):
        raise ConfigError(f"{name}={path!r} must be an absolute path inside the sandbox")
    return path


def check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in (env or {}).items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise ConfigError(f"environment variable name {key!r} is not valid")
        if not isinstance(value, str) or "\x00" in value:
            raise ConfigError(f"environment variable {key}={value!r} must be a string without NUL")
        out[key] = value
    return out
