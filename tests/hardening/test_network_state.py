"""Egress allow-lists and the runtime's network state, against the simulated internet (testnet.py).

- ``create(egress=[...])``: with internet off, a sandbox reaches exactly the listed addresses,
  networks and what the listed names resolve to (by the host's dnsmasq, into the sandbox's own set),
  on the allowed ports; nothing else, and no other sandbox gains anything from it.
- A reload of the sandbox tables (what the boot unit and site.yml do) or a restart of the sandbox
  dnsmasq while sandboxes run: internet and egress states come back from the runtime's state files,
  and the isolation controls still hold.

Every "blocked" is shown next to a "the host reaches it" or a "this other sandbox reaches it".
"""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest

from sandbox_rt import Settings
from sandbox_rt.backends.lxc.egress_dns import bound_ports
from sandbox_rt.backends.lxc.netstate import NetState
from sandbox_rt.backends.lxc.nft import NftInternetSet

from . import checks
from .checks import Target
from .conftest import Factory
from .controls import Waiver
from .sites import Site
from .testnet import SimNet

pytestmark = [pytest.mark.slow]


def _http_ok(t: Target, net: SimNet, address: str, port: int = 80) -> bool:
    r = checks.probe(t, "http", address, port)
    return bool(r["ok"]) and r["body"] == net.http_body(address, port)


def _resolves(t: Target, name: str) -> list[str]:
    return t.sb.exec(f"getent hosts {name}", timeout=15).text.split()[:1]


def _egress_works(t: Target, net: SimNet) -> None:
    assert _resolves(t, net.dns_name) == [net.public_web_ip], "the allowed name does not resolve"
    assert _http_ok(t, net, net.public_web_ip), "the allowed name's address is not reachable"


def _preconditions(net: SimNet) -> None:
    for addr in (net.public_web_ip, net.other_web_ip):
        assert net.netns_tcp_open(net.wan_ns, addr, 80), f"precondition: the wan serves {addr}:80"
    served = net.host_tcp_open(net.wan_ip, 80) and net.host_tcp_open(net.wan_ip, 8080)
    assert served, "precondition: the wan serves :80 :8080"


def _names_refused(site: Site, waiver: Waiver) -> None:
    """A PVE waiver's statement: an egress list naming a domain is refused before anything is made."""
    holds, evidence = checks.pve_egress_names_refused(site)
    assert holds and waiver.condition == "pve_egress_names_refused", evidence


def test_SBX_NET_16_egress_allow_list(
    site: Site,
    site_make: Factory,
    site_net: SimNet,
    site_nft: NftInternetSet,
    pve_waivers: dict[str, Waiver],
) -> None:
    net, nft, make = site_net, site_nft, site_make
    _preconditions(net)
    if site.is_pve:  # addresses only (the CT firewall's rules); names are refused (the waiver)
        _names_refused(site, pve_waivers["SBX-NET-16"])
        checks.check_egress_addresses_only(make(egress=[net.wan_ip]), make(), net, nft)
        return
    t = make(egress=[net.dns_name, net.wan_ip])
    bystander = make()
    assert t.sb.status().egress == (net.dns_name, net.wan_ip)
    assert not nft.contains(t.ip), "an egress list must not turn internet on"

    _egress_works(t, net)  # the name: resolved by the sandbox's own resolver into its own set
    assert _http_ok(t, net, net.wan_ip), "the allowed address is not reachable"
    # a name outside the list does not resolve (SBX-NET-18), and its address does not connect
    assert _resolves(t, net.other_dns_name) == []
    reached = checks.sweep(t, [f"{net.other_web_ip}:80", f"{net.wan_ip}:8080", f"{net.public_web_ip}:8080"])
    assert reached == set(), f"reached what the list does not allow: {reached}"
    checks.check_no_lan(t, net)

    # the bystander (no list) gains nothing from the first sandbox's resolved addresses, nor DNS
    assert checks.sweep(bystander, [f"{net.public_web_ip}:80,443", f"{net.wan_ip}:80"]) == set()
    checks.check_dns_only_via_host(bystander, net, internet=False)
    # the listed sandbox asks only the host's resolver, never another one
    direct = checks.probe(t, "dns-many", net.dns_name, f"{net.wan_ip}/udp", f"{net.public_resolver_ip}/udp")
    assert set(direct.values()) == {None}, f"other resolvers answered the listed sandbox: {direct}"

    # closing the list closes it at once
    assert t.sb.set_egress([]) == ()
    assert checks.sweep(t, [f"{net.public_web_ip}:80", f"{net.wan_ip}:80"]) == set()
    assert t.sb.status().egress == ()


