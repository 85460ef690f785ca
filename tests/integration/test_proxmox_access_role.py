"""The proxmox_access role (and the Proxmox play) against the PVE API test server.

The server runs as its own process (memory engine, ``--state`` file); Ansible and the server share
nothing but HTTPS and the files the server writes (URL, CA, bootstrap token), exactly as the
``inventories/pve_testserver`` inventory reads them. The play is ``site.yml`` once
``playbooks/site.yml`` imports ``playbooks/proxmox.yml``, until then ``playbooks/proxmox.yml``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
INVENTORY = REPO / "inventories" / "pve_testserver"
POOL, ROLE, USER, TOKEN = "sandbox-pool", "SandboxRuntime", "sandbox-rt@pve", "runtime"
TOKENID = f"{USER}!{TOKEN}"
STORAGE, BRIDGE = "local-lvm", "vmbr1"
ACL_PATHS = (f"/pool/{POOL}", f"/storage/{STORAGE}", f"/sdn/zones/localnetwork/{BRIDGE}")
PRIVILEGES = {
    "VM.Allocate",
    "VM.Clone",
    "VM.Audit",
    "VM.PowerMgmt",
    "VM.Config.CPU",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.Options",
    "VM.Config.Disk",
    "VM.Snapshot",
    "Datastore.AllocateSpace",
    "SDN.Use",
}
RECAP_LINE = re.compile(r"^(?P<host>\S+)\s*:\s*(?P<counts>(?:\w+=\d+\s*)+)$")
SERVER_START_TIMEOUT_S = 30.0
PLAYBOOK_TIMEOUT_S = 300.0


def playbook() -> str:
    """site.yml once playbooks/site.yml imports the Proxmox play, else the play itself."""
    site = (REPO / "playbooks" / "site.yml").read_text()
    if re.search(r"^\s*(ansible\.builtin\.)?import_playbook:\s*proxmox\.yml\s*$", site, re.M):
        return "site.yml"
    return "playbooks/proxmox.yml"


@dataclasses.dataclass
class Server:
    dir: Path
    info: dict[str, Any]
    root_secret: str

    @property
    def secret_file(self) -> Path:
        return self.dir / "secrets" / "pve-token.secret"

    def api(self, tokenid: str, secret: str) -> ProxmoxAPI:
        user, name = tokenid.split("!")
        return ProxmoxAPI(
            self.info["host"],
            port=self.info["port"],
            user=user,
            token_name=name,
            token_value=secret,
            verify_ssl=self.info["ca_file"],
            timeout=30,
        )

    @property
    def root(self) -> ProxmoxAPI:
        return self.api(self.info["token_id"], self.root_secret)

    def state(self) -> str:
        return (self.dir / "state.json").read_text()


@contextlib.contextmanager
def pve_server(directory: Path) -> Iterator[Server]:
    """``python -m pve_testserver`` in the background; stopped (and reaped) on exit."""
    directory.mkdir(parents=True, exist_ok=True)
    info_file, token_file = directory / "info.json", directory / "root.token"
    with (directory / "server.log").open("w") as log:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "pve_testserver", "--engine", "memory", "--port", "0",
                "--state", str(directory / "state.json"), "--tls-dir", str(directory / "tls"),
                "--bootstrap-token-file", str(token_file), "--info-file", str(info_file),
            ],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        info: dict[str, Any] | None = None
        while info is None:
            assert proc.poll() is None, f"the test server exited: {(directory / 'server.log').read_text()}"
            assert time.monotonic() < deadline, "the test server did not write its info file in time"
            with contextlib.suppress(OSError, ValueError):
                info = json.loads(info_file.read_text())
            if info is None:
                time.sleep(0.05)  # polling for the file the server writes once it listens
        tokenid, _, secret = token_file.read_text().strip().partition("=")
        assert tokenid == info["token_id"]
        yield Server(directory, info, secret)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@dataclasses.dataclass
class Run:
    returncode: int
    output: str
    recap: dict[str, dict[str, int]]
    seconds: float

    def total(self, key: str) -> int:
        return sum(counts.get(key, 0) for counts in self.recap.values())

    def tail(self, lines: int = 80) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def run_play(server: Server, *extra: str) -> Run:
    env = dict(os.environ, SANDBOX_RT_PVE_TESTSERVER_DIR=str(server.dir), ANSIBLE_NOCOLOR="1")
    env.pop("PROXMOX_ACCESS_API_TOKEN_SECRET", None)
    start = time.monotonic()
    proc = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(INVENTORY), playbook(), *extra],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=PLAYBOOK_TIMEOUT_S,
        check=False,
    )
    recap: dict[str, dict[str, int]] = {}
    for line in proc.stdout.split("PLAY RECAP", 1)[-1].splitlines()[1:]:
        match = RECAP_LINE.match(line.strip())
        if match:
            recap[match["host"]] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match["counts"])}
    return Run(proc.returncode, proc.stdout + proc.stderr, recap, time.monotonic() - start)


def assert_clean(run: Run, what: str) -> None:
    assert run.returncode == 0 and run.recap, f"{what} failed:\n{run.tail()}"
    assert run.total("failed") == 0 and run.total("unreachable") == 0, f"{what}: {run.recap}\n{run.tail()}"
    assert "[DEPRECATION WARNING]" not in run.output, run.tail()
    changed = [line for line in run.output.splitlines() if line.startswith("changed:")]
    assert run.total("changed") == 0, f"{what} changed something: {run.recap}\n" + "\n".join(changed)


def module_changed(run: Run, task: str, item: str) -> bool:
    """The task (a community.proxmox module) reported ``changed`` for ``item`` (its loop label)."""
    section = run.output.split(f"TASK [proxmox_access : {task}]", 1)[-1].split("TASK [", 1)[0]
    header = f"TASK [proxmox_access : {task}]"
    return header in run.output and "changed: [" in section and f"(item={item})" in section


def acl_entries(api: ProxmoxAPI) -> set[tuple[str, str, str, str, int]]:
    return {(e["path"], e["type"], e["ugid"], e["roleid"], int(e["propagate"])) for e in api.access.acl.get()}


SUBJECTS = (("user", USER), ("token", TOKENID))
# The pool role on the pool, storage and bridge; the template's clone-only role and the audit role on
# "/" only on their own path (not propagated): the template lives outside the pool.
WANTED_ACLS = {(path, kind, ugid, ROLE, 1) for path in ACL_PATHS for kind, ugid in SUBJECTS} | {
    (path, kind, ugid, role, 0)
    for path, role in (("/vms/9000", "SandboxTemplateClone"), ("/", "SandboxRuntimeAudit"))
    for kind, ugid in SUBJECTS
}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Run]]:
    """A server the play converged once (at -vvv: the run whose output must not show the new secret)."""
    with pve_server(tmp_path_factory.mktemp("pve-prepared")) as server:
        first = run_play(server, "-vvv")
        assert first.returncode == 0 and first.total("failed") == 0, first.tail()
        assert first.total("changed") > 0, first.recap
        assert "[DEPRECATION WARNING]" not in first.output, first.tail()
        yield server, first


def test_converges_to_pool_role_user_token_and_acls(prepared: tuple[Server, Run]) -> None:
    server, _first = prepared
    root = server.root
    assert POOL in {p["poolid"] for p in root.pools.get()}
    assert set(root.access.roles(ROLE).get()) == PRIVILEGES
    assert set(root.access.roles("SandboxTemplateClone").get()) == {"VM.Clone", "VM.Audit"}
    assert set(root.access.roles("SandboxRuntimeAudit").get()) == {"Sys.Audit"}
    users = {u["userid"]: u for u in root.access.users.get(full=1)}
    assert users[USER]["enable"] == 1
    tokens = {t["tokenid"]: t for t in users[USER]["tokens"]}
    assert tokens[TOKEN]["privsep"] == 1
    ours = {e for e in acl_entries(root) if e[2] in (USER, TOKENID)}
    assert ours == WANTED_ACLS


def test_second_run_changes_nothing(prepared: tuple[Server, Run]) -> None:
    server, _first = prepared
    state = server.state()
    run = run_play(server)
    assert_clean(run, "the second run")
    assert server.state() == state
    print(f"idempotent run: {run.seconds:.1f} s")


def test_check_on_the_prepared_server_is_clean(prepared: tuple[Server, Run]) -> None:
    server, _first = prepared
    assert_clean(run_play(server, "--check"), "--check on the prepared server")


def test_check_on_a_fresh_server_reports_changes_and_creates_nothing(tmp_path: Path) -> None:
    with pve_server(tmp_path / "pve") as server:
        state = server.state()
        run = run_play(server, "--check")
        assert run.returncode == 0 and run.total("failed") == 0, run.tail()
        assert run.total("changed") > 0, run.recap
        for planned in (
            f"would create role {ROLE}",
            f"would create token {TOKENID}",
            f"would grant {ROLE} on {ACL_PATHS[0]} to token {TOKENID}",
        ):
            assert planned in run.output, planned
        # pools and users are the community.proxmox modules' (check mode: changed, nothing sent)
        assert module_changed(run, "Create missing pools", POOL), run.tail()
        assert module_changed(run, "Create missing users, update changed fields", USER), run.tail()
        assert server.state() == state, "check mode wrote to PVE"
        root = server.root
        assert POOL not in {p["poolid"] for p in root.pools.get()}
        assert USER not in {u["userid"] for u in root.access.users.get()}
        assert not server.secret_file.exists()


def test_the_secret_file_is_root_only_and_holds_a_working_token(prepared: tuple[Server, Run]) -> None:
    server, _first = prepared
    st = server.secret_file.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0, oct(st.st_mode)
    secret = server.secret_file.read_text().strip()
    api = server.api(TOKENID, secret)
    assert api.version.get()["version"]
    assert {p["poolid"] for p in api.pools.get()} <= {POOL}
    assert api.nodes("pve").storage(STORAGE).status.get()  # inside its ACLs
    outside_its_acls: list[Callable[[], Any]] = [
        lambda: api.nodes("pve").storage("local").status.get(),  # another storage
        lambda: api.access.roles.post(roleid="Escalate", privs="Sys.Modify"),
        lambda: api.access.acl.put(path="/", roles="Administrator", tokens=TOKENID),
    ]
    for outside in outside_its_acls:
        with pytest.raises(ResourceException) as err:
            outside()
        assert err.value.status_code == 403, err.value


def test_no_secret_in_the_output(prepared: tuple[Server, Run]) -> None:
    server, first = prepared
    secret = server.secret_file.read_text().strip()
    assert len(secret) >= 32
    again = run_play(server, "-vvv", "--check")
    for run in (first, again):
        assert secret not in run.output, "the runtime token's secret leaked into ansible's output"
        assert server.root_secret not in run.output, "the admin token's secret leaked into ansible's output"


def test_a_refused_write_shows_pves_message_and_no_secret(tmp_path: Path) -> None:
    """An admin token without the rights: the play stops with PVE's 403, and even the failure output
    (at -vvv) shows neither that token's secret nor anything else from the request headers."""
    with pve_server(tmp_path / "pve") as server:
        server.root.access.users.post(userid="weak@pve")
        secret = server.root.access.users("weak@pve").token("weak").post(privsep=0)["value"]
        token_file = tmp_path / "weak.token"
        token_file.write_text(f"weak@pve!weak={secret}\n")
        token_file.chmod(0o600)
        run = run_play(server, "-vvv", "-e", f"proxmox_access_api_token_file={token_file}")
        assert run.returncode != 0 and run.total("failed") == 1 and run.total("changed") == 0, run.tail()
        refused = "Failed to create pool with ID sandbox-pool: 403 Forbidden: Permission check failed"
        assert refused in run.output
        assert secret not in run.output and "PVEAPIToken" not in run.output


