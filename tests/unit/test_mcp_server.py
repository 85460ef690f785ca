"""The MCP server against a fake Manager, through the SDK's own client (in process): the tools and
their schemas, the error mapping, capped output, session scoping and cleanup, the bearer token."""

from __future__ import annotations

import asyncio
import errno
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp_types import CallToolResult

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
    SandboxNotReady,
    SnapshotNotFound,
)
from sandbox_rt.mcp.server import McpOptions, SandboxMcp
from sandbox_rt.mcp.sessions import SessionSandboxes
from sandbox_rt.mcp.transport import BearerToken
from sandbox_rt.models import EntryInfo, ExecResult, ResourceUsage, SandboxStatus, SnapshotInfo
from sandbox_rt.policy import DoorPolicy

TOOLS = {
    "create_sandbox",
    "run_command",
    "read_file",
    "write_file",
    "list_files",
    "set_internet",
    "set_egress",
    "snapshot_sandbox",
    "sandbox_status",
    "list_sandboxes",
    "destroy_sandbox",
}


# -- fakes -----------------------------------------------------------------------------------------
class FakeFiles:
    def __init__(self, box: FakeBox) -> None:
        self.box = box

    def list(self, path: str, depth: int = 1, *, max_entries: int = 10_000) -> list[EntryInfo]:
        self.box.mgr.check("list")
        return [EntryInfo(n, f"{path}/{n}", "file", len(d), 0o644, 1.0) for n, d in self.box.files.items()]

    def write(self, path: str, data: bytes | str, *, mode: int | None = None) -> EntryInfo:
        self.box.mgr.check("write")
        raw = data if isinstance(data, bytes) else data.encode()
        self.box.files[path] = raw
        return EntryInfo(path.rsplit("/", 1)[-1], path, "file", len(raw), mode or 0o644, 2.0)


@dataclass
class FakeBox:
    mgr: FakeManager
    kwargs: dict[str, Any]
    id: str = field(default_factory=lambda: "sbx-" + secrets.token_hex(5))
    files: dict[str, bytes] = field(default_factory=dict)
    internet: bool = False
    destroyed: bool = False

    def __post_init__(self) -> None:
        self._files = FakeFiles(self)

    @property
    def files_api(self) -> FakeFiles:
        return self._files

    hostname = property(lambda self: self.id)
    ip = property(lambda self: "10.99.1.9")
    labels = property(lambda self: dict(self.kwargs.get("labels") or {}))
    expires_at = property(lambda self: 1000.0 + self.kwargs.get("ttl_s", 0))

    def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        max_output: int = 64 << 20,
        user: str | None = None,
    ) -> ExecResult:
        self.mgr.check("exec")
        self.mgr.execs.append(
            dict(command=command, timeout=timeout, cwd=cwd, env=env, stdin=stdin, user=user)
        )
        out = self.mgr.output
        return ExecResult(str(command), out[:max_output], b"warn", 3, 0.5, max(0, len(out) - max_output), 0)

    def read_file(self, path: str, *, max_bytes: int = 1 << 20) -> bytes:
        self.mgr.check("read")
        if path not in self.files:
            raise FileOperationError(errno.ENOENT, "read: no such file in the sandbox", path)
        if len(self.files[path]) > max_bytes:
            raise FileOperationError(errno.EFBIG, "read: too large", path)
        return self.files[path]

    def set_internet(self, enabled: bool) -> None:
        self.internet = enabled

    def set_egress(self, egress: Sequence[str]) -> tuple[str, ...]:
        return tuple(e.lower() for e in egress)

    def status(self) -> SandboxStatus:
        self.mgr.check("status")
        return SandboxStatus(
            self.id,
            "running",
            self.ip,
            self.id,
            1.0,
            512,
            8,
            self.internet,
            1.0,
            ResourceUsage(),
            self.labels,
            1.0,
        )

    def snapshot(self, name: str) -> SnapshotInfo:
        self.mgr.snapshots.add(name)
        return SnapshotInfo(name, self.id, 5.0, "fake", 10)

    def destroy(self) -> None:
        self.mgr.check("destroy")
        self.destroyed = True
        self.mgr.destroyed.append(self.id)

    def close(self) -> None:
        pass


