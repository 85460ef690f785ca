"""``sandbox_rt.remote``: the sync and async clients against the real HTTP API server (``ApiServer``)
driving the in-memory fake Manager of test_http_api, and against hostile answers (httpx's mock
transport): every answer is bounded and checked, every error body maps back onto the error tree."""

from __future__ import annotations

import asyncio
import base64
import errno
import gzip
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox_rt import (
    BackendError,
    CommandTimeout,
    ConfigError,
    ConnectionLost,
    ExecError,
    FileOperationError,
    FirewallDisabled,
    HostKeyMismatch,
    PermissionDenied,
    SandboxError,
    SandboxNotFound,
    SnapshotInfo,
    SnapshotNotFound,
    remote,
)
from sandbox_rt.models import OutputChunk
from sandbox_rt.web.server import ApiServer
from tests.unit.test_http_api import TOKEN, FakeManager, FakeSandbox

SID = "sbx-0123456789"


class EgressSandbox(FakeSandbox):
    def set_egress(self, egress: list[str]) -> tuple[str, ...]:
        self._fail("set_egress")
        return tuple(dict.fromkeys(e.lower() for e in egress))


class Manager(FakeManager):
    """The fake manager, with egress and snapshots (what the API offers beyond the base fake)."""

    def _wrap(self, sb: FakeSandbox) -> EgressSandbox:
        wrapped = EgressSandbox(self, sb.box)
        self.handed[-1] = wrapped
        return wrapped

    def create(self, **kwargs: Any) -> EgressSandbox:
        return self._wrap(super().create(**kwargs))

    def attach(self, sandbox_id: str) -> EgressSandbox:
        return self._wrap(super().attach(sandbox_id))

    def snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo:
        if name == "missing_one":
            raise SnapshotNotFound(name)
        if sandbox_id not in self.boxes:
            raise SandboxNotFound(sandbox_id)
        return SnapshotInfo(name, sandbox_id, 1.5, "fake", 42)

    def list_snapshots(self) -> list[SnapshotInfo]:
        return [SnapshotInfo("base_env", SID, 1.5, "fake", 42, template="base")]

    def delete_snapshot(self, name: str) -> None:
        if name != "base_env":
            raise SnapshotNotFound(name)


@pytest.fixture
def mgr() -> Manager:
    return Manager()


@pytest.fixture
def url(mgr: Manager) -> Iterator[str]:
    with ApiServer(mgr, token=TOKEN, port=0) as server:
        yield server.url


@pytest.fixture
def client(url: str) -> Iterator[remote.Client]:
    with remote.Client(url, token=TOKEN) as c:
        yield c


# -- against the real server -------------------------------------------------------------------------
def test_lifecycle_round_trip(client: remote.Client, mgr: Manager) -> None:
    with client.create(memory_mb=512, labels={"agent": "a1"}, ttl_s=60, egress=["Example.org"]) as sb:
        assert sb.id in mgr.boxes and sb.labels == {"agent": "a1"} and sb.ip == "10.99.1.7"
        assert mgr.created[-1]["memory_mb"] == 512 and mgr.created[-1]["egress"] == ["Example.org"]
        r = sb.exec(["printf", "%s"], stdin=b"\x00\xff", env={"A": "1"}, cwd="/tmp", timeout=5)
        assert r.stdout == b"out:\x00\xff" and r.stderr == b"err" and r.exit_code == 0  # exact bytes
        assert mgr.handed[-1].calls[-1][1]["env"] == {"A": "1"}
        sb.write_file("/tmp/a.bin", b"\x00\x01", mode=0o755)
        assert sb.read_file("/tmp/a.bin") == b"\x00\x01" and sb.read_text("/tmp/a.bin") == "\x00\x01"
        sb.set_internet(True)
        assert sb.status().internet is True
        assert sb.set_egress(["A.org", "a.org"]) == ("a.org",)
        assert sb.snapshot("base_env") == SnapshotInfo("base_env", sb.id, 1.5, "fake", 42)
        assert client.list_snapshots() == [SnapshotInfo("base_env", SID, 1.5, "fake", 42, template="base")]
        client.delete_snapshot("base_env")
        with pytest.raises(SnapshotNotFound):
            client.delete_snapshot("other_one")
        with pytest.raises(ConfigError, match="snapshot name"):
            client.delete_snapshot("../x")
        sb.extend(7200)  # the answer's status is the handle's
        assert sb.expires_at is not None and 7100 < sb.expires_at - time.time() <= 7200
        assert mgr.boxes[sb.id].kwargs["ttl_s"] == 7200
        with pytest.raises(ConfigError, match="ttl_s"):
            sb.extend(0)
        assert [r.id for r in client.list(labels={"agent": "a1"})] == [sb.id]
        assert client.list(labels={"agent": "nobody"}) == []
        assert client.attach(sb.id).id == sb.id
        sid = sb.id
    assert mgr.destroyed == [sid]
    sb.destroy()  # idempotent
    with pytest.raises(SandboxError, match="destroyed"):
        sb.exec("true")


