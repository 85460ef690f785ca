"""The HTTP control API against an in-memory fake Manager/Sandbox: auth, routing, validation, error
mapping, SSE streaming, files, the sandbox cache, and the OpenAPI document matching the server."""

from __future__ import annotations

import base64
import errno
import http.client
import json
import logging
import os
import secrets
import subprocess
import sys
import textwrap
import threading
import time
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from sandbox_rt import (
    BackendError,
    CommandTimeout,
    ConfigError,
    ConnectionLost,
    ExecResult,
    FileOperationError,
    OutputChunk,
    PermissionDenied,
    ProcessNotFound,
    ResourceUsage,
    SandboxError,
    SandboxNotFound,
    SandboxNotReady,
    SandboxRecord,
    SandboxSpec,
    SandboxStatus,
    Settings,
)
from sandbox_rt.models import ProcessInfo
from sandbox_rt.options import CreateOptions
from sandbox_rt.validation import check_max_bytes, check_signal
from sandbox_rt.web import schemas as web_schemas
from sandbox_rt.web.app import ROUTERS, openapi_document
from sandbox_rt.web.native import PUBLIC_PATHS
from sandbox_rt.web.server import ApiServer, load_token, serve

TOKEN = "t0k-" + secrets.token_urlsafe(24)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


# -- fakes -----------------------------------------------------------------------------------------
@dataclass
class Container:
    id: str
    kwargs: dict[str, Any]
    files: dict[str, bytes] = field(default_factory=dict)
    internet: bool = False
    processes: dict[int, FakeProcess] = field(default_factory=dict)


class FakeProcess:
    """A background command whose output, stdin and end the test drives."""

    def __init__(self, pid: int, command: str, cwd: str | None, env: Mapping[str, str] | None) -> None:
        self.pid, self.handle, self.command = pid, f"{pid:016x}", command
        self.cwd, self.env = cwd, env
        self.out, self.err, self.stdin = b"", b"", b""
        self.stdin_open = True
        self.code: int | None = None
        self.signals: list[int] = []

    def exit_code(self) -> int | None:
        return self.code

    def is_running(self) -> bool:
        return self.code is None

    def info(self) -> ProcessInfo:
        return ProcessInfo(self.pid, self.handle, self.command, self.code is None, self.code)

    def wait(self, timeout: float | None = None) -> int:
        if self.code is None:
            raise CommandTimeout(self.command, timeout or 0.0, self.out, self.err)
        return self.code

    def send_stdin(self, data: bytes | str, *, timeout: float = 30.0) -> None:
        if not self.stdin_open:
            raise SandboxError(f"cannot write to the stdin of {self.command!r}: its stdin was closed")
        self.stdin += data if isinstance(data, bytes) else data.encode()

    def close_stdin(self) -> None:
        self.stdin_open = False

    def kill(self, sig: int = 9) -> None:
        self.signals.append(check_signal(sig))
        self.code = 128 + sig

    def logs_from(
        self, stdout_offset: int, stderr_offset: int, *, max_bytes: int | None = None
    ) -> tuple[bytes, bytes]:
        cap = max_bytes if max_bytes is not None else 1 << 62
        return self.out[stdout_offset:][:cap], self.err[stderr_offset:][:cap]


