"""The PVE test server's ACL evaluation (pve-access-control semantics), without HTTP."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for pve_testserver

from pve_testserver.auth import AccessControl, hash_secret, normalize_path, template_replace
from pve_testserver.errors import PVEError
from pve_testserver.privileges import BUILTIN_ROLES
from pve_testserver.state import State, empty_state

CLONE_CHECK = [
    "and",
    ["perm", "/vms/{vmid}", ["VM.Clone"]],
    [
        "or",
        ["perm", "/vms/{newid}", ["VM.Allocate"]],
        ["perm", "/pool/{pool}", ["VM.Allocate"], "require_param", "pool"],
    ],
]


@pytest.fixture
def acl() -> AccessControl:
    state = State(empty_state(["pve"]))
    for user in ("alice@pve", "bob@pve"):
        state.users[user] = {"enable": True, "expire": 0, "tokens": {}}
    state.users["alice@pve"]["tokens"] = {
        "sep": {"privsep": True, "secret_sha256": hash_secret("s1")},
        "full": {"privsep": False, "secret_sha256": hash_secret("s2")},
        "old": {"privsep": True, "expire": int(time.time()) - 10, "secret_sha256": hash_secret("s3")},
    }
    return AccessControl(state)


def grant(acl: AccessControl, path: str, role: str, kind: str, ugid: str, propagate: bool = True) -> None:
    entry = acl.state.acl.setdefault(path, {"users": {}, "groups": {}, "tokens": {}})
    entry[kind].setdefault(ugid, {})[role] = int(propagate)


def test_root_has_everything(acl: AccessControl) -> None:
    assert set(acl.permissions("root@pam", "/vms/100")) == BUILTIN_ROLES["Administrator"]
    acl.check_api2(None, "root@pam", {})  # methods without permissions are root-only


def test_propagation_and_deeper_levels_replace(acl: AccessControl) -> None:
    grant(acl, "/vms", "PVEVMAdmin", "users", "alice@pve")
    assert acl.check("alice@pve", "/vms/100", ["VM.Clone"], noerr=True)
    assert not acl.check("alice@pve", "/storage/local", ["Datastore.Audit"], noerr=True)
    grant(acl, "/vms/100", "PVEAuditor", "users", "alice@pve")
    assert not acl.check("alice@pve", "/vms/100", ["VM.Clone"], noerr=True)  # the deeper level wins
    assert acl.check("alice@pve", "/vms/101", ["VM.Clone"], noerr=True)
    grant(acl, "/nodes", "PVEAuditor", "users", "bob@pve", propagate=False)
    assert acl.check("bob@pve", "/nodes", ["Sys.Audit"], noerr=True)
    assert not acl.check("bob@pve", "/nodes/pve", ["Sys.Audit"], noerr=True)


def test_noaccess_and_groups(acl: AccessControl) -> None:
    acl.state.groups["ops"] = {"users": ["bob@pve"]}
    grant(acl, "/", "PVEAuditor", "groups", "ops")
    assert acl.check("bob@pve", "/vms/5000", ["VM.Audit"], noerr=True)
    grant(acl, "/vms/5000", "NoAccess", "groups", "ops")
    assert acl.permissions("bob@pve", "/vms/5000") == {}
    grant(acl, "/vms", "PVEVMUser", "users", "bob@pve")  # user entries beat group entries on a level
    assert acl.check("bob@pve", "/vms/4000", ["VM.PowerMgmt"], noerr=True)
    assert not acl.check("bob@pve", "/vms/4000", ["VM.Audit", "Sys.Audit"], noerr=True)


def test_pool_roles_apply_to_members(acl: AccessControl) -> None:
    acl.state.pools["sandbox"] = {"vms": [120], "storage": ["local-lvm"]}
    grant(acl, "/pool/sandbox", "PVEVMAdmin", "users", "alice@pve")
    grant(acl, "/pool/sandbox", "PVEDatastoreUser", "users", "alice@pve")
    assert acl.check("alice@pve", "/vms/120", ["VM.Clone"], noerr=True)
    assert not acl.check("alice@pve", "/vms/121", ["VM.Clone"], noerr=True)
    assert acl.check("alice@pve", "/storage/local-lvm", ["Datastore.AllocateSpace"], noerr=True)
    assert acl.permissions("alice@pve", "/vms/120")["VM.Clone"] is False  # pool roles never propagate


def test_tokens_privsep_and_full(acl: AccessControl) -> None:
    grant(acl, "/", "PVEAuditor", "users", "alice@pve")
    grant(acl, "/", "Administrator", "tokens", "alice@pve!sep")
    assert acl.check("alice@pve!sep", "/vms/1", ["VM.Audit"], noerr=True)
    assert not acl.check("alice@pve!sep", "/vms/1", ["VM.Clone"], noerr=True)  # intersection
    assert acl.permissions("alice@pve!full", "/vms/1") == acl.permissions("alice@pve", "/vms/1")
    assert acl.permissions("alice@pve!nosuch", "/vms/1") == {}
    grant(acl, "/", "Administrator", "tokens", "root@pam!sep2")
    acl.state.users["root@pam"]["tokens"]["sep2"] = {"privsep": True}
    assert acl.check(
        "root@pam!sep2", "/vms/1", ["VM.Clone"], noerr=True
    )  # root's own tokens: no intersection


def test_schema_check_expressions(acl: AccessControl) -> None:
    grant(acl, "/vms/9000", "PVETemplateUser", "users", "alice@pve")
    with pytest.raises(PVEError) as exc:
        acl.exec_check(CLONE_CHECK, "alice@pve", {"vmid": 9000, "newid": 101})
    assert (exc.value.status, exc.value.message) == (403, "Permission check failed\n")
    grant(acl, "/pool/sbx", "PVEVMAdmin", "users", "alice@pve")
    acl.exec_check(CLONE_CHECK, "alice@pve", {"vmid": 9000, "newid": 101, "pool": "sbx"})
    with pytest.raises(PVEError) as exc:
        acl.exec_check(CLONE_CHECK, "alice@pve", {"vmid": 9001, "newid": 101, "pool": "sbx"})
    assert exc.value.message == "Permission check failed (/vms/9001, VM.Clone)\n"
    any_check = ["perm", "/vms/{vmid}", ["VM.Config.Disk", "VM.Config.CPU"], "any", 1]
    grant(acl, "/vms/7", "PVEVMUser", "users", "bob@pve")
    with pytest.raises(PVEError) as exc:
        acl.exec_check(any_check, "bob@pve", {"vmid": 7})
    assert exc.value.message == "Permission check failed (/vms/7, VM.Config.Disk|VM.Config.CPU)\n"
    self_check = ["or", ["userid-param", "self"], ["userid-group", ["User.Modify"]]]
    acl.exec_check(self_check, "bob@pve", {"userid": "bob@pve"})
    with pytest.raises(PVEError):
        acl.exec_check(self_check, "bob@pve", {"userid": "alice@pve"})
    with pytest.raises(PVEError) as exc:  # a token is not its user
        acl.exec_check(self_check, "alice@pve!sep", {"userid": "alice@pve"})
    assert exc.value.status == 403
    acl.check_api2({"user": "all"}, "bob@pve", {})
    with pytest.raises(PVEError) as exc:
        acl.check_api2(None, "bob@pve", {})
    assert exc.value.message == "Permission check failed (user != root@pam)\n"


def test_token_verification(acl: AccessControl) -> None:
    assert acl.verify_api_token("PVEAPIToken=alice@pve!sep=s1") == "alice@pve!sep"
    assert acl.verify_api_token("PVEAPIToken alice@pve!full=s2") == "alice@pve!full"
    for header, reason in (
        (None, "No ticket"),
        ("Bearer x", "No ticket"),
        ("PVEAPIToken=alice@pve!sep=wrong", "Authentication failed!"),
        ("PVEAPIToken=alice@pve!old=s3", "Authentication failed!"),
        ("PVEAPIToken=alice@pve=s1", "Authentication failed!"),
    ):
        with pytest.raises(PVEError) as exc:
            acl.verify_api_token(header)
        assert (exc.value.status, exc.value.reason) == (401, reason)
    acl.state.users["alice@pve"]["enable"] = False
    with pytest.raises(PVEError):
        acl.verify_api_token("PVEAPIToken=alice@pve!sep=s1")


def test_path_helpers() -> None:
    assert normalize_path("//vms//100/") == "/vms/100"
    assert normalize_path("vms") == "/vms"
    assert normalize_path("/vms/a b") is None
    assert template_replace("/pool/{pool}", {}) == "/pool/-"
    assert template_replace("/vms/{vmid}", {"vmid": 100}) == "/vms/100"


def test_a_rolled_back_change_never_hides_the_tokens(acl: AccessControl) -> None:
    """A failed request rolls the state back while other requests authenticate (without the lock):
    they must see the old or the restored users, never none (it made a CI run's workers 401)."""
    stop = threading.Event()
    failures: list[str] = []

    def roll_back_again_and_again() -> None:
        while not stop.is_set():
            backup = acl.state.snapshot()
            acl.state.restore(backup)

    roller = threading.Thread(target=roll_back_again_and_again)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the window is a few bytecodes
    roller.start()
    try:
        for _ in range(20_000):
            try:
                acl.verify_api_token("PVEAPIToken=alice@pve!sep=s1")
            except PVEError as exc:
                failures.append(exc.reason)
    finally:
        stop.set()
        roller.join()
        sys.setswitchinterval(interval)
    assert failures == []