def test_exec_check_and_max_output(client: remote.Client, mgr: Manager) -> None:
    sb = client.create()
    r = sb.exec("x", stdin="0123456789", max_output=6)
    assert r.stdout == b"out:01" and r.stdout_dropped == 8 and r.truncated
    assert mgr.handed[-1].calls[-1][1]["max_output"] == 6
    from sandbox_rt.models import ExecResult

    mgr.exec_result = ExecResult("false", b"", b"bad", 1, 0.1)
    assert sb.exec("false").exit_code == 1  # a result
    with pytest.raises(ExecError) as info:
        sb.exec("false", check=True)
    assert info.value.exit_code == 1 and info.value.stderr == b"bad"
    with pytest.raises(ConfigError, match="neither stdin nor check"):
        sb.exec("sleep 9", background=True, check=True)  # background commands: test_remote_processes


def test_stream_yields_chunks_and_keeps_max_output(client: remote.Client, mgr: Manager) -> None:
    mgr.stream_script = [("stdout", b"ab"), ("stderr", b"e"), ("stdout", b"cdef")]
    sb = client.create()
    stream = sb.exec_stream("x", max_output=3)
    assert list(stream) == [
        OutputChunk("stdout", b"ab"),
        OutputChunk("stderr", b"e"),
        OutputChunk("stdout", b"cdef"),
    ]
    assert stream.result is not None
    assert (
        stream.result.stdout == b"abc" and stream.result.stdout_dropped == 3 and stream.result.exit_code == 3
    )
    with pytest.raises(ExecError):
        sb.exec_stream("x", check=True).wait()


def test_stream_timeout_carries_what_was_streamed(client: remote.Client, mgr: Manager) -> None:
    mgr.stream_script = [("stdout", b"so far"), CommandTimeout("x", 2.0, b"so far", b"")]
    stream = client.create().exec_stream("x")
    chunks: list[OutputChunk] = []
    with pytest.raises(CommandTimeout) as info:
        for chunk in stream:
            chunks.append(chunk)
    assert chunks == [OutputChunk("stdout", b"so far")]
    assert info.value.stdout == b"so far" and info.value.timeout == 2.0 and info.value.command == "x"


@pytest.mark.parametrize(
    ("failure", "expected", "check"),
    [
        (ConfigError("cwd='x' must be absolute"), ConfigError, lambda e: "absolute" in str(e)),
        (SandboxNotFound(SID), SandboxNotFound, lambda e: True),
        (
            FileOperationError(errno.EISDIR, "read: a directory", "/tmp"),
            FileOperationError,
            lambda e: e.errno == errno.EISDIR and e.filename == "/tmp" and e.strerror == "read: a directory",
        ),
        (
            FileOperationError(errno.EDQUOT, "write: quota", "/f"),
            FileOperationError,
            lambda e: e.errno == errno.EDQUOT,
        ),
        (
            CommandTimeout("sleep 9", 1.5, b"partial", b"\xff"),
            CommandTimeout,
            lambda e: e.stdout == b"partial" and e.stderr == b"\xff" and e.timeout == 1.5,
        ),
        (HostKeyMismatch("key changed"), HostKeyMismatch, lambda e: True),
        (ConnectionLost("ssh dropped"), ConnectionLost, lambda e: not isinstance(e, HostKeyMismatch)),
        (FirewallDisabled("datacenter firewall off"), FirewallDisabled, lambda e: True),
        (PermissionDenied("VM.Clone"), PermissionDenied, lambda e: "VM.Clone" in str(e)),
        (BackendError("lxc-start failed"), BackendError, lambda e: type(e) is BackendError),
        (SandboxError("sandbox is stopped, not running"), SandboxError, lambda e: type(e) is SandboxError),
    ],
)
def test_errors_map_back_onto_the_tree(
    client: remote.Client,
    mgr: Manager,
    failure: Exception,
    expected: type[Exception],
    check: Callable[[Any], bool],
) -> None:
    sb = client.create()
    mgr.fail["exec"] = failure
    mgr.fail["read_file"] = failure
    op = (
        (lambda: sb.read_file("/tmp"))
        if isinstance(failure, FileOperationError)
        else (lambda: sb.exec("sleep 9"))
    )
    with pytest.raises(expected) as info:
        op()
    assert isinstance(info.value, expected) and check(info.value), repr(info.value)


