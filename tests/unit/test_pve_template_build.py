"""Templates from code on Proxmox VE (issue 27), fast: the API side of ``Manager.build_template`` and
``remove_template`` against the PVE API test server (in-memory engine) with the runtime's
least-privilege token and the operator's admin token, as roles/proxmox_access leaves them. What runs
in the CT over SSH (the pyinfra steps, the controls' snapshots, the clean-up) is faked here; the real
thing is tests/integration/test_template_from_code_pve.py on the emulated node.

Every failure path leaves nothing: no CT, no ACL, no registry entry."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proxmoxer.tools import Tasks

from pve_testserver import PVETestServer
from sandbox_rt import ConfigError, Settings, Template
from sandbox_rt.backends.proxmox import ProxmoxBackend
from sandbox_rt.errors import BackendError, PermissionDenied, StateConflict, TemplateBuildError
from sandbox_rt.manager import Manager, new_sandbox_id
from sandbox_rt.models import ExecResult
from sandbox_rt.template_registry import BuiltTemplate, TemplateRegistry
from sandbox_rt.templates import ct_checks, ops, pve_store
from sandbox_rt.templates.build import build_template, remove_template
from sandbox_rt.validation import make_spec
from tests.pve_env import (
    POOL,
    TEMPLATE_ROLE,
    TOKEN,
    USER,
    make_ct_template,
    runtime_settings,
    runtime_token,
)

NODE = "pve"
TEMPLATE_VMID = 9000
CONTROLS: dict[str, Any] = {
    "setid": {"/usr/bin/su": 0o4755},
    "caps": [],
    "devices": [],
    "protected": {"/etc/ssh/sshd_config": {"mode": 0o644, "sha256": "a"}},
    "sshd": "permitrootlogin no",
    "user": "sandbox:x:1000:1000::/home/sandbox:/bin/bash",
    "uid0": [],
    "groups": [],
}


class FakeBox:
    """What the build needs of a Sandbox: its id, root commands (recorded), close."""

    def __init__(self, sandbox_id: str, ran: list[str]) -> None:
        self.id, self.ran = sandbox_id, ran

    def exec(self, command: Any, **kw: Any) -> ExecResult:
        text = command if isinstance(command, str) else " ".join(command)
        self.ran.append(text)
        return ExecResult(text, b"", b"", 0, 0.0)

    def close(self) -> None:
        pass


@dataclasses.dataclass
class Env:
    srv: PVETestServer
    root: Any
    settings: Settings
    manager: Manager
    admin_file: Path
    ran: list[str]
    after: dict[str, Any]  # the controls' snapshot after the steps (a test breaks one)

    @property
    def backend(self) -> ProxmoxBackend:
        backend = self.manager.backend
        assert isinstance(backend, ProxmoxBackend)
        return backend

    def cts(self) -> set[int]:
        return {int(v) for v in self.srv.state.cts}

    def build(self, name: str = "tools", **kw: Any) -> Any:
        return build_template(self.manager, Template().run("true"), name, **kw)


def _wait(api: Any, upid: str) -> None:
    assert Tasks.blocking_status(api, upid, timeout=10, polling_interval=0.02)["exitstatus"] == "OK"


def _admin_file(path: Path, tokenid: str, secret: str) -> Path:
    path.write_text(f"{tokenid}={secret}\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    with PVETestServer() as srv:
        root = srv.client()
        secret = runtime_token(root, "vmbr1", (TEMPLATE_VMID,))
        make_ct_template(root, NODE, TEMPLATE_VMID, "vmbr1")
        admin_file = _admin_file(tmp_path / "admin.token", *srv.root_token)
        settings = runtime_settings(
            Settings(),
            srv,
            secret,
            pve_template_vmid=TEMPLATE_VMID,
            pve_admin_token_file=str(admin_file),
            state_dir=tmp_path / "state",
        )
        manager = Manager(settings, backend=ProxmoxBackend(settings), ssh_key=tmp_path / "no-key")
        ran: list[str] = []
        after = dict(CONTROLS)

        def create(**kw: Any) -> FakeBox:
            spec = make_spec(
                host_cpus=2,
                root=kw["root"],
                template=kw["template"],
                egress=kw["egress"],
                labels=kw["labels"],
                memory_mb=kw["memory_mb"],
                ttl_s=kw["ttl_s"],
            )
            sid = new_sandbox_id()
            backend = manager.backend
            assert isinstance(backend, ProxmoxBackend)
            backend.begin(sid)
            try:
                backend.clone(sid, spec)
                backend.start(sid)
            finally:
                backend.end(sid)
            return FakeBox(sid, ran)

        snapshots = iter([])

        def controls_of(sandbox: Any, *, user: str, timeout_s: float = 300.0) -> dict[str, Any]:
            nonlocal snapshots
            return next(snapshots, None) or dict(CONTROLS)

        def apply_steps(sandbox: Any, steps: Any, log: Any, *, timeout_s: float = 0) -> None:
            nonlocal snapshots
            ran.append("steps: " + ", ".join(s.describe() for s in steps))
            snapshots = iter([after])

        monkeypatch.setattr(manager, "create", create)
        monkeypatch.setattr(ct_checks, "controls_of", controls_of)
        monkeypatch.setattr(ops, "apply_steps", apply_steps)
        yield Env(srv, root, settings, manager, admin_file, ran, after)


def _runtime_api(env: Env) -> Any:
    return env.backend.api


# -- the build ---------------------------------------------------------------------------------------
def test_a_build_becomes_a_clone_only_template_outside_the_pool(env: Env) -> None:
    result = env.build()
    entry = result.template
    assert not result.cached and entry.backend == "proxmox" and entry.vmid is not None
    vmid = entry.vmid
    assert env.cts() == {TEMPLATE_VMID, vmid}  # the build CT itself, nothing else
    conf = env.root.nodes(NODE).lxc(vmid).config.get()
    assert int(conf["template"]) == 1
    assert "tags" not in conf and "env" not in conf  # no sandbox identity, no root on request
    assert (
        conf["description"].startswith(pve_store.BUILT_PREFIX)
        and "sandbox-rt-record" not in conf["description"]
    )
    assert conf["hostname"] == entry.container
    members = {m.get("vmid") for m in env.root.pools(POOL).get()["members"]}
    assert vmid not in members
    acl = {(a["path"], a["ugid"], a["roleid"], a["propagate"]) for a in env.root.access.acl.get()}
    assert (f"/vms/{vmid}", f"{USER}!{TOKEN}", TEMPLATE_ROLE, 0) in acl
    assert (f"/vms/{vmid}", USER, TEMPLATE_ROLE, 0) in acl
    rules = env.root.nodes(NODE).lxc(vmid).firewall.rules.get()
    assert not [r for r in rules if str(r.get("comment", "")).startswith("sandbox-rt")]
    # the steps ran, then the clean-up; the registry has it, and create may name it
    assert env.ran[0] == "steps: run(true)" and "authorized_keys/root" in env.ran[-1]
    assert TemplateRegistry(env.settings.state_dir).get("tools") == entry
    assert "tools" in env.settings.template_names()
    assert env.backend._template_vmid("tools") == vmid
    assert env.manager.list() == []  # the template is no sandbox
    # the runtime's token may clone it, but not change, start or delete it
    api = _runtime_api(env)
    with pytest.raises(PermissionDenied):
        env.backend._call("t", lambda: api.nodes(NODE).lxc(vmid).config.put(description="x"))
    with pytest.raises(PermissionDenied):
        env.backend._call("t", lambda: api.nodes(NODE).lxc(vmid).delete())
    # a sandbox of it without root is refused before anything is made (docs/proxmox.md, "Root-tainted
    # sources"); with root it is a linked clone of the template
    with pytest.raises(ConfigError, match="root=True only"):
        env.backend.clone("sbx-00000000e0", make_spec(host_cpus=2, template="tools"))
    assert env.manager.list() == []
    rec = env.backend.clone("sbx-00000000e1", make_spec(host_cpus=2, template="tools", root=True))
    node, clone_vmid = env.backend._find(rec.id)
    rootfs = env.root.nodes(node).lxc(clone_vmid).config.get()["rootfs"]
    assert f"base-{vmid}-disk-0/" in rootfs and rec.spec.template == "tools"


def test_the_same_definition_again_is_a_cache_hit(env: Env) -> None:
    first = env.build()
    before = env.cts()
    again = env.build()
    assert again.cached and again.template == first.template and env.cts() == before
    rebuilt = env.build(skip_cache=True)  # the old template goes once the new one is recorded
    assert not rebuilt.cached and rebuilt.template.vmid != first.template.vmid
    assert env.cts() == {TEMPLATE_VMID, rebuilt.template.vmid}


def test_a_template_that_vanished_is_rebuilt(env: Env) -> None:
    first = env.build()
    assert first.template.vmid is not None
    _wait(env.root, env.root.nodes(NODE).lxc(first.template.vmid).delete())
    again = env.build()
    assert not again.cached and again.template.vmid in env.cts()


def test_egress_names_are_resolved_here_and_named_in_the_ct(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    def getaddrinfo(host: str, *_a: Any, **_k: Any) -> list[Any]:
        if host == "mirror.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.7", 0))]
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    resolver = types.SimpleNamespace(
        getaddrinfo=getaddrinfo,
        gaierror=socket.gaierror,
        AF_INET=socket.AF_INET,
        SOCK_STREAM=socket.SOCK_STREAM,
    )
    monkeypatch.setattr(pve_store, "socket", resolver)  # the build's lookups only (not the API's)
    assert pve_store.resolve_egress(["198.51.100.0/24", "mirror.test"]) == (
        ["198.51.100.0/24", "192.0.2.7"],
        {"mirror.test": ["192.0.2.7"]},
    )
    before = env.cts()
    with pytest.raises(ConfigError, match=r"does not resolve.*addresses only"):
        build_template(env.manager, Template().allow("gone.test").run("true"), "tools")
    assert env.cts() == before
    build_template(env.manager, Template().allow("mirror.test").run("true"), "tools")
    assert any(pve_store.HOSTS_BEGIN in c for c in env.ran)
    hosts = pve_store.hosts_block({"mirror.test": ["192.0.2.7"]})
    assert "192.0.2.7 mirror.test" in hosts and hosts.count("sandbox-rt build egress") == 2


# -- the admin token ---------------------------------------------------------------------------------
def test_without_the_admin_token_nothing_is_made(env: Env) -> None:
    env.manager.settings = dataclasses.replace(env.settings, pve_admin_token_file="")
    with pytest.raises(ConfigError, match=r"pve_admin_token_file.*SANDBOX_RT_PVE_ADMIN_TOKEN_FILE"):
        env.build()
    assert env.cts() == {TEMPLATE_VMID} and TemplateRegistry(env.settings.state_dir).read() == {}


def test_the_admin_token_file_must_be_private_and_well_formed(env: Env, tmp_path: Path) -> None:
    secret = env.srv.root_token[1]
    env.admin_file.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others") as info:
        pve_store.read_admin_token(env.settings)
    env.admin_file.write_text("not a token\n")
    env.admin_file.chmod(0o600)
    with pytest.raises(ConfigError, match="USER@REALM!TOKENID=SECRET") as bad:
        pve_store.read_admin_token(env.settings)
    for error in (info.value, bad.value):
        assert secret not in str(error)
    token = pve_store.read_admin_token(
        dataclasses.replace(
            env.settings, pve_admin_token_file=str(_admin_file(tmp_path / "t", "a@pam!x", "s3"))
        )
    )
    assert (token.tokenid, token.secret) == ("a@pam!x", "s3") and "s3" not in repr(token)


def test_the_setting_comes_from_the_environment(tmp_path: Path) -> None:
    env = {"SANDBOX_RT_PVE_ADMIN_TOKEN_FILE": "/etc/sandbox_rt/pve-admin.token"}
    assert (
        Settings.load(tmp_path / "absent.json", env=env).pve_admin_token_file
        == env["SANDBOX_RT_PVE_ADMIN_TOKEN_FILE"]
    )


def test_an_admin_token_without_the_privileges_leaves_nothing(env: Env, tmp_path: Path) -> None:
    """The runtime's own token as the "admin": PVE refuses the pool move; the CT goes."""
    _admin_file(env.admin_file, env.settings.pve_token_id, env.settings.pve_token_secret)
    with pytest.raises(PermissionDenied, match="admin token"):
        env.build()
    assert env.cts() == {TEMPLATE_VMID} and TemplateRegistry(env.settings.state_dir).read() == {}


