"""pve-firewall, emulated for the node engine: the datacenter switch, each CT's options and rules
compiled into one nftables table in the emulated node, replaced atomically on every change.

PVE's semantics that the runtime relies on, and nothing more:

* nothing is filtered while the **datacenter** firewall is off (``/cluster/firewall/options``
  ``enable`` is 0, PVE's default): a CT's own firewall then does nothing at all;
* a CT is filtered when its firewall ``options`` have ``enable=1`` and its ``net0`` has
  ``firewall=1``; then established/related traffic passes, invalid is dropped, its enabled rules
  are evaluated in order (first match: ``ACCEPT``/``DROP``/``REJECT``), then its policy
  (``policy_in`` default ``DROP``, ``policy_out`` default ``ACCEPT``);
* OUT rules see everything the CT sends (to the node itself too), IN rules what is sent to it;
* ``macfilter`` (PVE's default: on, off only with ``macfilter=0``): frames from the CT's port with
  another source MAC than ``net0``'s ``hwaddr`` are dropped (pve-firewall's ebtables ``-s ! <mac>``);
* ``ipfilter=1``: IPv4 from the CT's port with another source than ``net0``'s ``ip`` is dropped, and
  ARP whose sender address is another (pve-firewall's ``ipfilter-net0`` ipset and its ebtables ARP
  chain ``--arp-ip-src``); without it the CT may send from any address;
* ``net0``'s ``rate`` (MB/s, 2^20 bytes as pve-container computes it): PVE shapes the CT's veth with
  tc (ingress policing, egress tbf); here the same compiled table polices the CT's port both ways
  (nft ``limit``: one second's worth passes at once, then the rate).

Real pve-firewall binds guest rules to the guest's interface (iptables physdev or the
``proxmox-firewall`` bridge tables); so does this emulation: the bridge hook marks what enters from
a CT's port (``meta mark`` = its VMID) and the routed hooks jump to its OUT chain by that mark, so a
CT that sends from another's address still meets its own rules. IN rules are chosen by the CT's
static address (``ip daddr``), which nothing the CT sends can change. CTs without a static IPv4
address are not filtered (none of ours).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Mapping
from typing import Any, Protocol, runtime_checkable

from .ctconfig import parse_kv

TABLE = "pve-firewall-emu"
Nodes = str | Collection[str]  # one node's name, or the names of the nodes one machine stands in for
_VERDICT = {"ACCEPT": "accept", "DROP": "drop", "REJECT": "reject"}


@runtime_checkable
class FirewallProgrammer(Protocol):
    """An engine that runs the firewall (only the node engine does)."""

    def apply_firewall(self, text: str) -> None: ...


def _ports(spec: str) -> str:
    """PVE's ``80,443`` / ``1000:2000`` port lists as an nft set expression."""
    items = [p.strip().replace(":", "-") for p in str(spec).split(",") if p.strip()]
    return items[0] if len(items) == 1 else "{ " + ", ".join(items) + " }"


def _address(spec: str) -> str:
    items = [str(ipaddress.ip_network(a.strip(), strict=False)) for a in str(spec).split(",") if a.strip()]
    items = [i.removesuffix("/32") for i in items]
    return items[0] if len(items) == 1 else "{ " + ", ".join(items) + " }"


def rule_line(rule: Mapping[str, Any]) -> str | None:
    """One PVE rule as an nft rule (None when disabled or not representable)."""
    if not int(rule.get("enable", 0)) or rule.get("macro") or rule.get("type") not in ("in", "out"):
        return None
    parts: list[str] = []
    if rule.get("source"):
        parts.append(f"ip saddr {_address(rule['source'])}")
    if rule.get("dest"):
        parts.append(f"ip daddr {_address(rule['dest'])}")
    proto = str(rule.get("proto", "")).lower()
    if proto in ("tcp", "udp"):
        parts.append(f"meta l4proto {proto}")
        if rule.get("sport"):
            parts.append(f"th sport {_ports(rule['sport'])}")
        if rule.get("dport"):
            parts.append(f"th dport {_ports(rule['dport'])}")
    elif proto in ("icmp",):
        parts.append("meta l4proto icmp")
    elif proto:
        return None
    verdict = _VERDICT.get(str(rule.get("action")))
    if verdict is None:
        return None
    return " ".join([*parts, "counter", verdict])


_TRUE = ("1", "on", "yes", "true")


def _static_ip(config: Mapping[str, Any]) -> tuple[str, str] | None:
    net = parse_kv(str(config.get("net0", "")))
    if str(net.get("firewall", "0")) not in _TRUE:
        return None
    ip = net.get("ip", "")
    if "/" not in ip:
        return None
    return ip.split("/")[0], net.get("hwaddr", "").lower()


def rate_bytes(config: Mapping[str, Any]) -> int:
    """``net0``'s ``rate`` (MB/s) in bytes per second as pve-container computes it; 0 = none."""
    raw = parse_kv(str(config.get("net0", ""))).get("rate", "")
    try:
        return max(0, int(float(raw) * 1024 * 1024))
    except ValueError:
        return 0


def _on(ct: Mapping[str, Any], node: Nodes) -> bool:
    """Whether ``ct`` lives on ``node`` (or on one of those nodes)."""
    where = ct.get("node")
    return where == node if isinstance(node, str) else where in node


