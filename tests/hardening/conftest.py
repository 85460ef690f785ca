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
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from testinfra.host import Host

import sandbox_rt
from sandbox_rt import Manager, Settings
from sandbox_rt.network import NftInternetSet

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
    return Target(sb, user, hosts.sandbox_root_host(sb, settings), known_hosts, settings)


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
def _testnet_session(settings: Settings) -> Iterator[SimNet]:
    with simulated_network(SimNet(bridge=settings.bridge, gateway=settings.gateway)) as net:
        yield net


@pytest.fixture
def net(_testnet_session: SimNet) -> SimNet:
    """The simulated internet and LAN; re-applies the uplink if someone re-ran the role meanwhile."""
    if not _testnet_session.uplink_rule_loaded():
        reapply_uplink(_testnet_session)
    return _testnet_session
