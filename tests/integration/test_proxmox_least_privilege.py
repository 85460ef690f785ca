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
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]
from proxmoxer import ProxmoxAPI
from proxmoxer.tools import Tasks

from sandbox_rt import BackendError, PermissionDenied, Settings
from sandbox_rt.backends.proxmox import ProxmoxBackend
from sandbox_rt.validation import make_spec
from tests.pve_server import MemoryEngine, PVETestServer

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DEFAULTS = yaml.safe_load((REPO / "roles" / "proxmox_access" / "defaults" / "main.yml").read_text())
PRIVILEGES: list[str] = list(DEFAULTS["proxmox_access_privileges"])
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
    """A memory-engine test server with the pool and a CT template in it (as template_build leaves it)."""
    tmp = tmp_path_factory.mktemp("least-privilege")
    with PVETestServer(engine=MemoryEngine(), state_file=tmp / "state.json", tls_dir=tmp / "tls") as srv:
        root = srv.client()
        root.pools.post(poolid=POOL)
        _wait(
            root,
            root.nodes(NODE).lxc.post(
                vmid=TEMPLATE_VMID,
                ostemplate="local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst",
                storage=STORAGE,
                pool=POOL,
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


def _token_with(env: Env, privileges: list[str]) -> tuple[str, str]:
    """A role with ``privileges``, a user and a privsep token with the role's ACLs (as proxmox_access)."""
    name = "lp" + secrets.token_hex(4)
    role, user = f"Role{name}", f"{name}@pve"
    env.root.access.roles.post(roleid=role, privs=",".join(privileges))
    env.root.access.users.post(userid=user)
    secret = str(env.root.access.users(user).token("runtime").post(privsep=1)["value"])
    tokenid = f"{user}!runtime"
    for path in (f"/pool/{POOL}", f"/storage/{STORAGE}", f"/sdn/zones/localnetwork/{BRIDGE}"):
        env.root.access.acl.put(path=path, roles=role, users=user)
        env.root.access.acl.put(path=path, roles=role, tokens=tokenid)
    return tokenid, secret


def _cts(env: Env) -> set[int]:
    return {int(r["vmid"]) for r in env.root.cluster.resources.get(type="vm")}


def _lifecycle(env: Env, tokenid: str, secret: str) -> list[str]:
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
    done: list[str] = []
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


# Where the lifecycle stops without each privilege (the first call that needs it).
FIRST_NEEDED_AT = {
    "VM.Allocate": "clone",  # clone into the pool: VM.Allocate on /vms/<newid> or /pool/<pool>
    "VM.Clone": "clone",  # on the template
    "VM.Audit": "clone",  # the template is invisible in /cluster/resources
    "Datastore.AllocateSpace": "clone",  # the linked clone's volume on the storage
    "SDN.Use": "clone",  # the template's net0 bridge (PVE 8+)
    "VM.Config.CPU": "configure",  # cores, cpulimit
    "VM.Config.Memory": "configure",  # memory, swap
    "VM.Config.Network": "configure",  # net0, nameserver (later also the firewall rules)
    "VM.Config.Options": "configure",  # tags, description
    "VM.Config.Disk": "resize",
    "VM.PowerMgmt": "start",
    "VM.Snapshot": "snapshot",  # POST .../snapshot (the fork needs no more than the clone did)
}


def test_every_role_privilege_is_accounted_for() -> None:
    assert sorted(PRIVILEGES) == sorted(FIRST_NEEDED_AT), "update FIRST_NEEDED_AT with the role's privileges"
    assert "VM.Console" not in PRIVILEGES  # the seed guide's, never needed: the runtime uses SSH


def test_the_full_role_runs_the_lifecycle(env: Env) -> None:
    assert _lifecycle(env, *_token_with(env, PRIVILEGES)) == [
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
    from tests.integration.runtime.pve_env import PRIVILEGES as SUITE

    assert set(PRIVILEGES) <= set(SUITE)
    assert set(SUITE) - set(PRIVILEGES) <= {"Datastore.Audit"}


@pytest.mark.parametrize("missing", PRIVILEGES)
def test_each_privilege_is_needed(env: Env, missing: str) -> None:
    before = _cts(env)
    tokenid, secret = _token_with(env, [p for p in PRIVILEGES if p != missing])
    with pytest.raises(BackendError) as err:
        _lifecycle(env, tokenid, secret)
    assert err.value.step == FIRST_NEEDED_AT[missing], err.value
    if missing == "VM.Audit":
        assert f"template CT {TEMPLATE_VMID} not found" in str(err.value)
    elif missing == "VM.Allocate":
        # PVE's clone check is an "or" (/vms/<newid> or /pool/<pool>): its message names no privilege
        assert isinstance(err.value, PermissionDenied) and "Permission check failed" in str(err.value)
    else:
        assert isinstance(err.value, PermissionDenied), err.value
        assert f", {missing})" in str(err.value), err.value
    assert _cts(env) == before
