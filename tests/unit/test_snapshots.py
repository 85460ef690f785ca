"""Snapshots at the Manager level, with an in-memory backend: names are checked before anything is
made, a fork goes through the all-or-nothing create, unknown names are typed errors."""

from __future__ import annotations

import builtins
import time

import pytest
from test_manager_cleanup import PUB, FakeBackend, _manager

from sandbox_rt import (
    BackendError,
    ConfigError,
    SandboxNotReady,
    SnapshotInfo,
    SnapshotNotFound,
    StateConflict,
)
from sandbox_rt.backends.base import SnapshotBackend
from sandbox_rt.models import SandboxRecord, SandboxSpec
from sandbox_rt.validation import check_snapshot_name

BAD_NAMES = ["", "a", "1abc", "_x", "-x", "has space", "a.b", "x" * 41, "current", "VZDUMP", "../e", "a/b"]


class FakeSnapshots(FakeBackend):
    def __init__(self, fail_at: str = "") -> None:
        super().__init__(fail_at)
        self.snapshots: dict[str, SnapshotInfo] = {}
        self.forked_from: dict[str, str] = {}

    def snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo:
        self.get(sandbox_id)
        if name in self.snapshots:
            raise StateConflict(f"a snapshot named {name!r} exists already")
        self.snapshots[name] = SnapshotInfo(name, sandbox_id, time.time(), self.name)
        return self.snapshots[name]

    def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        return sorted(self.snapshots.values(), key=lambda s: s.name)

    def delete_snapshot(self, name: str) -> bool:
        return self.snapshots.pop(name, None) is not None

    def clone_from_snapshot(self, sandbox_id: str, spec: SandboxSpec, name: str) -> SandboxRecord:
        if name not in self.snapshots:
            raise SnapshotNotFound(name)
        rec = SandboxRecord(sandbox_id, sandbox_id, "127.0.0.1", PUB, spec, time.time(), None, 1, "h", "fake")
        self.made[sandbox_id] = rec
        self.forked_from[sandbox_id] = name
        self._maybe_fail("clone")
        return rec


def test_the_fake_has_the_capability_and_the_plain_fake_has_not() -> None:
    assert isinstance(FakeSnapshots(), SnapshotBackend)
    assert not isinstance(FakeBackend(), SnapshotBackend)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_config_errors(name: str) -> None:
    with pytest.raises(ConfigError):
        check_snapshot_name(name)


@pytest.mark.parametrize("name", ["ab", "Base_env", "py-3-11", "x" * 40])
def test_good_names_pass(name: str) -> None:
    assert check_snapshot_name(name) == name


@pytest.mark.parametrize("name", [*BAD_NAMES, 7, b"ab"])
def test_bad_names_touch_nothing(name: object) -> None:
    backend = FakeSnapshots()
    backend.made["sbx-000000000a"] = SandboxRecord(
        "sbx-000000000a", "a", "127.0.0.1", PUB, SandboxSpec(), 0.0, None, 1, "h", "fake"
    )
    mgr = _manager(backend)
    for call in (
        lambda: mgr.create(from_snapshot=name),  # type: ignore[arg-type]
        lambda: mgr.snapshot("sbx-000000000a", name),  # type: ignore[arg-type]
        lambda: mgr.delete_snapshot(name),  # type: ignore[arg-type]
    ):
        with pytest.raises(ConfigError):
            call()
    assert backend.snapshots == {} and backend.destroyed == [] and backend.intents == set()
    assert list(backend.made) == ["sbx-000000000a"]


def test_unknown_snapshot_is_typed_and_leaves_nothing() -> None:
    backend = FakeSnapshots()
    mgr = _manager(backend)
    with pytest.raises(SnapshotNotFound) as err:
        mgr.create(from_snapshot="nosuch")
    assert err.value.name == "nosuch" and isinstance(err.value, LookupError)
    assert backend.made == {} and backend.intents == set()
    with pytest.raises(SnapshotNotFound):
        mgr.delete_snapshot("nosuch")


@pytest.mark.parametrize(("fail_at", "error"), [("clone", BackendError), ("", SandboxNotReady)])
def test_a_failed_fork_destroys_what_was_made(fail_at: str, error: type[Exception]) -> None:
    backend = FakeSnapshots(fail_at)
    backend.snapshots["base"] = SnapshotInfo("base", "sbx-000000000a", 0.0, "fake")
    mgr = _manager(backend)
    with pytest.raises(error):
        mgr.create(from_snapshot="base")
    assert backend.made == {} and backend.intents == set() and len(backend.destroyed) == 1
    assert list(backend.forked_from.values()) == ["base"]  # it was a fork, not a template clone
    assert "base" in backend.snapshots


def test_a_backend_without_snapshots_says_so_before_anything() -> None:
    backend = FakeBackend()
    mgr = _manager(backend)
    with pytest.raises(ConfigError, match="no snapshots"):
        mgr.create(from_snapshot="base")
    with pytest.raises(ConfigError, match="no snapshots"):
        mgr.list_snapshots()
    assert backend.intents == set() and backend.destroyed == []


def test_manager_snapshot_calls_reach_the_backend() -> None:
    backend = FakeSnapshots()
    backend.made["sbx-000000000a"] = SandboxRecord(
        "sbx-000000000a", "a", "127.0.0.1", PUB, SandboxSpec(), 0.0, None, 1, "h", "fake"
    )
    mgr = _manager(backend)
    info = mgr.snapshot("sbx-000000000a", "base")
    assert info.source_id == "sbx-000000000a"
    assert [s.name for s in mgr.list_snapshots()] == ["base"]
    with pytest.raises(ConfigError):
        mgr.snapshot("sbx-000000000a", "base")
    mgr.delete_snapshot("base")
    assert mgr.list_snapshots() == []