# -- failures leave nothing ----------------------------------------------------------------------------
def _nothing_left(env: Env) -> None:
    assert env.cts() == {TEMPLATE_VMID}
    assert TemplateRegistry(env.settings.state_dir).read() == {}
    assert not [p for p in env.root.access.acl.get() if p["path"] not in ("/", f"/vms/{TEMPLATE_VMID}")
                and not p["path"].startswith(("/pool", "/storage", "/sdn"))]  # fmt: skip
    assert env.manager.list() == []


def test_a_failed_step_destroys_the_build_sandbox(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_a: Any, **_k: Any) -> None:
        raise TemplateBuildError("run(false) failed", step="step 1/1 run(false)")

    monkeypatch.setattr(ops, "apply_steps", fail)
    with pytest.raises(TemplateBuildError, match=r"run\(false\) failed"):
        env.build()
    _nothing_left(env)


@pytest.mark.parametrize(
    ("change", "control"),
    [
        ({"setid": {"/usr/bin/su": 0o4755, "/usr/local/bin/x": 0o4755}}, "SBX-ESC-05"),
        ({"protected": {"/etc/ssh/sshd_config": {"mode": 0o644, "sha256": "b"}}}, "SBX-SSH-01"),
        ({"sshd": "permitrootlogin yes"}, "sshd -T"),
        ({"groups": ["sudo"]}, "SBX-USER-01 the sandbox user joined groups: sudo"),
        ({"caps": ["/usr/bin/ping"]}, "SBX-ESC-26"),
    ],
)
def test_a_broken_control_refuses_the_template(env: Env, change: dict[str, Any], control: str) -> None:
    env.after.update(change)
    with pytest.raises(TemplateBuildError) as info:
        env.build()
    assert info.value.step == "hardening checks" and control in (info.value.detail or "")
    _nothing_left(env)


