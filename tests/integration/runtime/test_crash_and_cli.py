"""A caller killed at any step of create leaves nothing gc does not remove; the CLI end to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sandbox_rt import Manager

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import sandbox_rt
    step = sys.argv[1]
    def progress(msg):
        if msg.startswith(step):
            os.kill(os.getpid(), signal.SIGKILL)
    sandbox_rt.Manager.from_env().create(labels={"test-session": "crash"}, progress=progress)
    """
)


@pytest.mark.parametrize("step", ["cloning", "starting", "waiting for SSH", "ready"])
def test_sigkill_during_create_then_gc_removes_everything(lxc_manager: Manager, step: str) -> None:
    before = {p.name for p in lxc_manager.settings.lxc_path.iterdir()}
    proc = subprocess.run([sys.executable, "-c", CHILD, step], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    after = {p.name for p in lxc_manager.settings.lxc_path.iterdir()}
    leftovers = after - before
    if step != "cloning":  # killed after the clone: something is left for gc to find
        assert leftovers, "the child was killed after cloning, so a container must be left"
    removed = {r.sandbox_id for r in lxc_manager.gc()}
    assert leftovers <= removed
    assert {p.name for p in lxc_manager.settings.lxc_path.iterdir()} - before == set()
    intents = lxc_manager.settings.lxc_path / ".runtime" / "creating"
    for f in intents.glob("*.json"):  # what is left belongs to live creators (e.g. other tests)
        pid = json.loads(f.read_text())["pid"]
        assert Path(f"/proc/{pid}").exists(), f"a dead creator's marker was left: {f.name}"


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandbox_rt.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_cli_run_returns_the_commands_exit_code(lxc_manager: Manager) -> None:
    before = {r.id for r in lxc_manager.list()}
    r = _cli("run", "--memory", "256", "--", "echo hello from $(hostname); exit 5")
    assert r.returncode == 5, r.stderr
    assert r.stdout.startswith("hello from sbx-")
    assert "waiting for SSH" in r.stderr  # progress on stderr
    assert {x.id for x in lxc_manager.list()} == before  # run destroys its sandbox
    q = _cli("-q", "run", "--", "uname", "-s")
    assert q.returncode == 0 and q.stdout == "Linux\n" and q.stderr == ""


def test_cli_create_exec_ls_status_destroy(lxc_manager: Manager) -> None:
    c = _cli("--json", "-q", "create", "--label", "test-session=cli", "--memory", "256")
    assert c.returncode == 0, c.stderr
    sid = json.loads(c.stdout)["id"]
    try:
        e = _cli("exec", sid, "--", "echo", "a b")
        assert e.returncode == 0 and e.stdout == "a b\n"
        ls = json.loads(_cli("--json", "ls", "--label", "test-session=cli").stdout)
        assert [x["id"] for x in ls] == [sid] and "host_key" not in ls[0]
        st = json.loads(_cli("--json", "status", sid).stdout)
        assert st["state"] == "running" and st["memory_mb"] == 256
        x = json.loads(_cli("--json", "extend", sid, "7200").stdout)
        assert x["id"] == sid and 7100 < x["expires_at"] - time.time() <= 7200
        assert lxc_manager.get(sid).expires_at == x["expires_at"]
        assert _cli("extend", sid, "0").returncode != 0  # bad input: a usage error
    finally:
        d = _cli("destroy", sid)
    assert d.returncode == 0
    again = _cli("destroy", sid)
    assert again.returncode == 1 and "SandboxNotFound" in again.stderr


def test_cli_bad_input_is_a_usage_error_and_makes_nothing(lxc_manager: Manager) -> None:
    before = {p.name for p in lxc_manager.settings.lxc_path.iterdir()}
    for args in (["run", "--memory", "10", "--", "true"], ["run"], ["exec", "not-an-id", "--", "true"]):
        r = _cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr
    assert {p.name for p in lxc_manager.settings.lxc_path.iterdir()} == before


def test_cli_reaper_once_removes_expired_and_spares_detached(lxc_manager: Manager) -> None:
    expired = lxc_manager.create(labels={"test-session": "reaper"}, ttl_s=1)
    keep = _cli("--json", "-q", "create", "--label", "test-session=reaper", "--ttl", "600")
    keep_id = json.loads(keep.stdout)["id"]
    try:
        assert expired.expires_at is not None
        while time.time() <= expired.expires_at:  # a 1 s TTL: wait until it has passed
            time.sleep(0.05)
        r = _cli("reaper", "--once")
        assert r.returncode == 0 and f"reaped {expired.id}: expired" in r.stdout
        assert lxc_manager.backend.state(expired.id) == "absent"
        assert lxc_manager.backend.state(keep_id) == "running"  # its creating CLI died, but it is detached
    finally:
        expired.destroy()
        lxc_manager.destroy(keep_id)


def test_create_works_under_a_strict_umask(lxc_manager: Manager) -> None:
    """A service started with umask 077 (common for systemd units) still makes usable sandboxes."""
    r = subprocess.run(
        [sys.executable, "-m", "sandbox_rt.cli", "-q", "run", "--", "id -un"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(0o077),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "sandbox\n"


def test_cli_json_log_of_a_real_run(lxc_manager: Manager) -> None:
    """``--log-format json``: stderr is JSON lines only (no progress), the create and destroy events
    of the one sandbox carry its id; ``python -m sandbox_rt`` is the same CLI."""
    r = subprocess.run(
        [sys.executable, "-m", "sandbox_rt", "--log-format", "json", "run", "--memory", "256", "--", "true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in r.stderr.splitlines()]  # every line is a JSON object
    events = [(x["event"], x["sandbox_id"]) for x in records if "event" in x]
    assert [e for e, _ in events] == ["create", "destroy"], records
    assert events[0][1] == events[1][1] and events[0][1].startswith("sbx-")
    assert {x["level"] for x in records} <= {"info", "warning"}
