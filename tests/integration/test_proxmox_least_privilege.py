"""Each privilege of the proxmox_access role's SandboxRuntime role is needed by the runtime.

For every privilege in ``proxmox_access_privileges`` (the role's defaults), a token whose role lacks
just that one privilege - set up exactly as the role sets up the runtime's token (privilege-separated,
ACLs for user and token on the pool, the storage and the bridge) - cannot run the runtime's Proxmox
lifecycle (clone, configure, resize, firewall, start, internet on, snapshot, fork, delete the
snapshot, destroy): the backend raises
``PermissionDenied`` naming the privilege, or, without ``VM.Audit``, cannot even see the template. The
same set-up with the full role runs the lifecycle to the end. The memory engine suffices: these are
API calls; nothing waits for SSH, so the backend's steps are called directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException
from proxmoxer.tools import Tasks

from pve_testserver import MemoryEngine, PVETestServer
from sandbox_rt import BackendError, FirewallDisabled, PermissionDenied, Settings
from sandbox_rt.backends.proxmox import ProxmoxBackend
from sandbox_rt.validation import make_spec

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# the role's defaults over the shared host variables (roles/sandbox_host_vars), as the role sees them
DEFAULTS = {
    **yaml.safe_load((REPO / "roles" / "sandbox_host_vars" / "defaults" / "main.yml").read_text()),
    **yaml.safe_load((REPO / "roles" / "proxmox_access" / "defaults" / "main.yml").read_text()),
}
PRIVILEGES: list[str] = list(DEFAULTS["proxmox_access_privileges"])
TEMPLATE_PRIVILEGES: list[str] = list(DEFAULTS["proxmox_access_template_privileges"])
AUDIT_PRIVILEGES: list[str] = list(DEFAULTS["proxmox_access_audit_privileges"])
# (which role, privilege): the pool role, the template's read/clone role, the audit role on "/"
ALL_GRANTS: list[tuple[str, str]] = (
    [("pool", p) for p in PRIVILEGES]
    + [("template", p) for p in TEMPLATE_PRIVILEGES]
    + [("audit", p) for p in AUDIT_PRIVILEGES]
)
POOL = str(DEFAULTS["proxmox_access_pool"])
STORAGE = str(DEFAULTS["proxmox_access_storage"])
BRIDGE = str(DEFAULTS["proxmox_access_bridge"])
NODE = "pve"
TEMPLATE_VMID = 9000


@dataclasses.dataclass
class Env:
    srv: PVETestServer
    root: ProxmoxAPI
    base: Settings


def _wait(api: ProxmoxAPI, upid: str) -> None:
    status = Tasks.blocking_status(api, upid, timeout=30, polling_interval=0.05)
    assert status is not None and status["exitstatus"] == "OK", status


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """A memory-engine test server with the pool, a CT template outside it (as template_build leaves
    it) and the datacenter firewall on (as the node play leaves it)."""
    tmp = tmp_path_factory.mktemp("least-privilege")
    with PVETestServer(engine=MemoryEngine(), state_file=tmp / "state.json", tls_dir=tmp / "tls") as srv:
        root = srv.client()
        root.pools.post(poolid=POOL)
        root.cluster.firewall.options.put(enable=1)
        _wait(
            root,
            root.nodes(NODE).lxc.post(
                vmid=TEMPLATE_VMID,
                ostemplate="local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst",
                storage=STORAGE,
                unprivileged=1,
                swap=0,
                net0=f"name=eth0,bridge={BRIDGE},ip=dhcp",
            ),
        )
        root.nodes(NODE).lxc(TEMPLATE_VMID).template.post()
        base = Settings(
            backend="proxmox",
            bridge=BRIDGE,
            pve_url=f"https://{srv.host}:{srv.port}",
            pve_token_id="placeholder@pve!none",
            pve_token_secret="placeholder",
            pve_verify=str(srv.ca_file),
            pve_template_vmid=TEMPLATE_VMID,
            pve_pool=POOL,
            state_dir=tmp / "state",
        )
        yield Env(srv, root, base)


def _token_with(env: Env, without: tuple[str, str] | None = None) -> tuple[str, str]:
    """A user and a privsep token with the proxmox_access role's three roles and ACLs (the pool
    role on the pool, the storage and the bridge; the read/clone role on the template, not
    propagated; the audit role on "/", not propagated), ``without`` one (role, privilege)."""
    name = "lp" + secrets.token_hex(4)
    user = f"{name}@pve"
    env.root.access.users.post(userid=user)
    secret = str(env.root.access.users(user).token("runtime").post(privsep=1)["value"])
    tokenid = f"{user}!runtime"
    grants = {
        "pool": (
            PRIVILEGES,
            [f"/pool/{POOL}", f"/storage/{STORAGE}", f"/sdn/zones/localnetwork/{BRIDGE}"],
            1,
        ),
        "template": (TEMPLATE_PRIVILEGES, [f"/vms/{TEMPLATE_VMID}"], 0),
        "audit": (AUDIT_PRIVILEGES, ["/"], 0),
    }
    for kind, (privileges, paths, propagate) in grants.items():
        privs = [p for p in privileges if without is None or (kind, p) != without]
        if not privs:
            continue  # a role needs a privilege: without its only one, the ACL is simply not there
        role = f"Role{name}{kind}"
        env.root.access.roles.post(roleid=role, privs=",".join(privs))
        for path in paths:
            env.root.access.acl.put(path=path, roles=role, users=user, propagate=propagate)
            env.root.access.acl.put(path=path, roles=role, tokens=tokenid, propagate=propagate)
    return tokenid, secret


def _cts(env: Env) -> set[int]:
    return {int(r["vmid"]) for r in env.root.cluster.resources.get(type="vm")}


def _lifecycle(env: Env, tokenid: str, secret: str, done: list[str] | None = None) -> list[str]:
    """The runtime's Proxmox calls for create -> set_internet -> destroy; returns the steps done.

    Whatever the token leaves behind is removed with the root token, also on failure.
    """
    settings = dataclasses.replace(env.base, pve_token_id=tokenid, pve_token_secret=secret)
    backend = ProxmoxBackend(settings)
    before = _cts(env)
    sandbox_id = "sbx-" + secrets.token_hex(5)
    fork_id = "sbx-" + secrets.token_hex(5)
    snapname = "lp_" + secrets.token_hex(4)
    # disk_gb above the template's 4 GiB rootfs, so the resize (VM.Config.Disk) really happens
    spec = make_spec(cpus=1, memory_mb=512, disk_gb=6, internet=False)
    done = [] if done is None else done
    try:
        backend.begin(sandbox_id)
        record = backend.clone(sandbox_id, spec)
        done.append("clone")
        record = backend.start(sandbox_id)
        done.append("start")
        backend.set_internet(record, True)
        assert backend.internet_enabled(record)
        done.append("internet")
        backend.snapshot(sandbox_id, snapname)
        done.append("snapshot")
        backend.begin(fork_id)
        fork = backend.clone_from_snapshot(fork_id, spec, snapname)  # full clone of the snapshot
        assert fork.id == fork_id and fork.ip != record.ip
        done.append("fork")
        assert backend.delete_snapshot(snapname)
        assert backend.list_snapshots() == []
        done.append("delete-snapshot")
        assert backend.destroy(fork_id)
        assert backend.destroy(sandbox_id)
        done.append("destroy")
    finally:
        backend.end(sandbox_id)
        backend.end(fork_id)
        for vmid in _cts(env) - before:
            with contextlib.suppress(Exception):
                _wait(env.root, env.root.nodes(NODE).lxc(vmid).delete(force=1, purge=1))
        assert _cts(env) == before, "the root clean-up left containers behind"
    return done


# Where the lifecycle stops without each (role, privilege): the first call that needs it.
FIRST_NEEDED_AT = {
    ("pool", "VM.Allocate"): "clone",  # clone into the pool: VM.Allocate on /vms/<newid> or /pool/<pool>
    ("pool", "VM.Clone"): "clone",  # the fork: a full clone of a sandbox's snapshot
    ("pool", "VM.Audit"): "resize",  # the new CT's config (the first read of a sandbox)
    ("pool", "Datastore.AllocateSpace"): "clone",  # the linked clone's volume on the storage
    ("pool", "SDN.Use"): "clone",  # the template's net0 bridge (PVE 8+)
    ("pool", "VM.Config.CPU"): "configure",  # cores, cpulimit
    ("pool", "VM.Config.Memory"): "configure",  # memory, swap
    ("pool", "VM.Config.Network"): "configure",  # net0, nameserver (later also the firewall rules)
    ("pool", "VM.Config.Options"): "configure",  # tags, description
    ("pool", "VM.Config.Disk"): "resize",
    ("pool", "VM.PowerMgmt"): "start",
    ("pool", "VM.Snapshot"): "snapshot",  # POST .../snapshot (the fork needs no more than the clone did)
    ("template", "VM.Clone"): "clone",  # on the template
    ("template", "VM.Audit"): "clone",  # the template is invisible in /cluster/resources
    ("audit", "Sys.Audit"): "firewall",  # GET /cluster/firewall/options (the datacenter firewall gate)
}
# The step of the fork's clone is also "clone": where the pool's VM.Clone is missing, the lifecycle
# got that far (the test checks what was done before).
DONE_BEFORE = {("pool", "VM.Clone"): ["clone", "start", "internet", "snapshot"]}


def test_every_role_privilege_is_accounted_for() -> None:
    assert sorted(ALL_GRANTS) == sorted(FIRST_NEEDED_AT), "update FIRST_NEEDED_AT with the roles' privileges"
    assert "VM.Console" not in PRIVILEGES  # the seed guide's, never needed: the runtime uses SSH


def test_the_full_role_runs_the_lifecycle(env: Env) -> None:
    assert _lifecycle(env, *_token_with(env)) == [
        "clone",
        "start",
        "internet",
        "snapshot",
        "fork",
        "delete-snapshot",
        "destroy",
    ]


def test_the_runtime_suite_grants_no_other_privilege() -> None:
    """tests/integration/runtime/pve_env.py grants the role's set (it reads the role's defaults); at most
    Datastore.Audit more, which no runtime call checks (the full-role lifecycle above runs without it)."""
    from tests.pve_env import AUDIT_PRIVILEGES as SUITE_AUDIT
    from tests.pve_env import PRIVILEGES as SUITE
    from tests.pve_env import TEMPLATE_PRIVILEGES as SUITE_TEMPLATE

    assert set(PRIVILEGES) <= set(SUITE)
    assert set(SUITE) - set(PRIVILEGES) <= {"Datastore.Audit"}
    assert SUITE_TEMPLATE == TEMPLATE_PRIVILEGES and SUITE_AUDIT == AUDIT_PRIVILEGES


@pytest.mark.parametrize("missing", ALL_GRANTS, ids=[f"{k}-{p}" for k, p in ALL_GRANTS])
def test_each_privilege_is_needed(env: Env, missing: tuple[str, str]) -> None:
    before = _cts(env)
    tokenid, secret = _token_with(env, without=missing)
    done: list[str] = []
    with pytest.raises(BackendError) as err:
        done = _lifecycle(env, tokenid, secret, done)
    assert err.value.step == FIRST_NEEDED_AT[missing], err.value
    assert done == DONE_BEFORE.get(missing, done), done
    kind, privilege = missing
    if (kind, privilege) == ("template", "VM.Audit"):
        assert f"template CT {TEMPLATE_VMID} not found" in str(err.value)
    elif privilege == "VM.Allocate":
        # PVE's clone check is an "or" (/vms/<newid> or /pool/<pool>): its message names no privilege
        assert isinstance(err.value, PermissionDenied) and "Permission check failed" in str(err.value)
    else:
        assert isinstance(err.value, PermissionDenied), err.value
        assert f", {privilege})" in str(err.value), err.value
    assert _cts(env) == before


def test_the_token_cannot_change_the_template_but_can_clone_it(env: Env) -> None:
    """The template is outside the pool: the token's only grant there is the read/clone role, so every
    write to the template is refused by PVE, while the runtime still clones it."""
    tokenid, secret = _token_with(env)
    api = env.srv.client(tokenid, secret)
    ct = api.nodes(NODE).lxc(TEMPLATE_VMID)
    before = env.root.nodes(NODE).lxc(TEMPLATE_VMID).config.get()
    writes: dict[str, Callable[[], Any]] = {
        "config": lambda: ct.config.put(description="owned", memory=64),
        "tags": lambda: ct.config.put(tags="sandbox-rt;sbx-0000000000"),
        "net0": lambda: ct.config.put(net0="name=eth0,bridge=vmbr0,ip=dhcp"),
        "start": lambda: ct.status.start.post(),
        "snapshot": lambda: ct.snapshot.post(snapname="mine"),
        "destroy": lambda: ct.delete(),
        "firewall": lambda: ct.firewall.options.put(enable=0),
        "resize": lambda: ct.resize.put(disk="rootfs", size="+1G"),
    }
    for what, write in writes.items():
        with pytest.raises(ResourceException) as refused:
            write()
        assert refused.value.status_code == 403, (what, refused.value)
    after = env.root.nodes(NODE).lxc(TEMPLATE_VMID).config.get()
    assert after == before
    assert TEMPLATE_VMID not in {m.get("vmid") for m in env.root.pools(POOL).get()["members"]}
    assert _lifecycle(env, tokenid, secret)[:1] == ["clone"]  # and the clone works


def test_the_old_layout_let_the_token_change_the_template(env: Env) -> None:
    """Negative proof: with the template in the token's pool (the layout before), the same token could
    rewrite the template's config - which is what moving it out of the pool prevents."""
    tokenid, secret = _token_with(env)
    env.root.pools.put(poolid=POOL, vms=str(TEMPLATE_VMID))  # the old layout
    try:
        api = env.srv.client(tokenid, secret)
        api.nodes(NODE).lxc(TEMPLATE_VMID).config.put(tags="changed-by-the-token")
        assert "changed-by-the-token" in env.root.nodes(NODE).lxc(TEMPLATE_VMID).config.get()["tags"]
    finally:
        env.root.pools.put(poolid=POOL, vms=str(TEMPLATE_VMID), delete=1)
        env.root.nodes(NODE).lxc(TEMPLATE_VMID).config.put(delete="tags")


