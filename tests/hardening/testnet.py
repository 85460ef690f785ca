"""The simulated internet and LAN of the hardening suite, made and removed by the tests only.

    host                                   netns "hardening-wan" (the internet)
    hwan0 203.0.113.1/24  <--- veth --->   eth0 203.0.113.2/24   HTTP :80 :443 :8080 :22, DNS :53
                                           lo   169.254.169.254   HTTP :80 (a cloud metadata service)
                                           lo   198.51.100.53     DNS :53 (some public resolver)
                                           lo   198.18.0.80       HTTP :80 :443 (example.test)
                                           lo   198.18.0.81       HTTP :80 (other.test)
    hlan0 192.168.77.1/24 <--- veth --->   netns "hardening-lan": eth0 192.168.77.2/24, TCP :22 :80 :443

The network role is re-applied with ``sandbox_network_uplink=hwan0`` and the wan resolver as the
upstream of the host's dnsmasq, and restored (uplink "") at the end. Everything sent from the sandbox
bridge that is not for the bridge, the lan or the wan subnet is policy-routed into the wan netns
(``ip rule iif <bridge>``), so a sandbox packet can never take the machine's default route: no test
traffic reaches a real interface or an address outside this machine, whatever the firewall does. The
host's own traffic is not affected. The real uplink is never named.

Interface names start with ``h`` (never ``sbx``: the bridge table isolates ``sbx*`` ports; never
``veth``). Addresses are TEST-NET / link-local ones outside the blocked LAN ranges, except the LAN
itself (192.168.77.0/24, inside 192.168.0.0/16 on purpose).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.hardening import probe
from tests.integration.provision_helpers import run_playbook, sh, tcp_open, wait_for

SERVER = Path(__file__).with_name("netns_server.py")
ROUTE_TABLE = "10099"
RULE_PREFS = ("10990", "10991")
SYSCTL_FILE = Path("/etc/sysctl.d/61-sandbox_rt-network.conf")
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


@dataclasses.dataclass(frozen=True)
class SimNet:
    """Names and addresses of the test network (values only; :func:`simulated_network` builds it)."""

    bridge: str = "vmbr1"
    gateway: str = "10.99.0.1"
    wan_ns: str = "hardening-wan"
    lan_ns: str = "hardening-lan"
    wan_if: str = "hwan0"
    lan_if: str = "hlan0"
    host_wan_ip: str = "203.0.113.1"
    wan_ip: str = "203.0.113.2"
    metadata_ip: str = "169.254.169.254"
    public_resolver_ip: str = "198.51.100.53"
    # What example.test resolves to. Not a TEST-NET address: dnsmasq's stop-dns-rebind (on in the
    # host's dnsmasq) drops answers in RFC 1918, link-local and TEST-NET ranges. RFC 2544 space is fine.
    public_web_ip: str = "198.18.0.80"
    # A second public site (other.test), for egress allow-lists that name only the first.
    other_web_ip: str = "198.18.0.81"
    other_dns_name: str = "other.test"
    host_lan_ip: str = "192.168.77.1"
    lan_ip: str = "192.168.77.2"
    # TCP ports listening in the wan: the allowed ones (role default 80, 443) and two that are not.
    wan_tcp_ports: tuple[int, ...] = (80, 443, 8080, 22)
    lan_tcp_ports: tuple[int, ...] = (22, 80, 443)
    dns_name: str = "example.test"
    # What the role is re-applied with for the session (sandbox_network_internet_tcp_ports default).
    allowed_tcp_ports: tuple[int, ...] = (80, 443)
    # The wan resolver (the host dnsmasq's upstream) logs every query it receives here.
    wan_dns_log: str = "/tmp/sandbox_rt-hardening-wan-dns.log"

    @property
    def role_vars(self) -> dict[str, object]:
        return {"sandbox_network_uplink": self.wan_if, "sandbox_network_dns_servers": [self.wan_ip]}

    def http_body(self, address: str, port: int = 80) -> str:
        return f"{address}:{port} ok\n"

    def in_netns(self, netns: str, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", netns, *cmd, check=False, timeout=timeout)

    def netns_tcp_open(self, netns: str, address: str, port: int) -> bool:
        code = f"import socket; socket.create_connection(({address!r}, {port}), timeout=2).close()"
        return self.in_netns(netns, sys.executable, "-c", code).returncode == 0

    def route_from_bridge(self, address: str) -> str:
        """The interface the host forwards a sandbox's packet for ``address`` to."""
        out = sh("ip", "-j", "route", "get", address, "from", "10.99.1.1", "iif", self.bridge).stdout
        return str(json.loads(out)[0].get("dev", ""))

    def upstream_queries(self) -> list[str]:
        """The names the wan resolver was asked for (what left the host), oldest first."""
        try:
            text = Path(self.wan_dns_log).read_text()
        except FileNotFoundError:
            return []
        return re.findall(r"query\[\w+\] (\S+) from ", text)

    def uplink_rule_loaded(self) -> bool:
        out = sh("nft", "list", "chain", "inet", "sandbox", "forward", check=False).stdout
        return f'oifname "{self.wan_if}"' in out

    # -- probes from the machine that routes the sandboxes: this one (the emulated PVE node's
    # NodeSimNet, testnet_pve.py, runs them in the node) ---------------------------------------------
    def host_tcp_open(self, address: str, port: int) -> bool:
        return tcp_open(address, port)

    def host_ping(self, address: str) -> bool:
        return bool(probe.icmp(address)["reply"])

    def host_burst(self, address: str, port: int, count: int, window: float) -> dict[str, Any]:
        return probe.burst(address, port, count, window)

    def host_sweep(self, timeout: float, targets: list[str]) -> dict[str, Any]:
        return probe.sweep(timeout, targets)

    def host_dns(self, server: str, name: str) -> str | None:
        return dns_query(server, name)

    def host_conntrack(self, *args: str) -> str:
        return sh("conntrack", "-L", *args, check=False).stdout

    def host_listeners(self, address: str, ports: list[int]) -> contextlib.AbstractContextManager[list[int]]:
        return host_listeners(address, ports)


