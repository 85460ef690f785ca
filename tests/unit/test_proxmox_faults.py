"""The Proxmox backend's fault handling, fast: against the PVE API test server's memory engine.

Task timeout (a hung task is stopped), the lock retry budget, retried 502/503/504, and the
create marker a failed removal leaves for gc. The same faults on real LXC, through the Manager,
are in tests/integration/runtime/test_pve_reliability.py.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pve_fixtures import TEMPLATE, pve_server, pve_settings

from pve_testserver import PVETestServer
from sandbox_rt import BackendError
from sandbox_rt.backends import vmids
from sandbox_rt.backends.proxmox import ProxmoxBackend
from sandbox_rt.models import SandboxSpec

TIMEOUT = 1.0


@pytest.fixture
def server() -> Iterator[PVETestServer]:
    with pve_server() as srv:
        yield srv
        srv.faults.clear()


@pytest.fixture
def backend(server: PVETestServer, tmp_path: Path) -> ProxmoxBackend:
    return ProxmoxBackend(pve_settings(server, tmp_path, pve_task_timeout_s=TIMEOUT))


def _cts(server: PVETestServer) -> set[str]:
    with server.state.lock:
        return set(server.state.cts)


def _clone(backend: ProxmoxBackend, sandbox_id: str = "sbx-0000000001") -> Any:
    """The create steps as the Manager runs them: a failure destroys what was made."""
    backend.begin(sandbox_id)
    try:
        return backend.clone(sandbox_id, SandboxSpec())
    except BaseException:
        backend.destroy(sandbox_id)
        raise
    finally:
        backend.end(sandbox_id)


def test_task_timeout_comes_from_the_settings(backend: ProxmoxBackend) -> None:
    assert backend.task_timeout_s == TIMEOUT
    with pytest.raises(ValueError, match="pve_task_timeout_s"):
        dataclasses.replace(backend.settings, pve_task_timeout_s=0)


def test_a_hung_task_is_stopped_after_the_timeout(backend: ProxmoxBackend, server: PVETestServer) -> None:
    before = _cts(server)
    server.faults.slow_tasks(600, types=["vzclone"], count=1)
    t0 = time.monotonic()
    with pytest.raises(BackendError) as err:
        _clone(backend)
    assert TIMEOUT <= time.monotonic() - t0 < TIMEOUT + 3
    assert err.value.step == "clone" and "was stopped" in str(err.value)
    assert "clone failed: received interrupt" in str(err.value)  # the log: PVE ran its cleanup
    assert _cts(server) == before  # the stopped clone removed its CT


def test_the_lock_retry_budget_is_the_task_timeout(backend: ProxmoxBackend, server: PVETestServer) -> None:
    before = _cts(server)
    server.faults.inject_lock(count=10_000, lock="backup")  # config writes: the clone's is first
    t0 = time.monotonic()
    with pytest.raises(BackendError, match=r"CT is locked \(backup\) - still locked after \d+ attempts"):
        _clone(backend)
    assert TIMEOUT - 0.5 < time.monotonic() - t0 < TIMEOUT + 2
    assert _cts(server) == before


def test_503_is_retried_then_a_clear_error(backend: ProxmoxBackend, server: PVETestServer) -> None:
    server.faults.http_error(503, "Service Unavailable", method="GET", path="/cluster/nextid$", count=2)
    assert backend.list() == []
    backend.destroy(_clone(backend).id)  # two 503s: retried
    server.faults.http_error(503, "Service Unavailable", method="GET", path="/cluster/nextid$", count=3)
    with pytest.raises(BackendError, match=r"503 Service Unavailable \(3 attempts\): the PVE API at"):
        _clone(backend)


def test_a_failed_removal_keeps_the_marker_for_gc(backend: ProxmoxBackend, server: PVETestServer) -> None:
    record = _clone(backend)
    server.faults.http_error(503, "Service Unavailable", count=None)
    backend.begin(record.id)  # as during a create whose cleanup fails
    with pytest.raises(BackendError):
        backend.destroy(record.id)
    backend.end(record.id)
    assert [p.stem for p in backend.intents.glob("*.json")] == [record.id]  # abandoned, kept
    server.faults.clear()
    candidates = backend.gc_candidates(now=time.time(), dead_owners=False)
    assert [(c.sandbox_id, c.reason) for c in candidates] == [(record.id, "removal failed earlier")]
    assert backend.destroy(record.id)
    assert not list(backend.intents.glob("*.json"))
    assert backend.list() == []


def test_threads_of_one_process_never_race_for_a_vmid(backend: ProxmoxBackend, server: PVETestServer) -> None:
    """nextid reserves nothing and linked clones queue on the template's lock: 8 threads making 32
    clones each get their own VMID at the first try (before: 'no free VMID after 8 attempts')."""
    patient = ProxmoxBackend(dataclasses.replace(backend.settings, pve_task_timeout_s=30))
    server.faults.slow_tasks(0.03, types=["vzclone"])  # each clone holds the template a while
    ids = [f"sbx-{n:010d}" for n in range(1, 33)]
    clone_path = rf"/lxc/{TEMPLATE}/clone$"
    refused_before = server.requests_served("POST", clone_path, "already exists")
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        records = list(ex.map(lambda sid: _clone(patient, sid), ids))
    try:
        assert len({int(patient._find(r.id)[1]) for r in records}) == 32  # type: ignore[attr-defined]
        # no race lost: no clone request was refused for its VMID
        assert server.requests_served("POST", clone_path, "already exists") == refused_before
        assert server.requests_served("POST", clone_path, "^200 ") >= 32
    finally:
        for r in records:
            patient.destroy(r.id)


def test_after_a_lost_race_the_next_pick_spreads_out() -> None:
    assert vmids.candidate(100, 0) == 100  # no collision yet: the lowest free id
    assert vmids.spread(1) == 2 and vmids.spread(3) == 8 and vmids.spread(40) == vmids.SPREAD_MAX
    picks = {vmids.candidate(100, 5) for _ in range(500)}
    assert min(picks) >= 100 and max(picks) < 100 + vmids.spread(5) and len(picks) > 8


def test_a_locked_template_is_waited_for_outside_the_turn(
    backend: ProxmoxBackend, server: PVETestServer
) -> None:
    """8 threads facing a template that stays locked each fail after their own budget (about 1 s
    all together), not one after another (8 s): the back-off does not hold the VMID turn."""
    before = _cts(server)
    with server.state.lock:  # as while a backup of the template runs
        server.state.ct(TEMPLATE)["config"]["lock"] = "backup"
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        futures = [ex.submit(_clone, backend, f"sbx-{n:010d}") for n in range(1, 9)]
        errors = [f.exception(timeout=60) for f in futures]
    assert time.monotonic() - t0 < TIMEOUT * 3
    assert all(isinstance(e, BackendError) and e.step == "clone" for e in errors), errors
    assert all("CT is locked (backup) - still locked after" in str(e) for e in errors), errors
    assert f"pct unlock {TEMPLATE}" in str(errors[0])  # names the CT that is locked: the template
    assert _cts(server) == before
