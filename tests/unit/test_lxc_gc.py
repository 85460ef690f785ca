"""gc finds half-made, expired and orphaned sandboxes in an LXC path (no containers needed)."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from sandbox_rt.backends.lxc import LxcBackend
from sandbox_rt.backends.owner import owner_alive, process_start_time
from sandbox_rt.config import Settings


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _record(sid: str, *, expires_at: float | None, pid: int) -> dict[str, object]:
    return {
        "id": sid,
        "hostname": sid,
        "ip": "10.99.1.9",
        "host_key": "ssh-ed25519 AAAA",
        "created_at": 0.0,
        "expires_at": expires_at,
        "owner_pid": pid,
        "owner_host": socket.gethostname(),
        "backend": "lxc",
        "owner_start_time": process_start_time(pid),
        "spec": {"labels": {}},
    }


def test_candidates_and_collection(tmp_path: Path) -> None:
    backend = LxcBackend(Settings(lxc_path=tmp_path))
    dead = _dead_pid()
    now = time.time()
    layout = {
        "sbx-00000000a1": None,  # no record: half-made
        "sbx-00000000a2": _record("sbx-00000000a2", expires_at=now - 1, pid=os.getpid()),
        "sbx-00000000a3": _record("sbx-00000000a3", expires_at=now + 999, pid=dead),
        "sbx-00000000a4": _record("sbx-00000000a4", expires_at=now + 999, pid=os.getpid()),
        "not-ours": None,
    }
    for sid, rec in layout.items():
        (tmp_path / sid).mkdir()
        if rec is not None:
            (tmp_path / sid / "sandbox_rt.json").write_text(json.dumps(rec))
    backend.intents.mkdir(parents=True)
    (backend.intents / "sbx-00000000b1.json").write_text(
        json.dumps({"id": "sbx-00000000b1", "pid": dead, "start_time": None, "host": socket.gethostname()})
    )
    (tmp_path / "sbx-00000000b1").mkdir()
    backend.begin("sbx-00000000b2")  # a live create of ours: must be left alone
    (tmp_path / "sbx-00000000b2").mkdir()

    found = {c.sandbox_id: c.reason for c in backend.gc_candidates(now=now, dead_owners=False)}
    assert found == {
        "sbx-00000000a1": "no record (half-made)",
        "sbx-00000000a2": "expired",
        "sbx-00000000b1": "creator died during create",
    }
    with_owners = {c.sandbox_id for c in backend.gc_candidates(now=now, dead_owners=True)}
    assert with_owners == set(found) | {"sbx-00000000a3"}

    for sid in with_owners:
        assert backend.destroy(sid)
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert left == ["not-ours", "sbx-00000000a4", "sbx-00000000b2"]
    assert not (backend.intents / "sbx-00000000b1.json").exists()
    assert backend.destroy("sbx-00000000a1") is False  # idempotent


def test_owner_alive_uses_start_time_against_pid_reuse() -> None:
    me = os.getpid()
    host = socket.gethostname()
    assert owner_alive(me, process_start_time(me), host)
    assert not owner_alive(me, (process_start_time(me) or 0) + 1, host)
    assert not owner_alive(_dead_pid(), None, host)
    assert owner_alive(_dead_pid(), None, "some-other-host")
