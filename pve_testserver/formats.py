"""PVE's named string formats (``"format": "pve-vmid"`` etc.), checked as PVE checks them.

Every checker raises :class:`FormatError` with PVE's message (which, like PVE's ``die``, ends in a
newline: the validator reports ``"invalid format - <message>"``). Suffixes work as in
``PVE::JSONSchema::check_format``: ``<name>-list`` checks every element of a ``,``/``;``/space
separated list (empty lists allowed), ``<name>-opt`` checks only a non-empty value.

Formats this module does not know are accepted by the validator; :func:`is_known_format` lets the
route table report them (a unit test asserts that no implemented endpoint uses one).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable
from pathlib import Path

from .privileges import PRIVILEGES


class FormatError(Exception):
    """A value does not match its named format; ``str()`` is PVE's message (newline-terminated)."""

    def __init__(self, message: str) -> None:
        if not message.endswith("\n"):
            message += "\n"
        super().__init__(message)
        self.message = message


FormatFn = Callable[[str], None]

_CONFIGID_RE = re.compile(r"^[a-z][a-z0-9_-]+$", re.IGNORECASE)
_ID_RE = re.compile(r"^[a-z][a-z0-9\-_.]*[a-z0-9]$", re.IGNORECASE)
_VMID_RE = re.compile(r"^[1-9][0-9]{2,8}$")
_NODE_RE = re.compile(r"^([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)$")
_MAC_RE = re.compile(r"^[a-f0-9][02468ace](?::[a-f0-9]{2}){5}$", re.IGNORECASE)
_DNS_LABEL = r"([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)"
_DNS_RE = re.compile(rf"^({_DNS_LABEL}\.)*{_DNS_LABEL}$")
_IFACE_RE = re.compile(r"^[a-z][a-z0-9_]{1,20}([:.]\d+)?$", re.IGNORECASE)
_TAG_RE = re.compile(r"^[a-z0-9_][a-z0-9_\-+.]*$", re.IGNORECASE)
_EMAIL_USER = r"[\w+\-~]+(\.[\w+\-~]+)*"
_EMAIL_RE = re.compile(rf"^{_EMAIL_USER}@[a-zA-Z0-9\-]+(\.[a-zA-Z0-9\-]+)*$")
_EMAIL_USER_RE = re.compile(rf"^{_EMAIL_USER}$")
USER_RE = r"[^\s:/]+"
REALM_RE = r"[A-Za-z][A-Za-z0-9.\-_]+"
TOKEN_SUBID_RE = REALM_RE
_USERID_RE = re.compile(rf"^({USER_RE})@({REALM_RE})$")
_TOKENID_RE = re.compile(rf"^(({USER_RE})@({REALM_RE}))!({TOKEN_SUBID_RE})$")
_REALM_RE = re.compile(rf"^{REALM_RE}$")
_POOL_RE = re.compile(r"^[A-Za-z0-9.\-_]+(?:/[A-Za-z0-9.\-_]+){0,2}$")
_ROLE_RE = re.compile(r"^[A-Za-z0-9.\-_]+$")
_GROUP_RE = re.compile(r"^[A-Za-z0-9.\-_]+$")
_SIZE_RE = re.compile(r"^(\d+(\.\d+)?)([KMGT](?:iB)?)?$")
_VOLID_RE = re.compile(r"^([a-z][a-z0-9\-_.]*[a-z0-9]):(.+)$", re.IGNORECASE)
_ALIAS_RE = re.compile(r"^(dc/|guest/)?[A-Za-z][A-Za-z0-9\-_]+$")
_URLENC_RE = re.compile(r"^[-%a-zA-Z0-9_.!~*'()]*$")
_STORAGE_CONTENT = frozenset({"images", "rootdir", "vztmpl", "iso", "backup", "snippets", "import", "none"})
_NETMASK_BITS = {str(ipaddress.IPv4Network(f"0.0.0.0/{n}").netmask): n for n in range(33)}
_ICMP_TYPES = frozenset(
    {
        "any",
        "echo-reply",
        "destination-unreachable",
        "network-unreachable",
        "host-unreachable",
        "protocol-unreachable",
        "port-unreachable",
        "fragmentation-needed",
        "source-route-failed",
        "network-unknown",
        "host-unknown",
        "network-prohibited",
        "host-prohibited",
        "TOS-network-unreachable",
        "TOS-host-unreachable",
        "communication-prohibited",
        "host-precedence-violation",
        "precedence-cutoff",
        "source-quench",
        "redirect",
        "network-redirect",
        "host-redirect",
        "TOS-network-redirect",
        "TOS-host-redirect",
        "echo-request",
        "router-advertisement",
        "router-solicitation",
        "time-exceeded",
        "ttl-zero-during-transit",
        "ttl-zero-during-reassembly",
        "parameter-problem",
        "ip-header-bad",
        "required-option-missing",
        "timestamp-request",
        "timestamp-reply",
        "address-mask-request",
        "address-mask-reply",
        "no-route",
        "beyond-scope",
        "address-unreachable",
        "failed-policy",
        "reject-route",
        "packet-too-big",
        "bad-header",
        "unknown-header-type",
        "unknown-option",
        "neighbor-solicitation",
        "neighbour-solicitation",
        "neighbor-advertisement",
        "neighbour-advertisement",
    }
)


