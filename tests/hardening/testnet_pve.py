"""The simulated internet and LAN of the pve-node site (the emulated PVE node, tests/pve_node).

    node "pve1"                                  netns "<prefix>-wan" (the node's internet)
    eth1 192.0.2.2/24, default via 192.0.2.1 --> eth0 192.0.2.1   HTTP :80 :443 :8080 :22, DNS :53
    vmbr1 (the sandboxes; site.yml made it)      lo   169.254.169.254 HTTP :80 (cloud metadata)
                                                 lo   198.51.100.53   DNS :53 (a public resolver)
                                                 lo   198.18.0.80     HTTP :80 :443 (example.test)
                                                 lo   198.18.0.81     HTTP :80 (other.test)
                                                 lo   192.168.77.2    TCP :22 :80 :443 (a LAN host)

The node's uplink already leads into that namespace (tests/pve_node wires it; site.yml names eth1 the
uplink and the namespace's resolver the upstream of the node's dnsmasq), so nothing is re-applied:
the servers and addresses are added and removed again. The LAN host sits behind the uplink (the node
reaches it by its default route), as a LAN behind a PVE node's management bridge would; the node's
nftables drop the LAN ranges for sandboxes whichever way they lie. Probes "from the host" run in the
node (its python3, the same probe.py), which routes the sandboxes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.integration.provision_helpers import sh, wait_for
from tests.pve_node import PVENode

from .testnet import SERVER, SimNet

NODE_PROBE = "/root/.hardening-probe.py"
PROBE_SOURCE = Path(__file__).with_name("probe.py")
# Keeps the given ports of one address listening until its stdin closes (run in the node).
_LISTENER = """
import socket, sys
socks, ready = [], []
for port in map(int, sys.argv[2:]):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((sys.argv[1], port)); s.listen(16); socks.append(s)
    except OSError:
        s.close()