def test_drift_is_repaired(prepared: tuple[Server, Run]) -> None:
    server, _first = prepared
    root = server.root
    root.access.roles(ROLE).put(privs="VM.Allocate,Sys.Audit,VM.Console")
    root.access.acl.put(path="/", roles="Administrator", tokens=TOKENID)
    root.access.users(USER).token(TOKEN).put(privsep=0)
    root.access.users(USER).put(comment="edited by hand")
    repair = run_play(server)
    assert repair.returncode == 0 and repair.total("failed") == 0, repair.tail()
    for what in ("remove [Sys.Audit,VM.Console]", f"remove Administrator on / from token {TOKENID}",
                 f"update token {TOKENID} (privsep)"):  # fmt: skip
        assert what in repair.output, what
    assert module_changed(repair, "Create missing users, update changed fields", USER), repair.tail()
    assert root.access.users(USER).get()["comment"] != "edited by hand"
    assert set(root.access.roles(ROLE).get()) == PRIVILEGES
    assert {e for e in acl_entries(root) if e[2] in (USER, TOKENID)} == WANTED_ACLS
    assert root.access.users(USER).token(TOKEN).get()["privsep"] == 1
    assert_clean(run_play(server), "the run after the repair")


def test_lost_secret_stops_the_role_unless_rotation_is_allowed(tmp_path: Path) -> None:
    with pve_server(tmp_path / "pve") as server:
        assert run_play(server).returncode == 0
        old = server.secret_file.read_text().strip()
        server.secret_file.unlink()
        refused = run_play(server)
        assert refused.returncode != 0 and refused.total("failed") == 1, refused.tail()
        assert f"API token {TOKENID} exists on PVE but its secret file" in refused.output
        assert "proxmox_access_token_rotate=true" in refused.output
        assert not server.secret_file.exists()

        server.secret_file.write_text("not-the-secret\n")
        stale = run_play(server, "--check")
        assert stale.returncode != 0 and "PVE rejects the secret" in stale.output, stale.tail()

        rotated = run_play(server, "-e", "proxmox_access_token_rotate=true")
        assert rotated.returncode == 0 and rotated.total("failed") == 0, rotated.tail()
        new = server.secret_file.read_text().strip()
        assert new != old and new not in rotated.output
        assert server.api(TOKENID, new).version.get()
        with pytest.raises(ResourceException) as err:
            server.api(TOKENID, old).version.get()
        assert err.value.status_code == 401
        assert {e for e in acl_entries(server.root) if e[2] in (USER, TOKENID)} == WANTED_ACLS
        assert_clean(run_play(server), "the run after the rotation")


def test_node_audit_is_opt_in_and_taken_back(prepared: tuple[Server, Run]) -> None:
    """proxmox_access_node_audit: true grants the audit role on /nodes, propagated (a cluster's
    placement by free memory, docs/proxmox.md section 8); the default run removes it again."""
    server, _first = prepared
    root = server.root
    node_audit = {("/nodes", kind, ugid, "SandboxRuntimeAudit", 1) for kind, ugid in SUBJECTS}
    granted = run_play(server, "-e", "proxmox_access_node_audit=true")
    assert granted.returncode == 0 and granted.total("failed") == 0, granted.tail()
    assert {e for e in acl_entries(root) if e[2] in (USER, TOKENID)} == WANTED_ACLS | node_audit
    taken_back = run_play(server)
    assert taken_back.returncode == 0 and taken_back.total("failed") == 0, taken_back.tail()
    assert {e for e in acl_entries(root) if e[2] in (USER, TOKENID)} == WANTED_ACLS