def split_list(text: str) -> list[str]:
    """PVE::Tools::split_list: NUL-separated if it contains NUL, else split on ``,`` ``;`` blanks."""
    if "\0" in text:
        return text.split("\0")
    return [p for p in re.split(r"\s+", re.sub(r"[,;]", " ", text).strip()) if p]


def is_ipv4(value: str) -> bool:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        return False
    return True


def is_ipv6(value: str) -> bool:
    if "%" in value:
        return False
    try:
        ipaddress.IPv6Address(value)
    except ValueError:
        return False
    return True


def _cidr(value: str, v6: bool) -> bool:
    addr, sep, bits = value.partition("/")
    if not sep or not bits.isdigit():
        return False
    if not (is_ipv6(addr) if v6 else is_ipv4(addr)):
        return False
    return 7 < int(bits) <= (128 if v6 else 32)


def parse_size(value: str) -> int | None:
    """PVE::JSONSchema::parse_size: ``10``, ``10.5G``, ``4GiB`` -> bytes; None if invalid."""
    m = _SIZE_RE.match(value)
    if not m:
        return None
    size = float(m.group(1))
    unit = (m.group(3) or "").removesuffix("iB")
    size *= {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}[unit]
    return int(size)


def _regex_check(rx: re.Pattern[str], message: str) -> FormatFn:
    def check(value: str) -> None:
        if not rx.match(value):
            raise FormatError(message.format(v=value))

    return check


def _parse_id(kind: str) -> FormatFn:
    def check(value: str) -> None:
        if len(value) < 2:
            raise FormatError(f"{kind} ID '{value}' cannot be shorter than 2 characters")
        if not _ID_RE.match(value):
            raise FormatError(f"{kind} ID '{value}' contains illegal characters")

    return check


def _ipv4(value: str) -> None:
    if not is_ipv4(value):
        raise FormatError("value does not look like a valid IPv4 address")


def _ipv6(value: str) -> None:
    if not is_ipv6(value):
        raise FormatError("value does not look like a valid IPv6 address")


def _ip(value: str) -> None:
    if not (is_ipv4(value) or is_ipv6(value)):
        raise FormatError("value does not look like a valid IP address")


def _ipv4mask(value: str) -> None:
    if value not in _NETMASK_BITS:
        raise FormatError("value does not look like a valid IP netmask")


def _cidrv4(value: str) -> None:
    if not _cidr(value, v6=False):
        raise FormatError("value does not look like a valid IPv4 CIDR network")


