"""SBX-NET: the sandbox network against a simulated internet ("wan" netns on the uplink) and LAN
("lan" netns), see testnet.py (testnet_pve.py on the emulated PVE node, whose own wan netns holds
both). Every "blocked" is shown next to a "the host reaches it" (on PVE: the node), so a dead test
network cannot pass for a working firewall."""

from __future__ import annotations

import time
from functools import partial

import pytest
from testinfra.host import Host

from sandbox_rt import Settings
from sandbox_rt.backends.lxc.nft import NftInternetSet

from . import checks
from .checks import Target
from .conftest import Factory
from .controls import Waiver
from .sites import Site
from .testnet import SimNet

pytestmark = [pytest.mark.slow]


def test_SBX_NET_01_bridge_has_no_physical_port(
    site_settings: Settings, site_host: Host, site_baseline: Target
) -> None:
    # a sandbox is up, so the bridge has at least one port to look at
    assert site_baseline.sb.status().state == "running"
    checks.check_bridge_ports(site_settings.bridge, site_host)


def test_SBX_NET_02_firewall_loaded(site_settings: Settings, site_host: Host) -> None:
    s = site_settings
    checks.check_firewall_loaded(site_host, s.nft_table, s.nft_internet_set, s.bridge)


def test_SBX_NET_03_firewall_persists(waivers: dict[str, Waiver], site_host: Host) -> None:
    nft_file = checks.role_defaults("sandbox_network")["sandbox_network_nft_file"]
    waiver = waivers["SBX-NET-03"]
    holds, evidence = checks.no_systemd(site_host)
    if holds:  # the waiver applies: nothing persists; site.yml restores the rules from the file
        assert waiver.condition == "no_systemd"
        assert site_host.file(nft_file).exists, f"{nft_file} missing: site.yml could not restore the rules"
        assert site_host.run(f"nft -c -f {nft_file}").rc == 0, f"{nft_file} does not load"
        return
    unit = site_host.service("sandbox-nftables")
    checks.require("SBX-NET-03", unit.is_enabled, f"sandbox-nftables.service is not enabled ({evidence})")


def test_SBX_NET_04_no_internet_by_default(
    site_make: Factory, site_net: SimNet, site_nft: NftInternetSet
) -> None:
    net = site_net
    assert net.host_tcp_open(net.wan_ip, 80) and net.host_tcp_open(net.wan_ip, 443), "precondition: HTTP(S)"
    assert net.route_from_bridge(net.public_web_ip) == net.wan_if, "precondition: a route to the wan"
    checks.check_no_internet(site_make(), net, site_nft)


def test_SBX_NET_05_internet_toggle(
    site: Site,
    site_make: Factory,
    site_net: SimNet,
    site_nft: NftInternetSet,
    pve_waivers: dict[str, Waiver],
) -> None:
    if site.is_pve:  # the waiver's statement: the toggle works, an open connection lives on
        waiver = pve_waivers["SBX-NET-05"]
        holds, evidence = checks.pve_firewall_keeps_established(site)
        assert holds and waiver.condition == "pve_firewall_keeps_established", evidence
        checks.check_internet_toggle(site_make(), site_net, site_nft, open_connection_dies=False)
        return
    checks.check_internet_toggle(site_make(), site_net, site_nft)


def test_SBX_NET_06_only_allowed_ports(site_make: Factory, site_net: SimNet) -> None:
    net = site_net
    for port in net.wan_tcp_ports:
        assert net.host_tcp_open(net.wan_ip, port), f"precondition: the wan serves :{port}"
    allowed = checks.role_defaults("sandbox_network")["sandbox_network_internet_tcp_ports"]
    checks.check_only_allowed_ports(site_make(internet=True), net, allowed)


def test_SBX_NET_07_no_lan(site_make: Factory, site_net: SimNet) -> None:
    net = site_net
    for port in net.lan_tcp_ports:
        assert net.host_tcp_open(net.lan_ip, port), f"precondition: the host reaches the lan :{port}"
    assert net.host_ping(net.lan_ip), "precondition: the lan answers the host's ping"
    checks.check_no_lan(site_make(internet=True), net)  # internet or not: never the LAN


def test_SBX_NET_08_no_sandbox_to_sandbox(site_make: Factory, site_net: SimNet) -> None:
    a, b = site_make(), site_make()
    for t in (a, b):
        assert site_net.host_tcp_open(t.ip, 22), "precondition: the host reaches the sandbox's sshd"
        assert site_net.host_ping(t.ip), "precondition: the sandbox answers the host's ping"
    checks.check_isolated(a, b)


