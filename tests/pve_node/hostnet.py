"""The node's wiring on the controller: the management veth's host end, the route to the node's
sandbox network, and the wan network namespace its uplink leads into. Nothing here touches the
machine's real uplink; every object carries the node's prefix so :func:`remove` finds them all.
"""

from __future__ import annotations

import json
import shlex
import subprocess

from .spec import NodeSpec


def run(*cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{shlex.join(cmd)} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}"
        )
    return proc


def link_exists(name: str, netns: str | None = None) -> bool:
    cmd = ["ip", "-n", netns, "link", "show", name] if netns else ["ip", "link", "show", name]
    return run(*cmd, check=False).returncode == 0


def netns_exists(name: str) -> bool:
    return name in run("ip", "netns", "list", check=False).stdout.split()


def ensure_wan_netns(spec: NodeSpec) -> None:
    """The node's internet: an empty netns (tests start their servers in it)."""
    if not netns_exists(spec.wan_netns):
        run("ip", "netns", "add", spec.wan_netns)
    run("ip", "-n", spec.wan_netns, "link", "set", "lo", "up")


def wire(spec: NodeSpec) -> None:
    """After each start of the node container (its veths are new then): address the management
    link's host end, route the node's sandbox network through it, move the uplink's host end into
    the wan netns. Idempotent."""
    mgmt = spec.mgmt_if
    cidr = f"{spec.mgmt_host_ip}/{spec.mgmt_prefixlen}"
    addrs = json.loads(run("ip", "-j", "addr", "show", "dev", mgmt).stdout or "[]")
    have = {
        f"{a['local']}/{a['prefixlen']}"
        for i in addrs
        for a in i.get("addr_info", [])
        if a["family"] == "inet"
    }
    if cidr not in have:
        run("ip", "addr", "add", cidr, "dev", mgmt)
    run("sysctl", "-q", "-w", f"net.ipv6.conf.{mgmt}.disable_ipv6=1")
    run("ip", "link", "set", mgmt, "up")
    route = run("ip", "route", "show", "exact", spec.sandbox_cidr).stdout.strip()
    if not route:
        run("ip", "route", "add", spec.sandbox_cidr, "via", spec.mgmt_node_ip, "dev", mgmt)
    elif f"via {spec.mgmt_node_ip} " not in route + " ":
        # never take over a network this machine uses itself (another bridge, another node)
        raise RuntimeError(
            f"{spec.sandbox_cidr} is routed elsewhere on this machine ({route}); pick another node index"
        )
    ensure_wan_netns(spec)
    if link_exists(spec.wan_if):  # fresh from lxc-start: into the wan, named as its end there
        run("ip", "link", "set", spec.wan_if, "netns", spec.wan_netns)
        run("ip", "-n", spec.wan_netns, "link", "set", spec.wan_if, "name", "eth0")
    run("ip", "netns", "exec", spec.wan_netns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1")
    wan_cidr = f"{spec.wan_gateway_ip}/{spec.wan_prefixlen}"
    have_wan = run("ip", "-n", spec.wan_netns, "-j", "addr", "show", "dev", "eth0").stdout
    if f'"{spec.wan_gateway_ip}"' not in have_wan:
        run("ip", "-n", spec.wan_netns, "addr", "add", wan_cidr, "dev", "eth0")
    run("ip", "-n", spec.wan_netns, "link", "set", "eth0", "up")


def remove(spec: NodeSpec) -> list[str]:
    """Remove everything :func:`wire` made (the veths go with the container); returns what was left
    and had to be removed, for the caller's report."""
    removed: list[str] = []
    route = run("ip", "route", "show", "exact", spec.sandbox_cidr, check=False).stdout
    if f"via {spec.mgmt_node_ip}" in route:
        run("ip", "route", "del", spec.sandbox_cidr, "via", spec.mgmt_node_ip, check=False)
        removed.append(f"route {spec.sandbox_cidr}")
    for link in (spec.mgmt_if, spec.wan_if):
        if link_exists(link):
            run("ip", "link", "del", link, check=False)
            removed.append(f"link {link}")
    if netns_exists(spec.wan_netns):
        for pid in run("ip", "netns", "pids", spec.wan_netns, check=False).stdout.split():
            run("kill", "-KILL", pid, check=False)  # servers a test left running in the wan
        run("ip", "netns", "del", spec.wan_netns, check=False)
        removed.append(f"netns {spec.wan_netns}")
    return removed


def leftovers(spec: NodeSpec) -> list[str]:
    """What of the node's wiring exists now (empty after :func:`remove`)."""
    out = []
    if (
        f"via {spec.mgmt_node_ip}"
        in run("ip", "route", "show", "exact", spec.sandbox_cidr, check=False).stdout
    ):
        out.append(f"route {spec.sandbox_cidr}")
    out += [f"link {link}" for link in (spec.mgmt_if, spec.wan_if) if link_exists(link)]
    if netns_exists(spec.wan_netns):
        out.append(f"netns {spec.wan_netns}")
    return out
