"""Fixtures of the hardening suite: the runtime, real sandboxes, testinfra hosts and the test network.

Everything here is slow (real containers, the network role re-applied) and needs root on a host
prepared by site.yml. Sandboxes carry this session's label and are destroyed at the end of their
test, also on failure; whatever survives is swept when the package is done. The test network is
built once, only if a test asks for it, and always removed (the network role restored) as soon as the
last test of this package has run (package scope: the rest of the suite never sees the test uplink).

The catalogue's control tests run on every *site* (``sites.py``): the embedded default (``lxc``) and
PVE-backed sandboxes on the emulated PVE node (``pve-node``, the session's node of tests/conftest.py).
They take ``site_baseline``/``site_make``/``kernel_target``/``site_host``/``site_settings``;
``SANDBOX_RT_HARDENING_SITES=lxc`` (or ``pve-node``) runs one site only. The plain
``baseline``/``make``/``settings``/``local`` fixtures are the embedded default's (the proofs use them).
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
from sandbox_rt.backends.lxc.nft import NftInternetSet
from tests.integration.provision_helpers import destroy_labelled
from tests.pve_node.provisioning import ProvisionedNode, admin_api

from . import hosts, sites
from .checks import Target
from .controls import Waiver, load_waivers
from .sites import Site
from .testnet import SimNet, reapply_uplink, simulated_network
from .testnet_pve import NodeSimNet, PveInternetGate, node_network
from .variants import template_variant, without_caps

SESSION_LABEL = {"test-session": "hardening-" + uuid.uuid4().hex[:10]}
Factory = Callable[..., Target]
# The sites the control tests run on (all by default; SANDBOX_RT_HARDENING_SITES=lxc for one).
SITES = [s for s in os.environ.get("SANDBOX_RT_HARDENING_SITES", ",".join(sites.ALL)).split(",") if s]
assert set(SITES) <= set(sites.ALL), f"SANDBOX_RT_HARDENING_SITES: unknown site in {SITES}"


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
    destroy_labelled(mgr, SESSION_LABEL)


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


@pytest.fixture(scope="package")
def pve_waivers() -> dict[str, Waiver]:
    """Waivers of PVE-backed sandboxes (the pve-node site) only."""
    return load_waivers(section="pve_waivers")


def _target(
    sb: sandbox_rt.Sandbox,
    settings: Settings,
    workdir: Path,
    site: Site | None = None,
    mgr: Manager | None = None,
) -> Target:
    if site is not None and site.is_pve and mgr is not None:  # a CT nested in the emulated node
        user = hosts.sandbox_host(sb, site.settings, workdir)
        container = hosts.pve_vmid(mgr, sb.id)
        root = hosts.site_root_host(site, container)
        return Target(sb, user, root, hosts.known_hosts_path(workdir, sb), site.settings, container, site)
    user = hosts.sandbox_host(sb, settings, workdir)
    known_hosts = hosts.known_hosts_path(workdir, sb)  # pinned by sandbox_host
    container = hosts.container_of(sb, settings.lxc_path)
    root = hosts.sandbox_root_host(sb, settings, container)
    return Target(sb, user, root, known_hosts, settings, container, site)


@contextlib.contextmanager
def _factory(
    manager: Manager, settings: Settings, workdir: Path, site: Site | None = None
) -> Iterator[Factory]:
    made: list[Target] = []

    def make(**kwargs: object) -> Target:
        kwargs.setdefault("memory_mb", 256)
        labels = {**SESSION_LABEL, **dict(kwargs.pop("labels", None) or {})}  # type: ignore[call-overload]
        sb = manager.create(labels=labels, **kwargs)  # type: ignore[arg-type]
        made.append(t := _target(sb, settings, workdir, site, manager))
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


# -- the sites: every control test runs on each (sites.py) -----------------------------------------
def _node_site(provisioned: ProvisionedNode) -> Site:
    """PVE-backed sandboxes on the emulated node, as the runtime makes them from the host contract
    site.yml wrote for the node."""
    run = provisioned.first_run
    assert run.returncode == 0 and run.total("failed") == 0, f"site.yml on the emulated node:\n{run.tail(60)}"
    node = provisioned.node
    pve_settings = Settings.load(provisioned.host_json, env={})
    assert pve_settings.backend == "proxmox", pve_settings
    root = node.spec.rootfs
    prefix = ("lxc-attach", "-P", str(node.spec.lxc_path), "-n", node.spec.name, "--clear-env", "--")
    return Site(
        sites.PVE_NODE,
        pve_settings,
        root / "var/lib/lxc",
        "/var/lib/lxc",
        prefix,
        f"lxc.payload.{node.spec.name}/",
        Host(hosts.LxcAttachBackend(node.spec.name, node.spec.lxc_path)),
        root / "var/lib/lxc" / str(pve_settings.pve_template_vmid) / "rootfs",
        root,
        admin_api(node),
        provisioned.host_json,
    )


@pytest.fixture(scope="package", params=SITES)
def site(request: pytest.FixtureRequest) -> Site:
    """Where the control tests' sandboxes run (each test runs once per site)."""
    if request.param == sites.LXC:
        return sites.local_site(request.getfixturevalue("settings"))
    return _node_site(request.getfixturevalue("emulated_pve"))


