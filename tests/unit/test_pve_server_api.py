"""The PVE test server driven through proxmoxer over verified TLS (memory engine, 127.0.0.1)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from proxmoxer import ResourceException
from proxmoxer.tools import Tasks

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for pve_testserver

from pve_testserver import PVETestServer, hostkey_of

NODE = "pve"
TEMPLATE_ID = 9000
OSTEMPLATE = "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"
NET0 = "name=eth0,bridge=vmbr1,ip=10.99.1.2/16,gw=10.99.0.1"
TASK_TIMEOUT = 10.0


@pytest.fixture
def server() -> Iterator[PVETestServer]:
    with PVETestServer() as srv:
        yield srv


def client(srv: PVETestServer, tokenid: str | None = None, secret: str | None = None) -> Any:
    """proxmoxer on the server, TLS verified against the server's CA (never verify_ssl=False)."""
    return srv.client(tokenid, secret, timeout=10)


@pytest.fixture
def api(server: PVETestServer) -> Any:
    return client(server)


def wait(api: Any, upid: str) -> dict[str, Any]:
    status: dict[str, Any] | None = Tasks.blocking_status(
        api, upid, timeout=TASK_TIMEOUT, polling_interval=0.02
    )
    assert status is not None, f"task {upid} did not finish in {TASK_TIMEOUT}s"
    return status


def wait_ok(api: Any, upid: str) -> dict[str, Any]:
    status = wait(api, upid)
    assert status["exitstatus"] == "OK", status
    return status


def make_template(api: Any, vmid: int = TEMPLATE_ID) -> None:
    upid = api.nodes(NODE).lxc.post(
        vmid=vmid, ostemplate=OSTEMPLATE, rootfs="local-lvm:8", hostname="sandbox-template", net0=NET0
    )
    wait_ok(api, upid)
    api.nodes(NODE).lxc(vmid).template.post()


def clone(api: Any, newid: int, **extra: Any) -> str:
    upid: str = api.nodes(NODE).lxc(TEMPLATE_ID).clone.post(newid=newid, hostname=f"sbx-{newid}", **extra)
    return upid


def raw(srv: PVETestServer, method: str, path: str, token: str | None = None, **kw: Any) -> requests.Response:
    headers = {"Authorization": f"PVEAPIToken={token}"} if token else {}
    kw.setdefault("verify", str(srv.ca_file))
    return requests.request(method, srv.url + path, headers=headers, timeout=10, **kw)


def root_header(srv: PVETestServer) -> str:
    tokenid, secret = srv.root_token
    return f"{tokenid}={secret}"


def error_of(exc: pytest.ExceptionInfo[ResourceException]) -> tuple[int, str, Any]:
    """(HTTP status, reason phrase PVE sent, per-parameter errors)."""
    return exc.value.status_code, exc.value.content, exc.value.errors


# --- transport, auth, routing ------------------------------------------------------------------


def test_tls_is_verified_against_the_server_ca(server: PVETestServer, tmp_path: Path) -> None:
    assert client(server).version.get()["release"]
    other = PVETestServer()  # a different CA
    try:
        with pytest.raises(requests.exceptions.SSLError):
            raw(server, "GET", "/version", verify=str(other.ca_file))
    finally:
        other.stop()
    assert len(server.fingerprint.split(":")) == 32


def test_authentication_failures_are_401(server: PVETestServer) -> None:
    resp = raw(server, "GET", "/version")
    assert (resp.status_code, resp.reason, resp.content) == (401, "No ticket", b"")
    resp = raw(server, "GET", "/version", token="root@pam!bootstrap=wrong")
    assert (resp.status_code, resp.reason) == (401, "Authentication failed!")
    resp = raw(server, "GET", "/version", token="nobody@pve!tok=x")
    assert resp.status_code == 401


def test_unknown_and_unimplemented_paths_are_501(server: PVETestServer) -> None:
    resp = raw(server, "GET", "/foo", token=root_header(server))
    assert (resp.status_code, resp.reason) == (501, "Method 'GET /foo' not implemented")
    resp = raw(server, "POST", "/version", token=root_header(server))
    assert resp.status_code == 501
    resp = raw(server, "GET", f"/nodes/{NODE}/qemu", token=root_header(server))
    assert resp.status_code == 501
    assert "not implemented by the PVE test server" in resp.json()["message"]