def _cidrv6(value: str) -> None:
    if not _cidr(value, v6=True):
        raise FormatError("value does not look like a valid IPv6 CIDR network")


def _cidr_any(value: str) -> None:
    if not (_cidr(value, v6=False) or _cidr(value, v6=True)):
        raise FormatError("value does not look like a valid CIDR network")


def _ipv4_config(value: str) -> None:
    if value not in ("dhcp", "manual") and not _cidr(value, v6=False):
        raise FormatError("value does not look like a valid ipv4 network configuration")


def _ipv6_config(value: str) -> None:
    if value not in ("auto", "dhcp", "manual") and not _cidr(value, v6=True):
        raise FormatError("value does not look like a valid ipv6 network configuration")


def _email_or_username(value: str) -> None:
    if not (_EMAIL_RE.match(value) or _EMAIL_USER_RE.match(value)):
        raise FormatError("value does not look like a valid email address or user name")


def _address(value: str) -> None:
    if not (is_ipv4(value) or is_ipv6(value) or _DNS_RE.match(value)):
        raise FormatError(f"value does not look like a valid address: {value}")


def _disk_size(value: str) -> None:
    if parse_size(value) is None:
        raise FormatError(f"value does not look like a valid disk size: {value}")


def _vlan_id_or_range(value: str) -> None:
    m = re.match(r"^(\d+)(?:-(\d+))?$", value)
    if not m:
        raise FormatError(f"invalid VLAN configuration '{value}'")
    start, end = int(m.group(1)), m.group(2)
    for tag in (start, int(end) if end else None):
        if tag is not None and not 2 <= tag <= 4094:
            raise FormatError(f"invalid VLAN tag '{tag}'")
    if end and start >= int(end):
        raise FormatError(f"VLAN range must go from lower to higher tag '{value}'")


def _startup_order(value: str) -> None:
    if not value:
        raise FormatError("unable to parse startup options")
    for part in value.split(","):
        if part.strip() and not re.match(r"^((order=)?\d+|up=\d+|down=\d+)$", part):
            raise FormatError("unable to parse startup options")


def _poolid(value: str) -> None:
    if len(value.split("/")) > 3:
        raise FormatError(f"pool name '{value}' nested too deeply (max levels = 3)")
    if not _POOL_RE.match(value):
        raise FormatError(f"pool name '{value}' contains invalid characters")


def _userid(value: str) -> None:
    if len(value) < 3:
        raise FormatError(f"user name '{value}' is too short")
    if len(value) > 64:
        raise FormatError(f"user name '{value}' is too long ({len(value)} > 64)")
    if not _USERID_RE.match(value):
        raise FormatError(f"value '{value}' does not look like a valid user name")


def _tokenid(value: str) -> None:
    if not _TOKENID_RE.match(value):
        raise FormatError(f"value '{value}' does not look like a valid token ID")


def _priv(value: str) -> None:
    if value not in PRIVILEGES:
        raise FormatError(f"invalid privilege '{value}'")


def _storage_content(value: str) -> None:
    if value not in _STORAGE_CONTENT:
        raise FormatError(f"invalid content type '{value}'")


def _volume_id(value: str) -> None:
    if not _VOLID_RE.match(value):
        raise FormatError(f"unable to parse volume ID '{value}'")


def _task_status(value: str) -> None:
    if not re.match(r"^(ok|error|warning|unknown)$", value, re.IGNORECASE):
        raise FormatError(f"invalid status '{value}'")


def _ip_or_cidr(value: str) -> None:
    addr, sep, bits = value.partition("/")
    v4 = is_ipv4(addr)
    if not (v4 or is_ipv6(addr)) or (sep and not bits.isdigit()):
        raise FormatError("value does not look like a valid IP address or CIDR network")
    if sep and int(bits) > (32 if v4 else 128):
        raise FormatError(f"Invalid prefix length /{bits}")


def _ip_or_cidr_or_alias(value: str) -> None:
    if _ALIAS_RE.match(value):
        return
    _ip_or_cidr(value)


