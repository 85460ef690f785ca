"""The same agent code on the host and on another machine: one sync snippet run unchanged against
``Manager`` and ``remote.Client``, one async snippet against ``AsyncManager`` and
``remote.AsyncClient``, the clients talking to a real ``sandbox-rt serve`` on loopback (token in a
0600 file), all driving real LXC sandboxes. Each snippet makes one sandbox."""

from __future__ import annotations

import asyncio
import errno
import secrets
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sandbox_rt
from sandbox_rt import remote
from tests.integration.prepared import labelled_manager
from tests.integration.server_process import served

pytestmark = pytest.mark.slow

SANDBOX_RT = Path(sys.executable).with_name("sandbox-rt")
LABEL = {"test-remote": uuid.uuid4().hex[:12]}
TOKEN = secrets.token_urlsafe(32)
FILE = "/home/sandbox/work/data.bin"
PAYLOAD = bytes(range(256)) * 4


def agent(factory: Any) -> dict[str, Any]:
    """What an agent does: create, exec, write/read a file, stream, fail in the usual ways, destroy."""
    with factory.create(memory_mb=512, labels=LABEL, ttl_s=600) as sb:
        r = sb.exec("cat; echo $X >&2; exit 3", stdin="in\n", env={"X": "ex"}, timeout=30)
        sb.write_file(FILE, PAYLOAD)
        data = sb.read_file(FILE)
        stream = sb.exec_stream("for i in 1 2 3; do echo $i; done; echo done >&2", timeout=30)
        chunks = [(c.stream, c.data) for c in stream]
        try:
            sb.read_file("/home/sandbox/missing")
        except sandbox_rt.FileOperationError as exc:
            missing = exc.errno
        try:
            sb.exec("echo partial; sleep 30", timeout=1)
        except sandbox_rt.CommandTimeout as exc:
            timed_out = exc.stdout
        try:
            sb.exec("exit 7", check=True)
        except sandbox_rt.ExecError as exc:
            failed = exc.exit_code
        return {
            "id": sb.id,
            "labels": sb.labels,
            "result": (r.stdout, r.stderr, r.exit_code),
            "file": data,
            "stdout": b"".join(d for s, d in chunks if s == "stdout"),
            "stderr": b"".join(d for s, d in chunks if s == "stderr"),
            "stream_exit": stream.result.exit_code if stream.result else None,
            "missing": missing,
            "timed_out": timed_out,
            "failed": failed,
        }


async def async_agent(factory: Any) -> dict[str, Any]:
    """The same, for asyncio."""
    async with factory.create(memory_mb=512, labels=LABEL, ttl_s=600) as sb:
        r = await sb.exec("cat; echo $X >&2; exit 3", stdin="in\n", env={"X": "ex"}, timeout=30)
        await sb.write_file(FILE, PAYLOAD)
        data = await sb.read_file(FILE)
        stream = sb.exec_stream("for i in 1 2 3; do echo $i; done; echo done >&2", timeout=30)
        chunks = [(c.stream, c.data) async for c in stream]
        try:
            await sb.read_file("/home/sandbox/missing")
        except sandbox_rt.FileOperationError as exc:
            missing = exc.errno
        try:
            await sb.exec("echo partial; sleep 30", timeout=1)
        except sandbox_rt.CommandTimeout as exc:
            timed_out = exc.stdout
        try:
            await sb.exec("exit 7", check=True)
        except sandbox_rt.ExecError as exc:
            failed = exc.exit_code
        return {
            "id": sb.id,
            "labels": sb.labels,
            "result": (r.stdout, r.stderr, r.exit_code),
            "file": data,
            "stdout": b"".join(d for s, d in chunks if s == "stdout"),
            "stderr": b"".join(d for s, d in chunks if s == "stderr"),
            "stream_exit": stream.result.exit_code if stream.result else None,
            "missing": missing,
            "timed_out": timed_out,
            "failed": failed,
        }


EXPECTED = {
    "labels": LABEL,
    "result": (b"in\n", b"ex\n", 3),
    "file": PAYLOAD,
    "stdout": b"1\n2\n3\n",
    "stderr": b"done\n",
    "stream_exit": 0,
    "missing": errno.ENOENT,
    "timed_out": b"partial\n",
    "failed": 7,
}