def test_parameter_errors_are_400_with_pve_body(server: PVETestServer, api: Any) -> None:
    make_template(api)
    with pytest.raises(ResourceException) as exc:
        api.nodes(NODE).lxc(TEMPLATE_ID).clone.post(newid=101, hostnme="typo")
    status, reason, errors = error_of(exc)
    assert (status, reason) == (400, "Parameter verification failed.")
    assert errors == {
        "hostnme": "property is not defined in schema and the schema does not allow additional properties"
    }
    with pytest.raises(ResourceException) as exc:  # proxmoxer sends Python True as 'True': PVE says no
        api.nodes(NODE).lxc(TEMPLATE_ID).clone.post(newid=101, full=True)
    assert error_of(exc)[2] == {"full": "type check ('boolean') failed - got 'True'"}
    resp = raw(
        server,
        "PUT",
        f"/nodes/{NODE}/lxc/{TEMPLATE_ID}/config",
        token=root_header(server),
        data={"cores": "x"},
    )
    assert resp.json() == {
        "data": None,
        "message": "Parameter verification failed.\n",
        "errors": {"cores": "type check ('integer') failed - got 'x'"},
    }


def test_json_bodies_and_conflicting_uri_parameters(server: PVETestServer, api: Any) -> None:
    make_template(api)
    hdr = {"Authorization": f"PVEAPIToken={root_header(server)}"}
    url = f"{server.url}/nodes/{NODE}/lxc/{TEMPLATE_ID}/config"
    resp = requests.put(
        url,
        json={"description": "json body", "onboot": True},
        headers=hdr,
        verify=str(server.ca_file),
        timeout=10,
    )
    assert resp.status_code == 200, resp.text
    assert api.nodes(NODE).lxc(TEMPLATE_ID).config.get()["onboot"] == 1
    resp = requests.put(url, data={"vmid": "9001"}, headers=hdr, verify=str(server.ca_file), timeout=10)
    assert resp.status_code == 400
    assert resp.json()["errors"] == {
        "vmid": "duplicate parameter (already defined in URI) with conflicting values!"
    }


# --- lifecycle ---------------------------------------------------------------------------------


def test_clone_start_stop_destroy_lifecycle(server: PVETestServer, api: Any) -> None:
    make_template(api)
    tmpl = api.nodes(NODE).lxc(TEMPLATE_ID).config.get()
    assert tmpl["template"] == 1 and tmpl["rootfs"].startswith("local-lvm:base-9000-disk-0")
    api.pools.post(poolid="sandbox")
    newid = int(api.cluster.nextid.get())
    upid = clone(api, newid, pool="sandbox")
    assert upid.startswith(f"UPID:{NODE}:") and upid.endswith(":vzclone:9000:root@pam!bootstrap:")
    status = wait_ok(api, upid)
    assert status["type"] == "vzclone" and status["tokenid"] == "bootstrap"

    ct = api.nodes(NODE).lxc(newid)
    conf = ct.config.get()
    assert conf["hostname"] == f"sbx-{newid}" and "lock" not in conf and "template" not in conf
    assert conf["rootfs"].startswith(f"local-lvm:base-9000-disk-0/vm-{newid}-disk-0")
    assert conf["net0"] != tmpl["net0"]  # a clone always gets a new MAC
    ct.config.put(net0="name=eth0,bridge=vmbr1,ip=10.99.1.7/16,gw=10.99.0.1", cores=2, memory=1024, swap=0)
    conf = ct.config.get()
    assert "ip=10.99.1.7/16" in conf["net0"] and "hwaddr=BC:24:11:" in conf["net0"]
    assert (conf["cores"], conf["memory"], conf["swap"]) == (2, 1024, 0)
    assert [m["vmid"] for m in api.pools.get(poolid="sandbox")[0]["members"]] == [newid]

    assert ct.status.current.get()["status"] == "stopped"
    assert ct.interfaces.get() is None
    wait_ok(api, ct.status.start.post())
    current = ct.status.current.get()
    assert current["status"] == "running" and current["maxmem"] == 1024 * 1024 * 1024 and current["cpus"] == 2
    key = hostkey_of(ct.config.get().get("description"))
    assert key is not None and key.startswith("ssh-ed25519 AAAA")
    ifaces = {i["name"]: i for i in ct.interfaces.get()}
    assert ifaces["eth0"]["inet"] == "10.99.1.7/16"
    with pytest.raises(ResourceException) as exc:
        ct.status.start.post()
    assert error_of(exc)[:2] == (500, f"CT {newid} already running")
    with pytest.raises(ResourceException) as exc:
        ct.delete()
    assert error_of(exc)[1] == f"unable to destroy CT {newid} - container is running"

    wait_ok(api, ct.status.shutdown.post(timeout=5))
    assert ct.status.current.get()["status"] == "stopped"
    wait_ok(api, ct.status.start.post())
    assert hostkey_of(ct.config.get().get("description")) == key  # the key survives a restart
    wait_ok(api, ct.status.stop.post())
    wait_ok(api, ct.delete(purge=1))
    with pytest.raises(ResourceException) as exc:
        ct.config.get()
    assert error_of(exc)[:2] == (500, f"Configuration file 'nodes/{NODE}/lxc/{newid}.conf' does not exist")
    assert api.pools.get(poolid="sandbox")[0]["members"] == []
    assert newid not in [int(c["vmid"]) for c in api.nodes(NODE).lxc.get()]


