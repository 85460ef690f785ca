"""A PVE API test server with the pool, the firewall gate and CT templates as site.yml leaves them,
and the runtime settings that reach it with its root token (the unit tests of the PVE backend)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from proxmoxer.tools import Tasks

from pve_testserver import PVETestServer
from sandbox_rt import Settings

NODE = "pve"
TEMPLATE = 9000
POOL = "sandbox-pool"


def add_template(root: Any, vmid: int, node: str = NODE) -> None:
    """A CT template at ``vmid`` (created in the pool, then converted)."""
    upid = root.nodes(node).lxc.post(
        vmid=vmid,
        ostemplate="local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst",
        storage="local-lvm",
        pool=POOL,
        net0="name=eth0,bridge=vmbr1,ip=dhcp",
    )
    assert Tasks.blocking_status(root, upid, timeout=10, polling_interval=0.02)["exitstatus"] == "OK"
    root.nodes(node).lxc(vmid).template.post()


@contextlib.contextmanager
def pve_server(*templates: int) -> Iterator[PVETestServer]:
    """The test server with the runtime's pool, the datacenter firewall on (as the node play leaves
    it; else FirewallDisabled) and a template at each VMID (default: ``TEMPLATE``)."""
    with PVETestServer() as srv:
        root = srv.client()
        root.pools.post(poolid=POOL)
        root.cluster.firewall.options.put(enable=1)
        for vmid in templates or (TEMPLATE,):
            add_template(root, vmid)
        yield srv


def pve_settings(srv: PVETestServer, state_dir: Path, **overrides: Any) -> Settings:
    """Settings of the proxmox backend against ``srv`` with its root token."""
    tokenid, secret = srv.root_token
    values: dict[str, Any] = {
        "backend": "proxmox",
        "pve_url": f"https://{srv.host}:{srv.port}",
        "pve_token_id": tokenid,
        "pve_token_secret": secret,
        "pve_verify": str(srv.ca_file),
        "pve_template_vmid": TEMPLATE,
        "state_dir": state_dir,
        **overrides,
    }
    return Settings(**values)