class FakeCommands:
    def __init__(self, box: Container) -> None:
        self.box = box

    def run(
        self,
        command: str | list[str],
        *,
        background: bool,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> FakeProcess:
        assert background
        pid = 100 + len(self.box.processes)
        text = command if isinstance(command, str) else " ".join(command)
        self.box.processes[pid] = FakeProcess(pid, text, cwd, env)
        return self.box.processes[pid]

    def list(self) -> list[ProcessInfo]:
        return [
            ProcessInfo(p.pid, p.handle, p.command, p.code is None, p.code)
            for p in sorted(self.box.processes.values(), key=lambda p: -p.pid)
        ]

    def connect(self, pid: int) -> FakeProcess:
        if pid not in self.box.processes:
            raise ProcessNotFound(pid)
        return self.box.processes[pid]


class FakeStream:
    """Yields the script's chunks; a ``threading.Event`` in the script waits; an exception raises."""

    def __init__(self, command: str, script: list[Any]) -> None:
        self.command = command
        self.script = script
        self.result: ExecResult | None = None

    def __iter__(self) -> Iterator[OutputChunk]:
        out, err = b"", b""
        for item in self.script:
            if isinstance(item, threading.Event):
                assert item.wait(10), "the test never released the stream"
            elif isinstance(item, BaseException):
                raise item
            else:
                stream, data = item
                if stream == "stdout":
                    out += data
                else:
                    err += data
                yield OutputChunk(stream, data)
        self.result = ExecResult(self.command, out, err, 3, 0.25)


class FakeSandbox:
    def __init__(self, mgr: FakeManager, box: Container) -> None:
        self.mgr = mgr
        self.box = box
        self.connected = True
        self.closed = 0
        self.calls: list[tuple[str, Any]] = []

    @property
    def id(self) -> str:
        return self.box.id

    @property
    def commands(self) -> FakeCommands:
        return FakeCommands(self.box)

    def _fail(self, op: str) -> None:
        exc = self.mgr.fail.get(op)
        if exc is not None:
            raise exc

    def exec(
        self,
        command: str | list[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        max_output: int | None = None,
        user: str | None = None,
    ) -> ExecResult:
        self._fail("exec")
        call = dict(command=command, timeout=timeout, cwd=cwd, env=env, stdin=stdin)
        if user is not None:
            call["user"] = user
        if max_output is not None:
            call["max_output"] = check_max_bytes(max_output, "max_output")  # as Sandbox.exec does
        self.calls.append(("exec", call))
        text = command if isinstance(command, str) else " ".join(command)
        data = stdin.encode() if isinstance(stdin, str) else stdin or b""
        out = b"out:" + data
        if max_output is not None and len(out) > max_output:  # what the executor keeps and counts
            return ExecResult(text, out[:max_output], b"err", 0, 0.5, stdout_dropped=len(out) - max_output)
        return self.mgr.exec_result or ExecResult(text, out, b"err", 0, 0.5)

    def exec_stream(
        self,
        command: str | list[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        user: str | None = None,
    ) -> FakeStream:
        self._fail("exec_stream")
        call: dict[str, Any] = dict(command=command, timeout=timeout)
        if user is not None:
            call["user"] = user
        self.calls.append(("exec_stream", call))
        return FakeStream(command if isinstance(command, str) else " ".join(command), self.mgr.stream_script)

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        self._fail("write_file")
        self.calls.append(("write_file", mode))
        self.box.files[path] = data if isinstance(data, bytes) else data.encode()

    def read_file(self, path: str) -> bytes:
        self._fail("read_file")
        if path not in self.box.files:
            raise FileOperationError(errno.ENOENT, "read: no such file in the sandbox", path)
        return self.box.files[path]

    def set_internet(self, enabled: bool) -> None:
        self._fail("set_internet")
        self.box.internet = enabled

    def status(self) -> SandboxStatus:
        self._fail("status")
        return SandboxStatus(
            id=self.id,
            state="running",
            ip="10.99.1.7",
            hostname=self.id,
            cpus=float(self.box.kwargs.get("cpus", 1)),
            memory_mb=int(self.box.kwargs.get("memory_mb", 1024)),
            disk_gb=8,
            internet=self.box.internet,
            uptime_s=1.5,
            usage=ResourceUsage(memory_bytes=1 << 20, memory_peak_bytes=2 << 20, cpu_time_s=0.1, pids=3),
            labels=dict(self.box.kwargs.get("labels") or {}),
            expires_at=time.time() + float(self.box.kwargs.get("ttl_s") or 60),
        )

    def extend(self, ttl_s: int) -> None:
        self._fail("extend")
        self.box.kwargs["ttl_s"] = ttl_s

    def is_connected(self) -> bool:
        return self.connected

    def close(self) -> None:
        self.closed += 1
        self.connected = False


class FakeManager:
    def __init__(self) -> None:
        self.boxes: dict[str, Container] = {}
        self.created: list[dict[str, Any]] = []
        self.attached: list[str] = []
        self.destroyed: list[str] = []
        self.list_labels: list[Mapping[str, str] | None] = []
        self.fail: dict[str, BaseException] = {}
        self.exec_result: ExecResult | None = None
        self.stream_script: list[Any] = []
        self.attach_delay = 0.0
        self.handed: list[FakeSandbox] = []

    def create(self, **kwargs: Any) -> FakeSandbox:
        if "create" in self.fail:
            raise self.fail["create"]
        if kwargs.get("cpus", 1) > 64:
            raise ConfigError(f"cpus={kwargs['cpus']!r} must be > 0 and <= the host's 2 cores")
        self.created.append(kwargs)
        sid = "sbx-" + secrets.token_hex(5)
        self.boxes[sid] = Container(sid, kwargs, internet=kwargs.get("internet", False))
        sb = FakeSandbox(self, self.boxes[sid])
        self.handed.append(sb)
        return sb

    def templates(self) -> list[str]:
        return ["default", "base"]

    def attach(self, sandbox_id: str) -> FakeSandbox:
        if not sandbox_id.startswith("sbx-"):
            raise ConfigError(f"sandbox id {sandbox_id!r} is not of the form sbx-<10 hex digits>")
        time.sleep(self.attach_delay)
        self.attached.append(sandbox_id)
        if "attach" in self.fail:
            raise self.fail["attach"]
        if sandbox_id not in self.boxes:
            raise SandboxNotFound(sandbox_id)
        sb = FakeSandbox(self, self.boxes[sandbox_id])
        self.handed.append(sb)
        return sb

    def destroy(self, sandbox_id: str) -> None:
        if self.boxes.pop(sandbox_id, None) is None:
            raise SandboxNotFound(sandbox_id)
        self.destroyed.append(sandbox_id)

    def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxRecord]:
        self.list_labels.append(labels)
        want = dict(labels or {})
        out = []
        for box in self.boxes.values():
            spec = SandboxSpec(labels=dict(box.kwargs.get("labels") or {}))
            if all(spec.labels.get(k) == v for k, v in want.items()):
                out.append(
                    SandboxRecord(
                        box.id, box.id, "10.99.1.7", "ssh-ed25519 AAAA", spec, 1.0, None, 1, "h", "fake"
                    )
                )
        return out


# -- fixtures --------------------------------------------------------------------------------------
@pytest.fixture
def mgr() -> FakeManager:
    return FakeManager()


@pytest.fixture
def server(mgr: FakeManager) -> Iterator[ApiServer]:
    with ApiServer(mgr, token=TOKEN, port=0) as srv:
        yield srv


@pytest.fixture
def api(server: ApiServer) -> Iterator[Callable[..., requests.Response]]:
    session = requests.Session()

    def call(method: str, path: str, *, auth: bool = True, **kwargs: Any) -> requests.Response:
        headers = {**(AUTH if auth else {}), **kwargs.pop("headers", {})}
        return session.request(method, server.url + path, headers=headers, timeout=10, **kwargs)

    yield call
    session.close()


def make_box(api: Callable[..., requests.Response], **body: Any) -> str:
    r = api("POST", "/v1/sandboxes", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def error_of(r: requests.Response) -> dict[str, Any]:
    assert r.headers["Content-Type"] == "application/json", r.headers
    err: dict[str, Any] = r.json()["error"]
    return err


# -- auth and the token ------------------------------------------------------------------------------
def test_public_routes_need_no_token(api: Callable[..., requests.Response]) -> None:
    r = api("GET", "/healthz", auth=False)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    r = api("GET", "/openapi.json", auth=False)
    assert r.status_code == 200 and r.json()["openapi"] == "3.1.0"


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        f"Basic {TOKEN}",
        "Bearer",
        "Bearer wrong-token-xxxxxxxxxxxx",
        f"Bearer {TOKEN[:-1]}",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN.upper()}",
        "Bearer \u00e9\u00e9\u00e9",
    ],
)
def test_missing_or_wrong_token_is_401(api: Callable[..., requests.Response], header: str | None) -> None:
    headers = {} if header is None else {"Authorization": header.encode("utf-8")}
    for method, path in (
        ("GET", "/v1/sandboxes"),
        ("POST", "/v1/sandboxes"),
        ("GET", "/v1/nope"),
        ("DELETE", "/v1/sandboxes/sbx-0123456789"),
    ):
        r = api(method, path, auth=False, headers=headers)
        assert r.status_code == 401, (method, path)
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
        assert error_of(r)["code"] == "unauthorized"