def test_task_list_and_log(server: PVETestServer, api: Any) -> None:
    make_template(api)
    upid = clone(api, 120)
    wait_ok(api, upid)
    log = api.nodes(NODE).tasks(upid).log.get()
    assert log[0] == {"n": 1, "t": "creating a clone of container 9000 with ID 120"}
    assert log[-1]["t"] == "TASK OK"
    tasks = api.nodes(NODE).tasks.get(typefilter="vzclone")
    assert [t["upid"] for t in tasks] == [upid] and tasks[0]["status"] == "OK"
    with pytest.raises(ResourceException) as exc:
        api.nodes(NODE).tasks("UPID:garbage").status.get()
    assert error_of(exc)[2] == {"upid": "unable to parse worker upid"}


def test_create_checks_storage_content(server: PVETestServer, api: Any) -> None:
    with pytest.raises(ResourceException) as exc:  # 'local' holds templates, not container disks
        api.nodes(NODE).lxc.post(vmid=200, ostemplate=OSTEMPLATE)
    assert error_of(exc)[2] == {"storage": "storage 'local' does not support container directories"}
    with pytest.raises(ResourceException) as exc:
        api.nodes(NODE).lxc.post(vmid=200, ostemplate="local:vztmpl/nope.tar.zst", storage="local-lvm")
    assert error_of(exc)[1] == "volume 'local:vztmpl/nope.tar.zst' does not exist"
    wait_ok(api, api.nodes(NODE).lxc.post(vmid=200, ostemplate=OSTEMPLATE, storage="local-lvm", start=1))
    assert api.nodes(NODE).lxc(200).status.current.get()["status"] == "running"
    volumes = api.nodes(NODE).storage("local-lvm").content.get()
    assert [v["volid"] for v in volumes] == ["local-lvm:vm-200-disk-0"]


def test_template_and_resize(server: PVETestServer, api: Any) -> None:
    make_template(api)
    with pytest.raises(ResourceException) as exc:
        api.nodes(NODE).lxc(TEMPLATE_ID).template.post()
    assert error_of(exc)[1] == "you can't convert a template to a template"
    wait_ok(api, clone(api, 130))
    ct = api.nodes(NODE).lxc(130)
    wait_ok(api, ct.resize.put(disk="rootfs", size="+2G"))
    assert ct.config.get()["rootfs"].endswith("size=10G")
    with pytest.raises(ResourceException) as exc:
        ct.resize.put(disk="rootfs", size="4G")
    assert error_of(exc)[1] == "unable to shrink disk size"
    upid = clone(api, 131)
    wait_ok(api, upid)
    wait_ok(api, api.nodes(NODE).lxc(131).status.start.post())
    with pytest.raises(ResourceException) as exc:
        api.nodes(NODE).lxc(131).template.post()
    assert error_of(exc)[1] == "you can't convert a CT to template if the CT is running"


def test_tags_round_trip(server: PVETestServer, api: Any) -> None:
    make_template(api)
    wait_ok(api, clone(api, 140))
    ct = api.nodes(NODE).lxc(140)
    ct.config.put(tags="sandbox-rt;Owner-alice,expires-1700000000")
    assert ct.config.get()["tags"] == "expires-1700000000;owner-alice;sandbox-rt"
    resources = {r["vmid"]: r for r in api.cluster.resources.get(type="vm")}
    assert resources[140]["tags"] == "expires-1700000000;owner-alice;sandbox-rt"
    assert resources[TEMPLATE_ID]["template"] == 1
    assert api.nodes(NODE).lxc.get()[0].get("tags") in (None, "expires-1700000000;owner-alice;sandbox-rt")
    ct.config.put(delete="tags")
    assert "tags" not in ct.config.get()