def guests(state: Mapping[str, Any], node: Nodes) -> list[tuple[int, str, str, Mapping[str, Any]]]:
    """(vmid, ip, mac, firewall config) of every CT on ``node`` whose firewall is on."""
    out = []
    for key, ct in sorted(state.get("cts", {}).items(), key=lambda kv: int(kv[0])):
        if not _on(ct, node) or ct["config"].get("template"):
            continue
        fw = state.get("firewall", {}).get(key) or {}
        if not int((fw.get("options") or {}).get("enable", 0)):
            continue
        found = _static_ip(ct["config"])
        if found:
            out.append((int(key), found[0], found[1], fw))
    return out


def _port_filters(port: str, ip: str, mac: str, opts: Mapping[str, Any]) -> list[str]:
    """pve-firewall's layer-2 filter of a CT's port: macfilter (default on) and ipfilter (off unless
    set), ARP included."""
    lines: list[str] = []
    if mac and str(opts.get("macfilter", "1")) in _TRUE:
        lines.append(f'\t\tiifname "{port}" ether saddr != {mac} counter drop')
    if str(opts.get("ipfilter", "0")) in _TRUE:
        lines.append(f'\t\tiifname "{port}" ether type ip ip saddr != {ip} counter drop')
        lines.append(f'\t\tiifname "{port}" ether type arp arp saddr ip != {ip} counter drop')
    return lines


def _rate_limits(state: Mapping[str, Any], node: Nodes) -> tuple[list[str], list[str]]:
    """(into the bridge from a CT's port, out of the bridge to it): ``net0``'s ``rate`` of every
    running CT on ``node`` (tc on PVE, whether or not its firewall is on)."""
    inbound: list[str] = []
    outbound: list[str] = []
    for key, ct in sorted(state.get("cts", {}).items(), key=lambda kv: int(kv[0])):
        if not _on(ct, node) or ct["config"].get("template"):
            continue
        rate = rate_bytes(ct["config"])
        if rate:
            port = f"veth{int(key)}i0"
            inbound.append(f'\t\tiifname "{port}" limit rate over {rate} bytes/second counter drop')
            outbound.append(f'\t\toifname "{port}" limit rate over {rate} bytes/second counter drop')
    return inbound, outbound


def render(state: Mapping[str, Any], node: Nodes) -> str:
    """The whole emulated firewall of ``node`` as one ``nft -f`` transaction (a collection of node
    names: of the CTs of all of them, when one machine stands in for several nodes)."""
    head = [
        f"table inet {TABLE}",
        f"delete table inet {TABLE}",
        f"table bridge {TABLE}",
        f"delete table bridge {TABLE}",
    ]
    cluster = (state.get("cluster_firewall") or {}).get("options") or {}
    inbound, outbound = _rate_limits(state, node)
    if not int(cluster.get("enable", 0)):
        # Datacenter firewall off: PVE filters no guest at all (the NICs' rate limits stay: tc).
        return "\n".join([*head, f"table inet {TABLE} {{\n}}", *_bridge_table([], inbound, outbound), ""])
    inet: list[str] = []
    jumps_out: list[str] = []
    jumps_in: list[str] = []
    bridge: list[str] = []
    for vmid, ip, mac, fw in guests(state, node):
        opts = fw.get("options") or {}
        for direction, policy_key, default in (("out", "policy_out", "ACCEPT"), ("in", "policy_in", "DROP")):
            chain = [f"\tchain ct{vmid}-{direction} {{"]
            for rule in fw.get("rules") or []:
                if rule.get("type") == direction:
                    line = rule_line(rule)
                    if line:
                        chain.append(f"\t\t{line}")
            policy = _VERDICT.get(str(opts.get(policy_key, default)), "drop")
            chain += [f"\t\tcounter {policy}", "\t}"]
            inet += chain
        jumps_out.append(f"\t\tmeta mark {vmid} jump ct{vmid}-out")
        jumps_in.append(f"\t\tip daddr {ip} jump ct{vmid}-in")
        port = f"veth{vmid}i0"
        bridge += _port_filters(port, ip, mac, opts)
        bridge.append(f'\t\tiifname "{port}" meta mark set {vmid}')  # its OUT rules follow its port

    def base(name: str, hook: str, jumps: list[str]) -> list[str]:
        return [
            f"\tchain {name} {{",
            f"\t\ttype filter hook {hook} priority filter - 5; policy accept;",
            "\t\tct state established,related accept",
            "\t\tct state invalid counter drop",
            *jumps,
            "\t}",
        ]

    body = [f"table inet {TABLE} {{", *inet]
    body += base("forward", "forward", jumps_out + jumps_in)
    body += base("input", "input", jumps_out)
    body += base("output", "output", jumps_in)
    body += ["}", *_bridge_table(bridge, inbound, outbound), ""]
    return "\n".join([*head, *body])


def _bridge_table(filters: list[str], inbound: list[str], outbound: list[str]) -> list[str]:
    """The layer-2 part: the CT ports' filters and marks, then their rate limits both ways."""
    return [
        f"table bridge {TABLE} {{",
        "\tchain prerouting {",
        "\t\ttype filter hook prerouting priority filter; policy accept;",
        *filters,
        *inbound,
        "\t}",
        "\tchain output {",
        "\t\ttype filter hook output priority filter; policy accept;",
        *outbound,
        "\t}",
        "\tchain forward {",
        "\t\ttype filter hook forward priority filter; policy accept;",
        *outbound,
        "\t}",
        "}",
    ]