@pytest.fixture(scope="package")
def site_manager(site: Site) -> Iterator[Manager]:
    mgr = Manager(site.settings)
    yield mgr
    destroy_labelled(mgr, SESSION_LABEL)


@pytest.fixture(scope="package")
def site_settings(site: Site) -> Settings:
    return site.settings


@pytest.fixture(scope="package")
def site_host(site: Site) -> Host:
    """The machine that runs the site's sandboxes (this one, or the emulated node)."""
    return site.host


@pytest.fixture(scope="package")
def site_rootfs(site: Site) -> Path:
    """This machine's path of the site's template root filesystem."""
    return site.template_rootfs


@pytest.fixture
def site_make(site: Site, site_manager: Manager, workdir: Path) -> Iterator[Factory]:
    """``site_make(**create_kwargs)`` -> a Target on the site, destroyed at the end of the test."""
    with _factory(site_manager, site.settings, workdir, site) as factory:
        yield factory


@pytest.fixture(scope="package")
def site_baseline(site: Site, site_manager: Manager, workdir: Path) -> Iterator[Target]:
    """One default sandbox (no internet) per site, shared by the read-only state checks."""
    with _factory(site_manager, site.settings, workdir, site) as factory:
        yield factory(memory_mb=512)


@pytest.fixture(scope="package")
def kernel_target(site: Site, site_baseline: Target) -> Target:
    """The site's shared sandbox for the kernel-surface controls: their probes change nothing in it."""
    return site_baseline


@pytest.fixture(scope="package")
def make_with_net_caps(settings: Settings, workdir: Path) -> Iterator[Factory]:
    """Throw-away sandboxes whose container root keeps net_admin and net_raw, granted on purpose
    (a copy of the template's config; the real template is never changed): what a root sandbox
    could hold at most, to show that the port binding (SBX-NET-19) holds by itself."""
    with (
        template_variant(settings, without_caps(settings, ("net_admin", "net_raw"))) as variant,
        _factory(Manager(variant), settings, workdir) as make_caps,
    ):
        yield make_caps


@pytest.fixture(scope="package")
def _testnet_session(settings: Settings, request: pytest.FixtureRequest) -> Iterator[SimNet]:
    if sites.PVE_NODE in SITES:
        # The emulated node first: its site.yml builds the OS template on this machine from Debian's
        # mirror, and the test network takes 203.0.113.0/24 over, where a machine's mirror may live.
        request.getfixturevalue("emulated_pve")
    with simulated_network(SimNet(bridge=settings.bridge, gateway=settings.gateway)) as net:
        yield net


@pytest.fixture
def net(_testnet_session: SimNet) -> SimNet:
    """The simulated internet and LAN; re-applies the uplink if someone re-ran the role meanwhile."""
    if not _testnet_session.uplink_rule_loaded():
        reapply_uplink(_testnet_session)
    return _testnet_session


# -- the sites' test networks ---------------------------------------------------------------------
@pytest.fixture(scope="package")
def _node_net_session(emulated_pve: ProvisionedNode) -> Iterator[NodeSimNet]:
    with node_network(emulated_pve.node) as node_net:
        yield node_net


@pytest.fixture
def site_net(site: Site, request: pytest.FixtureRequest) -> SimNet:
    """The site's simulated internet and LAN: this machine's (``net``), or the emulated node's wan."""
    if site.is_pve:
        node_net: SimNet = request.getfixturevalue("_node_net_session")
        return node_net
    lxc_net: SimNet = request.getfixturevalue("net")
    return lxc_net


@pytest.fixture(scope="package")
def site_nft(site: Site, site_manager: Manager) -> NftInternetSet | PveInternetGate:
    """Who holds a sandbox's internet: the nft set here, the CT's firewall rules on PVE."""
    if site.is_pve:
        return PveInternetGate(site_manager)
    s = site.settings
    return NftInternetSet(s.nft_family, s.nft_table, s.nft_internet_set)
