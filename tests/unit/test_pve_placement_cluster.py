"""Cluster placement of the proxmox backend against the PVE API test server with three nodes, each
running its CTs in its own (memory) engine: spread, overrides, a node going away mid-run, list and
gc across nodes. The same with real LXC engines: tests/integration/test_pve_cluster.py."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pve_testserver import MemoryEngine, PVETestServer
from sandbox_rt import Settings
from sandbox_rt.backends.proxmox import ProxmoxBackend
from sandbox_rt.cli import _parser
from sandbox_rt.errors import BackendError, ConfigError
from sandbox_rt.manager import Manager, new_sandbox_id
from sandbox_rt.models import SandboxRecord, SandboxSpec
from tests import pve_env as env
from tests.unit.pve_fixtures import POOL, add_template, pve_settings

NODES = ("pve1", "pve2", "pve3")
COPIES = {"pve1": 9000, "pve2": 9100, "pve3": 9200}  # the default template, one copy per node
NODE_TEMPLATES = {"pve2": {"default": 9100}, "pve3": {"default": 9200}}
GIB = 1024**3
SPEC = SandboxSpec(ttl_s=3600)
UNREACHABLE = "Errors during connection establishment, proxy handler: No route to host"


@contextlib.contextmanager
def cluster() -> Iterator[PVETestServer]:
    with PVETestServer(engines={name: MemoryEngine() for name in NODES}) as srv:
        root = srv.client()
        root.pools.post(poolid=POOL)
        root.cluster.firewall.options.put(enable=1)
        for name, vmid in COPIES.items():
            add_template(root, vmid, name)
        yield srv


@pytest.fixture
def srv() -> Iterator[PVETestServer]:
    with cluster() as server:
        yield server


def backend(srv: PVETestServer, tmp_path: Path, **overrides: Any) -> ProxmoxBackend:
    values: dict[str, Any] = {"pve_node_templates": NODE_TEMPLATES, **overrides}
    return ProxmoxBackend(pve_settings(srv, tmp_path, **values))


def create(b: ProxmoxBackend, node: str | None = None, spec: SandboxSpec = SPEC) -> SandboxRecord:
    """The manager's create steps, without SSH (the memory engine runs nothing)."""
    sid = new_sandbox_id()
    b.begin(sid)
    try:
        b.clone_on(sid, spec, node) if node else b.clone(sid, spec)
        return b.start(sid)
    except BaseException:
        b.destroy(sid)
        raise
    finally:
        b.end(sid)


def node_of(srv: PVETestServer, sandbox_id: str) -> str:
    with srv.state.lock:
        hits = [
            ct["node"] for ct in srv.state.cts.values() if sandbox_id in str(ct["config"].get("tags", ""))
        ]
    assert len(hits) == 1, hits
    return str(hits[0])


def cts_on(srv: PVETestServer, node: str) -> list[int]:
    """The CTs on ``node`` besides its template."""
    with srv.state.lock:
        return sorted(
            int(k) for k, ct in srv.state.cts.items() if ct["node"] == node and int(k) not in COPIES.values()
        )


def test_sandboxes_spread_over_the_nodes_most_free_memory_first(srv: PVETestServer, tmp_path: Path) -> None:
    srv.core.node_memory["pve3"] = (1 * GIB, 16 * GIB)  # pve3 has the most free memory
    b = backend(srv, tmp_path)
    first = create(b)
    assert node_of(srv, first.id) == "pve3"
    srv.core.node_memory.clear()  # all alike again, but for the memory of pve3's running CT
    records = [first, *(create(b) for _ in range(5))]
    spread = sorted(node_of(srv, r.id) for r in records)
    # each running CT takes its memory from its node: the next one goes where most is free
    assert spread == ["pve1", "pve1", "pve2", "pve2", "pve3", "pve3"], spread
    # list, get (attach's lookup) and destroy find each sandbox on its own node
    assert sorted(r.id for r in b.list()) == sorted(r.id for r in records)
    for r in records:
        assert b.get(r.id).ip == r.ip and b.state(r.id) == "running"
        assert b.destroy(r.id)
    assert all(cts_on(srv, name) == [] for name in NODES)


def test_without_node_templates_every_sandbox_stays_on_the_templates_node(
    srv: PVETestServer, tmp_path: Path
) -> None:
    """The host contract of one template (before clusters): linked clones live on its node."""
    b = backend(srv, tmp_path, pve_node_templates={})
    srv.core.node_memory["pve3"] = (1 * GIB, 16 * GIB)
    assert {node_of(srv, create(b).id) for _ in range(3)} == {"pve1"}


