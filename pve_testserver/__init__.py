"""A schema-checking Proxmox VE API test server (see docs/pve-test-server.md).

Real PVE cannot run on our machines; this package answers the PVE API the way PVE answers it:
every request is validated against the official API schema, authenticated with API tokens,
checked against ACLs, and served by an engine that either keeps records (``memory``) or makes
real LXC containers from the host template (``lxc``). A cluster (``PVETestServer(engines=...)``)
gives each node an engine of its own; ``Faults.set_node_offline`` takes one away (595), and
``server.core.node_memory`` sets what a node reports as used and total memory.
"""

from __future__ import annotations

from .engine import Engine, EngineError
from .engine_lxc import LxcEngine
from .engine_memory import MemoryEngine
from .errors import PVEError
from .faults import Faults
from .hostkey import HOSTKEY_PREFIX, hostkey_of
from .schema import Method, Schema
from .server import PVETestServer

__all__ = [
    "HOSTKEY_PREFIX",
    "Engine",
    "EngineError",
    "Faults",
    "LxcEngine",
    "MemoryEngine",
    "Method",
    "PVEError",
    "PVETestServer",
    "Schema",
    "hostkey_of",
]
