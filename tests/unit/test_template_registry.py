"""The registry of built templates and its merge into the host's template names (what create(),
the HTTP API, MCP and the OpenSandbox dialect read), and the builder's refusals before anything is
made: another backend, a reserved or inventory name, a template in use; a cache hit makes nothing."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
from test_manager_cleanup import FakeBackend, _key

from sandbox_rt import ConfigError, Manager, Settings, StateConflict, Template
from sandbox_rt.models import SandboxSpec
from sandbox_rt.templates import (
    BuiltTemplate,
    TemplateRegistry,
    build_template,
    list_templates,
    remove_template,
)
from sandbox_rt.templates.cache import cache_key
from sandbox_rt.templates.lxc_store import base_identity, container_name

KEY = "ab" * 32


def _entry(name: str = "tools", key: str = KEY) -> BuiltTemplate:
    return BuiltTemplate(name, container_name(name, key), key, "default", "lxc", time.time(), ("run(true)",))


def test_put_read_remove(tmp_path: Path) -> None:
    reg = TemplateRegistry(tmp_path / "state")
    assert reg.read() == {}  # no file: none
    assert reg.put(_entry()) is None
    assert reg.get("tools") == _entry().__class__(**{**dataclasses.asdict(reg.get("tools") or _entry())})
    old = reg.put(_entry(key="cd" * 32))
    assert old is not None and old.key == KEY
    assert reg.remove("tools") is not None and reg.read() == {}
    assert reg.remove("tools") is None


@pytest.mark.parametrize(
    "text",
    ["not json", "[]", '{"version": 2, "templates": {}}', '{"version": 1}',
     '{"version": 1, "templates": {"x": {"container": "../etc", "key": "' + KEY + '", "base": "d", '
     '"built_at": 1}}}',
     '{"version": 1, "templates": {"x": {"container": "built-x", "key": "short", "base": "d", '
     '"built_at": 1}}}'],
)  # fmt: skip
def test_a_malformed_registry_is_a_config_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "templates.json").write_text(text)
    with pytest.raises(ConfigError, match="template registry"):
        TemplateRegistry(tmp_path).read()


def test_settings_merge_built_templates_live(tmp_path: Path) -> None:
    s = Settings(state_dir=tmp_path, templates={"inv": "sandbox-template-inv"})
    assert s.template_names() == ["default", "inv"]
    TemplateRegistry(tmp_path).put(_entry("tools"))  # after the settings were made: seen at once
    assert s.template_names() == ["default", "inv", "tools"]
    assert s.lxc_templates()["tools"] == container_name("tools", KEY)
    s.check_template("tools")
    TemplateRegistry(tmp_path).remove("tools")
    with pytest.raises(ConfigError, match="unknown template 'tools'"):
        s.check_template("tools")
    pve_built = dataclasses.replace(_entry("pvebuilt"), backend="proxmox", vmid=4242)
    TemplateRegistry(tmp_path).put(pve_built)
    assert "pvebuilt" not in s.template_names()  # only this backend's


def test_the_inventory_wins_a_shared_name(tmp_path: Path) -> None:
    TemplateRegistry(tmp_path).put(_entry("inv"))
    s = Settings(state_dir=tmp_path, templates={"inv": "sandbox-template-inv"})
    assert s.lxc_templates()["inv"] == "sandbox-template-inv"


def _manager(tmp_path: Path, fake: FakeBackend | None = None, **settings: object) -> Manager:
    lxc = tmp_path / "lxc"
    (lxc / "sandbox-template" / "rootfs").mkdir(parents=True, exist_ok=True)
    (lxc / "sandbox-template" / "config").write_text(
        f"lxc.rootfs.path = dir:{lxc / 'sandbox-template/rootfs'}\n"
    )
    s = Settings(state_dir=tmp_path / "state", lxc_path=lxc, **settings)  # type: ignore[arg-type]
    return Manager(s, backend=fake or FakeBackend(), ssh_key=_key())


def test_names_the_builder_refuses_make_nothing(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr = _manager(tmp_path, backend, templates={"inv": "sandbox-template-inv"})
    for name, needle in (
        ("default", "default template"),
        ("inv", "inventory"),
        ("Bad_Name", "template name"),
    ):
        with pytest.raises(ConfigError, match=needle):
            build_template(mgr, Template().run("true"), name)
    with pytest.raises(ConfigError, match="unknown template 'absent'"):
        build_template(mgr, Template().from_template("absent").run("true"), "x")
    with pytest.raises(ConfigError, match=r"sandbox_rt\.Template"):
        mgr.build_template("run true", "x")  # type: ignore[arg-type]
    assert backend.made == {}


def test_proxmox_without_the_admin_token_is_a_clear_config_error(tmp_path: Path) -> None:
    """Proxmox VE builds need the operator's admin token (tests/unit/test_pve_template_build.py)."""
    backend = FakeBackend()
    pve = {"pve_url": "https://pve.invalid:8006", "pve_token_id": "u@pve!t", "pve_token_secret": "s"}
    mgr = _manager(tmp_path, backend, backend="proxmox", pve_template_vmid=100, **pve)
    with pytest.raises(ConfigError, match=r"admin API token.*pve_admin_token_file"):
        mgr.build_template(Template().run("true"), "tools")
    with pytest.raises(ConfigError, match="no template named 'tools'"):
        remove_template(mgr, "tools")
    assert backend.made == {}


def test_a_cache_hit_makes_no_sandbox(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr = _manager(tmp_path, backend)
    t = Template().run("make")
    key = cache_key(t, base_identity(mgr.settings, "default", None))
    entry = _entry("tools", key)
    TemplateRegistry(mgr.settings.state_dir).put(entry)
    (mgr.settings.lxc_path / entry.container).mkdir()
    log: list[str] = []
    result = mgr.build_template(t, "tools", on_log=log.append)
    assert result.cached and result.template == entry and backend.made == {}
    assert log == [f"cache hit: tools is {entry.container} (key {key[:12]})"]
    assert list_templates(mgr) == [entry]


def test_a_template_in_use_is_not_removed_or_rebuilt(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr = _manager(tmp_path, backend)
    entry = _entry("tools")
    TemplateRegistry(mgr.settings.state_dir).put(entry)
    (mgr.settings.lxc_path / entry.container).mkdir()
    user = backend.clone("sbx-00000000aa", SandboxSpec(template="tools"))
    with pytest.raises(StateConflict, match=f"in use by sandbox {user.id}"):
        remove_template(mgr, "tools")
    with pytest.raises(StateConflict, match="cannot rebuild"):
        mgr.build_template(Template().run("something else"), "tools")
    assert TemplateRegistry(mgr.settings.state_dir).get("tools") == entry
    backend.made.clear()
    assert remove_template(mgr, "tools") == entry
    assert not (mgr.settings.lxc_path / entry.container).exists()
    with pytest.raises(ConfigError, match="no template named 'tools'"):
        remove_template(mgr, "tools")


def test_the_registry_file_is_plain_json(tmp_path: Path) -> None:
    TemplateRegistry(tmp_path).put(_entry())
    data = json.loads((tmp_path / "templates.json").read_text())
    assert data["version"] == 1 and data["templates"]["tools"]["container"] == container_name("tools", KEY)