class FakeManager:
    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.destroyed: list[str] = []
        self.snapshots: set[str] = set()
        self.deleted_snapshots: list[str] = []
        self.execs: list[dict[str, Any]] = []
        self.fail: dict[str, BaseException] = {}
        self.output = b"hello\n"
        self.gate: threading.Event | None = None

    def check(self, op: str) -> None:
        if op in self.fail:
            raise self.fail[op]

    def create(self, **kwargs: Any) -> Any:
        if self.gate is not None:
            assert self.gate.wait(10)
        self.check("create")
        self.created.append(kwargs)
        box = FakeBox(self, kwargs)
        return _Handle(box)

    def templates(self) -> list[str]:
        return ["default", "python-data"]

    def delete_snapshot(self, name: str) -> None:
        if name not in self.snapshots:
            raise SnapshotNotFound(name)
        self.snapshots.discard(name)
        self.deleted_snapshots.append(name)


class _Handle:
    """A FakeBox with ``files`` as the sandbox has it (the dataclass field holds the bytes)."""

    def __init__(self, box: FakeBox) -> None:
        self._box = box
        self.files = box.files_api

    def __getattr__(self, name: str) -> Any:
        return getattr(self._box, name)


# -- helpers ---------------------------------------------------------------------------------------
@asynccontextmanager
async def session(srv: SandboxMcp, mode: str = "legacy") -> AsyncIterator[Callable[..., Any]]:
    async with Client(srv.server, mode=mode) as client:

        async def call(tool: str, /, **args: Any) -> CallToolResult:
            return await client.call_tool(tool, args)

        yield call


def text(r: CallToolResult) -> str:
    return "\n".join(c.text for c in r.content if c.type == "text")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def mgr() -> FakeManager:
    return FakeManager()


@pytest.fixture
def srv(mgr: FakeManager, request: pytest.FixtureRequest) -> Any:
    policy = getattr(request, "param", None)  # a DoorPolicy (indirect parametrization); None: the default
    options = McpOptions(max_sandboxes=2, max_output=8, base_snapshots=("shared_base",))
    server = SandboxMcp(mgr, options, policy)  # type: ignore[arg-type]
    yield server
    server.close(10)


# -- tools and schemas -----------------------------------------------------------------------------
def test_tools_are_listed_with_schemas(srv: SandboxMcp) -> None:
    async def main() -> None:
        async with Client(srv.server, mode="legacy") as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == TOOLS
            for tool in tools.values():
                assert tool.description and tool.output_schema, tool.name
            run_props = tools["run_command"].input_schema["properties"]
            assert {"sandbox_id", "command", "timeout", "cwd", "env", "stdin", "max_output"} <= set(run_props)
            create_props = tools["create_sandbox"].input_schema["properties"]
            assert {"cpus", "memory_mb", "disk_gb", "internet", "egress", "ttl_s", "from_snapshot"} <= set(
                create_props
            )
            assert (
                tools["read_file"].annotations is not None and tools["read_file"].annotations.read_only_hint
            )

    run(main())


def test_create_labels_ttl_and_owner(srv: SandboxMcp, mgr: FakeManager) -> None:
    async def main() -> None:
        async with session(srv) as call:
            r = await call("create_sandbox", memory_mb=512, labels={"agent": "a1"}, egress=["a.org"])
            assert not r.is_error, text(r)
            made = mgr.created[-1]
            assert made["labels"]["agent"] == "a1" and made["labels"]["mcp-server"] == srv.server_id
            session_key = made["labels"]["mcp-session"]
            assert session_key and session_key != srv.server_id
            assert made["ttl_s"] == McpOptions.default_ttl_s and made["detached"] is False
            assert made["egress"] == ["a.org"] and "net_mbps" not in made  # unset: the host's default
            assert r.structured_content is not None and r.structured_content["labels"] == made["labels"]
            r = await call("create_sandbox", ttl_s=McpOptions.max_ttl_s + 1)
            assert r.is_error and "invalid_argument" in text(r) and "ttl_s" in text(r)
            r = await call("create_sandbox", labels={"mcp-session": "someone-else"})
            assert r.is_error and "set by the MCP server" in text(r)
            assert len(mgr.created) == 1

    run(main())


def test_sandboxes_per_session_are_capped(srv: SandboxMcp, mgr: FakeManager) -> None:
    async def main() -> None:
        async with session(srv) as call:
            ids = []
            for _ in range(2):
                r = await call("create_sandbox")
                ids.append(r.structured_content["id"])  # type: ignore[index]
            r = await call("create_sandbox")
            assert r.is_error and "limit per session" in text(r)
            await call("destroy_sandbox", sandbox_id=ids[0])
            r = await call("create_sandbox")
            assert not r.is_error

    run(main())