print("ready", flush=True)
sys.stdin.read()
"""


@dataclasses.dataclass(frozen=True)
class NodeSimNet(SimNet):
    """The test network of the emulated node (values; :func:`node_network` builds it)."""

    node_name: str = "pve1"
    node_lxc_path: str = ""  # this machine's LXC path of the node container
    node_root: str = ""  # this machine's path of the node's root filesystem
    uplink: str = "eth1"
    sandbox_probe_source: str = "10.90.1.1"  # an address of the node's sandbox network (route lookups)

    def in_node(self, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        argv = ["lxc-attach", "-P", self.node_lxc_path, "-n", self.node_name, "--clear-env", "--", *cmd]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    def _node_probe(self, *args: object, timeout: float = 60) -> dict[str, Any]:
        target = Path(self.node_root) / NODE_PROBE.lstrip("/")
        if not target.is_file() or target.read_bytes() != PROBE_SOURCE.read_bytes():
            target.write_bytes(PROBE_SOURCE.read_bytes())
        r = self.in_node("python3", NODE_PROBE, *map(str, args), timeout=timeout)
        assert r.returncode == 0, f"probe {args} in the node failed: {r.stderr}"
        out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
        return out

    # -- the machine that routes the sandboxes: the node ------------------------------------------
    def host_tcp_open(self, address: str, port: int) -> bool:
        return bool(self._node_probe("tcp", address, port)["open"])

    def host_ping(self, address: str) -> bool:
        return bool(self._node_probe("icmp", address)["reply"])

    def host_burst(self, address: str, port: int, count: int, window: float) -> dict[str, Any]:
        return self._node_probe("burst", address, port, count, window)

    def host_sweep(self, timeout: float, targets: list[str]) -> dict[str, Any]:
        return self._node_probe("sweep", timeout, *targets, timeout=timeout + 60)

    def host_dns(self, server: str, name: str) -> str | None:
        answer = self._node_probe("dns", server, name)["answer"]
        return answer if isinstance(answer, str) else None

    def host_conntrack(self, *args: str) -> str:
        return self.in_node("conntrack", "-L", *args).stdout

    @contextlib.contextmanager
    def host_listeners(self, address: str, ports: list[int]) -> Iterator[list[int]]:
        argv = ["lxc-attach", "-P", self.node_lxc_path, "-n", self.node_name, "--clear-env", "--"]
        proc = subprocess.Popen(
            [*argv, "python3", "-c", _LISTENER, address, *map(str, ports)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready", "the node's listeners did not start"
            yield [p for p in ports if self.host_tcp_open(address, p)]
        finally:
            if proc.stdin is not None:
                proc.stdin.close()  # the listener exits when its stdin closes
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def route_from_bridge(self, address: str) -> str:
        out = self.in_node(
            "ip", "-j", "route", "get", address, "from", self.sandbox_probe_source, "iif", self.bridge
        ).stdout
        return str(json.loads(out or "[{}]")[0].get("dev", ""))

    def uplink_rule_loaded(self) -> bool:
        chain = self.in_node("nft", "list", "chain", "inet", "sandbox", "forward").stdout
        return f'oifname "{self.uplink}"' in chain


def _start(netns: str, *cmd: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["ip", "netns", "exec", netns, *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@contextlib.contextmanager
def node_network(node: PVENode) -> Iterator[NodeSimNet]:
    """Servers and addresses in the node's wan namespace for the catalogue's network controls; all
    removed again at the end, also on failure (the namespace itself is the node helper's)."""
    spec = node.spec
    net = NodeSimNet(
        bridge="vmbr1",
        gateway=spec.sandbox_gateway,
        wan_ns=spec.wan_netns,
        lan_ns=spec.wan_netns,
        wan_if="eth1",
        lan_if="eth1",
        host_wan_ip=spec.wan_node_ip,
        wan_ip=spec.wan_gateway_ip,
        host_lan_ip=spec.wan_node_ip,
        lan_ip="192.168.77.2",
        wan_dns_log=f"/tmp/sandbox_rt-hardening-{spec.name}-wan-dns.log",
        node_name=spec.name,
        node_lxc_path=str(spec.lxc_path),
        node_root=str(spec.rootfs),
        sandbox_probe_source=spec.sandbox_pool[0],
    )
    extra = (net.metadata_ip, net.public_resolver_ip, net.public_web_ip, net.other_web_ip, net.lan_ip)
    added: list[str] = []
    procs: list[subprocess.Popen[str]] = []
    Path(net.wan_dns_log).unlink(missing_ok=True)
    try:
        for address in extra:
            made = sh("ip", "-n", net.wan_ns, "addr", "add", f"{address}/32", "dev", "lo", check=False)
            if made.returncode == 0:
                added.append(address)
        wan_listen = [f"{net.wan_ip}:{p}" for p in net.wan_tcp_ports] + [
            f"{net.metadata_ip}:80",
            f"{net.public_web_ip}:80",
            f"{net.public_web_ip}:443",
            f"{net.other_web_ip}:80",
        ]
        lan_listen = [f"{net.lan_ip}:{p}" for p in net.lan_tcp_ports]
        procs.append(_start(net.wan_ns, sys.executable, str(SERVER), *wan_listen, *lan_listen))
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
        for address, port in [(net.wan_ip, p) for p in net.wan_tcp_ports] + [
            (net.lan_ip, p) for p in net.lan_tcp_ports
        ]:
            wait_for(lambda a=address, p=port: net.netns_tcp_open(net.wan_ns, a, p), 15, f"{address}:{port}")
        for address in (net.metadata_ip, net.public_web_ip, net.other_web_ip):
            wait_for(lambda a=address: net.netns_tcp_open(net.wan_ns, a, 80), 15, f"{address}:80")
        wait_for(lambda: net.host_dns(net.wan_ip, net.dns_name) == net.public_web_ip, 15, "the wan resolver")
        for proc in procs:
            assert proc.poll() is None, f"{proc.args} exited: {proc.stderr.read() if proc.stderr else ''}"
        assert net.uplink_rule_loaded(), "the node's sandbox tables do not name its uplink"
        yield net
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for address in added:
            sh("ip", "-n", net.wan_ns, "addr", "del", f"{address}/32", "dev", "lo", check=False)
        Path(net.wan_dns_log).unlink(missing_ok=True)
        Path(net.node_root, NODE_PROBE.lstrip("/")).unlink(missing_ok=True)


class PveInternetGate:
    """The pve-node site's stand-in for the ``internet_allowed`` set: on PVE a sandbox's internet is
    its CT firewall's rules (``backends/proxmox/firewall.py``), read through the runtime."""

    set_name = "the CT firewall's internet rules"

    def __init__(self, mgr: Any) -> None:
        self.mgr = mgr

    def contains(self, ip: str) -> bool:
        for record in self.mgr.list():
            if record.ip == ip:
                return bool(self.mgr.backend.internet_enabled(record))
        return False