def test_scheme_is_case_insensitive(api: Callable[..., requests.Response]) -> None:
    r = api("GET", "/v1/sandboxes", auth=False, headers={"Authorization": f"bearer {TOKEN}"})
    assert r.status_code == 200


@pytest.mark.parametrize("token", ["", "short", "has space in it 12345", "x" * 15, None])
def test_refuses_to_start_without_a_usable_token(mgr: FakeManager, token: Any) -> None:
    with pytest.raises(ConfigError, match="token"):
        ApiServer(mgr, token=token, port=0)
    with pytest.raises(ConfigError, match="token"):
        serve(mgr, port=0, token=token)


def test_load_token_from_env_and_file(tmp_path: Path) -> None:
    assert load_token(env={"SANDBOX_RT_API_TOKEN": f" {TOKEN}\n"}) == TOKEN
    with pytest.raises(ConfigError, match="--token-file"):
        load_token(env={})
    with pytest.raises(ConfigError, match="shorter"):
        load_token(env={"SANDBOX_RT_API_TOKEN": "abc"})
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    assert load_token(f, env={"SANDBOX_RT_API_TOKEN": "ignored-when-a-file-is-given"}) == TOKEN
    f.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_token(f)
    with pytest.raises(ConfigError, match="cannot read"):
        load_token(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    with pytest.raises(ConfigError, match="empty"):
        load_token(empty)


def test_the_token_never_reaches_the_log(
    api: Callable[..., requests.Response], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sandbox_rt")
    api("GET", "/v1/sandboxes")
    api("GET", "/v1/sandboxes", auth=False, headers={"Authorization": f"Bearer {TOKEN}x"})
    api("GET", "/v1/nope")
    assert len(caplog.records) >= 3, "requests are logged"
    assert not any(TOKEN[4:] in rec.getMessage() for rec in caplog.records)


# -- routing -----------------------------------------------------------------------------------------
def test_unknown_route_is_404_and_wrong_method_405(api: Callable[..., requests.Response]) -> None:
    r = api("GET", "/v1/nothing")
    assert r.status_code == 404 and error_of(r)["code"] == "route_not_found"
    r = api("GET", "/v1/sandboxes/sbx-0123456789/exec")
    assert r.status_code == 405 and r.headers["Allow"] == "POST"
    r = api("DELETE", "/v1/sandboxes")
    assert r.status_code == 405 and r.headers["Allow"] == "GET, POST"
    r = api("PATCH", "/v1/sandboxes/sbx-0123456789")
    assert r.status_code == 405 and r.headers["Allow"] == "DELETE, GET"
    r = api("POST", "/healthz", auth=False)
    assert r.status_code == 405


def test_an_undeclared_method_is_a_json_405(api: Callable[..., requests.Response]) -> None:
    """Any method the document does not declare on a path (issue 18: not 501)."""
    for method in ("OPTIONS", "HEAD", "TRACE", "BREW"):
        r = api(method, "/v1/sandboxes")
        assert r.status_code == 405 and r.headers["Allow"] == "GET, POST", method
        if method != "HEAD":
            assert error_of(r)["code"] == "method_not_allowed"


def test_keep_alive_serves_several_requests_on_one_connection(server: ApiServer) -> None:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    for _ in range(3):
        conn.request("GET", "/v1/sandboxes", headers=AUTH)
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read()) == {"sandboxes": []}
    conn.close()


# -- create / list / status / delete -----------------------------------------------------------------
def test_create_passes_the_body_to_create(api: Callable[..., requests.Response], mgr: FakeManager) -> None:
    body = {
        "cpus": 0.5,
        "memory_mb": 512.0,
        "labels": {"team": "x"},
        "ttl_s": 60,
        "internet": True,
        "hostname": None,
    }
    r = api("POST", "/v1/sandboxes", json=body)
    assert r.status_code == 201, r.text
    data = r.json()
    assert r.headers["Location"] == f"/v1/sandboxes/{data['id']}"
    assert data["state"] == "running" and data["internet"] is True and data["labels"] == {"team": "x"}
    kwargs = mgr.created[0]
    assert kwargs == {
        "cpus": 0.5,
        "memory_mb": 512,
        "labels": {"team": "x"},
        "ttl_s": 60,
        "internet": True,
        "detached": True,
    }
    assert isinstance(kwargs["memory_mb"], int)
    # an empty body is create() with its defaults; detached can be turned off
    assert api("POST", "/v1/sandboxes").status_code == 201
    assert mgr.created[1] == {"detached": True}
    assert api("POST", "/v1/sandboxes", json={"detached": False}).status_code == 201
    assert mgr.created[2] == {"detached": False}


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"cpus": "two"}, "'cpus' must be a number"),
        ({"cpus": True}, "'cpus' must be a number"),
        ({"memory_mb": 1.5}, "'memory_mb' must be a whole number"),
        ({"internet": "yes"}, "'internet' must be true or false"),
        ({"labels": {"a": 1}}, "'labels' must be an object whose values are strings"),
        ({"labels": ["a"]}, "'labels'"),
        ({"hostname": 5}, "'hostname' must be a string"),
        ({"ttl_s": "1h"}, "'ttl_s'"),
        ({"image": "ubuntu"}, "unknown field(s) in the create body: image"),
        ({"cpus": 99}, "cpus=99 must be > 0"),  # the runtime's own range check, passed through
        ({"root": "yes"}, "'root' must be true or false"),
        ({"root": None}, "'root' must be true or false"),
    ],
)
def test_create_validation_names_the_field(
    api: Callable[..., requests.Response], mgr: FakeManager, body: dict[str, Any], needle: str
) -> None:
    r = api("POST", "/v1/sandboxes", json=body)
    assert r.status_code == 400
    err = error_of(r)
    assert err["code"] == "invalid_argument" and needle in err["message"], err
    assert not mgr.boxes


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"{", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"x"', "must be a JSON object"),
        (b'{"hostname": "\\ud800"}', "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_malformed_json_is_400(api: Callable[..., requests.Response], raw: bytes, needle: str) -> None:
    r = api("POST", "/v1/sandboxes", data=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and needle in error_of(r)["message"]


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_a_json_body_under_another_media_type_is_415(
    api: Callable[..., requests.Response], mgr: FakeManager, content_type: str
) -> None:
    r = api("POST", "/v1/sandboxes", data=b'{"cpus": 1}', headers={"Content-Type": content_type})
    assert r.status_code == 415 and error_of(r)["code"] == "unsupported_media_type" and not mgr.created
    for ok in ("application/json; charset=utf-8", "application/vnd.api+json"):
        assert api("POST", "/v1/sandboxes", data=b"{}", headers={"Content-Type": ok}).status_code == 201
    assert api("POST", "/v1/sandboxes", data=b"{}").status_code == 201  # no Content-Type: read as JSON
    sid = make_box(api)  # raw bytes go under any media type
    r = api("PUT", f"/v1/sandboxes/{sid}/files?path=/x", data=b"{", headers={"Content-Type": content_type})
    assert r.status_code == 200 and mgr.boxes[sid].files["/x"] == b"{"


def test_the_served_document_knows_the_hosts_templates_and_cores(
    api: Callable[..., requests.Response],
) -> None:
    """What only this host knows is exact in the document it serves (a request the document allows
    is one the host accepts), and absent from the generic one."""
    served = api("GET", "/openapi.json", auth=False).json()["components"]["schemas"]["CreateSandboxRequest"]
    assert served["properties"]["template"]["enum"] == ["default", "base", None]
    assert served["properties"]["cpus"]["maximum"] == (os.cpu_count() or 1)
    generic = openapi_document()["components"]["schemas"]["CreateSandboxRequest"]
    assert "enum" not in generic["properties"]["template"] and "maximum" not in generic["properties"]["cpus"]


def test_the_served_pids_max_is_the_lxc_hosts_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35 (found by fuzzing): above an LXC host's pids budget a create is a 400, so the served
    maximum is that budget (a Proxmox VE node's ceiling is the node's: the schema's bound stays, and
    the create's 400 says so)."""
    from sandbox_rt.web import app

    monkeypatch.setattr(app, "read_pid_max", lambda: 32768)
    lxc, unknown = FakeManager(), FakeManager()  # a runtime without settings: the schema's bound
    lxc.settings = Settings(backend="lxc")  # type: ignore[attr-defined]
    for mgr, want in ((lxc, 32768 - 32768 // 8), (unknown, 1 << 22)):
        served = app.served_document(mgr)["components"]["schemas"]["CreateSandboxRequest"]
        assert served["properties"]["pids_max"]["maximum"] == want
    create = openapi_document()["paths"]["/v1/sandboxes"]["post"]["responses"]
    assert "pids budget" in create["409"]["description"] and "pids_max" in create["400"]["description"]


def test_create_is_all_or_nothing_when_status_fails(
    api: Callable[..., requests.Response], mgr: FakeManager
) -> None:
    mgr.fail["status"] = BackendError("lxc-info failed", step="state")
    r = api("POST", "/v1/sandboxes", json={})
    assert r.status_code == 502
    assert mgr.destroyed and not mgr.boxes


def test_list_filters_by_labels(api: Callable[..., requests.Response], mgr: FakeManager) -> None:
    a = make_box(api, labels={"team": "x", "run": "1"})
    make_box(api, labels={"team": "y"})
    r = api("GET", "/v1/sandboxes?label=team=x&label=run=1")
    assert r.status_code == 200
    assert [s["id"] for s in r.json()["sandboxes"]] == [a]
    assert mgr.list_labels[-1] == {"team": "x", "run": "1"}
    entry = r.json()["sandboxes"][0]
    assert "host_key" not in entry and entry["labels"] == {"team": "x", "run": "1"}
    assert len(api("GET", "/v1/sandboxes").json()["sandboxes"]) == 2
    assert api("GET", "/v1/sandboxes?label=a%3Db%3Dc").status_code == 200  # value may contain '='
    assert mgr.list_labels[-1] == {"a": "b=c"}
    for bad in ("label=novalue", "label==x", "owner=me"):
        r = api("GET", f"/v1/sandboxes?{bad}")
        assert r.status_code == 400, bad
        assert "label" in error_of(r)["message"] or "owner" in error_of(r)["message"]


def test_status_and_delete(api: Callable[..., requests.Response], mgr: FakeManager) -> None:
    sid = make_box(api, cpus=2)
    r = api("GET", f"/v1/sandboxes/{sid}")
    assert r.status_code == 200 and r.json()["id"] == sid and r.json()["cpus"] == 2
    assert r.json()["usage"]["pids"] == 3
    created = mgr.handed[0]
    r = api("DELETE", f"/v1/sandboxes/{sid}")
    assert r.status_code == 204 and r.content == b""
    assert mgr.destroyed == [sid] and created.closed == 1
    for method in ("GET", "DELETE"):
        r = api(method, f"/v1/sandboxes/{sid}")
        assert r.status_code == 404 and error_of(r)["code"] == "not_found", method
    r = api("POST", f"/v1/sandboxes/{sid}/exec", json={"command": "true"})
    assert r.status_code == 404


def test_a_malformed_sandbox_id_is_400(api: Callable[..., requests.Response]) -> None:
    r = api("GET", "/v1/sandboxes/not-an-id")
    assert r.status_code == 400 and "sbx-" in error_of(r)["message"]


# -- exec --------------------------------------------------------------------------------------------
def test_exec_json_result(api: Callable[..., requests.Response], mgr: FakeManager) -> None:
    sid = make_box(api)
    body = {"command": ["echo", "a b"], "timeout": 5, "cwd": "/tmp", "env": {"X": "1"}, "stdin": "héllo"}
    r = api("POST", f"/v1/sandboxes/{sid}/exec", json=body)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "command": "echo a b",
        "exit_code": 0,
        "duration_s": 0.5,
        "truncated": False,
        "stdout_dropped": 0,
        "stderr_dropped": 0,
        "encoding": "utf-8",
        "stdout": "out:héllo",
        "stderr": "err",
    }
    call = mgr.handed[0].calls[-1]
    assert call == (
        "exec",
        {
            "command": ["echo", "a b"],
            "timeout": 5,
            "cwd": "/tmp",
            "env": {"X": "1"},
            "stdin": "héllo".encode(),
        },
    )


def test_exec_keeps_max_output_and_says_what_it_dropped(
    api: Callable[..., requests.Response], mgr: FakeManager
) -> None:
    sid = make_box(api)
    body = {"command": "x", "stdin": "0123456789", "max_output": 6}
    r = api("POST", f"/v1/sandboxes/{sid}/exec", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["stdout"] == "out:01" and got["truncated"] is True and got["stdout_dropped"] == 8
    assert mgr.handed[0].calls[-1][1]["max_output"] == 6
    for bad in (0, -1, "6", 1.5, True):
        r = api("POST", f"/v1/sandboxes/{sid}/exec", json={"command": "x", "max_output": bad})
        assert r.status_code == 400, (bad, r.text)


def test_exec_output_encodings(api: Callable[..., requests.Response], mgr: FakeManager) -> None:
    sid = make_box(api)
    raw = bytes(range(256))
    mgr.exec_result = ExecResult("cat", raw, b"\xff", 7, 0.1)
    r = api("POST", f"/v1/sandboxes/{sid}/exec", json={"command": "cat"})
    assert r.json()["stdout"] == raw.decode("utf-8", "replace") and r.json()["stderr"] == "\ufffd"
    assert r.json()["exit_code"] == 7
    r = api(
        "POST",
        f"/v1/sandboxes/{sid}/exec",
        json={"command": "cat", "encoding": "base64", "stdin_b64": base64.b64encode(b"\x00\x01").decode()},
    )
    assert base64.b64decode(r.json()["stdout"]) == raw and base64.b64decode(r.json()["stderr"]) == b"\xff"
    assert r.json()["encoding"] == "base64"
    assert mgr.handed[0].calls[-1][1]["stdin"] == b"\x00\x01"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({}, "'command' is required"),
        ({"command": ""}, "'command' must be a non-empty string"),
        ({"command": []}, "'command'"),
        ({"command": ["ls", 1]}, "'command'"),
        ({"command": 5}, "'command'"),
        ({"command": "ls", "timeout": "10"}, "'timeout' must be a number"),
        ({"command": "ls", "env": {"A": 1}}, "'env'"),
        ({"command": "ls", "encoding": "latin-1"}, "'encoding' must be one of utf-8, base64"),
        ({"command": "ls", "stdin": "a", "stdin_b64": "YQ=="}, "at most one of"),
        ({"command": "ls", "stdin_b64": "!!"}, "'stdin_b64' is not valid base64"),
        ({"command": "ls", "stream": "yes"}, "'stream' must be true or false"),
        ({"command": "ls", "shell": True}, "unknown field(s) in the exec body: shell"),
        ({"command": "ls", "user": 0}, "'user' must be a string"),
    ],
)
def test_exec_validation_names_the_field(
    api: Callable[..., requests.Response], body: dict[str, Any], needle: str
) -> None:
    sid = make_box(api)
    r = api("POST", f"/v1/sandboxes/{sid}/exec", json=body)
    assert r.status_code == 400 and needle in error_of(r)["message"], r.text


def test_templates_are_listed_and_create_takes_one(
    api: Callable[..., requests.Response], mgr: FakeManager
) -> None:
    r = api("GET", "/v1/templates")
    assert r.status_code == 200 and r.json() == {"templates": ["default", "base"]}
    assert api("POST", "/v1/sandboxes", json={"template": "base"}).status_code == 201
    assert mgr.created[-1] == {"template": "base", "detached": True}
    r = api("POST", "/v1/sandboxes", json={"template": 3})
    assert r.status_code == 400 and "template" in error_of(r)["message"]
    mgr.fail["create"] = ConfigError("unknown template 'nope'; this host has: default, base")
    r = api("POST", "/v1/sandboxes", json={"template": "nope"})
    assert r.status_code == 400 and "default, base" in error_of(r)["message"]


def test_exec_timeout_is_504_with_the_output_so_far(
    api: Callable[..., requests.Response], mgr: FakeManager
) -> None:
    sid = make_box(api)
    mgr.fail["exec"] = CommandTimeout("sleep 9", 2.0, b"partial\xff", b"e")
    r = api("POST", f"/v1/sandboxes/{sid}/exec", json={"command": "sleep 9", "timeout": 2})
    assert r.status_code == 504
    err = error_of(r)
    assert err["code"] == "command_timeout" and err["timeout_s"] == 2.0
    assert err["stdout"] == "partial\ufffd" and err["stderr"] == "e"
    r = api("POST", f"/v1/sandboxes/{sid}/exec", json={"command": "sleep 9", "encoding": "base64"})
    assert base64.b64decode(error_of(r)["stdout"]) == b"partial\xff"


# -- server-sent events --------------------------------------------------------------------------------
def read_events(resp: http.client.HTTPResponse) -> Iterator[tuple[str, dict[str, Any]]]:
    """Parse an SSE body as it arrives (one event per blank-line-terminated block)."""
    name, data = "", ""
    while True:
        line = resp.readline()
        if not line:
            return
        text = line.decode("utf-8").rstrip("\n")
        if text.startswith("event: "):
            name = text[7:]
        elif text.startswith("data: "):
            data = text[6:]
        elif text == "":
            yield name, json.loads(data)
            name, data = "", ""


def open_stream(
    server: ApiServer, sid: str, body: dict[str, Any], headers: Mapping[str, str] | None = None
) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    conn.request(
        "POST",
        f"/v1/sandboxes/{sid}/exec",
        body=json.dumps(body),
        headers={**AUTH, "Content-Type": "application/json", **(headers or {})},
    )
    return conn.getresponse()


def test_sse_sends_the_first_chunk_before_the_command_ends(
    server: ApiServer, api: Callable[..., requests.Response], mgr: FakeManager
) -> None:
    sid = make_box(api)
    release = threading.Event()
    mgr.stream_script = [("stdout", b"1\n"), release, ("stderr", b"warn\n"), ("stdout", b"2\n")]
    resp = open_stream(server, sid, {"command": "loop", "stream": True})
    assert resp.status == 200
    assert resp.getheader("Content-Type", "").startswith("text/event-stream")
    events = read_events(resp)
    assert next(events) == ("stdout", {"data": "1\n"})  # while the command is still "running"
    release.set()
    rest = list(events)
    assert rest[:2] == [("stderr", {"data": "warn\n"}), ("stdout", {"data": "2\n"})]
    exit_event = {"command": "loop", "exit_code": 3, "duration_s": 0.25}
    assert rest[2] == ("exit", {**exit_event, "truncated": False, "stdout_dropped": 0, "stderr_dropped": 0})
    assert len(rest) == 3


def test_sse_by_accept_header_and_stream_false_wins(
    server: ApiServer, api: Callable[..., requests.Response], mgr: FakeManager
) -> None:
    sid = make_box(api)
    mgr.stream_script = [("stdout", b"x")]
    resp = open_stream(server, sid, {"command": "x"}, {"Accept": "text/event-stream"})
    assert [e for e, _ in read_events(resp)] == ["stdout", "exit"]
    r = api(
        "POST",
        f"/v1/sandboxes/{sid}/exec",
        json={"command": "x", "stream": False},
        headers={"Accept": "text/event-stream"},
    )
    assert r.headers["Content-Type"] == "application/json" and r.json()["exit_code"] == 0


def test_sse_text_keeps_utf8_split_across_chunks_and_base64_is_exact(
    server: ApiServer, api: Callable[..., requests.Response], mgr: FakeManager
) -> None:
    sid = make_box(api)
    e_acute = "é".encode()
    mgr.stream_script = [
        ("stdout", b"caf" + e_acute[:1]),
        ("stdout", e_acute[1:] + b"\n"),
        ("stdout", b"\xc3"),
    ]
    events = list(read_events(open_stream(server, sid, {"command": "x", "stream": True})))
    text = "".join(d["data"] for e, d in events if e == "stdout")
    assert text == "café\n\ufffd"
    events = list(
        read_events(open_stream(server, sid, {"command": "x", "stream": True, "encoding": "base64"}))
    )
    raw = b"".join(base64.b64decode(d["data"]) for e, d in events if e == "stdout")
    assert raw == b"caf" + e_acute + b"\n\xc3"


def test_sse_error_event_after_a_timeout(
    server: ApiServer, api: Callable[..., requests.Response], mgr: FakeManager
) -> None:
    sid = make_box(api)
    mgr.stream_script = [("stdout", b"1\n"), CommandTimeout("loop", 1.0, b"1\n", b"")]
    events = list(read_events(open_stream(server, sid, {"command": "loop", "stream": True})))
    assert events[0] == ("stdout", {"data": "1\n"})
    name, data = events[1]
    assert name == "error" and data["status"] == 504 and data["error"]["code"] == "command_timeout"
    assert "stdout" not in data["error"]
    assert len(events) == 2


def test_sse_validation_errors_are_plain_json(
    server: ApiServer, api: Callable[..., requests.Response]
) -> None:
    sid = make_box(api)
    resp = open_stream(server, sid, {"command": "", "stream": True})
    assert resp.status == 400 and resp.getheader("Content-Type") == "application/json"


def test_a_client_that_leaves_mid_stream_does_not_break_the_server(
    server: ApiServer, api: Callable[..., requests.Response], mgr: FakeManager
) -> None:
    sid = make_box(api)
    release = threading.Event()
    mgr.stream_script = [("stdout", b"1\n"), release, *[("stdout", b"x" * 65536)] * 50]
    resp = open_stream(server, sid, {"command": "loop", "stream": True})
    assert next(read_events(resp))[0] == "stdout"
    resp.close()
    release.set()
    time.sleep(0.2)
    assert api("GET", "/healthz").status_code == 200


# -- files -------------------------------------------------------------------------------------------
def test_files_round_trip_binary(api: Callable[..., requests.Response], mgr: FakeManager) -> None:
    sid = make_box(api)
    data = bytes(range(256)) * 1000
    r = api("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/a%20b.bin&mode=0755", data=data)
    assert r.status_code == 200 and r.json() == {"path": "/tmp/a b.bin", "size": len(data)}
    assert mgr.handed[0].calls[-1] == ("write_file", 0o755)
    r = api("GET", f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/a b.bin"})
    assert r.status_code == 200 and r.content == data
    assert r.headers["Content-Type"] == "application/octet-stream"
    r = api("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/empty", data=b"")
    assert r.status_code == 200 and mgr.boxes[sid].files["/tmp/empty"] == b""
    r = api("GET", f"/v1/sandboxes/{sid}/files?path=/nope")
    assert r.status_code == 404 and error_of(r)["code"] == "file_not_found" and error_of(r)["path"] == "/nope"


@pytest.mark.parametrize(
    ("query", "needle"),
    [
        ("", "'path' is required"),
        ("path=/a&path=/b", "more than once"),
        ("path=/a&mode=999", "octal"),
        ("path=/a&x=1", "unknown query parameter 'x'"),
    ],
)
def test_files_query_validation(api: Callable[..., requests.Response], query: str, needle: str) -> None:
    sid = make_box(api)
    r = api("PUT", f"/v1/sandboxes/{sid}/files?{query}", data=b"x")
    assert r.status_code == 400 and needle in error_of(r)["message"]


def test_body_limit_is_413_and_chunked_uploads_411(mgr: FakeManager) -> None:
    with ApiServer(mgr, token=TOKEN, port=0, max_body_bytes=1024) as srv:
        sid = mgr.create().id
        url = f"{srv.url}/v1/sandboxes/{sid}/files?path=/tmp/x"
        r = requests.put(url, data=b"x" * 1024, headers=AUTH, timeout=5)
        assert r.status_code == 200
        r = requests.put(url, data=b"x" * (4 << 20), headers=AUTH, timeout=5)
        assert r.status_code == 413 and error_of(r)["limit_bytes"] == 1024
        assert r.headers["Connection"] == "close"
        r = requests.put(url, data=iter([b"abc"]), headers=AUTH, timeout=5)  # chunked
        assert r.status_code == 411
        r = requests.post(f"{srv.url}/v1/sandboxes", data=b"{}" + b" " * 2000, headers=AUTH, timeout=5)
        assert r.status_code == 413
        assert requests.get(f"{srv.url}/healthz", timeout=5).status_code == 200


# -- internet ----------------------------------------------------------------------------------------
def test_internet_toggle(api: Callable[..., requests.Response], mgr: FakeManager) -> None:
    sid = make_box(api)
    r = api("POST", f"/v1/sandboxes/{sid}/internet", json={"enabled": True})
    assert r.status_code == 200 and r.json() == {"id": sid, "internet": True}
    assert api("GET", f"/v1/sandboxes/{sid}").json()["internet"] is True
    api("POST", f"/v1/sandboxes/{sid}/internet", json={"enabled": False})
    assert mgr.boxes[sid].internet is False
    for body in ({"enabled": "yes"}, {}, {"enabled": True, "ports": [80]}):
        r = api("POST", f"/v1/sandboxes/{sid}/internet", json=body)
        assert r.status_code == 400 and "field" in error_of(r)["message"], body
    r = api("POST", f"/v1/sandboxes/{sid}/internet")
    assert r.status_code == 400 and "JSON object body" in error_of(r)["message"]


# -- error mapping -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (ConfigError("path='x' must be an absolute path"), 400, "invalid_argument"),
        (SandboxNotFound("sbx-0123456789"), 404, "not_found"),
        (FileOperationError(errno.ENOENT, "no such file", "/x"), 404, "file_not_found"),
        (FileOperationError(errno.EACCES, "permission denied", "/x"), 403, "file_permission_denied"),
        (FileOperationError(errno.EPERM, "not permitted", "/x"), 403, "file_permission_denied"),
        (FileOperationError(errno.EISDIR, "is a directory", "/x"), 409, "file_conflict"),
        (FileOperationError(errno.ENOSPC, "disk full", "/x"), 507, "insufficient_storage"),
        (FileOperationError(errno.EIO, "i/o error", "/x"), 500, "file_error"),
        (FileOperationError(errno.ENAMETOOLONG, "name too long", "/x"), 400, "file_name_too_long"),
        (FileOperationError(errno.ENOTEMPTY, "not empty", "/x"), 409, "file_conflict"),
        (FileOperationError(errno.ETIMEDOUT, "no answer", "/x"), 504, "file_timeout"),
        (FileOperationError(errno.EROFS, "read-only mount", "/x"), 403, "file_permission_denied"),
        (FileOperationError(errno.EXDEV, "different mounts", "/x"), 409, "file_conflict"),
        (FileOperationError(errno.EBUSY, "a mount point", "/x"), 409, "file_conflict"),
        (FileOperationError(errno.EILSEQ, "a name that is not UTF-8", "/x"), 409, "file_conflict"),
        (BackendError("lxc-attach failed", step="exec"), 502, "backend_error"),
        (PermissionDenied("token lacks VM.Audit", step="status"), 502, "backend_permission_denied"),
        (ConnectionLost("ssh dropped"), 502, "connection_lost"),
        (SandboxNotReady("ssh not ready"), 503, "sandbox_not_ready"),
        (SandboxError("sandbox sbx-0123456789 is stopped, not running"), 409, "conflict"),
    ],
)
def test_runtime_errors_map_to_http(
    api: Callable[..., requests.Response], mgr: FakeManager, exc: Exception, status: int, code: str
) -> None:
    sid = make_box(api)
    mgr.fail["read_file"] = exc
    r = api("GET", f"/v1/sandboxes/{sid}/files?path=/x")
    assert r.status_code == status
    err = error_of(r)
    assert err["code"] == code and err["message"] == str(exc) and err["type"] == type(exc).__name__


def test_unexpected_errors_are_500_without_details(
    api: Callable[..., requests.Response], mgr: FakeManager, caplog: pytest.LogCaptureFixture
) -> None:
    sid = make_box(api)
    mgr.fail["read_file"] = RuntimeError("secret internals")
    r = api("GET", f"/v1/sandboxes/{sid}/files?path=/x")
    assert r.status_code == 500 and "secret" not in r.text
    assert "secret internals" in caplog.text  # the traceback goes to the log


# -- the sandbox cache -------------------------------------------------------------------------------
def test_cache_reuses_one_attached_sandbox(
    api: Callable[..., requests.Response], mgr: FakeManager, server: ApiServer
) -> None:
    sid = make_box(api)
    for _ in range(3):
        assert api("POST", f"/v1/sandboxes/{sid}/exec", json={"command": "true"}).status_code == 200
    assert mgr.attached == []  # the sandbox create() returned is reused
    server.cache.drop(sid)
    mgr.attach_delay = 0.2
    results: list[int] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(
                api("POST", f"/v1/sandboxes/{sid}/exec", json={"command": "true"}).status_code
            )
        )
        for _ in range(5)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 5 and mgr.attached == [sid]  # concurrent misses attach once


def test_cache_reattaches_a_dead_connection_and_forgets_lost_ones(
    api: Callable[..., requests.Response], mgr: FakeManager, server: ApiServer
) -> None:
    sid = make_box(api)
    mgr.handed[0].connected = False
    assert api("GET", f"/v1/sandboxes/{sid}").status_code == 200
    assert mgr.attached == [sid] and mgr.handed[0].closed == 1
    mgr.fail["exec"] = ConnectionLost("dropped")
    assert api("POST", f"/v1/sandboxes/{sid}/exec", json={"command": "true"}).status_code == 502
    assert len(server.cache) == 0
    del mgr.fail["exec"]
    assert api("POST", f"/v1/sandboxes/{sid}/exec", json={"command": "true"}).status_code == 200
    assert mgr.attached == [sid, sid]


def test_stop_closes_cached_connections_but_destroys_nothing(mgr: FakeManager) -> None:
    srv = ApiServer(mgr, token=TOKEN, port=0).start()
    r = requests.post(f"{srv.url}/v1/sandboxes", json={}, headers=AUTH, timeout=5)
    assert r.status_code == 201
    srv.stop()
    assert mgr.handed[0].closed == 1 and not mgr.destroyed and len(mgr.boxes) == 1
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{srv.url}/healthz", timeout=2)


def test_serve_blocks_until_sigterm(tmp_path: Path) -> None:
    """serve() as `sandbox-rt serve` runs it: in the main thread, stopped by SIGTERM."""
    ready = tmp_path / "url"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_http_api import FakeManager
        from sandbox_rt.web.server import serve
        serve(FakeManager(), port=0, token={TOKEN!r},
              on_ready=lambda url: open({str(ready)!r}, "w").write(url))
        print("stopped cleanly")
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).parents[2],
        env={**os.environ, "PYTHONPATH": "."},
    )
    try:
        deadline = time.monotonic() + 20
        while not (ready.exists() and ready.read_text()) and time.monotonic() < deadline:
            time.sleep(0.02)
        url = ready.read_text()
        assert url.startswith("http://127.0.0.1:")
        assert requests.get(f"{url}/v1/sandboxes", headers=AUTH, timeout=5).json() == {"sandboxes": []}
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert b"stopped cleanly" in out and TOKEN.encode() not in out + err


