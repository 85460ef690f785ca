"""Named templates (issue 17 item 2), fast: the host contract's map, the checks before anything is
made, the choice of template on both backends, forks keep their snapshot's template, and the front
doors (CLI, HTTP API, remote client answers). Real templates built by site.yml:
tests/integration/runtime/test_named_templates.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pve_fixtures import TEMPLATE, pve_server, pve_settings
from test_manager_cleanup import FakeBackend, _key

from sandbox_rt import ConfigError, Manager, Settings
from sandbox_rt.backends.lxc import LxcBackend
from sandbox_rt.backends.proxmox import ProxmoxBackend
from sandbox_rt.backends.proxmox.description import snapshot_template
from sandbox_rt.backends.records import spec_from_json, spec_to_json, updated_record
from sandbox_rt.cli import _parser
from sandbox_rt.errors import BackendError
from sandbox_rt.models import DEFAULT_TEMPLATE, SandboxSpec
from sandbox_rt.remote import answers, calls
from sandbox_rt.validation import check_template_name, make_spec

NAMED = 9001


# -- the host contract -------------------------------------------------------------------------------
def test_settings_list_default_first_then_the_named_ones() -> None:
    s = Settings(templates={"python-data": "sandbox-template-python-data", "base": "sandbox-template-base"})
    assert s.template_names() == ["default", "base", "python-data"]
    assert Settings().template_names() == ["default"]
    pve = Settings(backend="lxc", pve_templates={"gpu": 9100})
    assert pve.template_names() == ["default"]  # the lxc backend reads `templates`


def test_settings_read_the_maps_from_host_json_and_env(tmp_path: Path) -> None:
    contract = tmp_path / "host.json"
    contract.write_text(json.dumps({"templates": {"base": "sandbox-template-base"}}))
    assert Settings.load(contract, env={}).templates == {"base": "sandbox-template-base"}
    env = {"SANDBOX_RT_PVE_TEMPLATES": '{"base": "9001"}'}
    assert Settings.load(tmp_path / "absent.json", env=env).pve_templates == {"base": 9001}


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"templates": {"default": "x"}}, "host's default template"),
        ({"templates": {"Bad_Name": "x"}}, "template name"),
        ({"templates": {"base": "../etc"}}, "not a container name"),
        ({"templates": {"base": ""}}, "not a container name"),
        ({"pve_templates": {"base": 12}}, "not a VMID"),
        ({"pve_templates": {"base": "9001"}}, "not a VMID"),
        ({"templates": ["base"]}, "must map template names"),
    ],
)
def test_bad_maps_are_config_errors(values: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        Settings(**values)


def test_a_bad_map_in_env_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pve_templates"):
        Settings.load(tmp_path / "absent.json", env={"SANDBOX_RT_PVE_TEMPLATES": '{"base": "x"}'})
    with pytest.raises(ConfigError, match="templates"):
        Settings.load(tmp_path / "absent.json", env={"SANDBOX_RT_TEMPLATES": "[1]"})


@pytest.mark.parametrize("name", ["", "-x", "A", "a_b", "a/b", "x" * 41, 3, None])
def test_bad_template_names(name: Any) -> None:
    with pytest.raises(ConfigError, match="template name"):
        check_template_name(name)
    if name is None:  # the declared meaning of None (sandbox_rt.options): the default template
        assert make_spec(template=name).template == DEFAULT_TEMPLATE
        return
    with pytest.raises(ConfigError, match="template name"):
        make_spec(template=name)


def test_the_spec_carries_the_template_and_old_records_read_as_default() -> None:
    spec = make_spec(template="base")
    assert spec.template == "base" and spec_from_json(spec_to_json(spec)) == spec
    old = spec_to_json(SandboxSpec())
    del old["template"]  # a record written before named templates
    assert spec_from_json(old).template == DEFAULT_TEMPLATE


def test_an_update_never_changes_the_template() -> None:
    backend = FakeBackend()
    rec = backend.clone("sbx-00000000b1", SandboxSpec(template="base"))
    assert updated_record(rec, SandboxSpec()).spec.template == "base"


# -- the manager: checks before anything is made -------------------------------------------------------
def _manager(backend: FakeBackend, **settings: Any) -> Manager:
    return Manager(Settings(ssh_ready_timeout_s=0.3, **settings), backend=backend, ssh_key=_key())


def test_an_unknown_template_makes_nothing() -> None:
    backend = FakeBackend()
    mgr = _manager(backend, templates={"base": "sandbox-template-base"})
    with pytest.raises(ConfigError, match=r"unknown template 'nope'; this host has: default, base"):
        mgr.create(template="nope")
    assert backend.made == {} and backend.intents == set()
    assert mgr.templates() == ["default", "base"]


def test_template_and_from_snapshot_do_not_go_together() -> None:
    backend = FakeBackend()
    with pytest.raises(ConfigError, match="from_snapshot"):
        _manager(backend).create(template="default", from_snapshot="snap1")
    assert backend.made == {}


def test_a_known_template_reaches_the_backend_and_a_failure_cleans_up() -> None:
    backend = FakeBackend(fail_at="start")
    specs: list[tuple[str, SandboxSpec]] = []
    clone = backend.clone
    backend.clone = lambda sid, spec: specs.append((sid, spec)) or clone(sid, spec)  # type: ignore[method-assign]
    mgr = _manager(backend, templates={"base": "sandbox-template-base"})
    with pytest.raises(BackendError):
        mgr.create(template="base")
    ((sid, spec),) = specs
    assert spec.template == "base" and backend.destroyed == [sid] and backend.made == {}


def test_the_pool_template_must_exist() -> None:
    backend = FakeBackend()
    with pytest.raises(ConfigError, match="unknown template"):
        Manager(Settings(), backend=backend, ssh_key=_key(), pool_size=1, pool_spec={"template": "base"})
    assert backend.made == {}


# -- LXC: which template dir a sandbox and its forks are cloned from -------------------------------------
def test_lxc_unknown_template_fails_before_anything_is_made(tmp_path: Path) -> None:
    backend = LxcBackend(Settings(lxc_path=tmp_path, templates={"base": "tpl-base"}))
    with pytest.raises(ConfigError, match="unknown template"):
        backend.clone("sbx-00000000c1", SandboxSpec(template="other"))
    with pytest.raises(BackendError, match=r"template 'base' \(tpl-base\) not found"):
        backend.clone("sbx-00000000c1", SandboxSpec(template="base"))
    assert not (tmp_path / "sbx-00000000c1").exists()
    assert backend.templates.slot_dir("base") == tmp_path / "tpl-base"
    assert backend.templates.slot_dir(DEFAULT_TEMPLATE) == tmp_path / "sandbox-template"


def test_lxc_fork_takes_its_snapshots_template(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = LxcBackend(Settings(lxc_path=tmp_path, templates={"base": "tpl-base"}))
    snap = tmp_path / "snap-s1"
    (snap / "delta").mkdir(parents=True)
    (snap / "snapshot.json").write_text(
        json.dumps({"name": "s1", "source_id": "sbx-00000000c2", "created_at": 1.0, "backend": "lxc",
                    "template": "base"})
    )  # fmt: skip
    seen: list[tuple[SandboxSpec, str | None]] = []
    monkeypatch.setattr(
        backend, "clone", lambda sid, spec, delta=None, container=None: seen.append((spec, container))
    )
    backend.clone_from_snapshot("sbx-00000000c3", SandboxSpec(), "s1")
    # a snapshot from before template generations: its template's slot (here absent: clone says so)
    assert seen[0] == (SandboxSpec(template="base"), "tpl-base")
    assert backend.list_snapshots()[0].template == "base"


# -- Proxmox VE: the template's VMID -------------------------------------------------------------------
@pytest.fixture
def pve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    with pve_server(TEMPLATE, NAMED) as srv:
        sources: dict[int, int] = {}  # clone VMID -> the VMID it was cloned from
        real = srv.engine.clone

        def clone(source_vmid: int, vmid: int, config: Any) -> None:
            sources[vmid] = source_vmid
            real(source_vmid, vmid, config)

        monkeypatch.setattr(srv.engine, "clone", clone)
        settings = pve_settings(srv, tmp_path, pve_templates={"base": NAMED})
        yield ProxmoxBackend(settings), sources


def test_pve_clones_the_named_templates_vmid(pve: Any) -> None:
    backend, sources = pve
    rec = backend.clone("sbx-00000000d1", SandboxSpec(template="base"))
    plain = backend.clone("sbx-00000000d2", SandboxSpec())
    assert rec.spec.template == "base" and backend.get(rec.id).spec.template == "base"
    assert sources[backend._find(rec.id)[1]] == NAMED
    assert sources[backend._find(plain.id)[1]] == TEMPLATE
    with pytest.raises(ConfigError, match="unknown template"):
        backend.clone("sbx-00000000d3", SandboxSpec(template="gone"))


def test_pve_snapshots_carry_the_template_to_forks(pve: Any) -> None:
    backend, _sources = pve
    backend.clone("sbx-00000000d4", SandboxSpec(template="base"))
    info = backend.snapshot("sbx-00000000d4", "base1")
    assert info.template == "base"
    assert [s.template for s in backend.list_snapshots()] == ["base"]
    fork = backend.clone_from_snapshot("sbx-00000000d5", SandboxSpec(), "base1")
    assert fork.spec.template == "base"


@pytest.mark.parametrize(
    ("description", "template"),
    [
        ("sandbox-rt snapshot of sbx-0000000001; template base", "base"),
        ("sandbox-rt snapshot of sbx-0000000001", "default"),  # older snapshots
        ("sandbox-rt snapshot of sbx-0000000001; template ../X", "default"),
        ("", "default"),
    ],
)
def test_pve_snapshot_template_from_its_description(description: str, template: str) -> None:
    assert snapshot_template(description) == template


# -- the front doors ---------------------------------------------------------------------------------
def test_cli_takes_template_and_lists_them() -> None:
    args = _parser().parse_args(["create", "--template", "base"])
    assert args.template == "base"
    assert _parser().parse_args(["run", "--", "true"]).template is None
    assert _parser().parse_args(["template", "ls"]).action == "ls"
    removing = _parser().parse_args(["template", "rm", "base"])  # issue 27: build and rm joined ls
    assert (removing.action, removing.target) == ("rm", "base")
    with pytest.raises(SystemExit):
        _parser().parse_args(["template", "frobnicate"])


def test_remote_create_sends_template_only_when_given() -> None:
    assert calls.create(template="base").json["template"] == "base"
    assert "template" not in calls.create().json


@pytest.mark.parametrize("bad", [{"templates": ["default", "../x"]}, {"templates": "default"}, {},
                                 {"templates": ["A"]}, {"templates": ["x"] * 1025}])  # fmt: skip
def test_a_lying_servers_template_list_is_refused(bad: Any) -> None:
    with pytest.raises(BackendError):
        answers.parse_templates(bad)


def test_a_servers_template_list_and_status_are_read() -> None:
    assert answers.parse_templates({"templates": ["default", "base"]}) == ["default", "base"]
    status = {
        "id": "sbx-0000000001", "state": "running", "ip": "10.99.1.2", "hostname": "h", "cpus": 1,
        "memory_mb": 512, "disk_gb": 4, "internet": False, "uptime_s": None, "usage": {}, "labels": {},
        "expires_at": None, "template": "base",
    }  # fmt: skip
    assert answers.parse_status(status).template == "base"
    with pytest.raises(BackendError):
        answers.parse_status({**status, "template": "Not A Name"})
    assert answers.parse_status({k: v for k, v in status.items() if k != "template"}).template == "default"
