"""Cluster placement end to end: the proxmox backend on a PVE API test server with three nodes, each
node's CTs real LXC containers of an engine of its own (own container prefix), reached over SSH,
with the runtime's least-privilege token (the proxmox_access role's lists).

One module-scoped cluster and a handful of sandboxes (about 10 s here): spread over the nodes, the
per-call override, a node going offline mid-run (skipped by create; list, attach and gc keep
working on the others) and a node answering 595 inside one create. Cleans up everything it made
(sandboxes, containers, markers), also when a check fails."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox_rt
from pve_testserver import LxcEngine, PVETestServer
from sandbox_rt import Manager, Settings
from sandbox_rt.errors import BackendError
from tests.integration.provision_helpers import destroy_labelled
from tests.pve_env import pve_cluster_test_server

pytestmark = [pytest.mark.slow, pytest.mark.root]

NODES = ("pve1", "pve2", "pve3")
UNREACHABLE = "Errors during connection establishment, proxy handler: No route to host"
LABEL = {"suite": "pve-cluster"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Manager, PVETestServer]]:
    base = Settings.load()
    if not (base.lxc_path / base.template / "config").is_file() or not base.ssh_key.is_file():
        pytest.fail("this host is not prepared: run site.yml (template, runtime key)", pytrace=False)
    with (
        tempfile.TemporaryDirectory(prefix="sandbox-rt-pvc-") as state_dir,
        pve_cluster_test_server(base, Path(state_dir), NODES) as (settings, srv),
    ):
        mgr = Manager(settings, ssh_key=base.ssh_key)
        try:
            yield mgr, srv
        finally:
            srv.faults.clear()
            destroy_labelled(mgr, LABEL)
            for candidate in mgr.gc():  # stranded CTs, if a check failed midway
                print("gc:", candidate)


def node_of(srv: PVETestServer, sandbox_id: str) -> str:
    with srv.state.lock:
        hits = [
            ct["node"] for ct in srv.state.cts.values() if sandbox_id in str(ct["config"].get("tags", ""))
        ]
    assert len(hits) == 1, hits
    return str(hits[0])


def container_of(srv: PVETestServer, sandbox_id: str) -> Path:
    """The LXC container behind a sandbox: its node's engine's, under that engine's prefix."""
    with srv.state.lock:
        vmid = next(
            int(k) for k, ct in srv.state.cts.items() if sandbox_id in str(ct["config"].get("tags", ""))
        )
    engine = srv.core.engine_for(node_of(srv, sandbox_id))
    assert isinstance(engine, LxcEngine)
    return engine.lxc_path / engine.ct_name(vmid)


def containers(srv: PVETestServer) -> set[str]:
    out: set[str] = set()
    for name in NODES:
        engine = srv.core.engine_for(name)
        assert isinstance(engine, LxcEngine)
        out |= {p.name for p in engine.lxc_path.glob(f"{engine.prefix}*")}
    return out


def test_spread_override_offline_node_and_595_with_the_least_privilege_token(
    cluster: tuple[Manager, PVETestServer],
) -> None:
    mgr, srv = cluster
    templates = containers(srv)  # the three template CTs' containers
    made: list[sandbox_rt.Sandbox] = []
    try:
        # spread: the first three go one to each node (each running CT takes memory from its node)
        for _ in NODES:
            made.append(mgr.create(labels=LABEL, ttl_s=600))
        assert sorted(node_of(srv, sb.id) for sb in made) == list(NODES)
        for sb in made:
            node = node_of(srv, sb.id)
            assert container_of(srv, sb.id).is_dir()
            assert container_of(srv, sb.id).name.startswith(srv.core.engine_for(node).prefix)  # type: ignore[attr-defined]
            assert sb.exec(f"echo {node}").text.strip() == node  # a real container, over SSH

        # per-call override
        pinned = mgr.create(labels=LABEL, ttl_s=600, node="pve2")
        made.append(pinned)
        assert node_of(srv, pinned.id) == "pve2" and pinned.exec("true").exit_code == 0

        # pve2 goes offline mid-run: creates skip it; list, attach and gc work on the others
        on_pve2 = {sb.id for sb in made if node_of(srv, sb.id) == "pve2"}
        srv.faults.set_node_offline("pve2")
        away = mgr.create(labels=LABEL, ttl_s=600)
        made.append(away)
        assert node_of(srv, away.id) in ("pve1", "pve3")
        listed = {r.id for r in mgr.list(labels=LABEL)}
        assert listed == {sb.id for sb in made} - on_pve2
        for sid in listed:
            assert mgr.attach(sid).exec("true").exit_code == 0
        with pytest.raises(BackendError, match="595"):
            mgr.attach(next(iter(on_pve2)))
        assert mgr.gc() == []  # nothing expired; the offline node's sandboxes stop nothing
        with pytest.raises(BackendError, match="'pve2' is offline"):
            mgr.create(labels=LABEL, node="pve2")
        srv.faults.set_node_offline("pve2", False)
        assert {r.id for r in mgr.list(labels=LABEL)} == {sb.id for sb in made}

        # the best node answers 595 when asked to start: the same create goes to another node
        best = "pve1" if node_of(srv, away.id) == "pve3" else "pve3"  # the one with fewer sandboxes
        srv.faults.http_error(595, UNREACHABLE, method="POST", path=rf"^/nodes/{best}/lxc/\d+/status/start$")
        moved = mgr.create(labels=LABEL, ttl_s=600)
        made.append(moved)
        assert node_of(srv, moved.id) != best and moved.exec("true").exit_code == 0
        assert srv.requests_served("POST", rf"/nodes/{best}/lxc/\d+/status/start$", "^595") == 1
    finally:
        srv.faults.clear()
        for sb in made:
            with contextlib.suppress(sandbox_rt.SandboxError):
                sb.destroy()
    assert containers(srv) == templates  # every sandbox's container is gone, on every node
    assert mgr.list(labels=LABEL) == []