def test_a_failure_after_the_conversion_removes_the_template(env: Env) -> None:
    """The ACL write fails (no such role) after PVE converted the CT: the template goes."""
    settings = dataclasses.replace(env.settings, pve_template_role="NoSuchRole")
    env.manager.settings = env.backend.settings = settings
    with pytest.raises(BackendError, match="NoSuchRole"):
        env.build()
    _nothing_left(env)


def test_a_registry_that_cannot_be_written_removes_the_template(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    def put(self: Any, entry: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(TemplateRegistry, "put", put)
    with pytest.raises(OSError, match="No space"):
        env.build()
    _nothing_left(env)


def test_an_interrupted_stop_removes_the_build_ct(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    def stop(sandbox_id: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(env.backend, "stop", stop)
    with pytest.raises(KeyboardInterrupt):
        env.build()
    _nothing_left(env)


# -- remove ------------------------------------------------------------------------------------------
def test_remove_is_refused_while_used_then_deletes_the_template(env: Env) -> None:
    vmid = env.build().template.vmid
    rec = env.backend.clone("sbx-00000000e2", make_spec(host_cpus=2, template="tools", root=True))
    with pytest.raises(StateConflict, match=f"in use by sandbox {rec.id}"):
        remove_template(env.manager, "tools")
    assert vmid in env.cts() and TemplateRegistry(env.settings.state_dir).get("tools") is not None
    env.backend.destroy(rec.id)
    assert remove_template(env.manager, "tools").vmid == vmid
    assert env.cts() == {TEMPLATE_VMID} and TemplateRegistry(env.settings.state_dir).read() == {}
    assert not [a for a in env.root.access.acl.get() if a["path"] == f"/vms/{vmid}"]
    with pytest.raises(ConfigError, match="no template named"):
        remove_template(env.manager, "tools")


def test_remove_is_refused_when_pve_keeps_a_base_linked_clones_use(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone else's linked clone of the template (not a sandbox of this runtime): PVE's destroy
    task fails (PVE::Storage::vdisk_free, storages whose clones reference the base volume); the
    entry stays and the error says why."""
    vmid = env.build().template.vmid
    real_wait = pve_store._AdminCore.wait

    def wait(self: Any, upid: str, step: str) -> None:
        if step == "remove":
            raise BackendError(
                f"task failed: base volume 'base-{vmid}-disk-0' is still in use by linked clones", step=step
            )
        real_wait(self, upid, step)

    monkeypatch.setattr(pve_store._AdminCore, "wait", wait)
    with pytest.raises(StateConflict, match="linked clones of CT"):
        remove_template(env.manager, "tools")
    assert TemplateRegistry(env.settings.state_dir).get("tools") is not None


def test_remove_needs_the_admin_token(env: Env) -> None:
    env.build()
    env.manager.settings = dataclasses.replace(env.settings, pve_admin_token_file="")
    with pytest.raises(ConfigError, match=r"remove templates built from code.*pve_admin_token_file"):
        remove_template(env.manager, "tools")


# -- the registry and the controls -------------------------------------------------------------------
def test_registry_entries_carry_the_vmid_and_old_files_load(tmp_path: Path) -> None:
    key = "a" * 64
    old_entry = {"container": "built-t-aaaaaaaaaaaa", "key": key, "base": "default", "backend": "lxc"}
    old = {"version": 1, "templates": {"t": {**old_entry, "built_at": 1.0, "steps": []}}}
    (tmp_path / "templates.json").write_text(json.dumps(old))
    assert TemplateRegistry(tmp_path).get("t") == BuiltTemplate(
        "t", "built-t-aaaaaaaaaaaa", key, "default", "lxc", 1.0
    )
    registry = TemplateRegistry(tmp_path)
    registry.put(
        BuiltTemplate("p", "built-p-aaaaaaaaaaaa", key, "default", "proxmox", 2.0, ("run(x)",), 4242)
    )
    assert json.loads((tmp_path / "templates.json").read_text())["templates"]["p"]["vmid"] == 4242
    assert registry.get("p") is not None and registry.get("p").vmid == 4242  # type: ignore[union-attr]
    assert Settings(state_dir=tmp_path).pve_template_vmids() == {"p": 4242}
    bad = {"version": 1, "templates": {"q": {**old["templates"]["t"], "backend": "proxmox"}}}  # type: ignore[index]
    (tmp_path / "templates.json").write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match="without a vmid"):
        registry.read()


def test_controls_compare_names_each_broken_control() -> None:
    ct_checks.compare_controls(CONTROLS, dict(CONTROLS), user="sandbox")
    after = {
        **CONTROLS,
        "setid": {"/usr/bin/su": 0o6755},
        "protected": {"/etc/ssh/sshd_config.d/x.conf": {"mode": 0o644}, **CONTROLS["protected"]},
        "user": "sandbox:x:0:0::/root:/bin/bash",
        "uid0": ["toor"],
        "devices": ["/home/sandbox/sda"],
    }
    with pytest.raises(TemplateBuildError) as info:
        ct_checks.compare_controls(CONTROLS, after, user="sandbox")
    detail = info.value.detail or ""
    for expected in (
        "SBX-ESC-05 no new setuid/setgid programs: /usr/bin/su (6755)",
        "SBX-SSH-01..04,06 sshd configuration: the build changed /etc/ssh/sshd_config.d/x.conf",
        "SBX-USER-01 the sandbox user's account changed",
        "SBX-USER-01 a second uid-0 account: toor",
        "SBX-ESC-04 no device nodes: /home/sandbox/sda",
    ):
        assert expected in detail, detail
    assert str(os.getpid()) not in detail


# -- the test server's LXC engine: a clone of a converted build CT has that CT's files ---------------
def test_the_lxc_engine_clones_a_clones_own_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pve_testserver import LxcEngine

    engine = LxcEngine(tmp_path, "sandbox-template", prefix="t-", templates={9001: "named-template"})
    copies: list[tuple[str, int]] = []
    ran: list[list[str]] = []

    def copy(template: str, vmid: int, config: Any) -> None:
        copies.append((template, vmid))
        cdir = tmp_path / engine.ct_name(vmid)
        (cdir / "delta0").mkdir(parents=True)
        lower = tmp_path / template / "rootfs"
        (cdir / "config").write_text(f"lxc.rootfs.path = overlay:{lower}:{cdir / 'delta0'}\n")

    monkeypatch.setattr(engine, "_copy", copy)
    monkeypatch.setattr(engine, "_run", lambda cmd, *a, **k: ran.append(list(cmd)) or "")
    engine.create(9000, {})  # the OS template's CT: nothing of its own
    engine.clone(9000, 100, {})
    engine.clone(9001, 101, {})  # a named template: its LXC template
    engine.clone(100, 102, {})  # a clone (a build CT converted to a template): its own files too
    assert copies == [
        ("sandbox-template", 9000),
        ("sandbox-template", 100),
        ("named-template", 101),
        ("sandbox-template", 102),
    ]
    assert ran == [["cp", "-a", "--no-target-directory", "--", str(tmp_path / "t-100/delta0"),
                    str(tmp_path / "t-102/delta0")]]  # fmt: skip
