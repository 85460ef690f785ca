"""Reliability of the Proxmox backend (issue 9, PVE side): load, caller crashes, API faults.

Against the PVE API test server backed by real LXC: every sandbox made under load gets its own
id, VMID and address and works; a caller SIGKILLed at any step of create leaves nothing ``gc`` does
not remove; each injected API fault gives a typed error naming the step, within a bounded time,
and leaves no CT, LXC container, firewall config or create marker behind.
(Task failures at each create step are in test_proxmox_backend.py.)
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import multiprocessing.synchronize
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox_rt
from pve_testserver import PVETestServer
from sandbox_rt import BackendError, Manager, Settings
from tests.integration.provision_helpers import destroy_labelled
from tests.pve_env import TEMPLATE_VMID, create_markers, world

from .conftest import SESSION_LABEL, Factory, _factory, settings_environ

TASK_TIMEOUT_S = 2.0  # pve_task_timeout_s of the fault tests' manager


@pytest.fixture
def make_pve(pve_manager: Manager) -> Iterator[Factory]:
    yield from _factory(pve_manager)


@pytest.fixture
def fast(pve_manager: Manager, srv: PVETestServer) -> Iterator[Manager]:
    """The session's PVE manager with a short task timeout (the lock retry budget too)."""
    settings = dataclasses.replace(pve_manager.settings, pve_task_timeout_s=TASK_TIMEOUT_S)
    yield Manager(settings, ssh_key=pve_manager.settings.ssh_key)


def _vmid(mgr: Manager, sandbox_id: str) -> int:
    return int(mgr.backend._find(sandbox_id)[1])  # type: ignore[attr-defined]


# -- load ------------------------------------------------------------------------------------------
def test_50_creates_from_8_threads(pve_manager: Manager, srv: PVETestServer) -> None:
    """50 PVE sandboxes alive at once, made by 8 threads: distinct ids, VMIDs and addresses."""
    label = {**SESSION_LABEL, "load": "pve-threads"}
    before = world(srv)
    sandboxes: list[sandbox_rt.Sandbox] = []
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            futures = [
                ex.submit(pve_manager.create, memory_mb=128, internet=i % 2 == 0, labels=label)
                for i in range(50)
            ]
            for f in futures:
                sandboxes.append(f.result())
        vmids = {_vmid(pve_manager, sb.id) for sb in sandboxes}
        assert len({sb.id for sb in sandboxes}) == len({sb.ip for sb in sandboxes}) == len(vmids) == 50
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            outs = list(ex.map(lambda sb: sb.exec("echo ok; cat /etc/hostname").text, sandboxes))
        assert outs == [f"ok\n{sb.hostname}\n" for sb in sandboxes]
    finally:
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda sb: sb.destroy(), sandboxes))
    assert pve_manager.list(labels=label) == []
    assert world(srv) == before
    assert create_markers(pve_manager.settings) == []


def _process_worker(
    settings: Settings,
    key: Path,
    n: int,
    label: dict[str, str],
    out: multiprocessing.Queue,  # type: ignore[type-arg]
    done: multiprocessing.synchronize.Event,
) -> None:
    mgr = Manager(settings, ssh_key=key)
    made: list[sandbox_rt.Sandbox] = []
    try:
        for _ in range(n):
            sb = mgr.create(memory_mb=128, labels=label)
            made.append(sb)
            out.put((sb.id, sb.ip, _vmid(mgr, sb.id), sb.exec("echo ok").stdout))
        done.wait(300)  # all alive together until the parent has looked at them
    finally:
        for sb in made:
            sb.destroy()


def test_creates_from_4_processes(pve_manager: Manager, srv: PVETestServer) -> None:
    """52 PVE sandboxes made by 4 processes at once (own API sessions): distinct ids, VMIDs and
    addresses across processes (the address lock is a file lock); each destroys its own."""
    label = {**SESSION_LABEL, "load": "pve-processes"}
    before = world(srv)
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    done = ctx.Event()
    s = pve_manager.settings
    procs = [ctx.Process(target=_process_worker, args=(s, s.ssh_key, 13, label, out, done)) for _ in range(4)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=180) for _ in range(52)]
        assert all(r[3] == b"ok\n" for r in results)
        for column in range(3):  # id, address, VMID
            assert len({r[column] for r in results}) == 52
        alive = pve_manager.list(labels=label)
        assert len({r.ip for r in alive}) == len(alive) == 52  # all alive together, no address shared
    finally:
        done.set()
        for p in procs:
            p.join(120)
        destroy_labelled(pve_manager, label)  # what a failed worker left
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert pve_manager.list(labels=label) == []
    assert world(srv) == before
    assert create_markers(s) == []


def test_200_parallel_execs_on_5_sandboxes(make_pve: Factory) -> None:
    boxes = [make_pve(memory_mb=256) for _ in range(5)]

    def run(i: int) -> tuple[int, bytes, bytes]:
        r = boxes[i % 5].exec(f"echo {i}; echo err{i} >&2")
        return i, r.stdout, r.stderr

    with concurrent.futures.ThreadPoolExecutor(40) as ex:
        results = list(ex.map(run, range(200)))
    assert all(out == f"{i}\n".encode() and err == f"err{i}\n".encode() for i, out, err in results)