@pytest.fixture(scope="module")
def manager() -> Iterator[sandbox_rt.Manager]:
    with labelled_manager(LABEL) as mgr:
        yield mgr


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, manager: sandbox_rt.Manager) -> Iterator[tuple[str, Path]]:
    """A real ``sandbox-rt serve`` on 127.0.0.1 (a free port), its token in a 0600 file."""
    command = [str(SANDBOX_RT), "serve", "--port", "0"]
    ready = r"listening on (http://127\.0\.0\.1:\d+)"
    with served(command, TOKEN, tmp_path_factory.mktemp("api"), ready) as server:
        yield server.urls[0], server.token_file


def check(outcome: dict[str, Any], manager: sandbox_rt.Manager) -> None:
    assert {k: v for k, v in outcome.items() if k != "id"} == EXPECTED
    assert outcome["id"] not in {r.id for r in manager.list(labels=LABEL)}  # leaving the block destroyed it


def test_sync_snippet_in_process(manager: sandbox_rt.Manager) -> None:
    check(agent(manager), manager)


def test_sync_snippet_over_http(api: tuple[str, Path], manager: sandbox_rt.Manager) -> None:
    url, token_file = api
    with remote.Client(url, token_file=token_file) as client:
        check(agent(client), manager)


def test_async_snippet_in_process(manager: sandbox_rt.Manager) -> None:
    async def main() -> dict[str, Any]:
        async with sandbox_rt.AsyncManager(manager) as mgr:
            return await async_agent(mgr)

    check(asyncio.run(main()), manager)


def test_async_snippet_over_http(api: tuple[str, Path], manager: sandbox_rt.Manager) -> None:
    url, token_file = api

    async def main() -> dict[str, Any]:
        async with remote.AsyncClient(url, token_file=token_file) as client:
            return await async_agent(client)

    check(asyncio.run(main()), manager)


def test_remote_list_attach_and_errors(api: tuple[str, Path], manager: sandbox_rt.Manager) -> None:
    url, token_file = api
    with (
        remote.Client(url, token_file=token_file) as client,
        client.create(memory_mb=512, labels=LABEL) as sb,
    ):
        assert [r.id for r in client.list(labels=LABEL)] == [sb.id]
        again = client.attach(sb.id)
        assert again.exec("hostname").text.strip() == sb.hostname
        assert sb.status().state == "running"
        with pytest.raises(sandbox_rt.SandboxNotFound):
            client.attach("sbx-0000000000")
        with pytest.raises(sandbox_rt.ConfigError, match="memory_mb"):
            client.create(memory_mb=1)
    with remote.Client(url, token="x" * 32) as wrong, pytest.raises(sandbox_rt.PermissionDenied):
        wrong.list()


def test_remote_extend_and_snapshots_reach_the_real_sandbox(
    api: tuple[str, Path], manager: sandbox_rt.Manager
) -> None:
    """TTL extend, snapshot list and delete over HTTP change the real record and snapshot store."""
    url, token_file = api
    name = f"remote{secrets.token_hex(3)}"
    with (
        remote.Client(url, token_file=token_file) as client,
        client.create(memory_mb=512, labels=LABEL) as sb,
    ):
        sb.extend(7200)
        expires = manager.get(sb.id).expires_at
        assert expires is not None and 7100 < expires - time.time() <= 7200
        sb.exec("echo kept > /home/sandbox/note", check=True)
        sb.snapshot(name)
        try:
            listed = [s for s in client.list_snapshots() if s.name == name]
            assert [(s.source_id, s.template) for s in listed] == [(sb.id, "default")]
            assert name in {s.name for s in manager.list_snapshots()}
        finally:
            client.delete_snapshot(name)
        assert name not in {s.name for s in manager.list_snapshots()}
        with pytest.raises(sandbox_rt.SnapshotNotFound):
            client.delete_snapshot(name)