def test_not_found_kinds(client: remote.Client) -> None:
    with pytest.raises(SandboxNotFound) as info:
        client.attach(SID)
    assert info.value.sandbox_id == SID
    with pytest.raises(SandboxNotFound):
        client.destroy(SID)
    sb = client.create()
    with pytest.raises(SnapshotNotFound) as snap:
        sb.snapshot("missing_one")
    assert snap.value.name == "missing_one"
    with pytest.raises(ConfigError, match="snapshot name"):
        sb.snapshot("1bad")  # checked before sending
    with pytest.raises(ConfigError, match="sandbox id"):
        client.attach("../../etc")  # never reaches a URL


def test_wrong_token_is_permission_denied(url: str) -> None:
    with (
        remote.Client(url, token="w" * 32) as c,
        pytest.raises(PermissionDenied, match="refused the API token"),
    ):
        c.list()


def test_token_rules_are_the_servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDBOX_RT_API_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="no API token"):
        remote.Client("http://127.0.0.1:1")
    with pytest.raises(ConfigError, match="shorter"):
        remote.Client("http://127.0.0.1:1", token="short")
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o644)
    with pytest.raises(ConfigError, match="mode 0644"):
        remote.Client("http://127.0.0.1:1", token_file=f)
    f.chmod(0o600)
    remote.Client("http://127.0.0.1:1", token_file=f).close()
    monkeypatch.setenv("SANDBOX_RT_API_TOKEN", TOKEN)
    remote.Client("http://127.0.0.1:1").close()
    for bad in ("ftp://h/", "http://", "http://u:p@h/", "http://h/?q=1", 5):
        with pytest.raises(ConfigError, match="url="):
            remote.Client(bad, token=TOKEN)  # type: ignore[arg-type]


def test_unreachable_server_is_connection_lost() -> None:
    with remote.Client("http://127.0.0.1:9", token=TOKEN, timeout=5) as c, pytest.raises(ConnectionLost):
        c.list()


def test_bad_arguments_fail_before_sending(client: remote.Client, mgr: Manager) -> None:
    sb = client.create()
    sent = len(mgr.handed[-1].calls)
    for call in (
        lambda: sb.exec("x", max_output=0),
        lambda: sb.exec("x", cwd="relative"),
        lambda: sb.exec("x", stdin=5),  # type: ignore[arg-type]
        lambda: sb.write_file("rel", b""),
        lambda: sb.write_file("/a", b"", mode=0o17777),
        lambda: sb.read_file("/a", max_bytes=0),
        lambda: sb.set_internet("yes"),  # type: ignore[arg-type]
        lambda: sb.set_egress("a.org"),
        lambda: client.create(labels={"k": "\ud800"}),
    ):
        with pytest.raises(ConfigError):
            call()
    assert len(mgr.handed[-1].calls) == sent


# -- async, against the same server ------------------------------------------------------------------
def test_async_client_round_trip(url: str, mgr: Manager) -> None:
    mgr.stream_script = [("stdout", b"1\n"), ("stdout", b"2\n")]

    async def main() -> str:
        async with remote.AsyncClient(url, token=TOKEN) as c:
            async with c.create(memory_mb=256) as sb:
                r = await sb.exec("x", stdin="in")
                assert r.stdout == b"out:in"
                await sb.write_file("/f", "text")
                assert await sb.read_text("/f") == "text"
                stream = sb.exec_stream("y")
                assert [c.data async for c in stream] == [b"1\n", b"2\n"]
                assert stream.result is not None and stream.result.stdout == b"1\n2\n"
                with pytest.raises(SandboxNotFound):
                    await c.attach(SID)
                await sb.extend(600)
                assert sb.expires_at is not None and 500 < sb.expires_at - time.time() <= 600
                assert [i.name for i in await c.list_snapshots()] == ["base_env"]
                await c.delete_snapshot("base_env")
                with pytest.raises(SnapshotNotFound):
                    await c.delete_snapshot("other_one")
                made = sb.id
            sb2 = await c.create()
            await sb2.destroy()
            return made

    sid = asyncio.run(main())
    assert sid in mgr.destroyed and len(mgr.destroyed) == 2