# -- the OpenAPI document ------------------------------------------------------------------------------
def _operations(doc: dict[str, Any]) -> set[tuple[str, str]]:
    methods = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
    return {(m.upper(), p) for p, item in doc["paths"].items() for m in item if m in methods}


def _implemented() -> set[tuple[str, str]]:
    return {(m, r.path) for router in ROUTERS for r in router.routes for m in r.methods}  # type: ignore[attr-defined]


def test_openapi_documents_exactly_the_implemented_routes() -> None:
    doc = openapi_document()
    assert _operations(doc) == _implemented() and len(_implemented()) >= 20
    for method, path in _implemented():
        op = doc["paths"][path][method.lower()]
        assert op["operationId"] and op["summary"]
        assert {"200", "201", "204"} & set(op["responses"]), (method, path)
        assert "422" not in op["responses"], "validation errors are 400s"
        if path in PUBLIC_PATHS:
            assert op["security"] == [], path
        else:
            assert "security" not in op and "401" in op["responses"], (method, path)
        params = {p["name"] for p in op.get("parameters", [])}
        if "{id}" in path:
            assert "id" in params


def test_openapi_bodies_match_the_runtime() -> None:
    """The create body takes every option of Manager.create but the in-process ones, and the
    document's bodies are the models the server validates with."""
    schemas = openapi_document()["components"]["schemas"]
    options = set(typing.get_type_hints(CreateOptions))  # Manager.create(**options: Unpack[CreateOptions])
    assert set(schemas["CreateSandboxRequest"]["properties"]) == options
    assert set(schemas["ExecRequest"]["properties"]) == set(web_schemas.ExecRequest.model_fields)
    assert schemas["ExecRequest"]["required"] == ["command"]
    assert schemas["InternetRequest"]["properties"]["enabled"]["type"] == "boolean"
    for name in ("CreateSandboxRequest", "ExecRequest", "InternetRequest", "EgressRequest"):
        assert schemas[name]["additionalProperties"] is False, name
    status_fields = set(SandboxStatus.__dataclass_fields__)
    assert set(schemas["SandboxStatus"]["properties"]) == status_fields
    assert set(schemas["ResourceUsage"]["properties"]) == set(ResourceUsage.__dataclass_fields__)


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def test_openapi_document_is_valid() -> None:
    doc = openapi_document()
    assert doc["openapi"] == "3.1.0" and doc["info"]["title"] and doc["info"]["version"]
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {"type": "http", "scheme": "bearer"}
    for ref in _refs(doc):  # every $ref resolves inside the document
        node: Any = doc
        assert ref.startswith("#/")
        for part in ref[2:].split("/"):
            node = node[part]
    ids = [op["operationId"] for p in doc["paths"].values() for m, op in p.items() if m != "parameters"]
    assert len(ids) == len(set(ids))
    for path, item in doc["paths"].items():  # every path template variable is a declared parameter
        for op in item.values():
            for var in __import__("re").findall(r"\{(\w+)\}", path):
                assert any(p["name"] == var and p["in"] == "path" and p["required"] for p in op["parameters"])
    try:
        from openapi_spec_validator import validate  # type: ignore[import-not-found]
    except ImportError:
        jsonschema = pytest.importorskip("jsonschema")
        for schema in doc["components"]["schemas"].values():
            jsonschema.Draft202012Validator.check_schema(schema)
    else:
        validate(doc)
    json.dumps(doc)  # serialisable as served


