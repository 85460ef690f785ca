"""Provision an emulated node with ``site.yml`` (``inventories/pve_emulated``), once per test session.

The node costs a minute or two to provision, so the packages that use it (the hardening catalogue's
``pve-node`` site, tests/integration/test_pve_emulated.py) share one: :func:`emulated_pve` is the
session fixture (tests/conftest.py) that starts node 0, runs ``site.yml`` on it and removes it, with
everything it made, when the session ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.integration.provision_helpers import REPO, PlaybookRun, destroy_labelled, run_playbook

from .__main__ import exports
from .node import PVENode
from .spec import spec_for_index, spec_from_env


def run_site(node: PVENode, *extra: str, timeout: float = 1200) -> PlaybookRun:
    """``ansible-playbook -i inventories/pve_emulated site.yml`` with the node's environment."""
    inventory = REPO / "inventories" / "pve_emulated"
    return run_playbook(*extra, timeout=timeout, inventory=inventory, env=exports(node))


@contextlib.contextmanager
def node_environment(node: PVENode) -> Iterator[None]:
    """``python -m tests.pve_node env`` for this process (Manager.from_env reads SANDBOX_RT_CONFIG)."""
    saved = dict(os.environ)
    os.environ.update(exports(node))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def node_manager(node: PVENode, labels: dict[str, str]) -> Iterator[Any]:
    """``Manager.from_env()`` with the node's host contract; at the end the sandboxes carrying
    ``labels`` are destroyed (what a failed test left)."""
    import sandbox_rt

    with node_environment(node):
        mgr = sandbox_rt.Manager.from_env()
    try:
        yield mgr
    finally:
        destroy_labelled(mgr, labels)


@dataclasses.dataclass
class ProvisionedNode:
    """A running node, its API server, and the ``site.yml`` run that provisioned it."""

    node: PVENode
    first_run: PlaybookRun

    @property
    def host_json(self) -> Path:
        """The runtime's host contract site.yml wrote for this node (backend proxmox)."""
        return self.node.spec.home / "controller" / "host.json"


@contextlib.contextmanager
def provisioned_node(index: int = 0, extra_api_nodes: Sequence[str] = ()) -> Iterator[ProvisionedNode]:
    """Start node ``index`` (removing what a crashed session left), its API, run ``site.yml``; at
    the end remove it all and assert nothing is left. The run's result is handed over as it is:
    the tests that use it assert it succeeded. ``extra_api_nodes``: more PVE node names its API
    serves (:meth:`PVENode.api_start`)."""
    pve = PVENode(spec_for_index(index))
    pve.stop()
    try:
        pve.start()
        pve.api_start(extra_nodes=extra_api_nodes)
        yield ProvisionedNode(pve, run_site(pve))
    finally:
        pve.stop()
        assert pve.leftovers() == [], "the node helper left things behind"


def reused_node() -> ProvisionedNode:
    """The node ``SANDBOX_RT_PVE_NODE_INDEX`` names, running and provisioned already (development:
    ``python -m tests.pve_node provision``); its API server is started if it is not running."""
    pve = PVENode(spec_from_env())
    if not pve.running() or not (pve.spec.home / "controller" / "host.json").is_file():
        raise RuntimeError(
            f"node {pve.spec.name} is not running and provisioned: python -m tests.pve_node provision"
        )
    pve.api_start()
    return ProvisionedNode(pve, PlaybookRun([], 0, "(a node provisioned earlier, reused)", {}, 0.0))


def admin_api(node: PVENode) -> Any:
    """proxmoxer with the node's root token (the admin: root@pam's), TLS verified against the server's CA."""
    from proxmoxer import ProxmoxAPI

    info = json.loads((node.spec.api_dir / "info.json").read_text())
    tokenid, secret = (node.spec.api_dir / "root.token").read_text().strip().split("=", 1)
    user, name = tokenid.split("!")
    return ProxmoxAPI(
        info["host"],
        port=info["port"],
        user=user,
        token_name=name,
        token_value=secret,
        verify_ssl=info["ca_file"],
        timeout=60,
    )