def test_config_digest_and_delete_rules(server: PVETestServer, api: Any) -> None:
    make_template(api)
    wait_ok(api, clone(api, 150))
    ct = api.nodes(NODE).lxc(150)
    digest = ct.config.get()["digest"]
    ct.config.put(description="one", digest=digest)
    with pytest.raises(ResourceException) as exc:
        ct.config.put(description="two", digest=digest)
    assert error_of(exc)[1] == "detected modified configuration - file changed by other user? Try again."
    with pytest.raises(ResourceException) as exc:
        ct.config.put(delete="memory")
    assert error_of(exc)[1] == "unable to delete required option 'memory'"
    with pytest.raises(ResourceException) as exc:
        ct.config.put(delete="cores", cores=2)
    assert error_of(exc)[2] == {"delete": "you can't use '-cores' and -delete cores' at the same time"}
    with pytest.raises(ResourceException) as exc:
        ct.config.put()
    assert error_of(exc)[1] == "no options specified"


# --- permissions -------------------------------------------------------------------------------


def _sandbox_user(server: PVETestServer, api: Any) -> tuple[str, str]:
    """sbx@pve with a privsep token; the user may do anything, the token only what its ACLs say."""
    api.access.users.post(userid="sbx@pve", comment="runtime")
    token = api.access.users("sbx@pve").token("rt").post(privsep=1)
    assert token["full-tokenid"] == "sbx@pve!rt" and len(token["value"]) == 36
    api.access.acl.put(path="/", roles="Administrator", users="sbx@pve")
    return "sbx@pve!rt", token["value"]


def test_clone_needs_each_privilege(server: PVETestServer, api: Any) -> None:
    """VM.Clone on the source, VM.Allocate on the new ID, SDN.Use on the bridge, Datastore.AllocateSpace."""
    make_template(api)
    tokenid, secret = _sandbox_user(server, api)
    api.access.roles.post(roleid="SandboxRT", privs="VM.Allocate,VM.Audit,VM.Config.Network,VM.PowerMgmt")
    api.access.acl.put(path="/vms", roles="SandboxRT", tokens=tokenid)
    sbx = client(server, tokenid, secret)

    def denied(newid: int) -> str | None:
        try:
            wait_ok(sbx, sbx.nodes(NODE).lxc(TEMPLATE_ID).clone.post(newid=newid))
        except ResourceException as exc:
            assert exc.status_code == 403
            return str(exc.content)
        return None

    assert denied(160) == "Permission check failed (/vms/9000, VM.Clone)"
    # An ACL on /vms/9000 replaces the propagated /vms one there; VM.Allocate is needed on /vms/160.
    api.access.acl.put(path=f"/vms/{TEMPLATE_ID}", roles="PVETemplateUser", tokens=tokenid)
    assert denied(160) == "Permission check failed (/sdn/zones/localnetwork/vmbr1, SDN.Use)"
    api.access.acl.put(path="/sdn/zones/localnetwork/vmbr1", roles="PVESDNUser", tokens=tokenid)
    assert denied(160) == "Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)"
    api.access.acl.put(path="/storage/local-lvm", roles="PVEDatastoreUser", tokens=tokenid)
    assert denied(160) is None
    api.access.acl.put(path="/vms", roles="SandboxRT", tokens=tokenid, delete=1)
    assert denied(161) == "Permission check failed"  # no VM.Allocate on /vms/161 nor on a pool
    api.pools.post(poolid="sandbox")
    api.access.acl.put(path="/pool/sandbox", roles="SandboxRT", tokens=tokenid)
    assert denied(161) == "Permission check failed"  # the pool ACL only counts with pool=...
    wait_ok(sbx, sbx.nodes(NODE).lxc(TEMPLATE_ID).clone.post(newid=162, pool="sandbox"))
    assert [m["vmid"] for m in api.pools("sandbox").get()["members"]] == [162]
    with pytest.raises(ResourceException) as exc:  # and nothing its ACLs do not cover
        sbx.access.users.post(userid="evil@pve")
    assert error_of(exc)[0] == 403


def test_privsep_token_gets_intersection_with_user(server: PVETestServer, api: Any) -> None:
    make_template(api)
    api.access.users.post(userid="weak@pve")
    secret = api.access.users("weak@pve").token("t1").post()["value"]
    api.access.acl.put(path="/", roles="PVEAuditor", users="weak@pve")
    api.access.acl.put(path="/", roles="Administrator", tokens="weak@pve!t1")
    weak = client(server, "weak@pve!t1", secret)
    assert weak.nodes(NODE).lxc(TEMPLATE_ID).config.get()["template"] == 1  # VM.Audit: both have it
    with pytest.raises(ResourceException) as exc:
        weak.nodes(NODE).lxc(TEMPLATE_ID).clone.post(newid=170)
    assert error_of(exc)[:2] == (403, "Permission check failed (/vms/9000, VM.Clone)")
    perms = api.access.permissions.get(userid="weak@pve!t1", path="/vms/9000")
    assert perms["/vms/9000"]["VM.Audit"] == 1 and "VM.Clone" not in perms["/vms/9000"]
    api.access.users("weak@pve").token("t1").put(privsep=0)  # now it is the user: still an auditor
    assert "VM.Clone" not in api.access.permissions.get(userid="weak@pve!t1", path="/vms/9000")["/vms/9000"]


