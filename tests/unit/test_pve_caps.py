"""The caps a PVE CT config has no option for (pids_max, disk_mbps, disk_iops): the runtime asks the
node's hookscript for them in the CT's description and refuses a sandbox whose start did not confirm
them as asked (issue 26). Against the PVE API test server's memory engine, which keeps the
hookscript's books (pve_testserver/hookcaps.py); the script itself: test_proxmox_hookscript.py; the
caps holding on real nested CTs: tests/hardening SBX-RES-01/10 on the pve-node site."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pve_fixtures import TEMPLATE, pve_server, pve_settings

from pve_testserver import PVETestServer
from pve_testserver.hookcaps import Published, bookkept
from sandbox_rt.backends.proxmox import ProxmoxBackend
from sandbox_rt.backends.proxmox.description import applied_caps_of, caps_line
from sandbox_rt.errors import BackendError, ConfigError
from sandbox_rt.models import SandboxSpec


@pytest.fixture
def pve(tmp_path: Path) -> Iterator[tuple[ProxmoxBackend, Any, PVETestServer]]:
    with pve_server(TEMPLATE) as srv:
        yield ProxmoxBackend(pve_settings(srv, tmp_path)), srv.client(), srv


def _description(backend: ProxmoxBackend, api: Any, sandbox_id: str) -> str:
    node, vmid = backend._find(sandbox_id)
    return str(api.nodes(node).lxc(vmid).config.get().get("description", ""))


def _cts(api: Any) -> list[int]:
    return sorted(int(r["vmid"]) for r in api.cluster.resources.get(type="vm") if not r.get("template"))


def test_the_caps_line_asks_for_the_spec_and_the_start_confirms_it(pve: Any) -> None:
    backend, api, _srv = pve
    spec = SandboxSpec(pids_max=300, disk_mbps=20, disk_iops=200)
    backend.clone("sbx-00000000c1", spec)
    description = _description(backend, api, "sbx-00000000c1")
    assert "sandbox-rt-caps: pids_max=300 disk_mbps=20 disk_iops=200" in description.splitlines()
    assert applied_caps_of(description) is None  # nothing applied before a start
    record = backend.start("sbx-00000000c1")
    assert record.spec.pids_max == 300
    applied = applied_caps_of(_description(backend, api, "sbx-00000000c1"))
    assert applied == {"pids_max": 300, "disk_mbps": 20, "disk_iops": 200, "device": "-"}


def test_a_start_without_confirmed_caps_is_refused(pve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    backend, _api, srv = pve
    backend.clone("sbx-00000000c2", SandboxSpec())
    # a node without the script
    monkeypatch.setattr(srv.engine, "post_start", lambda vmid, config: Published())
    with pytest.raises(BackendError, match="without confirming its caps") as caught:
        backend.start("sbx-00000000c2")
    assert caught.value.step == "start"


def test_a_request_above_the_nodes_ceiling_is_a_config_error(
    pve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, _api, srv = pve
    ceilings = {"pids_max": 4096, "disk_mbps": 50, "disk_iops": 1000}
    monkeypatch.setattr(
        srv.engine,
        "post_start",
        lambda vmid, config: Published(bookkept(str(config.get("description")), ceilings)),
    )
    backend.clone("sbx-00000000c3", SandboxSpec(pids_max=8192, disk_mbps=20))
    with pytest.raises(ConfigError, match=r"pids_max at 4096 \(asked 8192\)"):
        backend.start("sbx-00000000c3")
    # 0 asks for no cap: the node's ceiling is fine
    backend.clone("sbx-00000000c4", SandboxSpec(pids_max=100, disk_mbps=0, disk_iops=0))
    assert backend.start("sbx-00000000c4").spec.disk_mbps == 0


def test_a_start_the_node_refused_says_why_and_leaves_nothing(
    pve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox_rt import Manager

    backend, api, srv = pve
    before = _cts(api)
    why = "pids budget: the node's CTs hold 3670000 of 3670016 pids (kernel.pid_max=4194304 less its reserve)"
    monkeypatch.setattr(srv.engine, "post_start", lambda vmid, config: Published(refused=why))
    with pytest.raises(BackendError, match="the node refused its caps: pids budget: ") as caught:
        Manager(backend.settings, backend=backend).create(pids_max=128)
    assert caught.value.step == "start"
    assert _cts(api) == before


def test_looser_caps_than_asked_are_refused(pve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    backend, _api, srv = pve
    monkeypatch.setattr(
        srv.engine,
        "post_start",
        lambda vmid, config: Published("pids_max=4096 disk_mbps=20 disk_iops=200 device=7:0"),
    )
    backend.clone("sbx-00000000c5", SandboxSpec(pids_max=128, disk_mbps=20, disk_iops=200))
    with pytest.raises(BackendError, match=r"pids_max=4096 \(asked 128\)"):
        backend.start("sbx-00000000c5")


def test_caps_do_not_change_on_a_running_ct(pve: Any) -> None:
    backend, api, _srv = pve
    backend.clone("sbx-00000000c6", SandboxSpec(pids_max=256))
    record = backend.start("sbx-00000000c6")
    with pytest.raises(ConfigError, match="pids_max=512 \\(running with 256\\)"):
        backend.update(record, dataclasses.replace(record.spec, pids_max=512))
    # other changes keep the request and the applied line (a TTL, labels)
    new = backend.update(record, dataclasses.replace(record.spec, labels={"a": "b"}))
    description = _description(backend, api, "sbx-00000000c6")
    assert new.spec.labels == {"a": "b"}
    assert caps_line(new.spec) in description.splitlines()
    assert applied_caps_of(description) is not None


def test_a_create_whose_caps_do_not_hold_leaves_nothing(pve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox_rt import Manager

    backend, api, srv = pve
    before = _cts(api)
    monkeypatch.setattr(srv.engine, "post_start", lambda vmid, config: Published())
    manager = Manager(backend.settings, backend=backend)
    with pytest.raises(BackendError, match="without confirming its caps"):
        manager.create(pids_max=128)
    assert _cts(api) == before