# -- hostile answers ---------------------------------------------------------------------------------
STATUS = {
    "id": SID,
    "state": "running",
    "ip": "10.99.1.7",
    "hostname": SID,
    "cpus": 1,
    "memory_mb": 512,
    "disk_gb": 8,
    "internet": False,
    "uptime_s": 1.0,
    "usage": {"memory_bytes": 1, "memory_peak_bytes": 2, "cpu_time_s": 0.1, "pids": 3, "disk_bytes": None},
    "labels": {},
    "expires_at": None,
    "egress": [],
}


def mock_client(handler: Callable[[httpx.Request], httpx.Response]) -> remote.Client:
    return remote.Client("http://127.0.0.1:8787", token=TOKEN, transport=httpx.MockTransport(handler))


def answer(body: Any, status: int = 200, **headers: str) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["Authorization"] == f"Bearer {TOKEN}"
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.Response(status, content=data, headers=headers)

    return handler


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({**STATUS, "id": "sbx-9999999999"}, "not the sandbox asked about"),
        ({**STATUS, "ip": "10.99.1.7; rm -rf /"}, "not an IP address"),
        ({**STATUS, "memory_mb": -1}, "memory_mb"),
        ({**STATUS, "cpus": float("nan")}, "finite"),
        ({**STATUS, "labels": {"bad key": "v"}}, "label key"),
        ({**STATUS, "labels": {"k": "v" * 300}}, "at most 256"),
        ({**STATUS, "usage": []}, "usage is not an object"),
        ({k: v for k, v in STATUS.items() if k != "state"}, "lacks 'state'"),
        ([], "not an object"),
        (b"<html>", "not JSON"),
    ],
)
def test_malformed_status_is_a_backend_error(body: Any, why: str) -> None:
    with mock_client(answer(body)) as c, pytest.raises(BackendError, match=why) as info:
        c.attach(SID)
    assert info.value.step == "remote API"


def test_exec_output_longer_than_asked_is_refused() -> None:
    result = {
        "command": "x",
        "exit_code": 0,
        "duration_s": 0.1,
        "truncated": False,
        "stdout_dropped": 0,
        "stderr_dropped": 0,
        "encoding": "base64",
        "stdout": base64.b64encode(b"y" * 11).decode(),
        "stderr": "",
    }

    def handler(request: httpx.Request) -> httpx.Response:
        body = STATUS if request.method == "GET" else result
        return httpx.Response(200, json=body)

    with mock_client(handler) as c:
        sb = c.attach(SID)
        assert sb.exec("x", max_output=11).stdout == b"y" * 11
        with pytest.raises(BackendError, match="more than the 10 asked for"):
            sb.exec("x", max_output=10)
        result["truncated"] = True
        with pytest.raises(BackendError, match="truncated disagrees"):
            sb.exec("x", max_output=11)


def test_answers_are_read_with_a_cap() -> None:
    big = b"x" * ((1 << 20) + 10)
    # declared too large: refused before reading
    with mock_client(answer(big)) as c, pytest.raises(BackendError, match="larger than"):
        c.attach(SID)

    # streamed without a length: stopped at the cap
    def chunked(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=iter([b"x" * 65536] * 64))

    with mock_client(chunked) as c, pytest.raises(BackendError, match="larger than"):
        c.attach(SID)

    # a gzip bomb counts by its decoded size
    bomb = gzip.compress(b"{" + b" " * (8 << 20) + b"}")
    with mock_client(answer(bomb, **{"Content-Encoding": "gzip"})) as c, pytest.raises(BackendError):
        c.attach(SID)


def test_file_larger_than_max_bytes_is_efbig() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/files"):
            return httpx.Response(200, content=b"z" * 100)
        return httpx.Response(200, json=STATUS)

    with mock_client(handler) as c:
        sb = c.attach(SID)
        assert sb.read_file("/f", max_bytes=100) == b"z" * 100
        with pytest.raises(FileOperationError) as info:
            sb.read_file("/f", max_bytes=99)
        assert info.value.errno == errno.EFBIG and info.value.filename == "/f"


SNAP = {"name": "ok_name", "source_id": SID, "created_at": 1, "backend": "lxc"}


@pytest.mark.parametrize(
    "body",
    [
        {"snapshots": [{**SNAP, "name": "../x"}]},
        {"snapshots": [{**SNAP, "source_id": "not-an-id"}]},
        {"snapshots": [{**SNAP, "template": "A!"}]},
        {"snapshots": [SNAP] * 100_001},
        {"snapshots": "all of them"},
        {},
    ],
)
def test_a_lying_snapshot_list_is_refused(body: Any) -> None:
    assert remote.answers.parse_snapshot_list({"snapshots": [SNAP]})[0].name == "ok_name"
    with pytest.raises(BackendError):
        remote.answers.parse_snapshot_list(body)


