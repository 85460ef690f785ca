"""create() is all or nothing: whatever step fails, what was made is destroyed before the error."""

from __future__ import annotations

import builtins
import time
from pathlib import Path

import paramiko
import pytest

from sandbox_rt import BackendError, Manager, SandboxNotFound, SandboxNotReady, Settings
from sandbox_rt.backends.base import Backend, GcCandidate
from sandbox_rt.models import ResourceUsage, SandboxRecord, SandboxSpec

PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL5dm4KOvl3QlBbhKdI3QN7La34YghQNSLORFdFDsUjF"


class FakeBackend:
    """In-memory engine; ``fail_at`` names the step that raises."""

    name = "fake"

    def __init__(self, fail_at: str = "") -> None:
        self.fail_at = fail_at
        self.made: dict[str, SandboxRecord] = {}
        self.intents: set[str] = set()
        self.destroyed: list[str] = []
        self.internet: set[str] = set()

    def _maybe_fail(self, step: str) -> None:
        if self.fail_at == step:
            raise BackendError("injected", step=step)

    def begin(self, sandbox_id: str) -> None:
        self.intents.add(sandbox_id)

    def end(self, sandbox_id: str) -> None:
        self.intents.discard(sandbox_id)

    def clone(self, sandbox_id: str, spec: SandboxSpec) -> SandboxRecord:
        rec = SandboxRecord(sandbox_id, sandbox_id, "127.0.0.1", PUB, spec, time.time(), None, 1, "h", "fake")
        self.made[sandbox_id] = rec
        self._maybe_fail("clone")
        return rec

    def start(self, sandbox_id: str) -> SandboxRecord:
        self._maybe_fail("start")
        return self.made[sandbox_id]

    def stop(self, sandbox_id: str) -> None:
        pass

    def update(self, record: SandboxRecord, spec: SandboxSpec) -> SandboxRecord:
        self._maybe_fail("update")
        new = SandboxRecord(
            record.id,
            spec.hostname or record.hostname,
            record.ip,
            record.host_key,
            spec,
            record.created_at,
            None,
            record.owner_pid,
            record.owner_host,
            record.backend,
        )
        self.made[record.id] = new
        return new

    def destroy(self, sandbox_id: str) -> bool:
        self.destroyed.append(sandbox_id)
        self.internet.discard(sandbox_id)
        return self.made.pop(sandbox_id, None) is not None

    def get(self, sandbox_id: str) -> SandboxRecord:
        try:
            return self.made[sandbox_id]
        except KeyError:
            raise SandboxNotFound(sandbox_id) from None

    def list(self) -> builtins.list[SandboxRecord]:
        return list(self.made.values())

    def state(self, sandbox_id: str) -> str:
        return "running" if sandbox_id in self.made else "absent"

    def uptime_s(self, sandbox_id: str) -> float | None:
        return 1.0

    def usage(self, sandbox_id: str) -> ResourceUsage:
        return ResourceUsage()

    def set_internet(self, record: SandboxRecord, enabled: bool) -> None:
        self._maybe_fail("internet")
        self.internet.add(record.id)

    def internet_enabled(self, record: SandboxRecord) -> bool:
        return record.id in self.internet

    def set_egress(self, record: SandboxRecord, egress: tuple[str, ...]) -> None:
        self._maybe_fail("egress")

    def gc_candidates(self, *, now: float, dead_owners: bool) -> builtins.list[GcCandidate]:
        return [GcCandidate(i, "test") for i in self.made]


def _manager(backend: FakeBackend) -> Manager:
    # nothing listens on port 22 of 127.0.0.1 in the test: SSH readiness fails fast
    settings = Settings(ssh_ready_timeout_s=0.3)
    return Manager(settings, backend=backend, ssh_key=_key())


def _key() -> paramiko.PKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    import io

    return paramiko.Ed25519Key.from_private_key(io.StringIO(pem.decode()))


def test_fake_backend_satisfies_the_protocol() -> None:
    assert isinstance(FakeBackend(), Backend)


@pytest.mark.parametrize(
    ("fail_at", "error"),
    [
        ("clone", BackendError),
        ("start", BackendError),
        ("internet", BackendError),
        ("egress", BackendError),
        ("", SandboxNotReady),
    ],
)
def test_any_failed_step_destroys_what_was_made(fail_at: str, error: type[Exception]) -> None:
    backend = FakeBackend(fail_at)
    mgr = _manager(backend)
    with pytest.raises(error):
        mgr.create(internet=True, egress=["192.0.2.0/24"])
    assert backend.made == {} and backend.intents == set() and len(backend.destroyed) == 1


def test_bad_arguments_touch_nothing() -> None:
    backend = FakeBackend()
    mgr = _manager(backend)
    with pytest.raises(Exception, match="memory_mb"):
        mgr.create(memory_mb=1)
    assert backend.destroyed == [] and backend.intents == set()


def test_missing_key_fails_before_clone(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr = Manager(Settings(), backend=backend, ssh_key=tmp_path / "absent")
    with pytest.raises(Exception, match="does not exist"):
        mgr.create()
    assert backend.destroyed == [] and backend.made == {}


def test_destroy_unknown_id_raises_not_found() -> None:
    mgr = _manager(FakeBackend())
    with pytest.raises(SandboxNotFound):
        mgr.destroy("sbx-0000000000")


def test_list_filters_by_labels() -> None:
    backend = FakeBackend()
    spec_a = SandboxSpec(labels={"team": "a", "x": "1"})
    spec_b = SandboxSpec(labels={"team": "b"})
    for sid, spec in (("sbx-000000000a", spec_a), ("sbx-000000000b", spec_b)):
        backend.made[sid] = SandboxRecord(sid, sid, "127.0.0.1", PUB, spec, 0.0, None, 1, "h", "fake")
    mgr = _manager(backend)
    assert [r.id for r in mgr.list(labels={"team": "a"})] == ["sbx-000000000a"]
    assert len(mgr.list()) == 2
    assert {r.sandbox_id for r in mgr.gc(dry_run=True)} == {"sbx-000000000a", "sbx-000000000b"}
    assert len(backend.made) == 2  # dry run removed nothing
