"""Fixtures for the runtime against real containers on a host prepared by site.yml.

``manager`` is parametrised over both backends: ``lxc`` (the embedded default) and ``proxmox``
(the PVE API test server backed by real LXC, or a real PVE when SANDBOX_RT_PVE_URL is set).
Tests that are about one engine's own mechanics use ``lxc_manager``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import sandbox_rt
from pve_testserver import PVETestServer
from sandbox_rt import Manager, Settings
from tests.integration.provision_helpers import destroy_labelled
from tests.pve_env import pve_test_server, real_pve_settings

SESSION_LABEL = {"test-session": uuid.uuid4().hex[:12]}
Factory = Callable[..., sandbox_rt.Sandbox]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration/runtime" in str(item.path):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def settings() -> Settings:
    s = Settings.load()
    if not (s.lxc_path / s.template / "config").is_file() or not s.ssh_key.is_file():
        pytest.fail(
            "this host is not prepared: run `ansible-playbook -i inventories/local site.yml` "
            f"(template {s.lxc_path / s.template}, key {s.ssh_key})",
            pytrace=False,
        )
    return s


def settings_environ(settings: Settings) -> dict[str, str]:
    """These settings as SANDBOX_RT_* variables (what Manager.from_env() reads in another process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_RT_")}
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        as_json = isinstance(value, dict | list)
        env[f"SANDBOX_RT_{field.name.upper()}"] = json.dumps(value) if as_json else str(value)
    return env


def _sweep(mgr: Manager) -> None:
    """Whatever a failed test left behind goes, found by this session's label."""
    destroy_labelled(mgr, SESSION_LABEL)


@pytest.fixture(scope="session")
def lxc_manager(settings: Settings) -> Iterator[Manager]:
    mgr = Manager(settings)
    yield mgr
    _sweep(mgr)


@pytest.fixture(scope="session")
def pve_env(settings: Settings) -> Iterator[tuple[Settings, PVETestServer | None]]:
    """(settings for the proxmox backend, the test server or None for a real PVE)."""
    with tempfile.TemporaryDirectory(prefix="sandbox-rt-pve-") as state_dir:
        real = real_pve_settings(settings)
        if real is not None:
            yield real, None
            return
        with pve_test_server(settings, Path(state_dir)) as env:
            yield env


@pytest.fixture
def srv(pve_env: tuple[Settings, PVETestServer | None]) -> Iterator[PVETestServer]:
    """The PVE API test server behind ``pve_manager``, its fault switches cleared afterwards."""
    server = pve_env[1]
    if server is None:  # pointed at a real PVE: faults cannot be injected there
        pytest.skip("fault injection needs the PVE API test server")
    yield server
    server.faults.clear()


@pytest.fixture(scope="session")
def pve_manager(settings: Settings, pve_env: tuple[Settings, PVETestServer | None]) -> Iterator[Manager]:
    mgr = Manager(pve_env[0], ssh_key=settings.ssh_key)
    yield mgr
    _sweep(mgr)


@pytest.fixture(scope="session", params=["lxc", "proxmox"])
def manager(request: pytest.FixtureRequest) -> Manager:
    name = "lxc_manager" if request.param == "lxc" else "pve_manager"
    mgr: Manager = request.getfixturevalue(name)
    return mgr


def _factory(mgr: Manager) -> Iterator[Factory]:
    made: list[sandbox_rt.Sandbox] = []

    def factory(**kwargs: object) -> sandbox_rt.Sandbox:
        labels = {**SESSION_LABEL, **dict(kwargs.pop("labels", None) or {})}  # type: ignore[call-overload]
        sb = mgr.create(labels=labels, **kwargs)  # type: ignore[arg-type]
        made.append(sb)
        return sb

    yield factory
    for sb in made:
        with contextlib.suppress(sandbox_rt.SandboxError):
            sb.destroy()


@pytest.fixture
def make(manager: Manager) -> Iterator[Factory]:
    """``make(**create_kwargs)`` → a sandbox destroyed at the end of the test, also on failure."""
    yield from _factory(manager)


@pytest.fixture
def make_lxc(lxc_manager: Manager) -> Iterator[Factory]:
    yield from _factory(lxc_manager)


@pytest.fixture
def sandbox(make: Factory) -> sandbox_rt.Sandbox:
    return make(memory_mb=512)