def test_list_must_honour_the_label_filter() -> None:
    entry = {
        k: STATUS[k] for k in ("id", "hostname", "ip", "cpus", "memory_mb", "disk_gb", "labels", "expires_at")
    }
    entry.update(backend="lxc", created_at=1.0, pids_max=1024, labels={"agent": "other"})
    with mock_client(answer({"sandboxes": [entry]})) as c:
        assert [r.id for r in c.list()] == [SID]
        with pytest.raises(BackendError, match="lacks the labels"):
            c.list(labels={"agent": "a1"})


def test_redirects_are_not_followed() -> None:
    with (
        mock_client(answer({}, 302, Location="http://evil.example/")) as c,
        pytest.raises(BackendError, match="302"),
    ):
        c.attach(SID)


def test_unknown_error_bodies() -> None:
    with mock_client(answer(b"Bad Gateway", 502)) as c, pytest.raises(BackendError, match="HTTP 502"):
        c.attach(SID)
    odd = {"error": {"code": "x" * 100, "message": "m"}}
    with mock_client(answer(odd, 418)) as c, pytest.raises(BackendError, match="HTTP 418"):
        c.attach(SID)
    # a "type" naming something else is never looked up: only the code's own subclasses are used
    body = {"error": {"code": "invalid_argument", "message": "no", "type": "os.system"}}
    with mock_client(answer(body, 400)) as c, pytest.raises(ConfigError, match="no"):
        c.attach(SID)


def sse(*events: tuple[str, Any]) -> bytes:
    return b"".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() if not isinstance(data, bytes) else data
        for name, data in events
    )


def stream_client(body: bytes, content_type: str = "text/event-stream") -> remote.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json=STATUS)
        assert json.loads(request.content)["stream"] is True
        return httpx.Response(200, content=body, headers={"Content-Type": content_type})

    return mock_client(handler)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


EXIT = {"command": "x", "exit_code": 0, "duration_s": 0.1}


def test_stream_events_are_checked() -> None:
    good = sse(
        ("stdout", {"data": b64(b"a")}), (": keep-alive", b": ping\n\n"), ("novel", {"x": 1}), ("exit", EXIT)
    )
    with stream_client(good) as c:
        s = c.attach(SID).exec_stream("x")
        assert list(s) == [OutputChunk("stdout", b"a")] and s.result is not None and s.result.stdout == b"a"
    for body, why in (
        (sse(("stdout", {"data": "%%%"})), "not base64"),
        (sse(("stdout", {"data": b64(b"a")})), "ended before the command's exit"),
        (sse(("exit", {**EXIT, "exit_code": "0"})), "exit_code"),
        (sse(("exit", EXIT), ("stdout", {"data": b64(b"late")})), "after the command's exit"),
        (b"data: " + b"x" * (5 << 20), "larger than"),
        (b"event: stdout\ndata: \xff\xfe\n\n", "not UTF-8"),
    ):
        with stream_client(body) as c, pytest.raises((BackendError, ConnectionLost), match=why):
            list(c.attach(SID).exec_stream("x"))
    with (
        stream_client(sse(("exit", EXIT)), "application/json") as c,
        pytest.raises(BackendError, match="event-stream"),
    ):
        list(c.attach(SID).exec_stream("x"))


def test_stream_error_event_maps_back() -> None:
    error = {
        "status": 502,
        "error": {"code": "connection_lost", "message": "gone", "type": "HostKeyMismatch"},
    }
    body = sse(("stdout", {"data": b64(b"a")}), ("error", error))
    with stream_client(body) as c, pytest.raises(HostKeyMismatch, match="gone"):
        list(c.attach(SID).exec_stream("x"))


def test_async_client_checks_answers_too() -> None:
    async def main() -> None:
        def handler(request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, json={**STATUS, "id": "sbx-9999999999"})

        async with remote.AsyncClient(
            "http://127.0.0.1:8787", token=TOKEN, transport=httpx.MockTransport(handler)
        ) as c:
            with pytest.raises(BackendError, match="not the sandbox asked about"):
                await c.attach(SID)

    asyncio.run(main())


def test_the_token_is_never_in_an_error() -> None:
    secret = "s3cr3t-" + os.urandom(12).hex()
    c = remote.Client("http://127.0.0.1:9", token=secret, timeout=2)
    with c, pytest.raises(ConnectionLost) as info:
        c.list()
    assert secret not in str(info.value) and secret not in repr(c)