def test_users_tokens_roles_acl_api(server: PVETestServer, api: Any) -> None:
    api.access.users.post(userid="ops@pve", email="ops@example.org")
    info = api.access.users("ops@pve").token("deploy").post(comment="ansible", expire=0)
    assert set(info) == {"full-tokenid", "info", "value"}
    assert info["info"]["privsep"] == 1
    listed = api.access.users("ops@pve").token.get()
    assert listed == [{"tokenid": "deploy", "privsep": 1, "expire": 0, "comment": "ansible"}]
    assert "value" not in api.access.users("ops@pve").token("deploy").get()
    with pytest.raises(ResourceException) as exc:
        api.access.users("ops@pve").token("deploy").post()
    assert error_of(exc)[2] == {"tokenid": "Token already exists."}
    roles = {r["roleid"]: r for r in api.access.roles.get()}
    assert roles["PVEVMAdmin"]["special"] == 1 and "VM.Clone" in roles["PVEVMAdmin"]["privs"].split(",")
    assert api.access.roles("PVEDatastoreUser").get() == {"Datastore.AllocateSpace": 1, "Datastore.Audit": 1}
    with pytest.raises(ResourceException) as exc:
        api.access.roles.post(roleid="PVEMine")
    assert error_of(exc)[0] == 400
    api.access.roles.post(roleid="Mine", privs="VM.Audit")
    api.access.roles("Mine").put(privs="VM.Clone", append=1)
    assert api.access.roles("Mine").get() == {"VM.Audit": 1, "VM.Clone": 1}
    api.access.acl.put(path="/vms", roles="Mine", tokens="ops@pve!deploy", propagate=0)
    assert {
        "path": "/vms",
        "type": "token",
        "ugid": "ops@pve!deploy",
        "roleid": "Mine",
        "propagate": 0,
    } in api.access.acl.get()
    with pytest.raises(ResourceException) as exc:
        api.access.acl.put(path="/bogus", roles="Mine", users="ops@pve")
    assert error_of(exc)[2] == {"path": "invalid ACL path '/bogus'"}
    with pytest.raises(ResourceException) as exc:
        api.access.acl.put(path="/vms", roles="Nope", users="ops@pve")
    assert error_of(exc)[:2] == (500, "ACL update failed: role 'Nope' does not exist")
    api.access.acl.put(path="/vms", roles="Mine", tokens="ops@pve!deploy", delete=1)
    assert not [a for a in api.access.acl.get() if a["ugid"] == "ops@pve!deploy"]
    api.access.users("ops@pve").token("deploy").delete()
    api.access.users("ops@pve").delete()
    assert "ops@pve" not in [u["userid"] for u in api.access.users.get()]


def test_pools_both_forms(server: PVETestServer, api: Any) -> None:
    make_template(api)
    api.pools.post(poolid="sandbox", comment="runtime CTs")
    with pytest.raises(ResourceException) as exc:
        api.pools.post(poolid="sandbox")
    assert error_of(exc)[1] == "create pool failed: pool 'sandbox' already exists"
    api.pools.put(poolid="sandbox", vms=str(TEMPLATE_ID))
    with pytest.raises(ResourceException) as exc:
        api.pools.put(poolid="sandbox", vms=str(TEMPLATE_ID))
    assert error_of(exc)[1] == "update pools failed: VM 9000 is already a pool member"
    assert api.pools("sandbox").get()["members"][0]["vmid"] == TEMPLATE_ID
    assert api.pools.get() == [{"poolid": "sandbox", "comment": "runtime CTs"}]
    with pytest.raises(ResourceException) as exc:
        api.pools.delete(poolid="sandbox")
    assert error_of(exc)[1] == "delete pool failed: pool 'sandbox' is not empty (contains VM 9000)"
    api.pools("sandbox").put(vms=str(TEMPLATE_ID), delete=1)
    api.pools.delete(poolid="sandbox")
    assert api.pools.get() == []


# --- fault switches ----------------------------------------------------------------------------