@pytest.mark.parametrize("srv", [DoorPolicy(allow_root=True, door="sandbox-rt mcp")], indirect=True)
def test_root_on_request_reaches_create_and_run_command(srv: SandboxMcp, mgr: FakeManager) -> None:
    async def main() -> None:
        async with session(srv) as call:
            sid = (await call("create_sandbox", root=True)).structured_content["id"]
            assert mgr.created[-1]["root"] is True
            assert not (await call("run_command", sandbox_id=sid, command="id -u", user="root")).is_error
            assert mgr.execs[-1]["user"] == "root"
            assert not (await call("run_command", sandbox_id=sid, command="id -u")).is_error
            assert mgr.execs[-1]["user"] is None
            await call("create_sandbox")
            assert mgr.created[-1]["root"] is False

    run(main())


def test_run_command_caps_output_with_a_marker(srv: SandboxMcp, mgr: FakeManager) -> None:
    mgr.output = b"0123456789abcdef"

    async def main() -> None:
        async with session(srv) as call:
            sid = (await call("create_sandbox")).structured_content["id"]
            r = await call("run_command", sandbox_id=sid, command=["ls", "-l"], env={"A": "1"}, cwd="/tmp")
            assert not r.is_error
            assert r.structured_content == {
                "exit_code": 3,
                "stdout": "01234567",
                "stderr": "warn",
                "duration_s": 0.5,
                "truncated": True,
                "stdout_dropped": 8,
                "stderr_dropped": 0,
                "max_output": 8,
            }
            assert "exit code 3" in text(
                r
            ) and "stdout truncated: 8 more bytes dropped (max_output=8" in text(r)
            assert mgr.execs[-1]["command"] == ["ls", "-l"] and mgr.execs[-1]["env"] == {"A": "1"}
            r = await call("run_command", sandbox_id=sid, command="x", max_output=16)
            assert r.structured_content is not None and r.structured_content["stdout"] == "0123456789abcdef"
            r = await call(
                "run_command", sandbox_id=sid, command="x", max_output=McpOptions.max_output_limit + 1
            )
            assert r.is_error and "max_output" in text(r)

    run(main())


def test_command_timeout_is_an_error_with_the_output_so_far(srv: SandboxMcp, mgr: FakeManager) -> None:
    mgr.fail["exec"] = CommandTimeout("sleep 9", 2.0, b"partial output here", b"")

    async def main() -> None:
        async with session(srv) as call:
            sid = (await call("create_sandbox")).structured_content["id"]
            r = await call("run_command", sandbox_id=sid, command="sleep 9", timeout=2)
            assert r.is_error
            assert text(r).startswith("command_timeout (CommandTimeout): command 'sleep 9' timed out")
            assert "partial " in text(r) and "11 more bytes dropped" in text(r)
            mgr.fail["exec"] = CommandTimeout("sleep 9", 2.0, b"12345678", b"e")  # filled its cap exactly
            r = await call("run_command", sandbox_id=sid, command="sleep 9", timeout=2)
            assert "stdout may be truncated: it filled max_output=8" in text(
                r
            ) and "--- stderr ---\ne" in text(r)

    run(main())


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ConfigError("bad"), "invalid_argument"),
        (SandboxNotFound("sbx-0000000000"), "not_found"),
        (SnapshotNotFound("x1"), "snapshot_not_found"),
        (ExecError("c", 1, b"", b""), "command_failed"),
        (FileOperationError(errno.EACCES, "denied", "/x"), "file_error:EACCES"),
        (SandboxNotReady("slow"), "sandbox_not_ready"),
        (HostKeyMismatch("changed"), "host_key_mismatch"),
        (ConnectionLost("gone"), "connection_lost"),
        (PermissionDenied("VM.Clone"), "backend_permission_denied"),
        (FirewallDisabled("off"), "firewall_disabled"),
        (BackendError("lxc"), "backend_error"),
        (SandboxError("stopped"), "conflict"),
    ],
)
def test_errors_become_tool_errors(srv: SandboxMcp, mgr: FakeManager, exc: SandboxError, code: str) -> None:
    async def main() -> None:
        async with session(srv) as call:
            sid = (await call("create_sandbox")).structured_content["id"]
            mgr.fail["status"] = exc
            r = await call("sandbox_status", sandbox_id=sid)
            assert r.is_error and r.structured_content is None
            assert text(r) == f"{code} ({type(exc).__name__}): {exc}"

    run(main())


