"""A template update on Proxmox VE, the runtime's half (issue 20 item 3): the proxmox backend follows
host.json's template VMIDs without a restart (sandbox_rt/backends/proxmox/contract.py), against the
PVE API test server, which refuses (as PVE does) to destroy a template a linked clone still uses.
The playbook half, on the emulated PVE node: tests/integration/test_pve_emulated_cluster.py."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proxmoxer.tools import Tasks

from pve_testserver import PVETestServer
from sandbox_rt import Settings
from sandbox_rt.backends.proxmox import ProxmoxBackend
from sandbox_rt.backends.proxmox.contract import TemplateContract
from sandbox_rt.manager import new_sandbox_id
from sandbox_rt.models import SandboxSpec
from tests.unit.pve_fixtures import NODE, pve_server, pve_settings

OLD, NEW = 9000, 9500
SPEC = SandboxSpec(ttl_s=3600)


@pytest.fixture
def srv() -> Iterator[PVETestServer]:
    with pve_server(OLD, NEW) as server:
        yield server


def write_contract(path: Path, settings: Settings, **templates: Any) -> None:
    """host.json as sandbox_runtime writes it (a new file renamed over the old), secret left out."""
    values = {
        f.name: getattr(settings, f.name)
        for f in dataclasses.fields(settings)
        if f.name not in ("pve_token_secret", "volume_host_dirs")
    }
    values.update(templates)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(values, default=str))
    os.replace(tmp, path)


@pytest.fixture
def contract(srv: PVETestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Settings]:
    """host.json naming template OLD, and the settings loaded from it (as Manager.from_env does)."""
    base = pve_settings(srv, tmp_path / "state")
    path = tmp_path / "host.json"
    write_contract(path, base, pve_template_vmid=OLD)
    monkeypatch.setenv("SANDBOX_RT_CONFIG", str(path))
    monkeypatch.setenv("SANDBOX_RT_PVE_TOKEN_SECRET", base.pve_token_secret)
    return path, Settings.load()


def create(b: ProxmoxBackend) -> str:
    sid = new_sandbox_id()
    b.begin(sid)
    try:
        b.clone(sid, SPEC)
        b.start(sid)
    finally:
        b.end(sid)
    return sid


def rootfs_of(srv: PVETestServer, sandbox_id: str) -> str:
    with srv.state.lock:
        hits = [ct for ct in srv.state.cts.values() if sandbox_id in str(ct["config"].get("tags", ""))]
        assert len(hits) == 1, hits
        return str(hits[0]["config"]["rootfs"])


def test_creates_after_a_switch_clone_the_new_template_without_a_restart(
    srv: PVETestServer, contract: tuple[Path, Settings]
) -> None:
    path, settings = contract
    b = ProxmoxBackend(settings)
    old = create(b)
    assert f":base-{OLD}-disk-0/" in rootfs_of(srv, old)
    write_contract(path, settings, pve_template_vmid=NEW)
    new = create(b)
    assert f":base-{NEW}-disk-0/" in rootfs_of(srv, new)
    assert b.settings.pve_template_vmid == OLD  # the rest of the settings: as loaded
    # the sandbox of the old template lives on (its record, its CT)
    assert {r.id for r in b.list()} == {old, new}
    for sid in (old, new):
        b.destroy(sid)


def test_a_sandbox_made_before_a_switch_is_not_current_and_nothing_is_pruned(
    srv: PVETestServer, contract: tuple[Path, Settings]
) -> None:
    """What the warm pool asks before handing a sandbox out (Manager._take_warm)."""
    path, settings = contract
    b = ProxmoxBackend(settings)
    sid = create(b)
    assert b.template_is_current(b.get(sid))
    write_contract(path, settings, pve_template_vmid=NEW)
    assert not b.template_is_current(b.get(sid))
    assert b.prune_templates() == []  # the token only clones: site.yml removes old generations
    b.destroy(sid)


def test_a_contract_that_does_not_load_keeps_the_last_good_vmids(contract: tuple[Path, Settings]) -> None:
    path, settings = contract
    watch = TemplateContract(settings)
    assert watch.watched
    path.write_text("{not json")
    assert watch.current().pve_template_vmid == OLD
    write_contract(path, settings, pve_template_vmid=NEW, pve_templates={"python": 9001})
    assert watch.current().pve_template_vmid == NEW
    assert watch.current().pve_templates == {"python": 9001}
    assert watch.current() is watch.current()  # unchanged file: no reload


def test_settings_not_from_the_file_are_not_followed(
    srv: PVETestServer, contract: tuple[Path, Settings], tmp_path: Path
) -> None:
    path, settings = contract
    in_code = pve_settings(srv, tmp_path / "state", pve_template_vmid=NEW)
    watch = TemplateContract(in_code)
    assert not watch.watched
    write_contract(path, settings, pve_template_vmid=OLD, pve_templates={"python": 9001})
    assert watch.current() is in_code


def test_pve_refuses_to_destroy_a_template_a_linked_clone_uses(
    srv: PVETestServer, contract: tuple[Path, Settings]
) -> None:
    _, settings = contract
    b = ProxmoxBackend(settings)
    sid = create(b)
    root = srv.client()

    def destroy_template() -> dict[str, Any]:
        upid = root.nodes(NODE).lxc(OLD).delete()
        return dict(Tasks.blocking_status(root, upid, timeout=10, polling_interval=0.02))

    status = destroy_template()
    assert "still in use by linked clone" in status["exitstatus"], status
    assert root.nodes(NODE).lxc(OLD).config.get()["template"] == 1
    b.destroy(sid)
    assert destroy_template()["exitstatus"] == "OK"
    assert OLD not in [int(c["vmid"]) for c in root.nodes(NODE).lxc.get()]
