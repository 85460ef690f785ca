"""SBX-NET: the sandbox network against a simulated internet ("wan" netns on the uplink) and LAN
("lan" netns), see testnet.py. Every "blocked" is shown next to a "the host reaches it", so a dead
test network cannot pass for a working firewall."""

from __future__ import annotations

import time
from functools import partial

import pytest
from testinfra.host import Host

from sandbox_rt import Settings
from sandbox_rt.network import NftInternetSet
from tests.integration.provision_helpers import tcp_open

from . import checks, probe
from .checks import Target
from .conftest import Factory
from .controls import Waiver
from .testnet import SimNet, dns_query, host_listeners

pytestmark = [pytest.mark.slow]


def test_SBX_NET_01_bridge_has_no_physical_port(settings: Settings, local: Host, baseline: Target) -> None:
    # a sandbox is up, so the bridge has at least one port to look at
    assert baseline.sb.status().state == "running"
    checks.check_bridge_ports(settings.bridge, local)


def test_SBX_NET_02_firewall_loaded(settings: Settings, local: Host) -> None:
    checks.check_firewall_loaded(local, settings.nft_table, settings.nft_internet_set, settings.bridge)


def test_SBX_NET_03_firewall_persists(waivers: dict[str, Waiver], local: Host) -> None:
    nft_file = checks.role_defaults("sandbox_network")["sandbox_network_nft_file"]
    waiver = waivers["SBX-NET-03"]
    holds, evidence = checks.no_systemd()
    if holds:  # the waiver applies: nothing persists; site.yml restores the rules from the file
        assert waiver.condition == "no_systemd"
        assert local.file(nft_file).exists, f"{nft_file} missing: site.yml could not restore the rules"
        assert local.run(f"nft -c -f {nft_file}").rc == 0, f"{nft_file} does not load"
        return
    unit = local.service("sandbox-nftables")
    checks.require("SBX-NET-03", unit.is_enabled, f"sandbox-nftables.service is not enabled ({evidence})")


def test_SBX_NET_04_no_internet_by_default(make: Factory, net: SimNet, nft: NftInternetSet) -> None:
    assert tcp_open(net.wan_ip, 80) and tcp_open(net.wan_ip, 443), "precondition: the wan serves HTTP(S)"
    assert net.route_from_bridge(net.public_web_ip) == net.wan_if, "precondition: a route to the wan"
    checks.check_no_internet(make(), net, nft)


def test_SBX_NET_05_internet_toggle(make: Factory, net: SimNet, nft: NftInternetSet) -> None:
    checks.check_internet_toggle(make(), net, nft)


def test_SBX_NET_06_only_allowed_ports(make: Factory, net: SimNet) -> None:
    for port in net.wan_tcp_ports:
        assert tcp_open(net.wan_ip, port), f"precondition: the wan serves :{port}"
    allowed = checks.role_defaults("sandbox_network")["sandbox_network_internet_tcp_ports"]
    checks.check_only_allowed_ports(make(internet=True), net, allowed)


def test_SBX_NET_07_no_lan(make: Factory, net: SimNet) -> None:
    for port in net.lan_tcp_ports:
        assert tcp_open(net.lan_ip, port), f"precondition: the host reaches the lan :{port}"
    assert probe.icmp(net.lan_ip)["reply"], "precondition: the lan answers the host's ping"
    checks.check_no_lan(make(internet=True), net)  # internet or not: never the LAN


def test_SBX_NET_08_no_sandbox_to_sandbox(make: Factory) -> None:
    a, b = make(), make()
    for t in (a, b):
        assert tcp_open(t.ip, 22), "precondition: the host reaches the sandbox's sshd"
        assert probe.icmp(t.ip)["reply"], "precondition: the sandbox answers the host's ping"
    checks.check_isolated(a, b)


