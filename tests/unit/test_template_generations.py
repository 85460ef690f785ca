"""Template generations on the embedded default (issue 20 item 3): the slot link, its atomic switch,
who uses a generation, and pruning only what nothing uses (sandbox_rt/backends/lxc/generations.py,
which roles/template_build runs as files/template-generations.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest

from sandbox_rt.backends.lxc import generations as gen
from sandbox_rt.backends.lxc.backend import LxcBackend
from sandbox_rt.backends.lxc.container import read_record, write_record
from sandbox_rt.config import Settings
from sandbox_rt.errors import BackendError
from sandbox_rt.manager import Manager
from sandbox_rt.models import SandboxRecord, SandboxSpec

REPO = Path(__file__).resolve().parents[2]
SLOT = "sandbox-template"
OLD, NEW = f"{SLOT}.aaaaaaaaaa", f"{SLOT}.bbbbbbbbbb"


def _container(lxc: Path, name: str) -> Path:
    cdir = lxc / name
    (cdir / "rootfs").mkdir(parents=True)
    (cdir / "config").write_text(f"lxc.uts.name = {name}\nlxc.rootfs.path = dir:{cdir / 'rootfs'}\n")
    return cdir


def _sandbox(lxc: Path, sid: str, *, template: str = "default", made_from: str | None = None) -> Path:
    cdir = lxc / sid
    cdir.mkdir()
    (cdir / "config").write_text(f"lxc.rootfs.path = overlay:{cdir / 'lower'}:{cdir / 'delta'}\n")
    record: dict[str, object] = {"id": sid, "spec": {"template": template}}
    if made_from is not None:
        record["template_container"] = made_from
    (cdir / "sandbox_rt.json").write_text(json.dumps(record))
    return cdir


def test_the_role_ships_this_module() -> None:
    """A copy, not a link: the collection (galaxy.yml) ships roles/ without sandbox_rt/, where a link
    would point to nothing. Keep them equal: cp sandbox_rt/backends/lxc/generations.py
    roles/template_build/files/template-generations.py"""
    shipped = REPO / "roles" / "template_build" / "files" / "template-generations.py"
    assert not shipped.is_symlink()
    assert shipped.read_bytes() == Path(gen.__file__).read_bytes()


def test_generation_names_carry_a_tag() -> None:
    assert gen.generation_name(SLOT, "0123456789") == f"{SLOT}.0123456789"
    with pytest.raises(ValueError, match="tag"):
        gen.generation_name(SLOT, "../x")


def test_resolve_reads_the_link_or_takes_a_real_dir(tmp_path: Path) -> None:
    _container(tmp_path, SLOT)
    assert gen.resolve(tmp_path, SLOT) == SLOT  # provisioned before generations
    _container(tmp_path, NEW)
    (tmp_path / "other").symlink_to(NEW)
    with pytest.raises(ValueError, match="not a generation of other"):
        gen.resolve(tmp_path, "other")  # a link may name only the slot's own generations
    with pytest.raises(FileNotFoundError):
        gen.resolve(tmp_path, "absent")


def test_switch_repoints_the_link_atomically(tmp_path: Path) -> None:
    _container(tmp_path, OLD)
    _container(tmp_path, NEW)
    assert gen.switch(tmp_path, SLOT, OLD) is True
    assert gen.resolve(tmp_path, SLOT) == OLD
    inode = os.lstat(tmp_path / SLOT).st_ino
    assert gen.switch(tmp_path, SLOT, OLD) is False  # idempotent: nothing touched
    assert os.lstat(tmp_path / SLOT).st_ino == inode
    assert gen.switch(tmp_path, SLOT, NEW) is True
    assert gen.resolve(tmp_path, SLOT) == NEW
    assert sorted(p.name for p in tmp_path.iterdir()) == [SLOT, OLD, NEW]  # no scratch link left
    with pytest.raises(FileNotFoundError):
        gen.switch(tmp_path, SLOT, f"{SLOT}.cccccccccc")  # not built
    with pytest.raises(ValueError):
        gen.switch(tmp_path, SLOT, "sandbox-template-base.aaaaaaaaaa")


def test_switch_turns_a_real_slot_into_the_legacy_generation(tmp_path: Path) -> None:
    """A host provisioned before generations: its template dir becomes <slot>.legacy, its config
    names its own rootfs there, and records without template_container are its users."""
    legacy_dir = _container(tmp_path, SLOT)
    (legacy_dir / "rootfs" / "v1").write_text("old")
    _container(tmp_path, NEW)
    _sandbox(tmp_path, "sbx-0000000001")  # a record written before generations
    assert gen.switch(tmp_path, SLOT, NEW) is True
    kept = tmp_path / f"{SLOT}.legacy"
    assert (kept / "rootfs" / "v1").read_text() == "old"
    assert f"lxc.rootfs.path = dir:{kept / 'rootfs'}" in (kept / "config").read_text()
    assert gen.resolve(tmp_path, SLOT) == NEW
    assert gen.legacy(tmp_path, SLOT) == f"{SLOT}.legacy"
    assert gen.users(tmp_path, f"{SLOT}.legacy", slot=SLOT, name="default") == ["sandbox sbx-0000000001"]
    assert gen.users(tmp_path, NEW, slot=SLOT, name="default") == []


def test_users_are_records_configs_snapshots_and_creates_in_progress(tmp_path: Path) -> None:
    old_dir = _container(tmp_path, OLD)
    _container(tmp_path, NEW)
    gen.switch(tmp_path, SLOT, NEW)
    _sandbox(tmp_path, "sbx-0000000001", made_from=OLD)
    _sandbox(tmp_path, "sbx-0000000002", made_from=NEW)
    shared = tmp_path / "sbx-0000000003"  # shared id maps: the config names the rootfs
    shared.mkdir()
    (shared / "config").write_text(f"lxc.rootfs.path = overlay:{old_dir / 'rootfs'}:{shared / 'delta'}\n")
    snap = tmp_path / "snap-keep"
    snap.mkdir()
    (snap / "snapshot.json").write_text(json.dumps({"template": "default", "template_container": OLD}))
    assert gen.users(tmp_path, OLD, slot=SLOT, name="default") == [
        "sandbox sbx-0000000001",
        "sandbox sbx-0000000003",
        "snapshot keep",
    ]
    markers = tmp_path / ".runtime" / "creating"
    markers.mkdir(parents=True)
    (markers / "sbx-0000000009.json").write_text(json.dumps({"pid": os.getpid()}))
    (markers / "sbx-000000000a.json").write_text(json.dumps({"pid": 2**22 + 17}))  # no such process
    assert gen.users(tmp_path, NEW, slot=SLOT, name="default") == [
        "sandbox sbx-0000000002",
        "create in progress sbx-0000000009",
    ]


def test_prune_removes_only_unused_old_generations(tmp_path: Path) -> None:
    _container(tmp_path, OLD)
    _container(tmp_path, NEW)
    gen.switch(tmp_path, SLOT, NEW)
    user = _sandbox(tmp_path, "sbx-0000000001", made_from=OLD)
    assert gen.prune(tmp_path, SLOT, "default") == []  # a sandbox still runs on it
    assert (tmp_path / OLD / "config").is_file()
    shutil.rmtree(user)  # destroyed
    assert gen.prune(tmp_path, SLOT, "default", dry_run=True) == [OLD]
    assert (tmp_path / OLD).is_dir()
    assert gen.prune(tmp_path, SLOT, "default") == [OLD]
    assert sorted(p.name for p in tmp_path.iterdir()) == [SLOT, NEW]  # the current one stays
    assert gen.prune(tmp_path, SLOT, "default") == []
    assert gen.prune(tmp_path, "absent", "x") == []


def test_the_script_speaks_json(tmp_path: Path) -> None:
    _container(tmp_path, OLD)
    script = REPO / "roles" / "template_build" / "files" / "template-generations.py"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, str(script), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)

    assert json.loads(run("switch", str(tmp_path), SLOT, OLD).stdout) == {"changed": True}
    assert json.loads(run("resolve", str(tmp_path), SLOT).stdout) == OLD
    assert json.loads(run("users", str(tmp_path), SLOT, "default", OLD).stdout) == []
    assert json.loads(run("prune", str(tmp_path), SLOT, "default").stdout) == []
    bad = run("switch", str(tmp_path), SLOT, f"{SLOT}.cccccccccc")
    assert bad.returncode == 1 and "generation has no config" in bad.stderr
    assert run("nonsense", str(tmp_path), SLOT).returncode == 2


# -- the backend: what a sandbox and a snapshot remember ----------------------------------------------
def _record(sid: str) -> SandboxRecord:
    return SandboxRecord(sid, sid, "10.99.1.2", "ssh-ed25519 AAAA", SandboxSpec(), 1.0, None, 0, "h", "lxc")


def test_a_record_keeps_its_generation_across_rewrites(tmp_path: Path) -> None:
    cdir = tmp_path / "sbx-0000000001"
    cdir.mkdir()
    write_record(cdir, _record(cdir.name), None, template_container=OLD)
    write_record(cdir, _record(cdir.name), 5)  # an update (TTL, egress) does not name it again
    assert read_record(cdir)[1] == {"owner_start_time": 5, "template_container": OLD}


def test_the_backend_tells_a_swapped_sandbox_and_resolves_live(tmp_path: Path) -> None:
    _container(tmp_path, OLD)
    _container(tmp_path, NEW)
    gen.switch(tmp_path, SLOT, OLD)
    backend = LxcBackend(Settings(lxc_path=tmp_path))
    assert backend.templates.current("default") == OLD
    cdir = tmp_path / "sbx-0000000001"
    cdir.mkdir()
    write_record(cdir, _record(cdir.name), None, template_container=OLD)
    assert backend.template_is_current(_record(cdir.name)) is True
    gen.switch(tmp_path, SLOT, NEW)  # site.yml's switch: the same backend object sees it at once
    assert backend.templates.current("default") == NEW
    assert backend.template_is_current(_record(cdir.name)) is False
    assert backend.prune_templates() == []  # the sandbox still uses OLD
    shutil.rmtree(cdir)
    assert backend.prune_templates() == [OLD]
    (tmp_path / SLOT).unlink()
    with pytest.raises(BackendError, match="not found"):
        backend.templates.current("default")


# -- the warm pool: no sandbox of a swapped generation is handed out ----------------------------------
class _Warm:
    def __init__(self, sid: str) -> None:
        self.id = sid
        self.record = _record(sid)
        self.destroyed = False

    def destroy(self) -> None:
        self.destroyed = True


class _Pool:
    def __init__(self, items: list[_Warm]) -> None:
        self.items = items

    def take(self) -> _Warm | None:
        return self.items.pop(0) if self.items else None


class _Generations:
    name = "fake"

    def __init__(self, current: set[str]) -> None:
        self.current = current

    def template_is_current(self, record: SandboxRecord) -> bool:
        return record.id in self.current

    def prune_templates(self, *, dry_run: bool = False) -> list[str]:
        return ["sandbox-template.aaaaaaaaaa"]


def test_the_pool_destroys_warm_sandboxes_of_a_swapped_template() -> None:
    stale, fresh = _Warm("sbx-0000000001"), _Warm("sbx-0000000002")
    mgr = object.__new__(Manager)
    mgr.pool = _Pool([stale, fresh])  # type: ignore[assignment]
    mgr.backend = _Generations({fresh.id})  # type: ignore[assignment]
    assert mgr._take_warm() is cast(Any, fresh)
    assert stale.destroyed and not fresh.destroyed
    assert mgr._take_warm() is None  # the pool is empty: create() makes one cold
    assert mgr.prune_templates() == ["sandbox-template.aaaaaaaaaa"]
