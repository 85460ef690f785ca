"""The network role's egress gate: ``nft`` (the runtime's set and chains, the default) or
``pve_firewall`` (Proxmox VE nodes: each CT's own PVE firewall decides, the host tables still fence).

The nft file is rendered from the role's template with the role's defaults and checked by the
kernel (``nft -c``, nothing is loaded); the guard that refuses ``pve_firewall`` on a kernel without
``meta ibrname`` runs through ansible-playbook.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from tests.integration.provision_helpers import REPO, run_playbook

# CI runs as root (it provisions the host first), so this never skips there
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (nft -c)")

ROLE = REPO / "roles" / "sandbox_network"
SHARED = REPO / "roles" / "sandbox_host_vars"  # the bridge, the network, the table names


def _render(tmp_path: Path, **overrides: Any) -> str:
    defaults: dict[str, Any] = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    shared: dict[str, Any] = yaml.safe_load((SHARED / "defaults" / "main.yml").read_text())
    values = {
        **shared,
        **defaults,
        "ansible_managed": "test",
        "sandbox_bridge_address": "10.99.0.1",
        "sandbox_network_state_dir": str(tmp_path / "net"),
        "sandbox_network_nft_ibrname": False,
        **overrides,
    }
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"), keep_trailing_newline=True)
    env.filters["bool"] = bool  # the one Ansible filter the template uses
    text = env.get_template("nftables.nft.j2").render(**values)
    path = tmp_path / "nftables.nft"
    path.write_text(text)
    check = subprocess.run(["nft", "-c", "-f", str(path)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, f"the kernel rejects the rendered file:\n{check.stderr}"
    return text


def _chain(text: str, name: str) -> str:
    start = text.index(f"chain {name} {{")
    return text[start : text.index("\n\t}", start)]


def _table_handles() -> dict[str, int]:
    out = subprocess.run(["nft", "-j", "list", "tables"], capture_output=True, text=True, check=True).stdout
    tables = [i["table"] for i in json.loads(out)["nftables"] if "table" in i]
    return {f"{t['family']} {t['name']}": int(t["handle"]) for t in tables}


def test_nft_gate_lets_only_the_runtimes_set_and_chains_out(tmp_path: Path) -> None:
    text = _render(tmp_path, sandbox_network_uplink="hwan0")
    forward = _chain(text, "forward")
    out = [ln.strip() for ln in forward.splitlines() if 'oifname "hwan0"' in ln and "accept" in ln]
    assert out == ['iifname "vmbr1" oifname "hwan0" ip saddr @internet_allowed tcp dport { 80, 443 } accept']
    assert "ip saddr vmap @egress_sources" in forward
    dns = [ln.strip() for ln in _chain(text, "from_sandbox").splitlines() if "dport 53 accept" in ln]
    assert dns and all(ln.startswith("ip saddr @internet_allowed") for ln in dns)
    # without internet, DNS reaches the host only DNATed to the sandbox's own egress resolver
    own = [ln.strip() for ln in _chain(text, "from_sandbox").splitlines() if "ct status dnat" in ln]
    dnated = "meta l4proto { tcp, udp } th dport 20000-21999 ct status dnat ct original proto-dst 53 accept"
    assert own == [dnated]
    assert "dnat ip to 10.99.0.1 : ip saddr map @dns_resolvers" in _chain(text, "prerouting")
    assert 'iifname "sbx*" counter drop' in text and 'oifname "sbx*" counter drop' in text


def test_pve_firewall_gate_leaves_egress_to_the_ct_firewall_and_still_fences(tmp_path: Path) -> None:
    text = _render(tmp_path, sandbox_network_uplink="hwan0", sandbox_network_egress_gate="pve_firewall")
    forward = _chain(text, "forward")
    lines = [ln.strip() for ln in forward.splitlines()]
    # what the CT firewall passed leaves on the allowed ports only; the blocked ranges stay dropped first
    accept = 'iifname "vmbr1" oifname "hwan0" tcp dport { 80, 443 } accept'
    blocked = 'iifname "vmbr1" ip daddr @blocked_destinations counter drop'
    assert accept in lines and blocked in lines and lines.index(blocked) < lines.index(accept)
    assert "@internet_allowed" not in forward and "@egress_sources" not in forward
    assert lines[-2:] == ['iifname "vmbr1" counter drop', 'oifname "vmbr1" counter drop']
    assert "udp dport 53 accept" in [ln.strip() for ln in _chain(text, "from_sandbox").splitlines()]
    assert "dns_resolvers" not in text.split("map dns_resolvers", 1)[1]  # no egress resolvers on PVE
    assert 'iifname "sbx*"' not in text  # PVE ports are veth*/fwpr* like any guest's: ibrname only


def test_pve_firewall_gate_refuses_a_kernel_without_ibrname() -> None:
    probe = (
        "table bridge sandbox_rt_probe { chain f { type filter hook forward priority filter; "
        'meta ibrname "vmbr1" drop; } }'
    )
    if subprocess.run(["nft", "-c", "-f", "-"], input=probe, capture_output=True, text=True).returncode == 0:
        pytest.skip(
            "this kernel has meta ibrname: the guard does not apply"
        )  # never the case on the CI machine
    before = _table_handles()
    run = run_playbook(
        "--tags", "sandbox_network", "-e", "sandbox_network_egress_gate=pve_firewall", timeout=600
    )
    assert run.returncode != 0 and run.total("failed") == 1, run.tail()
    assert "needs nftables `meta ibrname`" in run.output
    assert _table_handles() == before  # the live tables were not reloaded