def test_node_override_per_call_and_per_host_contract(srv: PVETestServer, tmp_path: Path) -> None:
    srv.core.node_memory["pve3"] = (1 * GIB, 16 * GIB)  # the policy would pick pve3
    b = backend(srv, tmp_path)
    assert node_of(srv, create(b, node="pve1").id) == "pve1"
    pinned = backend(srv, tmp_path, pve_node="pve2")
    assert {node_of(srv, create(pinned).id) for _ in range(2)} == {"pve2"}
    assert node_of(srv, create(pinned, node="pve1").id) == "pve1"  # the call's wins


def test_node_override_errors_make_nothing(srv: PVETestServer, tmp_path: Path) -> None:
    b = backend(srv, tmp_path, pve_node_templates={"pve2": {"default": 9100}})
    with pytest.raises(ConfigError, match="not a node of this cluster"):
        create(b, node="pve9")
    with pytest.raises(ConfigError, match="'pve3' has no copy of template 'default'"):
        create(b, node="pve3")
    srv.faults.set_node_offline("pve2")
    with pytest.raises(BackendError, match="'pve2' is offline"):
        create(b, node="pve2")
    assert all(cts_on(srv, name) == [] for name in NODES)
    assert not list((tmp_path / "proxmox" / "creating").glob("*.json"))


def test_cli_takes_node_and_the_lxc_backend_refuses_it(tmp_path: Path) -> None:
    assert _parser().parse_args(["run", "--node", "pve2", "--", "true"]).node == "pve2"
    assert _parser().parse_args(["create"]).node is None
    lxc = Manager(Settings(state_dir=tmp_path), ssh_key=tmp_path / "no-key")
    with pytest.raises(ConfigError, match="runs on one host"):
        lxc.create(node="pve1")
    with pytest.raises(ConfigError, match="node= and from_snapshot="):
        lxc.create(node="pve1", from_snapshot="snap")


def test_an_offline_node_is_skipped_and_list_and_gc_work_across_the_others(
    srv: PVETestServer, tmp_path: Path
) -> None:
    b = backend(srv, tmp_path)
    before = {name: create(b, node=name) for name in NODES}
    srv.faults.set_node_offline("pve2")
    later = [create(b) for _ in range(4)]
    assert {node_of(srv, r.id) for r in later} == {"pve1", "pve3"}
    # the sandbox on the offline node cannot be read now; every other one is listed
    assert {r.id for r in b.list()} == {r.id for r in later} | {before["pve1"].id, before["pve3"].id}
    # gc (all expired, an hour from now) removes what it can reach and leaves pve2's for later
    far = before["pve1"].created_at + 7200
    candidates = {c.sandbox_id for c in b.gc_candidates(now=far, dead_owners=False)}
    assert before["pve2"].id not in candidates and before["pve1"].id in candidates
    for sid in candidates:
        assert b.destroy(sid)
    assert cts_on(srv, "pve1") == [] and cts_on(srv, "pve3") == [] and len(cts_on(srv, "pve2")) == 1
    srv.faults.set_node_offline("pve2", False)
    assert [c.sandbox_id for c in b.gc_candidates(now=far, dead_owners=False)] == [before["pve2"].id]
    assert b.destroy(before["pve2"].id) and cts_on(srv, "pve2") == []


def test_a_node_answering_595_at_start_is_left_for_the_next_within_the_call(
    srv: PVETestServer, tmp_path: Path
) -> None:
    srv.core.node_memory["pve3"] = (1 * GIB, 16 * GIB)
    b = backend(srv, tmp_path)
    srv.faults.http_error(595, UNREACHABLE, method="POST", path=r"^/nodes/pve3/lxc/\d+/status/start$")
    record = create(b)
    assert node_of(srv, record.id) in ("pve1", "pve2") and b.state(record.id) == "running"
    assert cts_on(srv, "pve3") == []  # the clone made there was removed (pve3 answered that)
    assert srv.requests_served("POST", r"^/api2/json/nodes/pve3/lxc/\d+/status/start$", "^595") == 1


