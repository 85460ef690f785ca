"""Fixtures of the hardening suite: the runtime, real sandboxes, testinfra hosts and the test network.

Everything here is slow (real containers, the network role re-applied) and needs root on a host
prepared by site.yml. Sandboxes carry this session's label and are destroyed at the end of their
test, also on failure; whatever survives is swept when the package is done. The test network is
built once, only if a test asks for it, and always removed (the network role restored) as soon as the
last test of this package has run (package scope: the rest of the suite never sees the test uplink).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from testinfra.host import Host

import sandbox_rt
from sandbox_rt import Manager, Settings
from sandbox_rt.network import NftInternetSet
from tests.integration.runtime.pve_env import pve_test_server

from . import hosts
from .checks import Target
from .controls import Waiver, load_waivers
from .testnet import SimNet, reapply_uplink, simulated_network

SESSION_LABEL = {"test-session": "hardening-" + uuid.uuid4().hex[:10]}
Factory = Callable[..., Target]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/hardening" in str(item.path):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.root)


@pytest.fixture(scope="package")
def settings() -> Settings:
    if os.geteuid() != 0:
        pytest.fail("the hardening suite starts containers and changes the host network: run it as root")
    s = Settings.load()
    if s.backend != "lxc" or not (s.lxc_path / s.template / "config").is_file() or not s.ssh_key.is_file():
        pytest.fail(
            "this host is not prepared: run `ansible-playbook -i inventories/local site.yml` "
            f"(backend {s.backend}, template {s.lxc_path / s.template}, key {s.ssh_key})",
            pytrace=False,
        )
    return s


@pytest.fixture(scope="package")
def manager(settings: Settings) -> Iterator[Manager]:
    mgr = Manager(settings)
    yield mgr
    for record in mgr.list(labels=SESSION_LABEL):
        with contextlib.suppress(sandbox_rt.SandboxError):
            mgr.destroy(record.id)


@pytest.fixture(scope="package")
def nft(settings: Settings) -> NftInternetSet:
    return NftInternetSet(settings.nft_family, settings.nft_table, settings.nft_internet_set)


@pytest.fixture(scope="package")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hardening")


@pytest.fixture(scope="package")
def template_rootfs(settings: Settings) -> Path:
    return settings.lxc_path / settings.template / "rootfs"


@pytest.fixture(scope="package")
def local() -> Host:
    return hosts.local_host()


@pytest.fixture(scope="package")
def waivers() -> dict[str, Waiver]:
    return load_waivers()


def _target(sb: sandbox_rt.Sandbox, settings: Settings, workdir: Path) -> Target:
    user = hosts.sandbox_host(sb, settings, workdir)
    known_hosts = hosts.known_hosts_path(workdir, sb)  # pinned by sandbox_host
    container = hosts.container_of(sb, settings.lxc_path)
    root = hosts.sandbox_root_host(sb, settings, container)
    return Target(sb, user, root, known_hosts, settings, container)


@contextlib.contextmanager
def _factory(manager: Manager, settings: Settings, workdir: Path) -> Iterator[Factory]:
    made: list[Target] = []

    def make(**kwargs: object) -> Target:
        kwargs.setdefault("memory_mb", 256)
        labels = {**SESSION_LABEL, **dict(kwargs.pop("labels", None) or {})}  # type: ignore[call-overload]
        sb = manager.create(labels=labels, **kwargs)  # type: ignore[arg-type]
        made.append(t := _target(sb, settings, workdir))
        return t

    try:
        yield make
    finally:
        for t in made:
            with contextlib.suppress(sandbox_rt.SandboxError):
                t.sb.destroy()


@pytest.fixture
def make(manager: Manager, settings: Settings, workdir: Path) -> Iterator[Factory]:
    """``make(**create_kwargs)`` -> a Target destroyed at the end of the test, also on failure."""
    with _factory(manager, settings, workdir) as factory:
        yield factory


@pytest.fixture(scope="package")
def baseline(manager: Manager, settings: Settings, workdir: Path) -> Iterator[Target]:
    """One default sandbox (no internet) shared by the read-only state checks."""
    with _factory(manager, settings, workdir) as factory:
        yield factory(memory_mb=512)


@pytest.fixture(scope="package")
def pve_manager(settings: Settings) -> Iterator[Manager]:
    """The runtime on its Proxmox backend, against the PVE API test server backed by this host's LXC
    (its CTs are clones of the same template, so they carry the same LXC config and profile)."""
    with (
        tempfile.TemporaryDirectory(prefix="sandbox-rt-pve-") as state_dir,
        pve_test_server(settings, Path(state_dir)) as (pve_settings, _server),
    ):
        mgr = Manager(pve_settings, ssh_key=settings.ssh_key)
        try:
            yield mgr
        finally:
            for record in mgr.list(labels=SESSION_LABEL):
                with contextlib.suppress(sandbox_rt.SandboxError):
                    mgr.destroy(record.id)


@pytest.fixture(scope="package", params=["lxc", "proxmox"])
def kernel_target(request: pytest.FixtureRequest, settings: Settings, workdir: Path) -> Iterator[Target]:
    """One sandbox per backend (embedded LXC, PVE-backed through the test server), shared by the
    kernel-surface controls: their probes change nothing in it."""
    mgr: Manager = request.getfixturevalue("manager" if request.param == "lxc" else "pve_manager")
    with _factory(mgr, settings, workdir) as factory:
        yield factory(memory_mb=512)


@pytest.fixture(scope="package")
def _testnet_session(settings: Settings) -> Iterator[SimNet]:
    with simulated_network(SimNet(bridge=settings.bridge, gateway=settings.gateway)) as net:
        yield net


@pytest.fixture
def net(_testnet_session: SimNet) -> SimNet:
    """The simulated internet and LAN; re-applies the uplink if someone re-ran the role meanwhile."""
    if not _testnet_session.uplink_rule_loaded():
        reapply_uplink(_testnet_session)
    return _testnet_session