def test_a_crash_says_nothing_of_itself(srv: SandboxMcp, mgr: FakeManager) -> None:
    mgr.fail["read"] = RuntimeError("secret internals /root/key")

    async def main() -> None:
        async with session(srv) as call:
            sid = (await call("create_sandbox")).structured_content["id"]
            r = await call("read_file", sandbox_id=sid, path="/x")
            assert r.is_error and "internal_error" in text(r) and "secret" not in text(r)

    run(main())


def test_files(srv: SandboxMcp, mgr: FakeManager) -> None:
    async def main() -> None:
        async with session(srv) as call:
            sid = (await call("create_sandbox")).structured_content["id"]
            r = await call("write_file", sandbox_id=sid, path="/t/a.txt", content="héllo", mode="0600")
            assert r.structured_content == {
                "name": "a.txt",
                "path": "/t/a.txt",
                "type": "file",
                "size": 6,
                "mode": "0600",
                "mtime": 2.0,
                "symlink_target": None,
            }
            r = await call("read_file", sandbox_id=sid, path="/t/a.txt")
            assert r.structured_content is not None and r.structured_content["content"] == "héllo"
            await call("write_file", sandbox_id=sid, path="/t/b.bin", content="/wA=", encoding="base64")
            r = await call("read_file", sandbox_id=sid, path="/t/b.bin")
            assert r.structured_content is not None
            assert r.structured_content["binary"] is True and r.structured_content["content"] == "\ufffd\x00"
            r = await call("read_file", sandbox_id=sid, path="/t/b.bin", encoding="base64")
            assert r.structured_content is not None and r.structured_content["content"] == "/wA="
            r = await call("read_file", sandbox_id=sid, path="/t/a.txt", max_bytes=3)
            assert r.is_error and "file_error:EFBIG" in text(r)
            for bad in ({"content": "%%", "encoding": "base64"}, {"content": "x", "mode": "999"}):
                r = await call("write_file", sandbox_id=sid, path="/t/c", **bad)
                assert r.is_error and "invalid_argument" in text(r)
            r = await call("list_files", sandbox_id=sid, path="/t")
            assert r.structured_content is not None and len(r.structured_content["entries"]) == 2

    run(main())


# -- sessions --------------------------------------------------------------------------------------
def test_a_session_sees_only_its_own_sandboxes(srv: SandboxMcp, mgr: FakeManager) -> None:
    async def main() -> None:
        async with session(srv) as a, session(srv) as b:
            sid = (await a("create_sandbox")).structured_content["id"]
            for tool, args in (
                ("run_command", {"command": "id"}),
                ("read_file", {"path": "/etc/passwd"}),
                ("destroy_sandbox", {}),
                ("snapshot_sandbox", {"name": "steal"}),
            ):
                r = await b(tool, sandbox_id=sid, **args)
                assert r.is_error and text(r).startswith("not_found"), (tool, text(r))
            assert (await b("list_sandboxes")).structured_content == {"sandboxes": []}
            listed = (await a("list_sandboxes")).structured_content
            assert listed is not None and [s["id"] for s in listed["sandboxes"]] == [sid]
            assert mgr.execs == [] and mgr.destroyed == []

    run(main())


def test_snapshots_fork_only_within_the_session(srv: SandboxMcp, mgr: FakeManager) -> None:
    mgr.snapshots.add("shared_base")

    async def main() -> None:
        async with session(srv) as a, session(srv) as b:
            sid = (await a("create_sandbox")).structured_content["id"]
            assert not (await a("snapshot_sandbox", sandbox_id=sid, name="mine")).is_error
            r = await b("create_sandbox", from_snapshot="mine")
            assert r.is_error and text(r).startswith("snapshot_not_found")
            assert not (await b("create_sandbox", from_snapshot="shared_base")).is_error  # the operator's
            r = await a("create_sandbox", from_snapshot="mine")
            assert not r.is_error and mgr.created[-1]["from_snapshot"] == "mine"

    run(main())
    wait_for(lambda: "mine" in mgr.deleted_snapshots, "the session's snapshot to be deleted")
    assert "shared_base" not in mgr.deleted_snapshots


