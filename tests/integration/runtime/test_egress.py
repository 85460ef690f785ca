"""Egress allow-lists on real sandboxes, both backends: recorded with the sandbox, applied where the
backend enforces egress (LXC: the host's nft state; PVE: the CT's firewall), bad input changes nothing.
What the lists let through is tested against a simulated internet in tests/hardening/test_network_state.py.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from typing import Any

import pytest

import sandbox_rt
from sandbox_rt import BackendError, ConfigError, Manager, Settings
from sandbox_rt.backends.lxc.egress_dns import bound_ports
from sandbox_rt.backends.lxc.netstate import NetState

from .conftest import SESSION_LABEL

NETS = ["192.0.2.0/24", "198.51.100.7"]


def _pve_egress_rules(manager: Manager, sandbox_id: str) -> list[dict[str, Any]]:
    backend: Any = manager.backend
    node, vmid = backend._find(sandbox_id)
    rules = backend.api.nodes(node).lxc(vmid).firewall.rules.get()
    return [r for r in rules if r.get("comment") == "sandbox-rt egress"]


def _applied(manager: Manager, sb: sandbox_rt.Sandbox) -> set[str]:
    """The egress destinations the backend enforces for ``sb``."""
    if manager.backend.name == "proxmox":
        return {str(r["dest"]) for r in _pve_egress_rules(manager, sb.id)}
    net = NetState(manager.settings).read(sb.id)
    return set(net.egress) if net else set()


def test_egress_is_recorded_and_applied(manager: Manager, make) -> None:  # type: ignore[no-untyped-def]
    sb = make(egress=NETS)
    assert sb.status().egress == tuple(NETS)
    assert manager.get(sb.id).spec.egress == tuple(NETS)  # stored with the sandbox (attach sees it)
    assert _applied(manager, sb) == set(NETS)
    assert not sb.status().internet  # a list is not internet

    assert sb.set_egress(["203.0.113.0/25"]) == ("203.0.113.0/25",)
    assert _applied(manager, sb) == {"203.0.113.0/25"}
    assert manager.get(sb.id).spec.egress == ("203.0.113.0/25",)

    with pytest.raises(ConfigError):
        sb.set_egress(["not a name"])
    assert _applied(manager, sb) == {"203.0.113.0/25"}  # a bad list changes nothing
    assert sb.set_egress([]) == () and _applied(manager, sb) == set()


def test_bad_egress_makes_nothing(manager: Manager) -> None:
    before = {r.id for r in manager.list()}
    for bad in (["2001:db8::1"], ["10.0.0.1/8"], "example.org", [""]):
        with pytest.raises(ConfigError):
            manager.create(egress=bad, labels=SESSION_LABEL)  # type: ignore[arg-type]
    assert {r.id for r in manager.list()} == before


def test_domain_egress_on_proxmox_is_a_config_error_and_leaves_nothing(pve_manager: Manager) -> None:
    before = {r.id for r in pve_manager.list()}
    with pytest.raises(ConfigError, match="dnsmasq"):
        pve_manager.create(egress=["example.org"], labels=SESSION_LABEL)
    assert {r.id for r in pve_manager.list()} == before
    assert pve_manager.gc(dry_run=True) == []  # no half-made CT, no create marker


def test_warm_pool_hand_out_applies_the_egress_list(settings: Settings) -> None:
    with Manager(settings, pool_size=1, pool_spec={"memory_mb": 256, "labels": SESSION_LABEL}) as mgr:
        assert mgr.pool is not None and mgr.pool.wait_ready(timeout=60)
        pooled = {r.id for r in mgr.list(labels=SESSION_LABEL)}
        sb = mgr.create(memory_mb=256, egress=NETS, labels=SESSION_LABEL)
        try:
            assert sb.id in pooled
            assert _applied(mgr, sb) == set(NETS) and mgr.get(sb.id).spec.egress == tuple(NETS)
        finally:
            sb.destroy()
        assert NetState(settings).read(sb.id) is None


def _nft(*args: str) -> str:
    return subprocess.run(["nft", *args], capture_output=True, text=True, check=True, timeout=30).stdout


def _live(settings: Settings, sb: sandbox_rt.Sandbox) -> dict[str, object]:
    """What the live table holds for ``sb``: its chain and sets, and its elements in the shared
    internet set and maps (as nft lists them)."""
    t = ["inet", settings.nft_table]
    chain = "egress_" + sb.id.removeprefix("sbx-")
    table = json.loads(_nft("-j", "list", "table", *t))["nftables"]
    mine = [
        {k: v for k, v in item[kind].items() if k != "handle"}
        for item in table
        for kind in ("chain", "set", "rule")
        if kind in item
        and (item[kind].get("chain") == chain or str(item[kind].get("name")).startswith(chain))
    ]
    elements = {}
    shared = (settings.nft_internet_set, "set"), ("egress_sources", "map"), ("dns_resolvers", "map")
    for name, kind in shared:
        text = _nft("list", kind, *t, name)
        found = re.findall(rf"\b{re.escape(sb.ip)}(?: : [\w ]+?)?(?=[,\n}}])", text)
        elements[name] = [x.strip() for x in found]
    return {"objects": mine, "elements": elements}


def test_names_that_start_with_a_digit_are_names(settings: Settings, make_lxc) -> None:  # type: ignore[no-untyped-def]
    sb = make_lxc(memory_mb=256)
    entries = ["1password.com", "1e100.net", "3m.com", "192.0.2.0/24", "198.51.100.7"]
    assert sb.set_egress(entries) == tuple(entries)  # before: BackendError "nft -f ... failed"
    state = NetState(settings)
    net = state.read(sb.id)
    assert net is not None and net.names == ["1password.com", "1e100.net", "3m.com"]
    live = _live(settings, sb)
    nets = [o for o in live["objects"] if str(o.get("name", "")).endswith("_net")]  # type: ignore[attr-defined]
    assert len(nets) == 1 and "192.0.2.0" in json.dumps(nets[0]) and "198.51.100.7" in json.dumps(nets[0])
    assert live["elements"]["dns_resolvers"] == [f"{sb.ip} : {net.dns_port}"]
    conf = state.resolvers.read(sb.id) or ""
    assert [ln for ln in conf.splitlines() if ln.startswith("server=")] == [
        f"server=/{name}/{settings.dns_server}#53" for name in ("1e100.net", "1password.com", "3m.com")
    ]
    assert state.resolvers.running(sb.id) and net.dns_port in bound_ports(settings.dns_server, "udp")


def test_a_failing_change_keeps_the_old_rules_and_spares_the_others(
    settings: Settings,
    lxc_manager: Manager,
    make_lxc,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    a = make_lxc(memory_mb=256, egress=["a.example", "192.0.2.0/24"])
    b = make_lxc(memory_mb=256, egress=["b.example", "198.51.100.0/24"])
    state: NetState = lxc_manager.backend.netstate  # type: ignore[attr-defined]
    before = {sb.id: (_live(settings, sb), state.read(sb.id), state.resolvers.read(sb.id)) for sb in (a, b)}
    pid_b = state.resolvers.pid_path(b.id).read_text()
    assert before[a.id][0]["elements"]["egress_sources"], "precondition: a's list is live"

    # an entry that passes validation but nft rejects: a crafted line in a's transaction
    real = state.replace_script
    crafted = "add element inet sandbox no_such_set { 192.0.2.1 }\n"
    monkeypatch.setattr(state, "replace_script", lambda old, new: real(old, new) + crafted)
    with pytest.raises(BackendError, match="live rules are unchanged"):
        a.set_egress(["c.example", "203.0.113.0/24"])
    monkeypatch.undo()

    after = {sb.id: (_live(settings, sb), state.read(sb.id), state.resolvers.read(sb.id)) for sb in (a, b)}
    assert after == before, "a failed change altered the live rules, state files or resolvers"
    assert state.resolvers.running(a.id) and state.resolvers.pid_path(b.id).read_text() == pid_b
    assert lxc_manager.get(a.id).spec.egress == ("a.example", "192.0.2.0/24") == a.status().egress
    assert a.ip not in _nft("list", "set", "inet", settings.nft_table, settings.nft_internet_set)
    # the state directory holds nothing that would break the next load of the tables (for everyone)
    nft_file = "/etc/sandbox_rt/nftables.nft"
    check = subprocess.run(["nft", "-c", "-f", nft_file], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr

    # a list that skipped validation is refused by the backend before anything is written
    with pytest.raises(ConfigError):
        lxc_manager.backend.set_egress(a.record, ("192.0.2.0/24", "not a name"))
    assert _live(settings, a) == before[a.id][0] and state.read(a.id) == before[a.id][1]
    # and a good change still goes through afterwards
    assert a.set_egress(["c.example"]) == ("c.example",)
    kept = before[a.id][1]
    assert kept is not None and state.read(a.id) == dataclasses.replace(kept, egress=("c.example",))


def test_gc_collects_network_state_a_failed_destroy_left(
    settings: Settings,
    lxc_manager: Manager,
    make_lxc,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    sb = make_lxc(memory_mb=256, egress=["a.example"])
    state: NetState = lxc_manager.backend.netstate  # type: ignore[attr-defined]
    port = (state.read(sb.id) or pytest.fail("no state")).dns_port
    assert port is not None and state.resolvers.running(sb.id)

    def fail(*_args: object) -> bool:
        raise BackendError("injected", step="network")

    monkeypatch.setattr(state, "remove", fail)
    sb.destroy()  # the container goes; its network state and resolver stay behind
    monkeypatch.undo()
    assert not (settings.lxc_path / sb.id).exists() and state.resolvers.running(sb.id)

    assert (sb.id, "network state without a sandbox") in {
        (r.sandbox_id, r.reason) for r in lxc_manager.gc(dry_run=True)
    }
    assert sb.id in {r.sandbox_id for r in lxc_manager.gc()}
    assert state.read(sb.id) is None and state.resolvers.read(sb.id) is None
    assert not state.resolvers.running(sb.id) and port not in bound_ports(settings.dns_server)
    assert sb.ip not in _nft("list", "map", "inet", settings.nft_table, "dns_resolvers")
