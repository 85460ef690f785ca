"""Templates from code on Proxmox VE (issue 27) on the emulated PVE node (tests/pve_node; the session's
``emulated_pve`` fixture, shared with test_pve_emulated.py): ``Manager.build_template`` with the
runtime's own least-privilege token and the operator's admin token (the node's root token) builds a
Template with run, copy, env and a custom pyinfra deploy in a build CT, checks the hardening controls
inside it, and converts it to a CT template outside the runtime's pool with the clone-only role for
the runtime's token. A sandbox made from it has the files; the same definition again is a cache hit;
the runtime's token cannot change or delete the template; it cannot be removed while a sandbox uses
it, then it is. Everything it made is removed at the end, even on failure (the node is shared)."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_rt import ConfigError, Manager, PermissionDenied, StateConflict, Template, TemplateBuildError
from sandbox_rt.backends.proxmox import ProxmoxBackend
from sandbox_rt.templates import BuildResult, TemplateRegistry, remove_template
from sandbox_rt.templates.build import BUILD_LABEL
from sandbox_rt.templates.pve_store import BUILT_PREFIX
from tests.integration.provision_helpers import PlaybookRun, destroy_labelled
from tests.pve_node import PVENode
from tests.pve_node.provisioning import ProvisionedNode, admin_api, node_manager

pytestmark = [pytest.mark.slow, pytest.mark.root]

RUN_ID = secrets.token_hex(3)
NAME = f"pve-code-{RUN_ID}"
LABELS = {"test-session": f"pve-template-{RUN_ID}"}
POOL = "sandbox-pool"


@pytest.fixture(scope="module")
def node(emulated_pve: ProvisionedNode) -> PVENode:
    run: PlaybookRun = emulated_pve.first_run
    assert run.returncode == 0 and run.total("failed") == 0, run.tail(80)
    return emulated_pve.node


@pytest.fixture(scope="module")
def manager(node: PVENode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Manager]:
    """The runtime as site.yml configured it, plus the admin token file (the node's root token)."""
    token_file = tmp_path_factory.mktemp("pve-admin") / "admin.token"
    token_file.touch(mode=0o600)
    token_file.write_text((node.spec.api_dir / "root.token").read_text().strip() + "\n")
    with node_manager(node, LABELS) as mgr:
        mgr.settings = dataclasses.replace(mgr.settings, pve_admin_token_file=str(token_file))
        try:
            yield mgr
        finally:
            destroy_labelled(mgr, LABELS, {BUILD_LABEL: NAME})
            if TemplateRegistry(mgr.settings.state_dir).get(NAME) is not None:
                remove_template(mgr, NAME)
    assert TemplateRegistry(mgr.settings.state_dir).get(NAME) is None


def put_marker() -> None:
    """A custom pyinfra deploy."""
    import io

    from pyinfra.operations import files

    files.put(name="the deploy's marker", src=io.StringIO("deployed-by-pyinfra\n"), dest="/opt/marker.txt")


def definition(sources: Path) -> Template:
    return (
        Template()
        .copy(sources / "tool.sh", "/usr/local/bin/pve-tool")
        .env(TOOL_MODE="pve")
        .deploy(put_marker)
        .run("pve-tool > /opt/built-here.txt && cat /opt/marker.txt >> /opt/built-here.txt")
    )


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pve-template-sources")
    (root / "tool.sh").write_text("#!/bin/sh\necho tool-ok\n")
    (root / "tool.sh").chmod(0o755)
    return root


@pytest.fixture(scope="module")
def built(manager: Manager, sources: Path) -> tuple[BuildResult, list[str]]:
    log: list[str] = []
    try:
        result = manager.build_template(definition(sources), NAME, on_log=log.append)
    except TemplateBuildError:
        print("\n".join(log))
        raise
    print(log[-1])
    return result, log


def _admin(node: PVENode) -> Any:
    return admin_api(node)


def test_the_build_is_a_ct_template_outside_the_pool(
    node: PVENode, manager: Manager, built: tuple[BuildResult, list[str]]
) -> None:
    result, log = built
    vmid = result.template.vmid
    assert not result.cached and result.template.backend == "proxmox" and vmid is not None
    assert len([line for line in log if line.startswith("==> step ")]) == 4
    root = _admin(node)
    conf = root.nodes(node.spec.name).lxc(vmid).config.get()
    assert int(conf["template"]) == 1 and str(conf["description"]).startswith(BUILT_PREFIX)
    assert "tags" not in conf and "env" not in conf
    assert vmid not in {m.get("vmid") for m in root.pools(POOL).get()["members"]}
    rules = root.nodes(node.spec.name).lxc(vmid).firewall.rules.get()
    assert not [r for r in rules if str(r.get("comment", "")).startswith("sandbox-rt")]
    assert NAME in manager.templates()
    assert not manager.list(labels={BUILD_LABEL: NAME})  # the build CT is the template, no sandbox


def test_a_sandbox_from_it_has_the_files(manager: Manager, built: tuple[BuildResult, list[str]]) -> None:
    # a build step may have planted what root runs, and on Proxmox VE a sandbox's init and sshd
    # start as root: only sandboxes with root are made of it (the embedded default runs nothing as
    # root in a sandbox without root, SBX-ESC-28, and needs no such rule)
    before = {r.id for r in manager.list()}
    with pytest.raises(ConfigError, match="root=True only"):
        manager.create(template=NAME, labels=LABELS, memory_mb=512)
    assert {r.id for r in manager.list()} == before
    with manager.create(template=NAME, root=True, labels=LABELS, memory_mb=512) as sb:
        assert sb.read_file("/opt/built-here.txt") == b"tool-ok\ndeployed-by-pyinfra\n"
        assert sb.exec("pve-tool").stdout == b"tool-ok\n"
        assert sb.exec('echo "$TOOL_MODE"').stdout == b"pve\n"
        assert sb.exec("id -un").stdout == b"sandbox\n"
        # the build's identity did not come along; root's login files are the ones this sandbox's
        # init wrote (root=True), a copy of the sandbox user's key line
        keys = "/etc/ssh/authorized_keys"
        assert sb.read_file(f"{keys}/root") == sb.read_file(f"{keys}/sandbox")
        assert sb.exec("grep -c 'sandbox-rt build egress' /etc/hosts || true").stdout.strip() in (b"0", b"")
        assert sb.record.spec.template == NAME


def test_the_same_definition_again_is_a_cache_hit(
    manager: Manager, sources: Path, built: tuple[BuildResult, list[str]]
) -> None:
    again = manager.build_template(definition(sources), NAME)
    assert again.cached and again.template == built[0].template


def test_the_runtime_token_cannot_change_the_template(
    node: PVENode, manager: Manager, built: tuple[BuildResult, list[str]]
) -> None:
    backend = manager.backend
    assert isinstance(backend, ProxmoxBackend)
    vmid = built[0].template.vmid
    assert vmid is not None
    ct = backend.api.nodes(node.spec.name).lxc(vmid)
    with pytest.raises(PermissionDenied):
        backend._call("test", lambda: ct.config.put(description="changed"))
    with pytest.raises(PermissionDenied):
        backend._call("test", lambda: ct.delete())
    with pytest.raises(PermissionDenied):
        backend._call("test", lambda: ct.snapshot.post(snapname="x"))
    assert backend._call("test", lambda: ct.config.get())["template"] == 1  # it may read (and clone) it


@pytest.mark.parametrize(
    ("step", "control"),
    [
        ("install -m 4755 /bin/true /usr/local/bin/sneaky", "SBX-ESC-05 no new setuid/setgid programs"),
        ("echo 'PermitRootLogin yes' >> /etc/ssh/sshd_config", "SBX-SSH-01..04,06 sshd configuration"),
        ("exit 3", None),
    ],
)
def test_a_refused_build_leaves_nothing(
    node: PVENode, manager: Manager, step: str, control: str | None
) -> None:
    name = f"{NAME}-bad"
    rows = _admin(node).cluster.resources.get(type="vm")
    before = {int(r["vmid"]) for r in rows}
    with pytest.raises(TemplateBuildError) as info:
        manager.build_template(Template().run(step), name)
    if control is not None:
        assert info.value.step == "hardening checks" and control in (info.value.detail or ""), (
            info.value.detail
        )
    else:
        assert "run(exit 3)" in str(info.value)
    after = {int(r["vmid"]) for r in _admin(node).cluster.resources.get(type="vm")}
    assert after == before and TemplateRegistry(manager.settings.state_dir).get(name) is None
    assert not manager.list(labels={BUILD_LABEL: name})


def test_it_cannot_be_removed_while_used_then_is(
    node: PVENode, manager: Manager, built: tuple[BuildResult, list[str]]
) -> None:
    vmid = built[0].template.vmid
    sb = manager.create(template=NAME, root=True, labels=LABELS, memory_mb=512)
    try:
        with pytest.raises(StateConflict, match=f"in use by sandbox {sb.id}"):
            remove_template(manager, NAME)
    finally:
        sb.destroy()
    assert remove_template(manager, NAME).vmid == vmid
    rows = _admin(node).cluster.resources.get(type="vm")
    assert vmid not in {int(r["vmid"]) for r in rows}
    assert NAME not in manager.templates()