def test_answers_match_the_documented_schemas(
    api: Callable[..., requests.Response], mgr: FakeManager, server: ApiServer
) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    referencing = pytest.importorskip("referencing")
    doc = api("GET", "/openapi.json", auth=False).json()
    resource = referencing.Resource.from_contents(
        doc, default_specification=referencing.jsonschema.DRAFT202012
    )
    registry = referencing.Registry().with_resource("urn:openapi", resource)

    def check(r: requests.Response, schema_name: str) -> None:
        validator = jsonschema.Draft202012Validator(
            {"$ref": f"urn:openapi#/components/schemas/{schema_name}"}, registry=registry
        )
        validator.validate(r.json())

    r = api("POST", "/v1/sandboxes", json={"labels": {"a": "b"}})
    check(r, "SandboxStatus")
    sid = r.json()["id"]
    check(api("GET", f"/v1/sandboxes/{sid}"), "SandboxStatus")
    check(api("GET", "/v1/sandboxes"), "SandboxList")
    check(api("POST", f"/v1/sandboxes/{sid}/exec", json={"command": "x"}), "ExecResult")
    check(api("POST", f"/v1/sandboxes/{sid}/internet", json={"enabled": True}), "InternetState")
    check(api("PUT", f"/v1/sandboxes/{sid}/files?path=/a", data=b"x"), "FileWritten")
    check(api("GET", "/healthz", auth=False), "Health")
    check(api("GET", "/v1/sandboxes/sbx-ffffffffff"), "Error")
    check(api("GET", "/v1/sandboxes"), "SandboxList")
    mgr.stream_script = [("stdout", b"1"), CommandTimeout("x", 1.0, b"", b"")]
    names = {"stdout": "ExecOutputEvent", "exit": "ExecExitEvent", "error": "ExecErrorEvent"}
    for name, data in read_events(open_stream(server, sid, {"command": "x", "stream": True})):
        jsonschema.Draft202012Validator(
            {"$ref": f"urn:openapi#/components/schemas/{names[name]}"}, registry=registry
        ).validate(data)
    mgr.stream_script = [("stdout", b"1")]
    for name, data in read_events(open_stream(server, sid, {"command": "x", "stream": True})):
        jsonschema.Draft202012Validator(
            {"$ref": f"urn:openapi#/components/schemas/{names[name]}"}, registry=registry
        ).validate(data)
    # documented status codes: every error a route answered above is in its responses
    op = doc["paths"]["/v1/sandboxes/{id}"]["get"]
    assert "404" in op["responses"]
