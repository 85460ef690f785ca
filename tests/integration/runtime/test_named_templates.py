"""Named templates on real parts (issue 17 item 2): site.yml builds a second, lean template from the
inventory (its own packages and tasks, hardened like the default), lists it in host.json, and
sandboxes, snapshots and forks are cloned from it on both backends (the PVE API test server with
real LXC clones each CT template's own LXC template).

The module builds the template once (about a minute: its mmdebstrap tarball is cached by content),
checks that a second run changes nothing, and at the end removes it and restores host.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox_rt
from sandbox_rt import ConfigError, Manager, Settings
from sandbox_rt.backends.lxc import generations
from tests.pve_env import pve_test_server

from ..provision_helpers import HOST_JSON, REPO, run_playbook
from .conftest import SESSION_LABEL, _sweep, settings_environ

NAME = "itest-lean"
MARKER = "/etc/sandbox-rt-itest-template"
# what the template's own tasks write (the inventory's `tasks` of a named template)
TASKS = f"""---
- name: Mark the test template
  ansible.builtin.copy:
    dest: {MARKER}
    content: "built from the inventory\\n"
    mode: "0644"
"""
# files the hardening (sandbox_template) writes: the same in every template
HARDENED = (
    "etc/ssh/sshd_config",
    "sbin/sandbox-init",
    "etc/security/limits.d/sandbox.conf",
    "etc/ssh/authorized_keys/sandbox",
    "etc/sudoers",
)


@pytest.fixture(scope="module")
def named(settings: Settings) -> Iterator[Settings]:
    """The host's settings once site.yml built the template NAME (lean: base packages and jq)."""
    saved = HOST_JSON.read_bytes()
    container = settings.lxc_path / f"{settings.template}-{NAME}"
    with tempfile.TemporaryDirectory(prefix="sandbox-rt-named-") as work:
        tasks = Path(work) / "tasks.yml"
        tasks.write_text(TASKS)
        extra = Path(work) / "vars.json"
        template = {"name": NAME, "packages": ["jq"], "tasks": str(tasks)}
        extra.write_text(json.dumps({"template_build_templates": [template]}))
        try:
            first = run_playbook("-e", f"@{extra}")
            assert first.returncode == 0, first.tail()
            second = run_playbook("-e", f"@{extra}")
            assert second.returncode == 0, second.tail()
            assert second.total("changed") == 0, second.tail(120)
            yield Settings.load()
        finally:
            HOST_JSON.write_bytes(saved)
            for gen in generations.generations(settings.lxc_path, container.name):  # the slot's link's
                shutil.rmtree(settings.lxc_path / gen, ignore_errors=True)
            if container.is_symlink():
                container.unlink()
            shutil.rmtree(container, ignore_errors=True)


@pytest.fixture(scope="module", params=["lxc", "proxmox"])
def named_manager(request: pytest.FixtureRequest, named: Settings) -> Iterator[Manager]:
    if request.param == "lxc":
        mgr = Manager(named)
        yield mgr
        _sweep(mgr)
        return
    with contextlib.ExitStack() as stack:
        state = stack.enter_context(tempfile.TemporaryDirectory(prefix="sandbox-rt-pve-"))
        pve_settings, _srv = stack.enter_context(pve_test_server(named, Path(state)))
        mgr = Manager(pve_settings)
        yield mgr
        _sweep(mgr)


def _create(mgr: Manager, **kwargs: object) -> sandbox_rt.Sandbox:
    return mgr.create(labels=SESSION_LABEL, memory_mb=256, **kwargs)  # type: ignore[arg-type]


def test_host_json_lists_the_template_and_the_container_exists(named: Settings) -> None:
    assert named.templates == {NAME: f"{named.template}-{NAME}"}
    assert Manager(named).templates() == ["default", NAME]
    assert (named.lxc_path / named.templates[NAME] / "rootfs" / MARKER.lstrip("/")).is_file()
    # a template first built with generations: its slot links to <slot>.<tag>
    assert generations.resolve(named.lxc_path, named.templates[NAME]).startswith(f"{named.templates[NAME]}.")


def test_the_hardening_is_the_default_templates(named: Settings) -> None:
    default = named.lxc_path / named.template / "rootfs"
    lean = named.lxc_path / named.templates[NAME] / "rootfs"
    for rel in HARDENED:
        assert (lean / rel).read_bytes() == (default / rel).read_bytes(), rel

    def config(template: Path) -> list[str]:  # but its name and rootfs
        lines = (template.parent / "config").read_text().splitlines()
        return [ln for ln in lines if not ln.startswith(("#", "lxc.uts", "lxc.rootfs"))]

    assert config(lean) == config(default)  # the same seccomp, caps, id map, mounts


