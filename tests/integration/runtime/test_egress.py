"""Egress allow-lists on real sandboxes, both backends: recorded with the sandbox, applied where the
backend enforces egress (LXC: the host's nft state; PVE: the CT's firewall), bad input changes nothing.
What the lists let through is tested against a simulated internet in tests/hardening/test_network_state.py.
"""

from __future__ import annotations

from typing import Any

import pytest

import sandbox_rt
from sandbox_rt import ConfigError, Manager, Settings
from sandbox_rt.netstate import NetState

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
