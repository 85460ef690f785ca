"""Fixtures of the agent-work tests: the hardening suite's sites, sandboxes and simulated internet
(tests/hardening/conftest.py), imported as they are. These tests are not hardening controls (the
catalogue holds one test per control), but they need the same real sandboxes on both sites and the
same wan namespace; package scope gives this package its own test network, removed when it is done.
"""

from __future__ import annotations

import pytest

from tests.hardening.conftest import (  # noqa: F401 (fixtures are found by name)
    _node_net_session,
    _testnet_session,
    net,
    settings,
    site,
    site_manager,
    site_net,
    workdir,
)
from tests.hardening.conftest import site_make as site_make


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/agent" in str(item.path):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.root)