def _fw_addr_spec(value: str) -> None:
    if re.match(r"^\+\S+$", value):
        if len(value) > 65:
            raise FormatError("ipset name too long")
        return
    if _ALIAS_RE.match(value):
        if len(value) > 64:
            raise FormatError("alias name too long")
        return
    elements = value.split(",")
    versions: set[int] = set()
    for elem in elements:
        lo, dash, hi = elem.partition("-")
        try:
            if dash:
                versions.add(ipaddress.ip_address(lo).version)
                ipaddress.ip_address(hi)
            else:
                versions.add(ipaddress.ip_network(elem, strict=False).version)
        except ValueError:
            raise FormatError(f"invalid IP address: {elem}") from None
    if len(versions) > 1:
        raise FormatError(f"detected mixed ipv4/ipv6 addresses in address list '{value}'")
    if len(elements) > 1 and any("-" in e for e in elements):
        raise FormatError("you can't use a range in a list")


@functools.cache
def _services() -> frozenset[str]:
    try:
        text = Path("/etc/services").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset({"ssh", "http", "https", "domain", "smtp", "ftp"})
    names: set[str] = set()
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2:
            names.add(fields[0])
            names.update(fields[2:])
    return frozenset(names)


@functools.cache
def _protocols() -> frozenset[str]:
    try:
        text = Path("/etc/protocols").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset({"tcp", "udp", "icmp", "ipv6-icmp", "6", "17", "1", "58"})
    names: set[str] = set()
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2:
            names.update(fields)
    return frozenset(names)


def _port_spec(dport: bool) -> FormatFn:
    def check(value: str) -> None:
        elements = value.split(",")
        count = 0
        icmp = False
        services = _services()
        for item in elements:
            m = re.match(r"^([0-9]+):([0-9]+)$", item)
            if m:
                count += 2
                p1, p2 = int(m.group(1)), int(m.group(2))
                for p in (p1, p2):
                    if p > 65535:
                        raise FormatError(f"invalid port '{p}'")
                if p1 > p2:
                    raise FormatError(f"backwards range '{p1}:{p2}' not allowed, did you mean '{p2}:{p1}'?")
            elif item.isdigit():
                count += 1
                if int(item) > 65535:
                    raise FormatError(f"invalid port '{item}'")
            elif dport and item in _ICMP_TYPES:
                icmp = True
            elif item not in services:
                raise FormatError(f"invalid port '{item}'")
        if icmp and count > 0:
            raise FormatError("ICMP ports not allowed in port range")
        if count > 15:
            raise FormatError("too many entries in port list (> 15 numbers)")

    return check


def _protocol(value: str) -> None:
    if value and value not in _protocols():
        raise FormatError(f"unknown protocol '{value}'")


def _icmp_type(value: str) -> None:
    if value and value not in _ICMP_TYPES:
        raise FormatError(f"invalid icmp-type value '{value}'")


def _ip_with_ll_iface(value: str) -> None:
    m = re.match(r"^(fe80:[^%]+)%(.*)$", value)
    if m and is_ipv6(m.group(1)) and _IFACE_RE.match(m.group(2)):
        return
    _ip(value)


@functools.cache
def _zones() -> frozenset[str]:
    try:
        text = Path("/usr/share/zoneinfo/zone.tab").read_text(encoding="utf-8")
    except OSError:
        return frozenset()
    return frozenset(line.split("\t")[2] for line in text.splitlines() if line and not line.startswith("#"))


def _timezone(value: str) -> None:
    if value in ("host", "UTC"):
        return
    if value not in _zones():
        raise FormatError(f"invalid time zone '{value}'")


def _lxc_mp_string(value: str) -> None:
    if re.search(r"/\.\.?/", value) or re.search(r"/\.\.?$", value) or value.startswith("../"):
        raise FormatError(f"{value} contains illegal character sequences")