def _cleanup_leftovers(net: SimNet) -> None:
    """A crashed earlier session may have left our (fixed-name) objects: remove them first."""
    for pref in RULE_PREFS:
        while sh("ip", "rule", "del", "pref", pref, check=False).returncode == 0:
            pass
    sh("ip", "route", "flush", "table", ROUTE_TABLE, check=False)
    for ns in (net.wan_ns, net.lan_ns):
        pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            sh("kill", "-KILL", pid, check=False)
        sh("ip", "netns", "del", ns, check=False)
    for link in (net.wan_if, net.lan_if):
        sh("ip", "link", "del", link, check=False)
    Path(net.wan_dns_log).unlink(missing_ok=True)


def _veth_into_netns(host_if: str, netns: str, host_cidr: str, ns_cidr: str) -> None:
    sh("ip", "netns", "add", netns)
    sh("ip", "-n", netns, "link", "set", "lo", "up")
    sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", netns)
    sh("ip", "addr", "add", host_cidr, "dev", host_if)
    sh("ip", "link", "set", host_if, "up")
    sh("ip", "-n", netns, "addr", "add", ns_cidr, "dev", "eth0")
    sh("ip", "-n", netns, "link", "set", "eth0", "up")


def _start(netns: str, *cmd: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["ip", "netns", "exec", netns, *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _apply_role(extra_vars: dict[str, object] | None) -> None:
    args = ["--tags", "sandbox_network"]
    if extra_vars:
        args += ["-e", json.dumps(extra_vars)]
    run = run_playbook(*args, timeout=600)
    assert run.returncode == 0 and run.total("failed") == 0, f"network role failed:\n{run.tail()}"


def reapply_uplink(net: SimNet) -> None:
    """Re-apply the network role with the test uplink (someone re-ran site.yml meanwhile)."""
    _apply_role(net.role_vars)


@contextlib.contextmanager
def simulated_network(net: SimNet) -> Iterator[SimNet]:
    """Build the wan and lan namespaces, servers, policy routing and the uplink; always undo it all."""
    procs: list[subprocess.Popen[str]] = []
    sysctl_before = SYSCTL_FILE.read_text() if SYSCTL_FILE.exists() else None
    forward_before = IP_FORWARD.read_text().strip()
    role_applied = False
    errors: list[str] = []
    _cleanup_leftovers(net)
    try:
        _veth_into_netns(net.wan_if, net.wan_ns, f"{net.host_wan_ip}/24", f"{net.wan_ip}/24")
        _veth_into_netns(net.lan_if, net.lan_ns, f"{net.host_lan_ip}/24", f"{net.lan_ip}/24")
        # LAN hosts answer whoever reaches them (worst case: their router knows the way back)
        sh("ip", "-n", net.lan_ns, "route", "add", "default", "via", net.host_lan_ip)
        for extra in (net.metadata_ip, net.public_resolver_ip, net.public_web_ip, net.other_web_ip):
            sh("ip", "-n", net.wan_ns, "addr", "add", f"{extra}/32", "dev", "lo")
        # Sandbox packets for anything but the connected subnets go into the wan, never elsewhere.
        sh("ip", "route", "add", "default", "via", net.wan_ip, "dev", net.wan_if, "table", ROUTE_TABLE)
        sh(
            "ip",
            "rule",
            "add",
            "pref",
            RULE_PREFS[0],
            "iif",
            net.bridge,
            "lookup",
            "main",
            "suppress_prefixlength",
            "0",
        )
        sh("ip", "rule", "add", "pref", RULE_PREFS[1], "iif", net.bridge, "lookup", ROUTE_TABLE)

        wan_listen = [f"{net.wan_ip}:{p}" for p in net.wan_tcp_ports] + [
            f"{net.metadata_ip}:80",
            f"{net.public_web_ip}:80",
            f"{net.public_web_ip}:443",
            f"{net.other_web_ip}:80",
        ]
        lan_listen = [f"{net.lan_ip}:{p}" for p in net.lan_tcp_ports]
        procs.append(_start(net.wan_ns, sys.executable, str(SERVER), *wan_listen))
        procs.append(_start(net.lan_ns, sys.executable, str(SERVER), *lan_listen))
        procs.append(
            _start(
                net.wan_ns,
                "dnsmasq",
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                f"--listen-address={net.wan_ip}",
                f"--listen-address={net.public_resolver_ip}",
                f"--address=/{net.dns_name}/{net.public_web_ip}",
                f"--address=/{net.other_dns_name}/{net.other_web_ip}",
                "--pid-file",
                "--user=root",
                "--log-queries",
                f"--log-facility={net.wan_dns_log}",
            )
        )
        # Poll the ports (never sleep blindly): from the host where a route exists, else in the netns.
        for port in net.wan_tcp_ports:
            wait_for(lambda p=port: tcp_open(net.wan_ip, p), 15, f"wan :{port}")
        for port in net.lan_tcp_ports:
            wait_for(lambda p=port: tcp_open(net.lan_ip, p), 15, f"lan :{port}")
        for addr in (net.metadata_ip, net.public_web_ip, net.other_web_ip):
            wait_for(lambda a=addr: net.netns_tcp_open(net.wan_ns, a, 80), 15, f"{addr}:80")
        wait_for(lambda: dns_query(net.wan_ip, net.dns_name) == net.public_web_ip, 15, "wan dnsmasq")
        for proc in procs:
            assert proc.poll() is None, f"{proc.args} exited: {proc.stderr.read() if proc.stderr else ''}"

        role_applied = True
        _apply_role(net.role_vars)
        assert net.uplink_rule_loaded(), "the role did not load the uplink rule"
        yield net
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        try:
            _cleanup_leftovers(net)
        except Exception as exc:  # keep going: the role must be restored whatever happened
            errors.append(f"removing the test network: {exc}")
        if role_applied:
            try:
                _apply_role(None)
            except Exception as exc:
                errors.append(f"restoring the network role: {exc}")
            # The role leaves ip_forward alone without an uplink: put back what was there before.
            if sysctl_before is None:
                SYSCTL_FILE.unlink(missing_ok=True)
            else:
                SYSCTL_FILE.write_text(sysctl_before)
            IP_FORWARD.write_text(forward_before + "\n")
        if errors:
            raise AssertionError("; ".join(errors))


@contextlib.contextmanager
def host_listeners(address: str, ports: list[int]) -> Iterator[list[int]]:
    """Listen on address:port for each port that is free; ports already served stay as they are.
    Yields the ports that now answer on the host."""
    socks = []
    try:
        for port in ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, port))
                sock.listen(16)
                socks.append(sock)
            except OSError:
                sock.close()  # something on the host serves it already
        yield [p for p in ports if tcp_open(address, p)]
    finally:
        for sock in socks:
            sock.close()


def dns_query(server: str, name: str) -> str | None:
    """The A record ``server`` gives for ``name`` (UDP), None on any failure."""
    answer = probe.dns_query(server, name, "udp", timeout=2)["answer"]
    return answer if isinstance(answer, str) else None