def test_SBX_NET_09_no_host_services(site_make: Factory, site_settings: Settings, site_net: SimNet) -> None:
    gateway = site_settings.gateway
    ports = [22, 80, 443, 2222, 3128, 8006, 8080, 9100]
    with site_net.host_listeners(gateway, ports) as open_ports:
        assert 22 in open_ports and 8006 in open_ports, f"precondition: host serves {open_ports}"
        plain, online = site_make(), site_make(internet=True)
        checks.parallel(
            partial(checks.check_no_host_services, plain, gateway, [*open_ports, 53]),
            # with internet too (DNS is the only exception then: SBX-NET-11)
            partial(checks.check_no_host_services, online, gateway, open_ports),
        )


def test_SBX_NET_10_no_metadata(site_make: Factory, site_net: SimNet) -> None:
    net = site_net
    assert net.route_from_bridge(net.metadata_ip) == net.wan_if, "precondition: a route to 169.254.169.254"
    assert net.netns_tcp_open(net.wan_ns, net.metadata_ip, 80), "precondition: the metadata service runs"
    checks.check_no_metadata(site_make(internet=True), net)


def test_SBX_NET_11_dns_only_via_host(site_make: Factory, site_net: SimNet) -> None:
    net = site_net
    assert net.host_dns(net.wan_ip, net.dns_name) == net.public_web_ip, "precondition: the wan resolver"
    plain, online = site_make(), site_make(internet=True)
    checks.parallel(
        partial(checks.check_dns_only_via_host, plain, net, internet=False),
        partial(checks.check_dns_only_via_host, online, net, internet=True),
    )


def test_SBX_NET_12_no_ipv6_egress(site_make: Factory, site_settings: Settings, site_host: Host) -> None:
    checks.check_no_ipv6(site_make(), site_host, site_settings.bridge)


def test_SBX_NET_13_rate_limited(site_make: Factory, site_net: SimNet) -> None:
    net = site_net
    rate = int(checks.role_defaults("sandbox_network")["sandbox_network_new_conn_rate"])
    # the same burst from the host (not forwarded, so not limited) gets everything through
    host_burst = net.host_burst(net.wan_ip, 80, 200, 0.9)
    assert host_burst["connected"] == 200, f"precondition: the wan takes a burst ({host_burst})"
    t = site_make(internet=True)
    checks.check_rate_limited(t, net, rate)
    # a limit, not a ban: once the bucket refills (rate per second) the sandbox connects again
    deadline = time.monotonic() + 10
    while not checks.probe(t, "http", net.wan_ip, 80)["ok"]:
        assert time.monotonic() < deadline, "the sandbox stayed blocked 10 s after the burst"
        time.sleep(0.2)


def test_SBX_NET_14_scan_finds_only_allowed(
    site_make: Factory, site_settings: Settings, site_net: SimNet
) -> None:
    a, b, c = site_make(), site_make(), site_make(internet=True)
    gw = site_settings.gateway
    high = "2024,2049,3000,3128,3306,5432,5900,6379,8000,8006,8080,8443,9000,9090,9100,10250,11211,27017"
    targets = [f"{gw}:1-1024,{high}", *[f"{x.ip}:1-1024,{high}" for x in (a, b, c)]]
    # the sweep does find what is reachable: from the host, every sandbox's sshd
    found = site_net.host_sweep(2, [f"{x.ip}:22" for x in (a, b, c)])["open"]
    assert len(found) == 3, f"precondition: the host's sweep sees the sandboxes ({found})"
    allowed: dict[str, set[tuple[str, int]]] = {a.ip: set(), b.ip: set(), c.ip: {(gw, 53)}}
    others = {t.ip: [x for x in targets if not x.startswith(t.ip + ":")] for t in (a, b, c)}
    checks.parallel(*[partial(checks.check_sweep, t, others[t.ip], allowed[t.ip]) for t in (a, b, c)])


def test_SBX_NET_15_no_source_spoofing(site_make: Factory, site_net: SimNet) -> None:
    a, b = site_make(), site_make(internet=True)
    assert checks.probe(b, "http", site_net.wan_ip, 80)["ok"], "precondition: the victim has internet"
    checks.check_no_spoofing(a, b, site_net)
