"""SBX-RES-06..12, SBX-NET-19: no sandbox starves the host or its neighbours (issue 26). Each cap is
shown holding against a real flood from a real sandbox, all traffic to the host's own bridge
address; the negative proofs (test_proofs.py) remove each cap and see its check fail. The network
caps, the disk caps and the port binding run on every site (the embedded default and PVE-backed
sandboxes on the emulated node, where the node's hookscript sets the disk caps and keeps the node's
pids budget); lxcfs is the embedded default's (docs/threat-model.md: what PVE does instead)."""

from __future__ import annotations

import pytest

from sandbox_rt import Manager

from . import neighbour_checks as nc
from .conftest import SESSION_LABEL, Factory
from .sites import Site

pytestmark = [pytest.mark.slow]


def test_SBX_RES_06_conntrack_per_sandbox(site: Site, site_make: Factory) -> None:
    nc.check_conntrack_table_sized()
    t = site_make(internet=True)
    if site.is_pve:  # the CT's own firewall passes only DNS to the node, which the DNS meter bounds
        nc.check_caps_loaded(t)
        return
    held = nc.check_conntrack_capped(t)
    print(f"the flooding sandbox held {held} conntrack entries (cap {nc.conntrack_cap()})")


def test_SBX_RES_07_dns_rate_per_sandbox(site_make: Factory) -> None:
    flooder, neighbour = site_make(internet=True), site_make(internet=True)
    print(nc.check_dns_rate_limited(flooder, neighbour))


def test_SBX_RES_08_new_connections_to_the_host(make: Factory) -> None:
    print(f"{nc.check_new_flows_to_host_limited(make())} of 300 new flows reached the host")


def test_SBX_RES_09_bandwidth(site_make: Factory) -> None:
    up, down = nc.check_bandwidth_capped(site_make(net_mbps=80), 80)
    print(f"net_mbps=80: sandbox -> host {up * 8e-6:.0f} Mbit/s, host -> sandbox {down * 8e-6:.0f} Mbit/s")


def test_SBX_RES_10_disk_bandwidth_and_iops(site_make: Factory) -> None:
    rate, ops = nc.check_disk_capped(site_make(disk_mbps=20, disk_iops=200), 20, 200)
    print(f"disk_mbps=20, disk_iops=200: {rate:.1f} MB/s, {ops:.0f} IOPS with O_DIRECT")


def test_SBX_RES_11_pids_sum_within_pid_max(site: Site, site_make: Factory, site_manager: Manager) -> None:
    if site.is_pve:  # the node's hookscript keeps the node's budget at each CT's start
        nc.check_node_pids_budget_refused(site_make, site_manager)
        return
    nc.check_pids_budget_sized(density=1000, pids_max=1024)
    nc.check_pids_over_budget_refused(site_manager, SESSION_LABEL)


def test_SBX_RES_12_sandbox_sees_its_own_limits(make: Factory) -> None:
    print(nc.check_own_limits_visible(make(memory_mb=384, cpus=1), 384, 1))


def test_SBX_NET_19_port_bound_to_its_identity(
    site: Site, site_make: Factory, request: pytest.FixtureRequest
) -> None:
    victim = site_make(internet=True)
    nc.check_port_bound(site_make(), victim)  # container root as the site makes it
    if not site.is_pve:  # ... and with net_admin + net_raw granted on purpose (a throw-away variant)
        make_with_net_caps: Factory = request.getfixturevalue("make_with_net_caps")
        nc.check_port_bound(make_with_net_caps(), victim)