# -- a caller killed during create -----------------------------------------------------------------
CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import sandbox_rt
    from sandbox_rt.ssh import wire
    from sandbox_rt.backends.proxmox import ProxmoxBackend

    step = sys.argv[1]

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    wait, resize, tcp_connect = ProxmoxBackend._wait, ProxmoxBackend._resize, wire.tcp_connect

    def patched_wait(self, upid, st):
        if st == "clone" and step == "during clone":  # the clone task runs on without us
            die()
        wait(self, upid, st)
        if st == "clone" and step == "after clone":  # the CT exists, untagged: only the marker knows it
            die()

    def patched_resize(self, *args):
        if step == "after config":  # tagged and configured; not resized, no firewall yet
            die()
        return resize(self, *args)

    def patched_tcp_connect(*args):
        sock = tcp_connect(*args)
        if step == "during SSH wait":  # sshd answered, the SSH handshake has not happened
            die()
        return sock

    ProxmoxBackend._wait, ProxmoxBackend._resize = patched_wait, patched_resize
    wire.tcp_connect = patched_tcp_connect

    def progress(msg):  # "cloning" (nothing made), "starting" (configured), "waiting" (started)
        if msg.startswith(step):
            die()

    sandbox_rt.Manager.from_env().create(labels={"test-session": "pve-crash"}, progress=progress)
    """
)


@pytest.mark.parametrize(
    "step",
    [
        "cloning",
        "during clone",
        "after clone",
        "after config",
        "starting",
        "waiting for SSH",
        "during SSH wait",
        "ready",
    ],
)
def test_sigkill_during_create_then_gc_removes_everything(
    pve_manager: Manager, srv: PVETestServer, step: str
) -> None:
    before = world(srv)
    if step == "during clone":
        srv.faults.slow_tasks(0.5, types=["vzclone"], count=1)  # gc must wait out the clone's lock
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, step],
        capture_output=True,
        timeout=60,
        env=settings_environ(pve_manager.settings),
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    markers = create_markers(pve_manager.settings)
    assert len(markers) == 1  # the dead creator's
    left = world(srv)
    made = left["cts"] - before["cts"]
    if step != "cloning":  # killed after the clone was asked for: a CT is left for gc to find
        assert len(made) == 1, left
    removed = {r.sandbox_id: r.reason for r in pve_manager.gc()}
    assert removed == {markers[0]: "creator died during create"}
    assert world(srv) == before
    assert create_markers(pve_manager.settings) == []


# -- faults ----------------------------------------------------------------------------------------
def _create_fails(mgr: Manager, **kwargs: object) -> tuple[BackendError, float]:
    t0 = time.monotonic()
    with pytest.raises(BackendError) as err:
        mgr.create(labels=SESSION_LABEL, **kwargs)  # type: ignore[arg-type]
    return err.value, time.monotonic() - t0


@pytest.mark.parametrize(("task", "step"), [("vzclone", "clone"), ("resize", "resize"), ("vzstart", "start")])
def test_hung_task_is_stopped_and_leaves_nothing(
    fast: Manager, srv: PVETestServer, task: str, step: str
) -> None:
    """A task that never ends: stopped after pve_task_timeout_s, a BackendError naming the step."""
    before = world(srv)
    srv.faults.slow_tasks(600, types=[task], count=1)
    err, took = _create_fails(fast, disk_gb=8)  # 8 > the template's 4 GiB: a resize task runs
    assert err.step == step
    assert f"did not finish within pve_task_timeout_s={TASK_TIMEOUT_S:g} s and was stopped" in str(err)
    assert "received interrupt" in str(err)  # the task's log tail: PVE's worker ended it
    assert TASK_TIMEOUT_S <= took < TASK_TIMEOUT_S + 5
    assert world(srv) == before
    assert create_markers(fast.settings) == []


def test_hung_destroy_fails_clearly_and_gc_finishes_it(fast: Manager, srv: PVETestServer) -> None:
    before = world(srv)
    sb = fast.create(labels=SESSION_LABEL)
    srv.faults.slow_tasks(600, types=["vzdestroy"], count=1)
    t0 = time.monotonic()
    with pytest.raises(BackendError) as err:
        sb.destroy()
    assert time.monotonic() - t0 < TASK_TIMEOUT_S + 5
    assert err.value.step == "destroy" and "was stopped" in str(err.value)
    assert create_markers(fast.settings) == [sb.id]  # kept (abandoned): gc retries
    srv.faults.clear()
    assert {r.sandbox_id: r.reason for r in fast.gc()} == {sb.id: "removal failed earlier"}
    assert world(srv) == before
    assert create_markers(fast.settings) == []


@pytest.mark.parametrize(
    ("status", "method", "path", "step", "expect"),
    [
        (503, "POST", rf"/lxc/{TEMPLATE_VMID}/clone$", "clone", "503 Service Unavailable (3 attempts)"),
        (500, "PUT", r"/lxc/\d+/config$", "configure", "500 internal error"),
        (503, "POST", r"/firewall/rules$", "firewall", "503 Service Unavailable (3 attempts)"),
        (500, "POST", r"/status/start$", "start", "500 internal error"),
    ],
)
def test_api_error_names_the_step_and_leaves_nothing(
    fast: Manager, srv: PVETestServer, status: int, method: str, path: str, step: str, expect: str
) -> None:
    before = world(srv)
    message = "Service Unavailable" if status == 503 else "internal error"
    srv.faults.http_error(status, message, method=method, path=path, count=None)
    err, took = _create_fails(fast)
    assert err.step == step and expect in str(err)
    if status == 503:
        assert "check pveproxy and pvedaemon on the node" in str(err)
    assert took < 5
    assert world(srv) == before
    assert create_markers(fast.settings) == []


def test_transient_503s_are_retried(fast: Manager, srv: PVETestServer) -> None:
    srv.faults.http_error(503, "Service Unavailable", count=2)  # whatever the next two calls are
    with fast.create(labels=SESSION_LABEL) as sb:
        assert sb.exec("echo ok").stdout == b"ok\n"


def test_api_outage_mid_create_then_gc(fast: Manager, srv: PVETestServer) -> None:
    """The API goes away after the clone: create fails, its cleanup too; gc finishes it later."""
    before = world(srv)

    def progress(msg: str) -> None:
        if msg.startswith("starting"):  # cloned and configured: from now on every call answers 503
            srv.faults.http_error(503, "Service Unavailable", count=None)

    err, took = _create_fails(fast, progress=progress)
    assert "503 Service Unavailable (3 attempts): the PVE API at" in str(err)
    notes = "\n".join(getattr(err, "__notes__", []))
    assert "cleanup of sbx-" in notes and "503" in notes
    assert took < 10
    [sid] = create_markers(fast.settings)  # abandoned: gc retries once the API is back
    srv.faults.clear()
    assert {r.sandbox_id: r.reason for r in fast.gc()} == {sid: "removal failed earlier"}
    assert world(srv) == before
    assert create_markers(fast.settings) == []


def test_persistent_lock_is_a_clear_error_in_bounded_time(fast: Manager, srv: PVETestServer) -> None:
    before = world(srv)
    srv.faults.inject_lock(count=10_000, lock="backup")  # every config write: "CT is locked (backup)"
    err, took = _create_fails(fast)
    assert err.step == "configure"
    assert "CT is locked (backup)" in str(err)
    assert re.search(r"unlock it on the node: pct unlock \d+$", str(err))
    assert f"pve_task_timeout_s={TASK_TIMEOUT_S:g}" in str(err)
    assert TASK_TIMEOUT_S - 1 < took < TASK_TIMEOUT_S + 5
    assert world(srv) == before
    assert create_markers(fast.settings) == []


def test_clone_failing_half_way_is_removed(fast: Manager, srv: PVETestServer) -> None:
    """PVE's clone failed late and its own cleanup failed too: the runtime removes the CT."""
    before = world(srv)
    srv.faults.half_fail_tasks("post_clone_hook: no space left on device", types=["vzclone"])
    err, took = _create_fails(fast)
    assert err.step == "clone" and "clone failed: post_clone_hook: no space left on device" in str(err)
    assert "Failed to remove target CT config" in str(err)  # the task log tail
    assert not getattr(err, "__notes__", None)  # the runtime's own cleanup worked
    assert took < 5
    assert world(srv) == before
    assert create_markers(fast.settings) == []