def test_lock_injection_is_visible(server: PVETestServer, api: Any) -> None:
    make_template(api)
    wait_ok(api, clone(api, 180))
    server.faults.inject_lock(count=2, lock="backup", vmid=180)
    for _ in range(2):
        with pytest.raises(ResourceException) as exc:
            api.nodes(NODE).lxc(180).config.put(cores=2)
        assert error_of(exc)[:2] == (500, "CT is locked (backup)")
    api.nodes(NODE).lxc(180).config.put(cores=2)
    resp = raw(server, "POST", "/../_test/faults", token=root_header(server))  # outside /api2
    assert resp.status_code in (400, 404, 501)
    url = server.url.replace("/api2/json", "/_test/faults")
    hdr = {"Authorization": f"PVEAPIToken={root_header(server)}"}
    resp = requests.post(
        url, json={"lock": {"count": 1, "lock": "disk"}}, headers=hdr, verify=str(server.ca_file), timeout=10
    )
    assert resp.status_code == 200 and resp.json()["data"]["lock"] == [
        {"count": 1, "lock": "disk", "vmid": None}
    ]
    with pytest.raises(ResourceException) as exc:
        api.nodes(NODE).lxc(180).config.put(cores=1)
    assert error_of(exc)[1] == "CT is locked (disk)"
    assert requests.get(url, headers=hdr, verify=str(server.ca_file), timeout=10).json()["data"]["lock"] == []


def test_real_locks_while_a_clone_runs(server: PVETestServer, api: Any) -> None:
    make_template(api)
    server.faults.slow_tasks(TASK_TIMEOUT, types=["vzclone"], count=1)
    upid = clone(api, 190)
    assert api.nodes(NODE).tasks(upid).status.get()["status"] == "running"
    assert api.nodes(NODE).lxc(TEMPLATE_ID).config.get()["lock"] == "disk"
    assert api.nodes(NODE).lxc(190).config.get()["lock"] == "create"
    with pytest.raises(ResourceException) as exc:  # PVE serialises clones of one template
        clone(api, 191)
    assert error_of(exc)[:2] == (500, "CT is locked (disk)")
    with pytest.raises(ResourceException) as exc:
        api.nodes(NODE).lxc(190).config.put(memory=256)
    assert error_of(exc)[1] == "CT is locked (create)"
    server.faults.release_tasks()
    wait_ok(api, upid)
    assert "lock" not in api.nodes(NODE).lxc(TEMPLATE_ID).config.get()
    assert "lock" not in api.nodes(NODE).lxc(190).config.get()
    wait_ok(api, clone(api, 191))


def test_nextid_collision(server: PVETestServer, api: Any) -> None:
    make_template(api)
    server.faults.repeat_nextid(count=2)
    first = int(api.cluster.nextid.get())
    wait_ok(api, clone(api, first))
    second = int(api.cluster.nextid.get())
    assert second == first
    with pytest.raises(ResourceException) as exc:
        clone(api, second)
    assert error_of(exc)[:2] == (500, f"CT {first} already exists on node '{NODE}'")
    assert int(api.cluster.nextid.get()) != first
    with pytest.raises(ResourceException) as exc:
        api.cluster.nextid.get(vmid=first)
    assert error_of(exc)[2] == {"vmid": f"VM {first} already exists"}


def test_failing_task_rolls_back(server: PVETestServer, api: Any) -> None:
    make_template(api)
    server.faults.fail_tasks("storage exploded", types=["vzclone"])
    status = wait(api, clone(api, 200))
    assert status["status"] == "stopped" and status["exitstatus"] == "clone failed: storage exploded"
    assert (
        api.nodes(NODE).tasks(status["upid"]).log.get()[-1]["t"]
        == "TASK ERROR: clone failed: storage exploded"
    )
    assert 200 not in [int(c["vmid"]) for c in api.nodes(NODE).lxc.get()]
    assert "lock" not in api.nodes(NODE).lxc(TEMPLATE_ID).config.get()
    wait_ok(api, clone(api, 200))
    server.faults.fail_tasks("no cgroup", types=["vzstart"])
    assert wait(api, api.nodes(NODE).lxc(200).status.start.post())["exitstatus"] == "no cgroup"
    assert api.nodes(NODE).lxc(200).status.current.get()["status"] == "stopped"


def test_start_of_locked_ct_fails_in_the_task(server: PVETestServer, api: Any) -> None:
    make_template(api)
    server.faults.slow_tasks(TASK_TIMEOUT, types=["vzclone"], count=1)
    upid = clone(api, 210)
    status = wait(api, api.nodes(NODE).lxc(210).status.start.post())
    assert status["exitstatus"] == "CT is locked (create)"
    server.faults.release_tasks()
    wait_ok(api, upid)