def test_the_runtime_refuses_while_the_datacenter_firewall_is_off(env: Env) -> None:
    """Fail closed: with the datacenter firewall off no CT firewall applies, so create, set_internet
    and set_egress refuse with FirewallDisabled, before anything is made."""
    tokenid, secret = _token_with(env)
    settings = dataclasses.replace(env.base, pve_token_id=tokenid, pve_token_secret=secret)
    backend = ProxmoxBackend(settings)
    sandbox_id = "sbx-" + secrets.token_hex(5)
    spec = make_spec(cpus=1, memory_mb=512, disk_gb=4, internet=False)
    backend.begin(sandbox_id)
    record = backend.clone(sandbox_id, spec)  # while it is on
    before = _cts(env)
    env.root.cluster.firewall.options.put(enable=0)
    try:
        backend.begin("sbx-" + "1" * 10)
        with pytest.raises(FirewallDisabled) as err:
            backend.clone("sbx-" + "1" * 10, spec)
        assert err.value.step == "firewall" and "datacenter firewall is off" in str(err.value)
        assert _cts(env) == before  # nothing made
        with pytest.raises(FirewallDisabled):
            backend.set_internet(record, True)
        assert not backend.internet_enabled(record)
        with pytest.raises(FirewallDisabled):
            backend.set_egress(record, ("192.0.2.10",))
    finally:
        env.root.cluster.firewall.options.put(enable=1)
        backend.end("sbx-" + "1" * 10)
        backend.destroy(sandbox_id)
        backend.end(sandbox_id)