def test_a_sandbox_of_the_named_template_has_its_packages_only(named_manager: Manager) -> None:
    with _create(named_manager, template=NAME) as sb, _create(named_manager) as plain:
        assert sb.status().template == NAME and plain.status().template == "default"
        assert sb.exec("jq -n 1+1").text.strip() == "2"
        assert sb.exec(f"cat {MARKER}").text == "built from the inventory\n"
        assert sb.exec("command -v gcc").exit_code == 1  # lean: no tool packages
        assert plain.exec("command -v gcc").exit_code == 0
        assert plain.exec(f"test -e {MARKER}").exit_code == 1
        assert sb.exec("id -un").text.strip() == "sandbox"
        assert sb.exec("sudo -n true").exit_code != 0
        assert named_manager.get(sb.id).spec.template == NAME


def test_a_fork_is_cloned_from_its_snapshots_template(named_manager: Manager) -> None:
    name = f"itest{secrets.token_hex(4)}"
    # on PVE a snapshot lives as long as its CT: fork while the source exists
    with _create(named_manager, template=NAME) as sb:
        sb.files.write("/home/sandbox/note.txt", b"kept")
        try:
            assert sb.snapshot(name).template == NAME
            assert [s.template for s in named_manager.list_snapshots() if s.name == name] == [NAME]
            with named_manager.create(labels=SESSION_LABEL, from_snapshot=name) as fork:
                assert fork.record.spec.template == NAME
                assert fork.files.read("/home/sandbox/note.txt") == b"kept"
                # from the default template, the lean delta would sit on gcc: it must not be there
                assert fork.exec("command -v gcc").exit_code == 1
                assert fork.exec(f"test -e {MARKER}").exit_code == 0
            with pytest.raises(ConfigError, match="from_snapshot"):
                named_manager.create(labels=SESSION_LABEL, from_snapshot=name, template=NAME)
        finally:
            with contextlib.suppress(sandbox_rt.SandboxError):
                named_manager.delete_snapshot(name)


def test_an_unknown_template_makes_nothing(named_manager: Manager) -> None:
    before = {r.id for r in named_manager.list()}
    with pytest.raises(ConfigError, match=f"this host has: default, {NAME}"):
        named_manager.create(labels=SESSION_LABEL, template="absent")
    assert {r.id for r in named_manager.list()} == before


def test_the_prune_guard_sees_sandboxes_of_the_template(named: Settings) -> None:
    """template_build removes an old template generation only when nothing uses it: with isolated id
    maps a sandbox's config does not name it, its record does (template_container)."""
    script = REPO / "roles" / "template_build" / "files" / "template-generations.py"
    slot = named.templates[NAME]
    current = generations.resolve(named.lxc_path, slot)

    def users(name: str, slot: str, container: str) -> str:
        argv = [sys.executable, str(script), "users", str(named.lxc_path), slot, name, container]
        return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout

    with _create(Manager(named), template=NAME) as sb:
        assert f"sandbox {sb.id}" in json.loads(users(NAME, slot, current))
        default = generations.resolve(named.lxc_path, named.template)
        assert f"sandbox {sb.id}" not in json.loads(users("default", named.template, default))


def test_the_cli_lists_and_takes_the_template(named: Settings) -> None:
    env = settings_environ(named)
    cli = [sys.executable, "-m", "sandbox_rt"]
    listed = subprocess.run(
        [*cli, "--json", "template", "ls"], env=env, capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0 and json.loads(listed.stdout) == ["default", NAME], listed.stderr
    label = ",".join(f"{k}={v}" for k, v in SESSION_LABEL.items())
    run = subprocess.run(
        [*cli, "run", "--template", NAME, "--label", label, "--", "cat", MARKER],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0 and run.stdout == "built from the inventory\n", run.stderr
    bad = subprocess.run(
        [*cli, "run", "--template", "absent", "--", "true"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode != 0 and "unknown template 'absent'" in bad.stderr


def test_settings_survive_the_environment(named: Settings) -> None:
    """What other processes (CLI, servers) read: the map travels as JSON."""
    env = settings_environ(named)
    assert Settings.load(env=env).templates == named.templates
    assert dataclasses.replace(named).template_names() == ["default", NAME]