def test_node_offline(tmp_path: Path) -> None:
    with PVETestServer(nodes=("pve", "pve2")) as srv:
        api = client(srv)
        assert {n["node"]: n["status"] for n in api.nodes.get()} == {"pve": "online", "pve2": "online"}
        srv.faults.set_node_offline("pve2")
        with pytest.raises(ResourceException) as exc:
            api.nodes("pve2").lxc.get()
        assert error_of(exc)[:2] == (
            595,
            "Errors during connection establishment, proxy handler: No route to host",
        )
        assert {n["node"]: n["status"] for n in api.nodes.get()}["pve2"] == "offline"
        assert api.nodes("pve").lxc.get() == []
        with pytest.raises(ResourceException) as exc:
            api.nodes("pve3").lxc.get()
        assert error_of(exc)[0] == 500


def test_admin_api_needs_a_root_token(server: PVETestServer, api: Any) -> None:
    api.access.users.post(userid="x@pve")
    secret = api.access.users("x@pve").token("t1").post()["value"]
    url = server.url.replace("/api2/json", "/_test/faults")
    resp = requests.delete(
        url,
        headers={"Authorization": f"PVEAPIToken=x@pve!t1={secret}"},
        verify=str(server.ca_file),
        timeout=10,
    )
    assert resp.status_code == 403
    resp = requests.delete(url, verify=str(server.ca_file), timeout=10)
    assert resp.status_code == 401


# --- firewall ----------------------------------------------------------------------------------


def test_firewall_ipset_add_remove(server: PVETestServer, api: Any) -> None:
    make_template(api)
    wait_ok(api, clone(api, 220))
    fw = api.nodes(NODE).lxc(220).firewall
    fw.ipset.post(name="internet", comment="egress allowed")
    fw.ipset("internet").post(cidr="10.99.1.5")
    fw.ipset("internet").post(cidr="10.99.2.77/24", comment="net")
    with pytest.raises(ResourceException) as exc:
        fw.ipset("internet").post(cidr="10.99.1.5")
    assert error_of(exc)[2] == {"cidr": "address '10.99.1.5' already exists"}
    entries = fw.ipset("internet").get()
    assert [e["cidr"] for e in entries] == ["10.99.1.5", "10.99.2.0/24"]
    assert len({e["digest"] for e in entries}) == 1
    assert fw.ipset("internet")("10.99.2.0/24").get()["comment"] == "net"
    fw.ipset("internet")("10.99.2.0/24").delete()  # the CIDR's slash stays in the path, as with PVE
    assert [e["cidr"] for e in fw.ipset("internet").get()] == ["10.99.1.5"]
    with pytest.raises(ResourceException) as exc:
        fw.ipset("internet").delete()
    assert error_of(exc)[1] == "IPSet 'internet' is not empty"
    fw.ipset("internet")("10.99.1.5").delete()
    fw.ipset("internet").delete()
    assert fw.ipset.get() == []


def test_firewall_options_and_rules(server: PVETestServer, api: Any) -> None:
    make_template(api)
    wait_ok(api, clone(api, 230))
    fw = api.nodes(NODE).lxc(230).firewall
    fw.options.put(enable=1, policy_out="DROP")
    opts = fw.options.get()
    assert (opts["enable"], opts["policy_out"]) == (1, "DROP") and len(opts["digest"]) == 40
    fw.rules.post(type="out", action="ACCEPT", dest="+internet", enable=1, comment="egress")
    fw.rules.post(type="in", action="ACCEPT", proto="tcp", dport="22")
    rules = fw.rules.get()
    assert [(r["pos"], r["type"]) for r in rules] == [(0, "in"), (1, "out")]
    assert rules[0]["enable"] == 0
    fw.rules(0).put(enable=1)
    assert fw.rules(0).get()["enable"] == 1
    fw.rules(1).delete()
    assert len(fw.rules.get()) == 1
    with pytest.raises(ResourceException) as exc:
        fw.rules(5).get()
    assert error_of(exc)[1] == "no rule at position 5"
    wait_ok(api, clone(api, 231))  # not from 230: firewall configs are per guest
    assert api.nodes(NODE).lxc(231).firewall.rules.get() == []


# --- persistence -------------------------------------------------------------------------------


