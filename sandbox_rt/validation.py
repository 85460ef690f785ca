"""Argument checks shared by every public call: fail early, name the bad value, change nothing."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack

from .errors import ConfigError, StateConflict
from .models import SandboxSpec
from .options import (
    MAX_DISK_GB,
    MAX_EGRESS_ENTRIES,
    MAX_MEMORY_MB,
    MAX_PIDS_MAX,
    MAX_TTL_S,
    MIN_MEMORY_MB,
    MIN_PIDS_MAX,
    Option,
    SpecOptions,
    all_options,
)
from .volumes.checks import check_mounts

__all__ = [
    "MAX_DISK_GB",
    "MAX_EGRESS_ENTRIES",
    "MAX_MEMORY_MB",
    "MAX_PIDS_MAX",
    "MAX_TTL_S",
    "MIN_MEMORY_MB",
    "MIN_PIDS_MAX",
    "SYNTAX",
    "check_create",
    "check_egress",
    "check_env",
    "check_hostname",
    "check_labels",
    "check_max_bytes",
    "check_node_name",
    "check_remote_path",
    "check_sandbox_id",
    "check_snapshot_name",
    "check_template_name",
    "check_timeout",
    "egress_entry",
    "make_spec",
    "respec",
    "split_egress",
]

# Every pattern is applied with ``fullmatch`` (never ``match``/``search``): ``$`` would accept a
# trailing newline. SANDBOX_ID is also used by other modules, so it carries its own \A...\Z.
_HOSTNAME_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
_LABEL_KEY = re.compile(r"[A-Za-z0-9_.\-/]{1,63}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SANDBOX_ID = re.compile(r"\Asbx-[0-9a-f]{10}\Z")

# Egress entries. A name's last label starts with a letter (an all-numeric top-level label does not
# exist, RFC 3696 2), so no name looks like an address. Anything made of digits, dots and "/" only is
# an address or nothing: it must be four decimal octets 0-255 without leading zeros and, optionally,
# "/" and a prefix length 0-32 without leading zeros; "1.2.3", "01.2.3.4", "1.2.3.4.5", "999.1.1.1",
# "127.1" and dotted netmasks are refused, never read as names (or as inet_aton would).
_ADDRESS_LIKE = re.compile(r"[0-9./]+")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4_TEXT = re.compile(rf"(?:{_OCTET}\.){{3}}{_OCTET}(?:/(?:[12]?[0-9]|3[0-2]))?")
_DOMAIN = re.compile(r"(?=.{1,253}\Z)(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z][a-z0-9-]{0,61}[a-z0-9]")


def check_hostname(hostname: str) -> str:
    """RFC 1123 host name (lower-cased), at most 63 characters (one label: it is also the CT name)."""
    if not isinstance(hostname, str) or not _HOSTNAME_LABEL.fullmatch(hostname.lower()):
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


def check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """Labels: keys of 1-63 of ``A-Z a-z 0-9 _ . - /``, values strings of at most 256 characters."""
    if labels is not None and not isinstance(labels, Mapping):
        raise ConfigError(f"labels={labels!r:.60} must be a mapping of strings")
    clean: dict[str, str] = {}
    for key, value in (labels or {}).items():
        if not isinstance(key, str) or not _LABEL_KEY.fullmatch(key):
            raise ConfigError(f"label key {key!r} must be 1-63 of A-Z a-z 0-9 _ . - /")
        if not isinstance(value, str) or len(value) > 256 or "\x00" in value:
            raise ConfigError(f"label {key}={value!r} must be a string of at most 256 characters")
        clean[key] = value
    return clean


def _check_number(opt: Option, value: Any, host_cpus: int) -> int | float:
    """A number option within its declared range: "disk_gb=0 must be between 1 and 4096"."""
    v = _number(opt.name, value, integer=opt.kind == "integer")
    top = host_cpus if opt.host_bound == "cores" else opt.maximum
    if opt.exclusive_minimum is not None:
        above = v > opt.exclusive_minimum
    else:
        above = opt.minimum is None or v >= opt.minimum
    if above and (top is None or v <= top):
        return int(v) if opt.kind == "integer" else v
    ceiling = f"the host's {top} cores" if opt.host_bound == "cores" else str(top)
    if opt.exclusive_minimum is not None:
        bounds = f"> {opt.exclusive_minimum}" + (f" and <= {ceiling}" if top is not None else "")
    else:
        floor = f"{opt.minimum} (no cap)" if opt.policy == "cap" else str(opt.minimum)
        bounds = f"between {floor} and {ceiling}" if top is not None else f"at least {floor}"
    raise ConfigError(f"{opt.name}={value!r} must be {bounds}")


def check_create(
    given: Mapping[str, Any], *, host_cpus: int | None = None
) -> tuple[SandboxSpec, dict[str, Any]]:
    """Validate ``create`` arguments (:class:`~sandbox_rt.options.CreateOptions`) by their declaration:
    (the :class:`SandboxSpec`, the checked options that are not the spec's: how it is made) or a
    ConfigError naming the first bad one. An option left out has the spec's default; None keeps a
    spec default of None (no host name, no TTL) and means the empty default of a list, map or
    template, but is no number (the host's defaults are the manager's to fill in first).

    The one check every front door's create passes through (``Manager.create``)."""
    declared = {o.name: o for o in all_options()}
    for name in given:
        if name not in declared:
            raise TypeError(f"create() got an unexpected keyword argument {name!r}")
    for opt in declared.values():
        for other, why in opt.excludes.items():
            if given.get(opt.name) is not None and given.get(other) is not None:
                raise ConfigError(f"{other}= and {opt.name}= do not go together: {why}")
    cores = host_cpus or os.cpu_count() or 1
    blank = SandboxSpec()
    spec: dict[str, Any] = {}
    how: dict[str, Any] = {}
    for opt in declared.values():
        default = getattr(blank, opt.name) if opt.spec else None
        value = given.get(opt.name)
        if opt.name not in given and opt.spec_default is not None:
            value = opt.spec_default
        elif opt.name not in given or (value is None and opt.nullable and opt.host_default is None):
            if not opt.spec:  # how it is made: absent means not asked for
                continue
            value = default
        if value is None and default is None:
            checked: Any = None
        elif opt.kind in ("number", "integer"):
            checked = _check_number(opt, value, cores)
        elif opt.kind == "boolean":
            if not isinstance(value, bool):
                raise ConfigError(f"{opt.name}={value!r} must be True or False")
            checked = value
        elif opt.syntax is not None:
            checked = SYNTAX[opt.syntax](value)
        elif isinstance(value, str):
            checked = value
        else:
            raise ConfigError(f"{opt.name}={value!r:.60} must be a string")
        (spec if opt.spec else how)[opt.name] = checked
    return SandboxSpec(**spec), how


def make_spec(*, host_cpus: int | None = None, **given: Unpack[SpecOptions]) -> SandboxSpec:
    """Validate ``create`` arguments into a :class:`SandboxSpec` or raise ConfigError (options that
    are not the spec's are refused: :func:`check_create` takes those)."""
    spec, how = check_create(given, host_cpus=host_cpus)
    if how:
        raise TypeError(f"make_spec() takes the spec's options only, not {', '.join(sorted(how))}")
    return spec


def respec(spec: SandboxSpec, **changes: Any) -> SandboxSpec:
    """``spec`` with ``changes`` (``make_spec``'s arguments), checked again as a create's arguments
    are. Its fields are taken as they are, one level deep: ``dataclasses.asdict`` would also turn its
    VolumeMounts into dicts, which ``make_spec`` refuses (an extend of a sandbox with volumes did)."""
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    return make_spec(**{**fields, **changes})


def check_egress(entries: Sequence[str] | None) -> tuple[str, ...]:
    """An egress allow-list: IPv4 addresses, IPv4 networks (``192.0.2.0/24``) and domain names
    (``example.org``, which also allows its subdomains; a leading ``*.`` means the same).

    Each entry is classified by parsing it (see :func:`egress_entry`). Returns the entries
    normalised (networks in canonical form, names lower-case, no duplicates).
    """
    if entries is None:
        return ()
    if isinstance(entries, str | bytes) or not isinstance(entries, Sequence | set | frozenset):
        raise ConfigError(f"egress={entries!r} must be a list of addresses, networks or domain names")
    if len(entries) > MAX_EGRESS_ENTRIES:
        raise ConfigError(f"egress has {len(entries)} entries; at most {MAX_EGRESS_ENTRIES} are allowed")
    out: list[str] = []
    for entry in entries:
        norm = egress_entry(entry)[1]
        if norm not in out:
            out.append(norm)
    return tuple(out)


def split_egress(entries: Sequence[str]) -> tuple[list[str], list[str]]:
    """(networks, domain names) of an egress list, each entry classified by parsing it (the same
    :func:`egress_entry` that :func:`check_egress` uses); a bad entry is a ConfigError."""
    nets: list[str] = []
    names: list[str] = []
    for entry in entries:
        kind, norm = egress_entry(entry)
        (nets if kind == "network" else names).append(norm)
    return nets, names


def egress_entry(entry: object) -> tuple[str, str]:
    """``("network", "192.0.2.0/24" | "192.0.2.7")`` or ``("name", "example.org")``, else ConfigError.

    An entry of digits, dots and ``/`` only is an IPv4 address or network, or refused; anything else
    is a domain name, or refused. Whitespace is refused (no stripping: ``"a.org\\n"`` is an error).
    """
    if not isinstance(entry, str) or not entry or "\x00" in entry or len(entry) > 255:
        raise ConfigError(f"egress entry {entry!r} must be a non-empty string")
    text = entry.lower()
    if ":" in text:
        raise ConfigError(f"egress entry {entry!r}: IPv6 is not routed to sandboxes; give IPv4 or a name")
    if _ADDRESS_LIKE.fullmatch(text):
        if not _IPV4_TEXT.fullmatch(text):
            raise ConfigError(
                f"egress entry {entry!r} is not an IPv4 address or network: write four decimal "
                "octets 0-255 without leading zeros, optionally /0-32 (e.g. 192.0.2.0/24)"
            )
        try:
            net = ipaddress.IPv4Network(text, strict=True)
        except ValueError as exc:
            raise ConfigError(f"egress entry {entry!r} is not an IPv4 address or network: {exc}") from exc
        if net.prefixlen == 0:
            raise ConfigError(f"egress entry {entry!r} allows everything; use internet=True instead")
        return "network", str(net.network_address) if net.prefixlen == 32 else str(net)
    name = text.removeprefix("*.").removesuffix(".")
    if not _DOMAIN.fullmatch(name):
        raise ConfigError(
            f"egress entry {entry!r} is not an IPv4 address, an IPv4 network or a domain name "
            "(labels of a-z, 0-9 and '-', at least two labels, the last one starting with a letter)"
        )
    return "name", name


def check_sandbox_id(sandbox_id: str) -> str:
    if not isinstance(sandbox_id, str) or not SANDBOX_ID.fullmatch(sandbox_id):
        raise ConfigError(f"sandbox id {sandbox_id!r} is not of the form sbx-<10 hex digits>")
    return sandbox_id


# a template's name: what create(template=...) takes and the host contract maps to a container / VMID
TEMPLATE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")


def check_template_name(name: str) -> str:
    """A template name as the inventory and ``create(template=...)`` spell it: 1-40 of lower-case
    letters, digits and ``-``, starting with a letter or digit (``default`` is the host's default).
    Whether the host has it is the manager's check (:meth:`Settings.template_names`)."""
    if not isinstance(name, str) or not TEMPLATE_NAME.fullmatch(name):
        raise ConfigError(
            f"template name {name!r} must be 1-40 characters: lower-case letters, digits and '-', "
            "starting with a letter or digit"
        )
    return name


# a Proxmox VE node name (a host name's first label)
NODE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def check_node_name(node: object) -> str:
    """A cluster node's name as PVE spells it (whether the cluster has it is the backend's check)."""
    if not isinstance(node, str) or not NODE_NAME.fullmatch(node):
        raise ConfigError(
            f"node {node!r} is not a node name (1-63 of A-Z a-z 0-9 '-', not starting or ending with '-')"
        )
    return node


_SNAPSHOT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{1,39}")
_RESERVED_SNAPSHOT_NAMES = frozenset({"current", "vzdump"})


def check_snapshot_name(name: str) -> str:
    """A snapshot name valid on every backend: PVE's ``pve-configid`` (a letter, then 1-39 of
    letters, digits, ``_`` and ``-``), not PVE's reserved ``current``/``vzdump``."""
    if not isinstance(name, str) or not _SNAPSHOT_NAME.fullmatch(name):
        raise ConfigError(
            f"snapshot name {name!r} must be 2-40 characters: a letter, then letters, digits, '_' or '-'"
        )
    if name.lower() in _RESERVED_SNAPSHOT_NAMES:
        raise ConfigError(f"snapshot name {name!r} is reserved")
    return name


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
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise ConfigError(f"environment variable name {key!r} is not valid")
        if not isinstance(value, str) or "\x00" in value:
            raise ConfigError(f"environment variable {key}={value!r} must be a string without NUL")
        out[key] = value
    return out


def check_max_bytes(value: int, name: str = "max_bytes") -> int:
    """A byte cap (``max_output``, ``max_bytes``): a whole number, at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r} must be a whole number of bytes, at least 1")
    return value


def check_signal(sig: object) -> int:
    """A signal number to send (1-64: the kernel's standard and real-time signals)."""
    if isinstance(sig, bool) or not isinstance(sig, int) or not 1 <= sig <= 64:
        raise ConfigError(f"signal {sig!r} must be a signal number from 1 to 64")
    return int(sig)


ROOT_USER = "root"


def check_user(user: object, *, default: str, root_allowed: bool) -> str:
    """Whom a command runs as: ``None`` or the sandbox user (``default``), or ``"root"`` in a sandbox
    made with ``root=True``; anything else is a ConfigError."""
    if user is None or user == default:
        return default
    if user != ROOT_USER:
        raise ConfigError(
            f"user={user!r}: commands run as {default!r} or, in a sandbox made with root=True, 'root'"
        )
    if not root_allowed:
        raise StateConflict("user='root' needs a sandbox made with root=True (create(root=True))")
    return ROOT_USER


# What a string option's value (or each of a list's, or a map's) must look like, by its declared
# syntax (sandbox_rt.options): the checker returns it normalised, or raises ConfigError naming it.
SYNTAX: dict[str, Callable[[Any], Any]] = {
    "host_name": check_hostname,
    "label_map": check_labels,
    "destinations": check_egress,
    "template_name": check_template_name,
    "node_name": check_node_name,
    "snapshot_name": check_snapshot_name,
    "mounts": check_mounts,
}
