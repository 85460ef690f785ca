"""Snapshots on real containers: save a sandbox's files, fork new sandboxes from them.

Both backends (``manager``/``make``): the fork sees the files as they were at the snapshot, has its
own id, address, host key and machine-id; the source goes on; names are checked; unknown names are
typed errors that leave nothing behind; delete removes a snapshot. LXC only: snapshots outlive their
sandbox and gc never touches them; a failed fork removes what it made. PVE only: a snapshot goes
with its sandbox's CT, forks (full clones) do not.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox_rt
from pve_testserver import PVETestServer
from sandbox_rt import ConfigError, Manager, Sandbox, SnapshotNotFound
from sandbox_rt.backends.base import snapshot_backend
from sandbox_rt.backends.lxc import LxcBackend
from sandbox_rt.backends.proxmox import ProxmoxBackend
from sandbox_rt.cli import main as cli_main

from .conftest import SESSION_LABEL, Factory

DATA = "/home/sandbox/work/data.txt"


def _name() -> str:
    return "t_" + secrets.token_hex(6)


@pytest.fixture
def snapname(manager: Manager) -> Iterator[str]:
    """A fresh snapshot name, deleted after the test whatever happened."""
    name = _name()
    yield name
    with contextlib.suppress(SnapshotNotFound):
        manager.delete_snapshot(name)


def _machine_id(sb: Sandbox) -> str:
    return sb.exec("cat /etc/machine-id", check=True).text.strip()


def _fixed_id(monkeypatch: pytest.MonkeyPatch) -> str:
    """The id the next create will use (so a failed create's remains can be looked for by name,
    whatever other processes on this host make meanwhile)."""
    sandbox_id = "sbx-" + secrets.token_hex(5)
    monkeypatch.setattr(sandbox_rt.manager, "new_sandbox_id", lambda: sandbox_id)
    return sandbox_id


def _remains(mgr: Manager, sandbox_id: str) -> list[str]:
    """What is left of a create of ``sandbox_id``: container, create marker, address reservation."""
    backend = mgr.backend
    found = []
    if (backend.markers.directory / f"{sandbox_id}.json").exists():  # type: ignore[attr-defined]
        found.append("create marker")
    if sandbox_id in [r.id for r in mgr.list()]:
        found.append("sandbox")
    if isinstance(backend, LxcBackend) and (backend.path / sandbox_id).exists():
        found.append("container dir (its config holds the address)")
    if isinstance(backend, ProxmoxBackend):
        for r in backend._resources():
            if sandbox_id in str(r.get("tags", "")):
                found.append(f"CT {r['vmid']} (its tags hold the address)")
    return found


def test_fork_sees_the_files_and_has_its_own_identity(manager: Manager, make: Factory, snapname: str) -> None:
    src = make(memory_mb=512)
    src.write_file(DATA, b"prepared environment\n")
    src.exec("mkdir -p ~/venv/bin && echo tool > ~/venv/bin/tool && rm ~/.bashrc", check=True)

    info = src.snapshot(snapname)
    assert (info.name, info.source_id, info.backend) == (snapname, src.id, manager.backend.name)
    assert snapname in [s.name for s in manager.list_snapshots()]
    src.write_file("/home/sandbox/after.txt", b"written after the snapshot")

    fork = make(from_snapshot=snapname, memory_mb=512)
    # the files as they were at the snapshot: written, created, deleted (an overlay whiteout)
    assert fork.read_file(DATA) == b"prepared environment\n"
    assert fork.exec("cat ~/venv/bin/tool", check=True).text == "tool\n"
    assert fork.exec("test -e ~/.bashrc").exit_code == 1
    assert fork.exec("test -e ~/after.txt").exit_code == 1
    # its own identity
    assert fork.id != src.id and fork.ip != src.ip
    assert fork.record.host_key != src.record.host_key
    assert _machine_id(fork) != _machine_id(src)
    assert fork.exec("hostname", check=True).text.strip() == fork.id
    pub = fork.exec("cat /etc/ssh/ssh_host_ed25519_key.pub", check=True).text
    assert pub.split()[:2] == fork.record.host_key.split()[:2]  # the key it was pinned to
    assert fork.labels == SESSION_LABEL and fork.id in [r.id for r in manager.list(labels=SESSION_LABEL)]
    # the source goes on, with what it wrote after the snapshot
    assert src.read_file("/home/sandbox/after.txt") == b"written after the snapshot"
    assert src.exec("echo ok", check=True).text == "ok\n"
    # forks of one snapshot are independent of each other
    fork.write_file(DATA, b"changed in the fork")
    second = make(from_snapshot=snapname, memory_mb=512)
    assert second.read_file(DATA) == b"prepared environment\n"
    assert len({src.ip, fork.ip, second.ip}) == 3


def test_snapshot_names_are_checked(
    manager: Manager, sandbox: Sandbox, snapname: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox_id = _fixed_id(monkeypatch)
    for bad in ("", "x", "1abc", "with space", "../etc", "current", "y" * 41):
        with pytest.raises(ConfigError):
            sandbox.snapshot(bad)
        with pytest.raises(ConfigError):
            manager.create(from_snapshot=bad, labels=SESSION_LABEL)
    assert not [s for s in manager.list_snapshots() if s.source_id == sandbox.id]
    sandbox.snapshot(snapname)
    with pytest.raises(ConfigError, match="exists already"):
        sandbox.snapshot(snapname)
    assert [s.name for s in manager.list_snapshots()].count(snapname) == 1
    assert _remains(manager, sandbox_id) == []


def test_unknown_snapshot_is_typed_and_leaves_nothing(
    manager: Manager, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox_id = _fixed_id(monkeypatch)
    name = _name()
    with pytest.raises(SnapshotNotFound) as err:
        manager.create(from_snapshot=name, labels=SESSION_LABEL)
    assert err.value.name == name
    with pytest.raises(SnapshotNotFound):
        manager.delete_snapshot(name)
    assert _remains(manager, sandbox_id) == []  # no container, no address, no create marker


def test_delete_snapshot_removes_it(manager: Manager, sandbox: Sandbox, snapname: str) -> None:
    sandbox.snapshot(snapname)
    manager.delete_snapshot(snapname)
    assert snapname not in [s.name for s in manager.list_snapshots()]
    with pytest.raises(SnapshotNotFound):
        manager.create(from_snapshot=snapname, labels=SESSION_LABEL)
    with pytest.raises(SnapshotNotFound):
        manager.delete_snapshot(snapname)
    if isinstance(manager.backend, LxcBackend):
        assert not (manager.settings.lxc_path / f"snap-{snapname}").exists()
    assert sandbox.exec("echo alive", check=True).text == "alive\n"  # the source is untouched


# -- LXC: snapshots are independent of their sandbox --------------------------------------------


def test_lxc_snapshot_outlives_its_sandbox_and_gc_leaves_it(lxc_manager: Manager, make_lxc: Factory) -> None:
    name = _name()
    try:
        src = make_lxc(memory_mb=256)
        src.write_file(DATA, b"kept")
        info = src.snapshot(name)
        assert info.size_bytes is not None and info.size_bytes > 0
        early = make_lxc(from_snapshot=name, memory_mb=256)
        src.destroy()
        assert name in [s.name for s in lxc_manager.list_snapshots()]
        assert early.read_file(DATA) == b"kept"  # a fork made before the source went still works
        late = make_lxc(from_snapshot=name, memory_mb=256)  # and new forks still come
        assert late.read_file(DATA) == b"kept"

        sdir = lxc_manager.settings.lxc_path / f"snap-{name}"
        assert json.loads((sdir / "snapshot.json").read_text())["source_id"] == info.source_id
        assert not (sdir / "config").exists()  # not a container: no address, invisible to lxc-ls
        # gc (also with dead owners) never takes a snapshot for a sandbox
        swept = lxc_manager.gc(dead_owners=True, dry_run=True)
        assert all(not g.sandbox_id.startswith("snap-") for g in swept)
        lxc_manager.gc()
        assert sdir.is_dir() and name in [s.name for s in lxc_manager.list_snapshots()]
        assert all(r.id.startswith("sbx-") for r in lxc_manager.list())
    finally:
        with contextlib.suppress(SnapshotNotFound):
            lxc_manager.delete_snapshot(name)


def test_lxc_failed_fork_removes_what_it_made(
    lxc_manager: Manager, make_lxc: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sandbox_rt.backends.lxc.snapshots as lxc_module  # a fork fills its delta there

    name = _name()
    try:
        make_lxc(memory_mb=256).snapshot(name)
        sandbox_id = _fixed_id(monkeypatch)
        real_copy = lxc_module.copy_tree

        def failing_copy(src: Path, dst: Path, *, step: str, timeout: float = 3600) -> None:
            if step == "clone":
                raise sandbox_rt.BackendError("injected copy failure", step=step)
            real_copy(src, dst, step=step, timeout=timeout)

        monkeypatch.setattr(lxc_module, "copy_tree", failing_copy)
        with pytest.raises(sandbox_rt.BackendError, match="injected"):
            lxc_manager.create(from_snapshot=name, labels=SESSION_LABEL)
        assert _remains(lxc_manager, sandbox_id) == []
    finally:
        with contextlib.suppress(SnapshotNotFound):
            lxc_manager.delete_snapshot(name)


def test_lxc_snapshot_never_writes_through_a_planted_symlink(
    lxc_manager: Manager, make_lxc: Factory, tmp_path: Path
) -> None:
    """A snapshot's delta is the sandbox's: if its /etc/ssh were a symlink to a host path, the fork's
    identity must still land inside the fork (here: the delta is edited on the host as container
    root could have left it)."""
    name = _name()
    victim = tmp_path / "victim"
    victim.mkdir()
    try:
        make_lxc(memory_mb=256).snapshot(name)
        delta = lxc_manager.settings.lxc_path / f"snap-{name}" / "delta"
        ssh_dir = delta / "etc" / "ssh"
        for child in ssh_dir.iterdir():
            child.unlink()
        ssh_dir.rmdir()
        ssh_dir.symlink_to(victim)
        (delta / "etc" / "hostname").unlink()
        (delta / "etc" / "hostname").symlink_to(victim / "hostname")
        fork = make_lxc(from_snapshot=name, memory_mb=256)
        assert list(victim.iterdir()) == []
        assert fork.exec("hostname", check=True).text.strip() == fork.id
        assert fork.exec("test -L /etc/ssh").exit_code == 1
    finally:
        with contextlib.suppress(SnapshotNotFound):
            lxc_manager.delete_snapshot(name)


def test_lxc_cli_snapshot_and_fork(
    lxc_manager: Manager, make_lxc: Factory, capsys: pytest.CaptureFixture[str]
) -> None:
    name = _name()
    forked: list[str] = []
    try:
        src = make_lxc(memory_mb=256)
        src.write_file(DATA, b"via the cli")
        assert cli_main(["-q", "--json", "snapshot", src.id, name]) == 0
        assert json.loads(capsys.readouterr().out)["name"] == name
        assert cli_main(["-q", "snapshots"]) == 0
        assert name in capsys.readouterr().out
        assert cli_main(["-q", "create", "--from-snapshot", name, "--memory", "256", "--ttl", "600"]) == 0
        forked.append(capsys.readouterr().out.strip())
        fork = lxc_manager.attach(forked[0])
        try:
            assert fork.read_file(DATA) == b"via the cli"
        finally:
            fork.close()
        assert cli_main(["-q", "create", "--from-snapshot", "bad.name"]) == 2
        assert cli_main(["-q", "create", "--from-snapshot", _name()]) == 1  # SnapshotNotFound
        assert cli_main(["-q", "delete-snapshot", name]) == 0
        assert name not in [s.name for s in lxc_manager.list_snapshots()]
    finally:
        for sid in forked:
            with contextlib.suppress(sandbox_rt.SandboxError):
                lxc_manager.destroy(sid)
        with contextlib.suppress(SnapshotNotFound):
            lxc_manager.delete_snapshot(name)


# -- Proxmox VE: a snapshot belongs to its sandbox's CT --------------------------------------------


def test_pve_snapshot_goes_with_its_sandbox_but_forks_stay(
    pve_manager: Manager, pve_env: tuple[sandbox_rt.Settings, PVETestServer | None]
) -> None:
    name = _name()
    made: list[Sandbox] = []
    try:
        src = pve_manager.create(memory_mb=256, labels=SESSION_LABEL)
        made.append(src)
        src.write_file(DATA, b"pve")
        src.snapshot(name)
        fork = pve_manager.create(from_snapshot=name, memory_mb=256, labels=SESSION_LABEL)
        made.append(fork)
        backend = snapshot_backend(pve_manager.backend)
        assert [s.source_id for s in backend.list_snapshots() if s.name == name] == [src.id]
        # the clone copied the source's firewall: the fork has its own rules once, not the source's too
        assert isinstance(backend, ProxmoxBackend)

        def rules(sb: Sandbox) -> list[tuple[str, ...]]:
            return sorted(
                tuple(str(r.get(k, "")) for k in ("type", "action", "dest", "proto", "dport"))
                for r in backend._internet_rules(sb.record)[1]
            )

        assert rules(src) and rules(fork) == rules(src)
        assert not backend.internet_enabled(fork.record)
        src.destroy()
        assert name not in [s.name for s in pve_manager.list_snapshots()]  # gone with the CT
        assert fork.read_file(DATA) == b"pve"  # a full clone: independent of source and snapshot
        with pytest.raises(SnapshotNotFound):
            pve_manager.create(from_snapshot=name, labels=SESSION_LABEL)
    finally:
        for sb in made:
            with contextlib.suppress(sandbox_rt.SandboxError):
                sb.destroy()


def test_pve_failed_fork_removes_what_it_made(
    pve_manager: Manager, srv: PVETestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = _name()
    src = pve_manager.create(memory_mb=256, labels=SESSION_LABEL)
    try:
        src.snapshot(name)
        sandbox_id = _fixed_id(monkeypatch)
        srv.faults.fail_tasks("injected clone failure", types=["vzclone"], count=1)
        try:
            with pytest.raises(sandbox_rt.BackendError, match="injected clone failure"):
                pve_manager.create(from_snapshot=name, labels=SESSION_LABEL)
        finally:
            srv.faults.clear()
        assert _remains(pve_manager, sandbox_id) == []
        assert name in [s.name for s in pve_manager.list_snapshots()]
    finally:
        src.destroy()