def test_clone_failing_half_way_and_locked_is_reported_then_gc(fast: Manager, srv: PVETestServer) -> None:
    """As above, but the CT stays locked ``create``: only root can unlock it (``pct unlock``). The
    error says so; the marker stays; after the unlock, gc removes the CT."""
    before = world(srv)
    srv.faults.half_fail_tasks("post_clone_hook: I/O error", types=["vzclone"], keep_lock=True)
    err, took = _create_fails(fast)
    assert err.step == "clone" and "clone failed: post_clone_hook: I/O error" in str(err)
    [vmid] = {int(v) for v in world(srv)["cts"] - before["cts"]}
    notes = "\n".join(getattr(err, "__notes__", []))
    assert "CT is locked (create)" in notes and f"pct unlock {vmid}" in notes
    assert took < TASK_TIMEOUT_S + 5
    [sid] = create_markers(fast.settings)
    with pytest.raises(BackendError, match=f"pct unlock {vmid}"):  # gc cannot either, and says why
        fast.gc()
    assert create_markers(fast.settings) == [sid]
    with srv.state.lock:  # the operator's `pct unlock <vmid>` on the node
        ct = srv.state.ct(vmid)
        assert ct is not None
        ct["config"].pop("lock")
    assert {r.sandbox_id: r.reason for r in fast.gc()} == {sid: "removal failed earlier"}
    assert world(srv) == before
    assert create_markers(fast.settings) == []