def _lxc_dev_string(value: str) -> None:
    if re.search(r"/\.\.?(?:/|$)", value) or not value.startswith("/dev/"):
        raise FormatError(f"{value} is not a valid device path")


FORMATS: dict[str, FormatFn] = {
    "string": lambda _v: None,
    "urlencoded": _regex_check(_URLENC_RE, "invalid urlencoded string: {v}"),
    "pve-configid": _regex_check(_CONFIGID_RE, "invalid configuration ID '{v}'"),
    "pve-storage-id": _parse_id("storage"),
    "pve-bridge-id": _regex_check(re.compile(r"^[-_.\w\d]+$"), "invalid bridge ID '{v}'"),
    "pve-vmid": _regex_check(_VMID_RE, "value does not look like a valid VM ID"),
    "pve-node": _regex_check(_NODE_RE, "value does not look like a valid node name"),
    "mac-addr": _regex_check(_MAC_RE, "value does not look like a valid unicast MAC address"),
    "ipv4": _ipv4,
    "ipv6": _ipv6,
    "ip": _ip,
    "ipv4mask": _ipv4mask,
    "CIDRv4": _cidrv4,
    "CIDRv6": _cidrv6,
    "CIDR": _cidr_any,
    "pve-ipv4-config": _ipv4_config,
    "pve-ipv6-config": _ipv6_config,
    "email": _regex_check(_EMAIL_RE, "value does not look like a valid email address"),
    "email-or-username": _email_or_username,
    "dns-name": _regex_check(_DNS_RE, "value does not look like a valid DNS name"),
    "pve-iface": _regex_check(_IFACE_RE, "invalid network interface name '{v}'"),
    "pve-vlan-id-or-range": _vlan_id_or_range,
    "address": _address,
    "disk-size": _disk_size,
    "pve-startup-order": _startup_order,
    "pve-tag": _regex_check(_TAG_RE, "invalid characters in tag"),
    "pve-task-status-type": _task_status,
    "pve-poolid": _poolid,
    "pve-roleid": _regex_check(_ROLE_RE, "role name '{v}' contains invalid characters"),
    "pve-groupid": _regex_check(_GROUP_RE, "group name '{v}' contains invalid characters"),
    "pve-priv": _priv,
    "pve-userid": _userid,
    "pve-realm": _regex_check(_REALM_RE, "value does not look like a valid realm"),
    "pve-tokenid": _tokenid,
    "pve-storage-content": _storage_content,
    "pve-volume-id": _volume_id,
    "IPorCIDR": _ip_or_cidr,
    "IPorCIDRorAlias": _ip_or_cidr_or_alias,
    "pve-fw-addr-spec": _fw_addr_spec,
    "pve-fw-dport-spec": _port_spec(dport=True),
    "pve-fw-sport-spec": _port_spec(dport=False),
    "pve-fw-protocol-spec": _protocol,
    "pve-fw-icmp-type-spec": _icmp_type,
    "lxc-ip-with-ll-iface": _ip_with_ll_iface,
    "pve-ct-timezone": _timezone,
    "pve-lxc-mp-string": _lxc_mp_string,
    "pve-lxc-dev-string": _lxc_dev_string,
}


def _split_name(fmt: str) -> tuple[str, str]:
    for suffix in ("-list", "-opt"):
        if fmt.endswith(suffix) and fmt[: -len(suffix)] in FORMATS:
            return fmt[: -len(suffix)], suffix[1:]
    return fmt, ""


def is_known_format(fmt: str) -> bool:
    return _split_name(fmt)[0] in FORMATS


def check_named_format(fmt: str, value: str) -> None:
    """Check ``value`` against named format ``fmt`` (with -list / -opt); unknown formats pass."""
    name, kind = _split_name(fmt)
    checker = FORMATS.get(name)
    if checker is None:
        return
    if kind == "list":
        for item in split_list(value):
            checker(item)
    elif kind == "opt":
        if value:
            checker(value)
    else:
        checker(value)
