"""The old import paths of the MCP server, kept for code written against them:
``sandbox_rt.api.mcp`` is :mod:`sandbox_rt.mcp.server` now (``SandboxMcp``, ``McpOptions``) and
``sandbox_rt.api.mcp_transport`` is :mod:`sandbox_rt.mcp.transport` (``serve_stdio``, ``serve_http``):
both names lead to the new modules themselves. Nothing in the package imports this one."""

import sys
import warnings

from ..mcp import server as mcp
from ..mcp import transport as mcp_transport

__all__ = ["mcp", "mcp_transport"]

sys.modules[f"{__name__}.mcp"] = mcp
sys.modules[f"{__name__}.mcp_transport"] = mcp_transport

warnings.warn(
    "sandbox_rt.api.mcp and sandbox_rt.api.mcp_transport are sandbox_rt.mcp.server and "
    "sandbox_rt.mcp.transport now: import them from there",
    DeprecationWarning,
    stacklevel=2,
)
