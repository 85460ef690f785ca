"""The import paths the documentation gave before issue 36 moved their modules still work: each names
the same objects as the new path, with a DeprecationWarning that says where they are now."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_rt import output_limits
from sandbox_rt.mcp import server as mcp_server
from sandbox_rt.mcp import transport as mcp_transport
from sandbox_rt.web import limits as web_limits
from sandbox_rt.web import server as web_server

REPO = Path(__file__).resolve().parents[2]
OLD = ("sandbox_rt.http_api", "sandbox_rt.limits", "sandbox_rt.api", "sandbox_rt.api.mcp")


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    """Each test imports the old paths afresh (so their warning is seen) and leaves none behind."""

    def forget() -> None:
        for name in (*OLD, "sandbox_rt.api.mcp_transport"):
            sys.modules.pop(name, None)

    forget()
    yield
    forget()


def test_the_http_server_of_the_old_path_is_the_new_one() -> None:
    with pytest.warns(DeprecationWarning, match="sandbox_rt.web.server"):
        from sandbox_rt.http_api import ApiServer, load_token, serve
    assert (ApiServer, load_token, serve) == (web_server.ApiServer, web_server.load_token, web_server.serve)


def test_the_limits_of_the_old_path_are_the_new_ones() -> None:
    with pytest.warns(DeprecationWarning, match="sandbox_rt.output_limits"):
        old = importlib.import_module("sandbox_rt.limits")
    assert old.HttpLimits is web_limits.HttpLimits
    assert old.HTTP_LIMITS is web_limits.HTTP_LIMITS
    for name in output_limits.__all__:
        assert getattr(old, name) == getattr(output_limits, name), name


def test_the_mcp_server_of_the_old_paths_is_the_new_one() -> None:
    with pytest.warns(DeprecationWarning, match="sandbox_rt.mcp.server"):
        from sandbox_rt.api.mcp import McpOptions, SandboxMcp
    from sandbox_rt.api.mcp_transport import serve_http, serve_stdio

    assert (McpOptions, SandboxMcp) == (mcp_server.McpOptions, mcp_server.SandboxMcp)
    assert (serve_http, serve_stdio) == (mcp_transport.serve_http, mcp_transport.serve_stdio)
    assert importlib.import_module("sandbox_rt.api.mcp") is mcp_server


def test_nothing_in_the_package_uses_an_old_path() -> None:
    """A fresh interpreter that imports every front door imports none of them."""
    doors = "sandbox_rt, sandbox_rt.cli, sandbox_rt.mcp.transport, sandbox_rt.remote, sandbox_rt.web.server"
    code = f"import sys; import {doors}; print([n for n in {OLD!r} if n in sys.modules])"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env)
    assert (run.returncode, run.stdout.strip()) == (0, "[]"), run.stderr
