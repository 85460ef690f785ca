"""Background commands through ``sandbox_rt.remote`` (``sb.exec(background=True)``, ``sb.commands``):
the sync and async clients against the real HTTP API server driving test_http_api's fake processes,
and against lying servers (httpx's mock transport): offsets, pids, base64 and sizes are all checked."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from sandbox_rt import (
    BackendError,
    CommandTimeout,
    ConfigError,
    ExecResult,
    ProcessNotFound,
    SandboxError,
    SandboxNotFound,
    remote,
)
from sandbox_rt.models import ProcessInfo
from sandbox_rt.remote import calls
from sandbox_rt.web.server import ApiServer
from tests.unit.test_http_api import TOKEN, FakeManager, FakeProcess
from tests.unit.test_remote_client import SID, STATUS, mock_client

PID = 100
HANDLE = f"{PID:016x}"


@pytest.fixture
def mgr() -> FakeManager:
    return FakeManager()


@pytest.fixture
def url(mgr: FakeManager) -> Iterator[str]:
    with ApiServer(mgr, token=TOKEN, port=0) as server:
        yield server.url


@pytest.fixture
def client(url: str) -> Iterator[remote.Client]:
    with remote.Client(url, token=TOKEN) as c:
        yield c


def proc_of(mgr: FakeManager, sid: str, pid: int = PID) -> FakeProcess:
    return mgr.boxes[sid].processes[pid]


# -- against the real server -------------------------------------------------------------------------
def test_background_round_trip(client: remote.Client, mgr: FakeManager) -> None:
    sb = client.create()
    p = sb.exec(["python3", "-u", "srv.py"], background=True, cwd="/tmp", env={"A": "1"})
    assert isinstance(p, remote.RemoteProcess)
    assert (p.pid, p.handle, p.command) == (PID, HANDLE, "python3 -u srv.py")
    fake = proc_of(mgr, sb.id)
    assert (fake.cwd, fake.env) == ("/tmp", {"A": "1"})
    assert p.is_running() and p.exit_code() is None

    fake.out, fake.err = b"a\xff\x00", b""
    assert p.logs() == (b"a\xff\x00", b"")  # exact bytes
    fake.out += b"b"
    fake.err = b"warn"
    assert p.logs() == (b"b", b"warn")  # only what is new
    assert p.logs() == (b"", b"")

    p.send_stdin(b"\x00in\n")
    p.send_stdin("t\u00e9xt")
    p.send_stdin(b"")
    assert fake.stdin == b"\x00in\nt\xc3\xa9xt"
    p.close_stdin()
    p.close_stdin()  # idempotent
    with pytest.raises(SandboxError, match="stdin was closed"):
        p.send_stdin(b"more")

    fake.out += b"late"
    started = time.monotonic()
    with pytest.raises(CommandTimeout) as info:
        p.wait(timeout=0.3)
    assert time.monotonic() - started >= 0.25  # the fake answers at once: the client pauses, not spins
    assert (info.value.stdout, info.value.stderr, info.value.timeout) == (b"late", b"", 0.3)
    assert p.logs() == (b"", b"")  # the timeout consumed it, as in process

    fake.code = 3
    assert p.wait() == 3 and p.wait(timeout=5) == 3
    assert p.exit_code() == 3 and not p.is_running()
    assert "pid=100" in repr(p)


def test_logs_read_in_chunks_and_bounded(
    client: remote.Client, mgr: FakeManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(calls, "LOG_CHUNK_BYTES", 4)
    sb = client.create()
    p = sb.exec("x", background=True)
    fake = proc_of(mgr, sb.id)
    fake.out, fake.err = bytes(range(11)), b"0123"
    assert p.logs() == (bytes(range(11)), b"0123")  # 3 requests: 4 + 4 + 3 (stderr full on the first)
    fake.out += b"abcdefghij"
    assert p.logs(max_bytes=6) == (b"abcdef", b"")  # bounded; nothing is dropped
    assert p.logs() == (b"ghij", b"")
    with pytest.raises(ConfigError, match="max_bytes"):
        p.logs(max_bytes=0)


def test_commands_namespace(client: remote.Client, mgr: FakeManager) -> None:
    sb = client.create()
    first = sb.commands.run("sleep 600", background=True)
    second = sb.exec("cat", background=True)
    assert isinstance(first, remote.RemoteProcess) and (first.pid, second.pid) == (100, 101)
    assert sb.commands.list() == [
        ProcessInfo(101, f"{101:016x}", "cat", True, None),
        ProcessInfo(100, HANDLE, "sleep 600", True, None),
    ]
    again = sb.commands.connect(101)
    assert (again.pid, again.handle, again.command) == (101, f"{101:016x}", "cat")
    proc_of(mgr, sb.id, 101).out = b"seen by any reader"
    assert again.logs() == (b"seen by any reader", b"") == second.logs()  # each keeps its own offsets

    sb.commands.send_stdin(101, b"x")
    sb.commands.close_stdin(101)
    assert proc_of(mgr, sb.id, 101).stdin == b"x" and not proc_of(mgr, sb.id, 101).stdin_open
    sb.commands.kill(100, signal.SIGTERM)
    first.kill()
    assert proc_of(mgr, sb.id, 100).signals == [15, 9]
    assert first.exit_code() == 137

    with pytest.raises(ProcessNotFound) as info:
        sb.commands.connect(4242)
    assert info.value.pid == 4242
    for op in (
        lambda: sb.commands.kill(4242),
        lambda: sb.commands.send_stdin(4242, b"x"),
        lambda: sb.commands.close_stdin(4242),
    ):
        with pytest.raises(ProcessNotFound):
            op()

    result = sb.commands.run("echo", stdin="hi")
    assert isinstance(result, ExecResult) and result.stdout == b"out:hi"
    mgr.stream_script = [("stdout", b"1\n")]
    assert [c.data for c in sb.commands.stream("y")] == [b"1\n"]


def test_bad_arguments_fail_before_sending(client: remote.Client, mgr: FakeManager) -> None:
    sb = client.create()
    for kwargs, needle in [
        ({"stdin": "x"}, "neither stdin nor check"),
        ({"check": True}, "neither stdin nor check"),
        ({"user": "root"}, "sandbox user"),
        ({"timeout": -1}, "timeout"),
        ({"max_output": 0}, "max_output"),
        ({"cwd": "relative"}, "cwd"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            sb.exec("x", background=True, **kwargs)
    with pytest.raises(ConfigError, match="string or a list"):
        sb.exec(b"x", background=True)  # type: ignore[call-overload]
    assert mgr.boxes[sb.id].processes == {}
    p = sb.exec("x", background=True)
    for call in (
        lambda: sb.commands.connect(1),
        lambda: sb.commands.connect(True),
        lambda: sb.commands.kill(1 << 23),
        lambda: p.kill(0),
        lambda: p.kill(65),
        lambda: p.send_stdin(42),  # type: ignore[arg-type]
        lambda: p.wait(timeout=0),
        lambda: p.wait(timeout=float("nan")),
    ):
        with pytest.raises(ConfigError):
            call()
    assert proc_of(mgr, sb.id).signals == []


def test_a_server_that_rejects_the_start_says_why(client: remote.Client) -> None:
    sb = client.create()
    with pytest.raises(ConfigError, match="command"):
        sb.exec("", background=True)  # the server's 400


def test_a_destroyed_or_missing_sandbox(client: remote.Client, mgr: FakeManager) -> None:
    sb = client.create()
    p = sb.exec("x", background=True)
    other = client.attach(sb.id)
    other.destroy()
    with pytest.raises(SandboxNotFound):
        p.logs()
    with pytest.raises(SandboxNotFound):
        sb.commands.list()
    sb.destroy()
    with pytest.raises(SandboxError, match="destroyed"):
        p.is_running()
    with pytest.raises(SandboxError, match="destroyed"):
        sb.commands.list()


def test_async_background_round_trip(url: str, mgr: FakeManager) -> None:
    async def main() -> None:
        async with remote.AsyncClient(url, token=TOKEN) as c, c.create() as sb:
            p = await sb.exec("cat", background=True, env={"B": "2"})
            assert isinstance(p, remote.AsyncRemoteProcess) and (p.pid, p.handle) == (PID, HANDLE)
            fake = proc_of(mgr, sb.id)
            fake.out, fake.err = b"\x00\x01", b"e"
            assert await p.logs() == (b"\x00\x01", b"e")
            assert await p.is_running() and await p.exit_code() is None
            await p.send_stdin("in")
            await p.close_stdin()
            assert fake.stdin == b"in" and not fake.stdin_open
            fake.out += b"more"
            with pytest.raises(CommandTimeout) as info:
                await p.wait(timeout=0.2)
            assert info.value.stdout == b"more"
            await p.kill(signal.SIGINT)
            assert await p.wait() == 130 and fake.signals == [2]

            q = await sb.commands.run("sleep 1", background=True)
            assert [i.pid for i in await sb.commands.list()] == [101, 100]
            again = await sb.commands.connect(q.pid)
            assert again.command == "sleep 1"
            await sb.commands.send_stdin(101, b"z")
            await sb.commands.close_stdin(101)
            await sb.commands.kill(101)
            assert (await again.info()).exit_code == 137
            with pytest.raises(ProcessNotFound):
                await sb.commands.connect(999)
            with pytest.raises(ConfigError, match="neither stdin"):
                await sb.exec("x", background=True, stdin="y")
            r = await sb.commands.run("echo", stdin="a")
            assert isinstance(r, ExecResult) and r.stdout == b"out:a"
            mgr.stream_script = [("stdout", b"s")]
            assert [ch.data async for ch in sb.commands.stream("s")] == [b"s"]

    asyncio.run(main())


# -- lying servers -----------------------------------------------------------------------------------
INFO = {"pid": PID, "handle": HANDLE, "command": "x", "running": True, "exit_code": None}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def logs_answer(out: bytes = b"", err: bytes = b"", **over: Any) -> dict[str, Any]:
    return {
        "encoding": "base64",
        "stdout": b64(out),
        "stderr": b64(err),
        "stdout_offset": len(out),
        "stderr_offset": len(err),
        **over,
    }


Route = Callable[[httpx.Request], Any]


def liar(routes: dict[tuple[str, str], Any], seen: list[httpx.Request] | None = None) -> remote.Client:
    """A server that answers the sandbox's status honestly and each process route as given (a value,
    or a function of the request; ``(status, body)`` for an error)."""

    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        base = f"/v1/sandboxes/{SID}"
        if request.method == "GET" and request.url.path == base:
            return httpx.Response(200, json=STATUS)
        body = routes[(request.method, request.url.path.removeprefix(base))]
        body = body(request) if callable(body) else body
        status, body = body if isinstance(body, tuple) else (200, body)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.Response(status, content=data)

    return mock_client(handler)


def started(routes: dict[tuple[str, str], Any]) -> tuple[remote.Client, remote.RemoteProcess]:
    c = liar({("POST", "/processes"): (201, INFO), **routes})
    return c, c.attach(SID).exec("x", background=True)


@pytest.mark.parametrize(
    ("info", "why"),
    [
        ({**INFO, "pid": 1}, "pid=1 is not a whole number from 2"),
        ({**INFO, "pid": (1 << 22) + 1}, "pid"),
        ({**INFO, "pid": True}, "pid"),
        ({**INFO, "pid": "100"}, "pid"),
        ({**INFO, "handle": "../../etc/passwd"}, "handle"),
        ({**INFO, "handle": "ABCDEF0123456789"}, "not 16 hex digits"),
        ({**INFO, "command": 7}, "command"),
        ({**INFO, "command": "x" * ((1 << 20) + 1)}, "command"),
        ({**INFO, "running": "yes"}, "running"),
        ({**INFO, "exit_code": 1.5}, "exit_code"),
        ({**INFO, "exit_code": 0}, "running and has exit code"),
        ({k: v for k, v in INFO.items() if k != "handle"}, "lacks 'handle'"),
        ([INFO], "not an object"),
    ],
)
def test_a_lying_start_answer_is_refused(info: Any, why: str) -> None:
    with liar({("POST", "/processes"): (201, info)}) as c, pytest.raises(BackendError, match=why) as err:
        c.attach(SID).exec("x", background=True)
    assert err.value.step == "remote API"


def test_answers_about_another_process_are_refused() -> None:
    other = {**INFO, "pid": 101}
    with liar({("GET", "/processes/100"): other, ("POST", "/processes/100/kill"): other}) as c:
        sb = c.attach(SID)
        with pytest.raises(BackendError, match="not the process asked about"):
            sb.commands.connect(PID)
        with pytest.raises(BackendError, match="not the process asked about"):
            sb.commands.kill(PID)
    c, p = started({("POST", "/processes/100/wait"): {"pid": 101, "exit_code": 0}})
    with c, pytest.raises(BackendError, match="not the process asked about"):
        p.wait()


def test_a_lying_process_list_is_refused() -> None:
    c = liar({("GET", "/processes"): {"processes": [INFO] * 1001}})
    with c, pytest.raises(BackendError, match="at most 1000"):
        c.attach(SID).commands.list()
    c = liar({("GET", "/processes"): {"processes": [INFO, {**INFO, "pid": 0}]}})
    with c, pytest.raises(BackendError, match="pid"):
        c.attach(SID).commands.list()


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (logs_answer(b"abc", stdout_offset=4), "stdout_offset is 4, not 3"),
        (logs_answer(b"abc", stdout_offset=2), "stdout_offset is 2, not 3"),
        (logs_answer(err=b"e", stderr_offset=0), "stderr_offset is 0, not 1"),
        (logs_answer(b"abc", stdout_offset=-1), "stdout_offset"),
        (logs_answer(b"abc", encoding="utf-8"), "not base64-encoded as asked"),
        (logs_answer(stdout="YWJj\n"), "not base64"),
        (logs_answer(stdout="YWJ"), "not base64"),
        (logs_answer(stdout="YW=j"), "not base64"),
        (logs_answer(stdout=None), "stdout is not a string"),
        (logs_answer(b"123456789"), "more than the 8 asked for"),
        (logs_answer(stdout=b64(b"x" * 100)), "stdout"),
        ({"encoding": "base64", "stdout": ""}, "lacks"),
    ],
)
def test_lying_logs_are_refused(answer: dict[str, Any], why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calls, "LOG_CHUNK_BYTES", 8)
    c, p = started({("GET", "/processes/100/logs"): answer})
    with c, pytest.raises(BackendError, match=why):
        p.logs()


def test_logs_ask_from_the_offsets_kept_and_commit_them_only_on_success() -> None:
    seen: list[httpx.Request] = []
    answers = iter([logs_answer(b"ab"), logs_answer(b"ab", stdout_offset=1)])

    def logs(request: httpx.Request) -> Any:
        q = request.url.params
        assert (q["encoding"], q["max_bytes"]) == ("base64", str(calls.LOG_CHUNK_BYTES))
        if q["stdout_offset"] == "2":
            return {**logs_answer(b"cd"), "stdout_offset": 4}
        return next(answers)

    c = liar({("POST", "/processes"): (201, INFO), ("GET", "/processes/100/logs"): logs}, seen)
    p = c.attach(SID).exec("x", background=True)
    with c:
        assert p.logs() == (b"ab", b"")
        assert p.logs() == (b"cd", b"")  # asked from offset 2
        assert [r.url.params["stdout_offset"] for r in seen if r.url.path.endswith("/logs")] == ["0", "2"]


def test_oversized_answers_are_not_read() -> None:
    huge = logs_answer(stdout="A" * (8 << 20))
    c, p = started({("GET", "/processes/100/logs"): huge})
    with c, pytest.raises(BackendError, match="larger than"):
        p.logs()  # 1 MiB asked of each stream: the answer may take about 5 MiB, not 8


def test_process_errors_map_back() -> None:
    not_found = {
        "error": {"code": "not_found", "message": "no background command", "type": "ProcessNotFound"}
    }
    gone = {"error": {"code": "not_found", "message": "no sandbox", "type": "SandboxNotFound"}}
    with liar({("GET", "/processes/7"): (404, not_found), ("GET", "/processes/8"): (404, gone)}) as c:
        sb = c.attach(SID)
        with pytest.raises(ProcessNotFound) as info:
            sb.commands.connect(7)
        assert info.value.pid == 7
        with pytest.raises(SandboxNotFound):
            sb.commands.connect(8)


def test_a_server_that_times_out_at_once_does_not_make_wait_spin() -> None:
    seen: list[httpx.Request] = []
    timeout = {"error": {"code": "command_timeout", "message": "timed out", "timeout_s": 0.5}}
    c = liar(
        {
            ("POST", "/processes"): (201, INFO),
            ("POST", "/processes/100/wait"): (504, timeout),
            ("GET", "/processes/100/logs"): logs_answer(b"so far"),
        },
        seen,
    )
    p = c.attach(SID).exec("x", background=True)
    with c, pytest.raises(CommandTimeout) as info:
        p.wait(timeout=0.5)
    waits = [json.loads(r.content) for r in seen if r.url.path.endswith("/wait")]
    assert 1 <= len(waits) <= 2 and all(0 < w["timeout"] <= 0.5 for w in waits)
    assert (info.value.stdout, info.value.command) == (b"so far", "x")


def test_async_client_checks_process_answers_too() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == f"/v1/sandboxes/{SID}":
            return httpx.Response(200, json=STATUS)
        if request.url.path.endswith("/processes"):
            return httpx.Response(201, json=INFO)
        return httpx.Response(200, json=logs_answer(b"abc", stdout_offset=9))

    async def main() -> None:
        transport = httpx.MockTransport(handler)
        async with remote.AsyncClient("http://127.0.0.1:8787", token=TOKEN, transport=transport) as c:
            p = await (await c.attach(SID)).exec("x", background=True)
            with pytest.raises(BackendError, match="stdout_offset is 9, not 3"):
                await p.logs()

    asyncio.run(main())