def test_SBX_NET_09_no_host_services(make: Factory, settings: Settings, net: SimNet) -> None:
    ports = [22, 80, 443, 2222, 3128, 8006, 8080, 9100]
    with host_listeners(settings.gateway, ports) as open_ports:
        assert 22 in open_ports and 8006 in open_ports, f"precondition: host serves {open_ports}"
        plain, online = make(), make(internet=True)
        checks.parallel(
            partial(checks.check_no_host_services, plain, settings.gateway, [*open_ports, 53]),
            # with internet too (DNS is the only exception then: SBX-NET-11)
            partial(checks.check_no_host_services, online, settings.gateway, open_ports),
        )


def test_SBX_NET_10_no_metadata(make: Factory, net: SimNet) -> None:
    assert net.route_from_bridge(net.metadata_ip) == net.wan_if, "precondition: a route to 169.254.169.254"
    assert net.netns_tcp_open(net.wan_ns, net.metadata_ip, 80), "precondition: the metadata service runs"
    checks.check_no_metadata(make(internet=True), net)


def test_SBX_NET_11_dns_only_via_host(make: Factory, net: SimNet) -> None:
    assert dns_query(net.wan_ip, net.dns_name) == net.public_web_ip, "precondition: the wan resolver answers"
    plain, online = make(), make(internet=True)
    checks.parallel(
        partial(checks.check_dns_only_via_host, plain, net, internet=False),
        partial(checks.check_dns_only_via_host, online, net, internet=True),
    )


def test_SBX_NET_12_no_ipv6_egress(make: Factory, settings: Settings, local: Host) -> None:
    checks.check_no_ipv6(make(), local, settings.bridge)


def test_SBX_NET_13_rate_limited(make: Factory, net: SimNet) -> None:
    rate = int(checks.role_defaults("sandbox_network")["sandbox_network_new_conn_rate"])
    # the same burst from the host (not forwarded, so not limited) gets everything through
    host_burst = probe.burst(net.wan_ip, 80, 200, 0.9)
    assert host_burst["connected"] == 200, f"precondition: the wan takes a burst ({host_burst})"
    t = make(internet=True)
    checks.check_rate_limited(t, net, rate)
    # a limit, not a ban: once the bucket refills (rate per second) the sandbox connects again
    deadline = time.monotonic() + 10
    while not checks.probe(t, "http", net.wan_ip, 80)["ok"]:
        assert time.monotonic() < deadline, "the sandbox stayed blocked 10 s after the burst"
        time.sleep(0.2)


def test_SBX_NET_14_scan_finds_only_allowed(make: Factory, settings: Settings, net: SimNet) -> None:
    a, b, c = make(), make(), make(internet=True)
    gw = settings.gateway
    high = "2024,2049,3000,3128,3306,5432,5900,6379,8000,8006,8080,8443,9000,9090,9100,10250,11211,27017"
    targets = [f"{gw}:1-1024,{high}", *[f"{x.ip}:1-1024,{high}" for x in (a, b, c)]]
    # the sweep does find what is reachable: from the host, every sandbox's sshd
    found = probe.sweep(2, [f"{x.ip}:22" for x in (a, b, c)])["open"]
    assert len(found) == 3, f"precondition: the host's sweep sees the sandboxes ({found})"
    allowed: dict[str, set[tuple[str, int]]] = {a.ip: set(), b.ip: set(), c.ip: {(gw, 53)}}
    others = {t.ip: [x for x in targets if not x.startswith(t.ip + ":")] for t in (a, b, c)}
    checks.parallel(*[partial(checks.check_sweep, t, others[t.ip], allowed[t.ip]) for t in (a, b, c)])


def test_SBX_NET_15_no_source_spoofing(make: Factory, net: SimNet) -> None:
    a, b = make(), make(internet=True)
    assert checks.probe(b, "http", net.wan_ip, 80)["ok"], "precondition: the victim has internet"
    checks.check_no_spoofing(a, b, net)