def test_session_end_destroys_its_sandboxes(srv: SandboxMcp, mgr: FakeManager) -> None:
    async def main() -> list[str]:
        async with session(srv) as call:
            ids = [(await call("create_sandbox")).structured_content["id"] for _ in range(2)]
            await call("destroy_sandbox", sandbox_id=ids[0])
        return ids

    ids = run(main())
    wait_for(lambda: sorted(mgr.destroyed) == sorted(ids), "the session's sandboxes to be destroyed")
    assert mgr.destroyed.count(ids[0]) == 1  # destroyed once, by the tool


def test_sessionless_calls_share_the_server_scope_until_it_stops(mgr: FakeManager) -> None:
    srv = SandboxMcp(mgr)  # type: ignore[arg-type]

    async def main() -> str:
        async with session(srv, mode="auto") as call:  # the 2026 protocol: a connection per request
            sid = (await call("create_sandbox")).structured_content["id"]
            assert not (await call("run_command", sandbox_id=sid, command="true")).is_error
        return str(sid)

    sid = run(main())
    assert mgr.created[-1]["labels"]["mcp-session"] == srv.server_id and mgr.destroyed == []
    srv.close(10)
    assert mgr.destroyed == [sid]


def test_a_sandbox_made_after_its_session_ended_is_destroyed(mgr: FakeManager) -> None:
    sessions = SessionSandboxes(mgr, max_per_session=4, keep_snapshots=False)  # type: ignore[arg-type]
    sessions.reserve("s1")
    sessions.end("s1")
    late = mgr.create()
    with pytest.raises(SandboxError, match="ended while the sandbox was made"):
        sessions.admit("s1", late)
    assert mgr.destroyed == [late.id]
    with pytest.raises(SandboxError, match="has ended"):
        sessions.reserve("s1")


def test_keep_snapshots(mgr: FakeManager) -> None:
    srv = SandboxMcp(mgr, McpOptions(keep_snapshots=True))  # type: ignore[arg-type]

    async def main() -> None:
        async with session(srv) as call:
            sid = (await call("create_sandbox")).structured_content["id"]
            await call("snapshot_sandbox", sandbox_id=sid, name="kept")

    run(main())
    srv.close(10)
    assert len(mgr.destroyed) == 1 and mgr.deleted_snapshots == [] and "kept" in mgr.snapshots


@pytest.mark.parametrize(
    "options",
    [
        {"default_ttl_s": 0},
        {"default_ttl_s": 100, "max_ttl_s": 50},
        {"max_output": 10, "max_output_limit": 5},
        {"max_sandboxes": True},
        {"session_idle_s": -1},
        {"base_snapshots": ("1bad",)},
    ],
)
def test_options_are_checked(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        McpOptions(**options)


# -- the bearer token (streamable HTTP) ------------------------------------------------------------
async def _plain_app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"in"})


TOKEN = "tok-" + secrets.token_urlsafe(24)


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ([], 401),
        ([("Authorization", f"Bearer {TOKEN}x")], 401),
        ([("Authorization", f"Basic {TOKEN}")], 401),
        ([("Authorization", "Bearer")], 401),
        ([("Authorization", f"Bearer {TOKEN}"), ("Authorization", f"Bearer {TOKEN}")], 401),
        ([("Authorization", f"Bearer {TOKEN}")], 200),
        ([("authorization", f"bearer {TOKEN}")], 200),
    ],
)
def test_bearer_token(headers: list[tuple[str, str]], status: int) -> None:
    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=BearerToken(_plain_app, TOKEN))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.post("/mcp", headers=httpx.Headers(headers), content=b"{}")

    r = run(main())
    assert r.status_code == status
    if status == 401:
        assert r.json()["error"]["code"] == "unauthorized" and r.headers["WWW-Authenticate"].startswith(
            "Bearer"
        )
        assert r.content != b"in"


def test_bearer_token_rules_are_the_servers() -> None:
    for bad in ("short", "has a space 1234567890", ""):
        with pytest.raises(ConfigError, match="token"):
            BearerToken(_plain_app, bad)


def test_cli_refuses_an_unsafe_token_file(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from sandbox_rt import cli

    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o644)
    assert cli.main(["mcp", "--transport", "http", "--port", "0", "--token-file", str(f)]) == 2
    err = capsys.readouterr().err
    assert "mode 0644" in err and TOKEN not in err