def test_a_node_lost_mid_clone_strands_its_ct_until_gc_finds_the_node_back(
    srv: PVETestServer, tmp_path: Path
) -> None:
    srv.core.node_memory["pve3"] = (1 * GIB, 16 * GIB)
    b = backend(srv, tmp_path)
    # pve3 accepts the clone, then PVE cannot reach it: its task status and the cleanup answer 595
    srv.faults.http_error(595, UNREACHABLE, path=r"^/nodes/pve3/(tasks|lxc/\d+$)", count=None)
    record = create(b)
    assert node_of(srv, record.id) != "pve3"
    stranded = cts_on(srv, "pve3")
    assert len(stranded) == 1  # the CT its clone task made on pve3 is still there
    assert b.get(record.id).ip == record.ip  # the sandbox is the one that was made, not the stray
    srv.faults.clear()
    candidates = [c.sandbox_id for c in b.gc_candidates(now=record.created_at, dead_owners=False)]
    assert candidates == [f"{record.id}@{stranded[0]}"]
    assert b.destroy(candidates[0])
    assert cts_on(srv, "pve3") == [] and b.state(record.id) == "running"
    assert b.gc_candidates(now=record.created_at, dead_owners=False) == []


def test_a_node_pinned_create_does_not_move_to_another_node(srv: PVETestServer, tmp_path: Path) -> None:
    b = backend(srv, tmp_path)
    srv.faults.http_error(595, UNREACHABLE, method="POST", path=r"^/nodes/pve2/lxc/\d+/clone$")
    with pytest.raises(BackendError, match="595"):
        create(b, node="pve2")
    assert all(cts_on(srv, name) == [] for name in NODES)


def test_settings_validate_node_templates() -> None:
    base = dataclasses.asdict(Settings())
    base.update(
        backend="proxmox",
        pve_url="https://pve.example:8006",
        pve_token_id="u@pve!t",
        pve_token_secret="s",
        pve_template_vmid=9000,
    )
    for bad, message in (
        ({"pve 2": {"default": 9100}}, "not a PVE node name"),
        ({"pve2": {"base": 9100}}, "no such template"),
        ({"pve2": {"default": 99}}, "not a VMID"),
        ({"pve2": {"default": 9000}}, "used twice"),
        ({"pve2": [9100]}, "must map names to VMIDs"),
    ):
        with pytest.raises(ConfigError, match=message):
            Settings(**{**base, "pve_node_templates": bad})
    env = {
        "SANDBOX_RT_CONFIG": "/nonexistent",
        "SANDBOX_RT_PVE_NODE_TEMPLATES": '{"pve2": {"default": "9100"}}',
    }
    assert Settings.load(env=env).pve_node_templates == {"pve2": {"default": 9100}}


def test_the_least_privilege_token_places_and_node_audit_adds_the_memory_ranking(
    srv: PVETestServer, tmp_path: Path
) -> None:
    """The proxmox_access role's token (its privilege lists, ACLs on the pool, storage, bridge, the
    template copies and "/"): every placement call works; PVE shows it no node memory, so the nodes
    are ranked by fewest sandboxes. Sys.Audit on /nodes (proxmox_access_node_audit) adds memory."""
    root = srv.client()
    root.access.users.post(userid=env.USER)
    token = root.access.users(env.USER).token(env.TOKEN).post(privsep=1)
    tokenid = f"{env.USER}!{env.TOKEN}"
    env.grant_runtime_access(
        root, env.USER, tokenid, "vmbr1", env.PRIVILEGES, template_vmids=tuple(COPIES.values())
    )
    srv.core.node_memory["pve3"] = (1 * GIB, 16 * GIB)  # the most free memory, by far
    settings = pve_settings(
        srv,
        tmp_path,
        pve_token_id=tokenid,
        pve_token_secret=str(token["value"]),
        pve_node_templates=NODE_TEMPLATES,
    )
    b = ProxmoxBackend(settings)
    spread = [node_of(srv, create(b).id) for _ in NODES]
    assert spread == ["pve1", "pve2", "pve3"]  # fewest sandboxes, then name: memory is not seen
    assert node_of(srv, create(b, node="pve2").id) == "pve2"
    for grantee in ({"users": env.USER}, {"tokens": tokenid}):
        root.access.acl.put(path="/nodes", roles=env.AUDIT_ROLE, propagate=1, **grantee)
    assert [node_of(srv, create(b).id) for _ in range(2)] == ["pve3", "pve3"]  # now it is
    for record in b.list():
        assert b.destroy(record.id)