def test_state_survives_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    token_file = tmp_path / "bootstrap.token"
    with PVETestServer(state_file=state, bootstrap_token_file=token_file) as srv:
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        tokenid, secret = token_file.read_text().strip().rsplit("=", 1)
        api = client(srv, tokenid, secret)
        make_template(api)
        api.access.users.post(userid="rt@pve")
        rt_secret = api.access.users("rt@pve").token("t1").post(privsep=0)["value"]
        api.access.acl.put(path="/vms", roles="PVEVMAdmin", users="rt@pve")
    assert oct(state.stat().st_mode & 0o777) == "0o600"
    assert rt_secret not in state.read_text()
    with PVETestServer(state_file=state) as srv2:
        rt = client(srv2, "rt@pve!t1", rt_secret)
        assert rt.nodes(NODE).lxc(TEMPLATE_ID).config.get()["template"] == 1
        with pytest.raises(ResourceException):
            client(srv2, tokenid, secret).version.get()  # each start makes a new bootstrap secret


def test_http_error_switch(server: PVETestServer, api: Any) -> None:
    make_template(api)
    server.faults.http_error(503, "Service Unavailable", method="POST", path=r"/clone$", count=1)
    with pytest.raises(ResourceException) as exc:
        clone(api, 230)
    assert error_of(exc)[:2] == (503, "Service Unavailable")
    assert 230 not in [int(c["vmid"]) for c in api.nodes(NODE).lxc.get()]  # nothing was done
    wait_ok(api, clone(api, 230))  # consumed: the next one passes
    url = server.url.replace("/api2/json", "/_test/faults")
    hdr = {"Authorization": f"PVEAPIToken={root_header(server)}"}
    spec = {"http_error": {"status": 500, "message": "internal error", "method": "GET", "count": 2}}
    data = requests.post(url, json=spec, headers=hdr, verify=str(server.ca_file), timeout=10).json()["data"]
    assert data["http_error"] == [
        {"status": 500, "message": "internal error", "method": "GET", "path": None, "count": 2}
    ]
    for _ in range(2):
        with pytest.raises(ResourceException) as exc:
            api.nodes(NODE).lxc.get()
        assert error_of(exc)[:2] == (500, "internal error")
    assert api.nodes(NODE).lxc.get()


def test_stop_task_runs_the_tasks_cleanup(server: PVETestServer, api: Any) -> None:
    make_template(api)
    server.faults.slow_tasks(TASK_TIMEOUT * 10, types=["vzclone"], count=1)
    upid = clone(api, 240)
    assert api.nodes(NODE).tasks(upid).status.get()["status"] == "running"
    assert api.nodes(NODE).tasks(upid).delete() is None  # PVE's stop_task
    status = wait(api, upid)
    assert status["exitstatus"] == "clone failed: received interrupt"
    assert 240 not in [int(c["vmid"]) for c in api.nodes(NODE).lxc.get()]  # the clone cleaned up
    assert "lock" not in api.nodes(NODE).lxc(TEMPLATE_ID).config.get()
    assert api.nodes(NODE).tasks(upid).delete() is None  # a finished task: nothing to do
    wait_ok(api, clone(api, 240))


def test_stop_task_of_another_user_needs_sys_modify(server: PVETestServer, api: Any) -> None:
    make_template(api)
    server.add_user("other@pve")
    secret = server.add_token("other@pve", "tok", privsep=False)
    server.set_acl("/nodes/pve", "PVEAuditor", users=["other@pve"])  # Sys.Audit, no Sys.Modify
    other = client(server, "other@pve!tok", secret)
    server.faults.slow_tasks(TASK_TIMEOUT * 10, types=["vzclone"], count=1)
    upid = clone(api, 250)
    with pytest.raises(ResourceException) as exc:
        other.nodes(NODE).tasks(upid).delete()
    assert error_of(exc)[0] == 403
    api.nodes(NODE).tasks(upid).delete()
    assert wait(api, upid)["exitstatus"] == "clone failed: received interrupt"


@pytest.mark.parametrize("keep_lock", [False, True])
def test_half_failed_clone_leaves_its_ct(server: PVETestServer, api: Any, keep_lock: bool) -> None:
    make_template(api)
    api.pools.post(poolid="p")
    server.faults.half_fail_tasks("post_clone_hook failed", types=["vzclone"], keep_lock=keep_lock)
    status = wait(api, clone(api, 260, pool="p"))
    assert status["exitstatus"] == "clone failed: post_clone_hook failed"
    log = [line["t"] for line in api.nodes(NODE).tasks(status["upid"]).log.get()]
    assert any(line.startswith("Failed to remove target CT config") for line in log)
    conf = api.nodes(NODE).lxc(260).config.get()  # still there, in the pool
    assert conf.get("lock") == ("create" if keep_lock else None)
    assert 260 in [int(m["vmid"]) for m in api.pools("p").get()["members"]]
    assert "lock" not in api.nodes(NODE).lxc(TEMPLATE_ID).config.get()
