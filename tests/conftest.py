"""Session fixtures shared by several test packages."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.pve_node.provisioning import ProvisionedNode, provisioned_node, reused_node


@pytest.fixture(scope="session")
def emulated_pve() -> Iterator[ProvisionedNode]:
    """The emulated PVE node (tests/pve_node, index 0) provisioned by ``site.yml``, shared by the
    hardening catalogue's PVE site and tests/integration/test_pve_emulated.py; removed, with all
    it made, when the session ends.

    ``SANDBOX_RT_PVE_NODE_REUSE=1`` (development): use the node ``SANDBOX_RT_PVE_NODE_INDEX`` names
    as it is (``python -m tests.pve_node provision`` made it) and leave it running."""
    if os.geteuid() != 0:
        pytest.fail("the emulated PVE node is a privileged container: run as root", pytrace=False)
    if os.environ.get("SANDBOX_RT_PVE_NODE_REUSE") == "1":
        yield reused_node()
        return
    with provisioned_node(0) as provisioned:
        yield provisioned