def _dns_set(settings: Settings, t: Target) -> str:
    out = subprocess.run(
        ["nft", "list", "set", "inet", settings.nft_table, f"egress_{t.id[4:]}_dns"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split("elements", 1)[-1] if "elements" in out else ""


def _pid(path: Path) -> str:
    return path.read_text().strip()


def test_SBX_NET_18_dns_answers_only_the_list(
    site: Site,
    site_make: Factory,
    site_net: SimNet,
    site_settings: Settings,
    pve_waivers: dict[str, Waiver],
) -> None:
    net, make, settings = site_net, site_make, site_settings
    if site.is_pve:  # no names in a PVE egress list (the waiver): the host answers no DNS for it
        _names_refused(site, pve_waivers["SBX-NET-18"])
        t = make(egress=[net.wan_ip])
        for proto in ("udp", "tcp"):
            r = checks.probe(t, "dns", settings.dns_server, net.dns_name, proto)
            checks.require("SBX-NET-18", r["answer"] is None, f"the host answered a listed sandbox: {r}")
        return
    tag = secrets.token_hex(4)  # fresh names: the upstream's log is shared by the whole session
    a = make(egress=[net.dns_name])
    b = make(egress=[net.other_dns_name])
    # A: its own name resolves; B's name and a name nobody lists are refused and never leave the host
    allowed = (f"a{tag}.{net.dns_name}", net.public_web_ip)
    outside = [f"b{tag}.{net.other_dns_name}", f"c{tag}.tunnel.test"]
    checks.check_dns_answers_only_the_list(a, net, allowed, outside)
    # the answer landed in A's own set, not in B's; HTTP to it works, other destinations stay closed
    assert net.public_web_ip in _dns_set(settings, a) and net.public_web_ip not in _dns_set(settings, b)
    assert _http_ok(a, net, net.public_web_ip)
    assert checks.sweep(a, [f"{net.other_web_ip}:80", f"{net.wan_ip}:80,443"]) == set()
    # B: the mirror image, through its own resolver
    allowed_b = (f"d{tag}.{net.other_dns_name}", net.other_web_ip)
    checks.check_dns_answers_only_the_list(b, net, allowed_b, [f"e{tag}.{net.dns_name}"])

    # a change of A's list restarts A's resolver only: not B's, not the shared dnsmasq
    state = NetState(settings)
    pids = {p: _pid(p) for p in (state.resolvers.pid_path(b.id), settings.dnsmasq_pidfile)}
    a.sb.set_egress([net.other_dns_name])
    assert {p: _pid(p) for p in pids} == pids, "another sandbox's resolver or the shared dnsmasq restarted"
    assert net.public_web_ip not in _dns_set(settings, a), "a removed name's addresses stay allowed"
    allowed_a = (f"f{tag}.{net.other_dns_name}", net.other_web_ip)
    checks.check_dns_answers_only_the_list(a, net, allowed_a, [f"g{tag}.{net.dns_name}"])
    # a sandbox with internet still resolves everything through the shared dnsmasq
    a.sb.set_internet(True)
    assert _resolves(a, f"h{tag}.{net.dns_name}") == [net.public_web_ip]


def _reload_tables(settings: Settings) -> None:
    """What the boot unit and site.yml do: load the role's nft file (it deletes and redefines)."""
    nft_file = checks.role_defaults("sandbox_network")["sandbox_network_nft_file"]
    subprocess.run(["nft", "-f", str(nft_file)], check=True, capture_output=True, text=True, timeout=30)


def _restart_shared_dnsmasq(settings: Settings) -> None:
    """The role's handler (no systemd): stop by pidfile + executable, start with the role's config."""
    pid = ["--pidfile", str(settings.dnsmasq_pidfile), "--exec", "/usr/sbin/dnsmasq"]
    stop = ["start-stop-daemon", "--stop", "--quiet", "--oknodo", "--retry", "TERM/5/KILL/2", *pid]
    subprocess.run(stop, check=True, timeout=30)
    start = ["start-stop-daemon", "--start", "--quiet", *pid, "--", f"--conf-file={settings.dnsmasq_conf}"]
    subprocess.run(start, check=True, timeout=30)


def test_SBX_NET_17_reload_and_dns_restart_keep_state(
    site: Site, site_make: Factory, site_net: SimNet, site_nft: NftInternetSet, site_settings: Settings
) -> None:
    if site.is_pve:
        _reload_and_restart_keep_state_pve(site, site_make, site_net, site_nft)
        return
    make, net, nft, settings = site_make, site_net, site_nft, site_settings
    online = make(internet=True)
    listed = make(egress=[net.dns_name])
    offline = make()
    checks.check_internet_works(online, net)
    _egress_works(listed, net)

    state = NetState(settings)
    before = {n.sandbox_id: n for n in state.all()}
    assert {online.id, listed.id, offline.id} <= set(before)
    # every sandbox's port is bound (issue 26); the one without internet has nothing else
    plain = before[offline.id]
    assert plain.bound and not plain.internet and not plain.egress, plain

    _reload_tables(settings)
    assert nft.contains(online.ip), "the reload lost the internet element"
    listing = ["nft", "list", "map", "bridge", settings.nft_table, "port_in"]
    ports = subprocess.run(listing, capture_output=True, text=True, check=True).stdout
    for t in (online, listed, offline):
        bound = f'"{before[t.id].port}" : jump in_{t.id[4:]}'
        assert bound in ports, f"the reload lost {t.id}'s port binding"
    checks.check_internet_works(online, net)
    _egress_works(listed, net)  # chain, sets and map element restored; dnsmasq refills the set
    checks.check_no_internet(offline, net, nft)
    assert checks.sweep(listed, [f"{net.wan_ip}:80", f"{net.other_web_ip}:80"]) == set(), "beyond its list"
    checks.check_isolated(online, offline)
    checks.check_no_lan(online, net)

    _restart_shared_dnsmasq(settings)  # what the role's handler does
    _egress_works(listed, net)  # its own resolver forwards the listed name to the restarted one
    checks.check_internet_works(online, net)
    checks.check_no_internet(offline, net, nft)

    # toggled off before a reload: stays off after it
    online.sb.set_internet(False)
    _reload_tables(settings)
    checks.check_no_internet(online, net, nft)


def test_SBX_LIFE_05_destroy_forgets_the_network_state(
    site: Site, site_make: Factory, site_net: SimNet, site_settings: Settings
) -> None:
    if site.is_pve:  # the CT's own firewall (options, rules) and what pve-firewall compiled of it
        t = site_make(internet=True, egress=[site_net.wan_ip])
        checks.check_pve_network_state_forgotten(t)
        return
    make, net, settings = site_make, site_net, site_settings
    t = make(internet=True, egress=[net.dns_name, "192.0.2.0/24"])
    files = [settings.net_state_dir / f"{t.id}.{ext}" for ext in ("json", "nft", "dnsmasq.conf")]
    assert all(f.exists() for f in files)
    state = NetState(settings)
    port = state.read(t.id).dns_port  # type: ignore[union-attr]
    assert port is not None and state.resolvers.running(t.id)
    assert port in bound_ports(settings.dns_server, "udp")
    t.sb.destroy()
    assert not any(f.exists() for f in files)
    assert not state.resolvers.running(t.id) and not state.resolvers.pid_path(t.id).exists()
    assert port not in bound_ports(settings.dns_server), "the resolver's port is still bound"
    table = subprocess.run(
        ["nft", "list", "table", "inet", settings.nft_table], capture_output=True, text=True, check=True
    ).stdout
    assert f"egress_{t.id[4:]}" not in table
    for name in (settings.nft_internet_set, "egress_sources", "dns_resolvers"):
        kind = "set" if name == settings.nft_internet_set else "map"
        listed = subprocess.run(
            ["nft", "list", kind, "inet", settings.nft_table, name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert t.ip not in listed, f"{t.ip} is still in {name}"


def _reload_and_restart_keep_state_pve(site: Site, make: Factory, net: SimNet, nft: NftInternetSet) -> None:
    """SBX-NET-17 on the emulated PVE node: the node's sandbox tables reloaded and its dnsmasq
    restarted (the units site.yml installed: what a boot or a later site.yml run does) while sandboxes
    run. The sandboxes' internet and egress are their CT firewalls (PVE's, untouched); what the node's
    own tables hold must come back with them: isolation, the LAN ranges, DNS only with internet."""
    online = make(internet=True)
    listed = make(egress=[net.wan_ip])
    offline = make()
    checks.check_internet_works(online, net)
    assert _http_ok(listed, net, net.wan_ip), "precondition: the egress list works"

    for unit in ("sandbox-nftables.service", "sandbox-dnsmasq.service"):
        done = site.host.run(f"systemctl restart {unit}")
        assert done.rc == 0, f"restarting {unit}: {done.stderr}"
    checks.check_internet_works(online, net)
    assert _http_ok(listed, net, net.wan_ip), "the reload lost the egress list"
    checks.check_no_internet(offline, net, nft)
    beyond = checks.sweep(listed, [f"{net.public_web_ip}:80", f"{net.other_web_ip}:80"])
    assert beyond == set(), f"beyond its list: {beyond}"
    checks.check_isolated(online, offline)
    checks.check_no_lan(online, net)
    checks.check_dns_only_via_host(offline, net, internet=False)

    # toggled off before a reload: stays off after it
    online.sb.set_internet(False)
    assert site.host.run("systemctl restart sandbox-nftables.service").rc == 0
    checks.check_no_internet(online, net, nft)
