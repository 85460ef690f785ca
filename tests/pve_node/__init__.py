"""An emulated Proxmox VE node for tests, molecule and the docs' walk-through (issue 15).

The operating-system half of a PVE node is real: a Debian 12 system container with systemd,
ifupdown2, sshd, nftables, dnsmasq and LXC, whose nested unprivileged containers are the sandboxes.
The PVE-only half (the API, pve-firewall, the host-key hookscript) is the PVE API test server with
its node engine (``pve_testserver/engine_node.py``). See docs/pve-test-server.md.

    python -m tests.pve_node start | status | reboot | stop | env
"""

from __future__ import annotations

from .node import PVENode
from .spec import NodeSpec, spec_for_index, spec_from_env

__all__ = ["NodeSpec", "PVENode", "spec_for_index", "spec_from_env"]