def test_remote_files_on_a_real_sandbox(api: tuple[str, Path], manager: sandbox_rt.Manager) -> None:
    """sb.files over HTTP against a real sandbox, including a link the sandbox planted."""
    url, token_file = api
    with (
        remote.Client(url, token_file=token_file) as client,
        client.create(memory_mb=512, labels=LABEL) as sb,
    ):
        home = "/home/sandbox"
        assert sb.files.mkdir(f"{home}/w/x") is True and sb.files.mkdir(f"{home}/w/x") is False
        assert sb.files.write(f"{home}/w/x/n.txt", b"12345").size == 5
        sb.exec(f"ln -s /etc/shadow {home}/w/link", check=True)
        listed = {e.path: e for e in sb.files.list(f"{home}/w", depth=2)}
        assert set(listed) == {f"{home}/w/x", f"{home}/w/x/n.txt", f"{home}/w/link"}
        link = listed[f"{home}/w/link"]
        assert (link.type, link.symlink_target) == ("symlink", "/etc/shadow")
        assert sb.files.stat(f"{home}/w/link", follow_symlinks=False).type == "symlink"
        moved = sb.files.rename(f"{home}/w/x/n.txt", f"{home}/m.txt")
        assert (moved.path, moved.size) == (f"{home}/m.txt", 5)
        sb.files.remove(f"{home}/w/link")  # the link, never its target
        assert not sb.files.exists(f"{home}/w/link")
        with pytest.raises(sandbox_rt.FileOperationError):
            sb.files.remove(f"{home}/w")  # not empty
        sb.files.remove(f"{home}/w", recursive=True)
        assert not sb.files.exists(f"{home}/w") and sb.files.read(f"{home}/m.txt") == b"12345"
        assert sb.exec("test -e /etc/shadow").exit_code == 0


def read_until(p: remote.RemoteProcess, size: int, timeout: float = 30) -> tuple[bytes, bytes]:
    """Read ``p``'s new output with ``logs()`` until ``size`` bytes of stdout came (or ``timeout``)."""
    out, err = b"", b""
    deadline = time.monotonic() + timeout
    while len(out) < size and time.monotonic() < deadline:
        o, e = p.logs()
        out, err = out + o, err + e
        if len(out) < size:
            time.sleep(0.1)
    return out, err


def test_remote_background_command_stdin_logs_and_exit(
    api: tuple[str, Path], manager: sandbox_rt.Manager
) -> None:
    """A real background command over HTTP: stdin written in two parts (one binary) and closed, its
    output read incrementally as exact bytes, its exit code waited for; a second reader sees it all."""
    url, token_file = api
    blob = bytes(range(256))
    with (
        remote.Client(url, token_file=token_file) as client,
        client.create(memory_mb=512, labels=LABEL) as sb,
    ):
        p = sb.exec('cat; echo "done $X" >&2; exit 5', background=True, env={"X": "ex"}, cwd="/tmp")
        assert isinstance(p, remote.RemoteProcess) and p.is_running() and p.exit_code() is None
        assert any(i.pid == p.pid and i.running for i in sb.commands.list())
        p.send_stdin("one\n")
        assert read_until(p, 4) == (b"one\n", b"")
        sb.commands.send_stdin(p.pid, blob)
        assert read_until(p, len(blob)) == (blob, b"")  # only what is new, byte for byte
        p.close_stdin()
        assert p.wait(timeout=30) == 5
        assert p.logs() == (b"", b"done ex\n")
        assert p.exit_code() == 5 and not p.is_running()
        again = sb.commands.connect(p.pid)
        assert (again.handle, again.logs()) == (p.handle, (b"one\n" + blob, b"done ex\n"))
        with pytest.raises(sandbox_rt.SandboxError):
            p.send_stdin("late")  # it has ended
    assert sb.id not in {r.id for r in manager.list(labels=LABEL)}


def test_remote_background_kill(api: tuple[str, Path], manager: sandbox_rt.Manager) -> None:
    """``sleep 600`` in the background: a wait that times out (the server's 504), then a kill by pid."""
    url, token_file = api
    with (
        remote.Client(url, token_file=token_file) as client,
        client.create(memory_mb=512, labels=LABEL) as sb,
    ):
        p = sb.exec("echo up; sleep 600", background=True)
        assert read_until(p, 3) == (b"up\n", b"")
        with pytest.raises(sandbox_rt.CommandTimeout):
            p.wait(timeout=1)
        assert p.is_running()
        sb.commands.kill(p.pid)
        assert p.wait(timeout=30) == 128 + signal.SIGKILL
        listed = [i for i in sb.commands.list() if i.pid == p.pid]
        assert [(i.running, i.exit_code) for i in listed] == [(False, 137)]
        assert sb.exec("pgrep -x sleep").exit_code == 1  # the whole group went
        with pytest.raises(sandbox_rt.ProcessNotFound):
            sb.commands.connect(4_000_000)
    assert sb.id not in {r.id for r in manager.list(labels=LABEL)}
