"""The MCP server (``sandbox-rt mcp``): sandboxes as tools for any MCP client, on the official SDK.

Tools: ``create_sandbox``, ``run_command``, ``read_file``, ``write_file``, ``list_files``,
``set_internet``, ``set_egress``, ``snapshot_sandbox``, ``sandbox_status``, ``list_sandboxes``,
``destroy_sandbox``. Each is a thin translation onto :class:`~sandbox_rt.Manager` /
:class:`~sandbox_rt.Sandbox`; the one error tree becomes an MCP tool error (``isError``) in one place,
:func:`tool_error`. A session sees only the sandboxes it made; each carries the labels
``mcp-session=<session>`` and ``mcp-server=<server>`` and a TTL (``McpOptions.default_ttl_s``), and
goes when its session ends (:mod:`sandbox_rt.mcp.sessions`). Output handed to the model is
capped (``max_output`` bytes per stream, with a marker saying what was dropped); so are file reads.

Transports (stdio, streamable HTTP with a bearer token) are in :mod:`sandbox_rt.mcp.transport`.
"""

# no ``from __future__ import annotations``: the SDK reads the tools' signatures at registration, and
# their annotations name the server's options (descriptions with its limits)
import base64
import binascii
import contextlib
import dataclasses
import functools
import inspect
import logging
import re
import secrets
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, TypeVar, cast

import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ToolAnnotations
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from .. import __version__
from ..errors import ConfigError, SandboxError, SnapshotNotFound
from ..files import LIST_MAX_ENTRIES
from ..models import ExecResult, SnapshotInfo
from ..options import JSON_TYPES, door_options, named
from ..policy import DoorPolicy
from ..protocols import ManagerLike
from ..validation import MAX_TTL_S, check_snapshot_name
from ..web.limits import HTTP_LIMITS
from .answers import (
    CommandResult,
    Destroyed,
    EgressState,
    Entry,
    FileContent,
    FileList,
    InternetState,
    SandboxList,
    SandboxView,
    SnapshotView,
    brief,
    command_answer,
    entry,
    internal_error,
    ok,
    tool_error,
    view,
)
from .sessions import SERVER_LABEL, SESSION_LABEL, SessionSandboxes

__all__ = ["McpOptions", "SandboxMcp", "tool_error"]

log = logging.getLogger(__name__)
T = TypeVar("T")

INSTRUCTIONS = """\
Each sandbox is a fresh, isolated Linux box (Debian) that only you use: run commands, read and \
write files there, then destroy it. Start with create_sandbox and keep its id. Commands run as an \
unprivileged user (home /home/sandbox) in bash; the internet is off unless you turn it on \
(set_internet) or allow destinations (set_egress). Output is capped: raise max_output to see more. \
Sandboxes of this session are destroyed when it ends, or when their TTL runs out."""

_STATE_KEY = "sandbox_rt.mcp.session"
_MODE = re.compile(r"0?[0-7]{3,4}")


@dataclasses.dataclass(frozen=True)
class McpOptions:
    """What one MCP server allows its sessions (``sandbox-rt mcp`` sets them from its options)."""

    default_ttl_s: int = 3600  # a sandbox made through MCP lives at most this long unless asked
    max_ttl_s: int = 24 * 3600  # the most a client may ask for
    max_sandboxes: int = 8  # per session, at once
    max_output: int = 64 << 10  # bytes of each stream run_command returns unless asked
    max_output_limit: int = 4 << 20  # the most a client may ask for
    read_max_bytes: int = 1 << 20  # the largest file read_file returns unless asked
    read_max_limit: int = 16 << 20
    write_max_bytes: int = (HTTP_LIMITS.max_body_bytes // 4) * 3 // 2  # decoded; base64 fits a body
    list_max_entries: int = 1000
    keep_snapshots: bool = False  # keep a session's snapshots after it ends
    base_snapshots: tuple[str, ...] = ()  # snapshots every session may fork (the operator's)
    session_idle_s: float = 1800.0  # streamable HTTP: a session idle this long ends

    def __post_init__(self) -> None:
        whole = {
            "default_ttl_s": (1, MAX_TTL_S),
            "max_ttl_s": (1, MAX_TTL_S),
            "max_sandboxes": (1, 1000),
            "max_output": (1, 1 << 30),
            "max_output_limit": (1, 1 << 30),
            "read_max_bytes": (1, 1 << 30),
            "read_max_limit": (1, 1 << 30),
            "write_max_bytes": (1, 1 << 30),
            "list_max_entries": (1, LIST_MAX_ENTRIES),
        }
        for name, (lo, hi) in whole.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ConfigError(f"MCP option {name}={value!r} must be a whole number from {lo} to {hi}")
        for small, big in (
            ("default_ttl_s", "max_ttl_s"),
            ("max_output", "max_output_limit"),
            ("read_max_bytes", "read_max_limit"),
        ):
            if getattr(self, small) > getattr(self, big):
                raise ConfigError(f"MCP option {small} must not be larger than {big}")
        if not isinstance(self.session_idle_s, int | float) or not 0 < self.session_idle_s < 1e6:
            raise ConfigError(f"MCP option session_idle_s={self.session_idle_s!r} must be a positive number")
        for name in self.base_snapshots:
            check_snapshot_name(name)


# -- tool arguments --------------------------------------------------------------------------------
F = TypeVar("F", bound=Callable[..., Any])


def create_tool_signature(templates: Sequence[str], o: McpOptions, policy: DoorPolicy) -> Callable[[F], F]:
    """Give ``create_sandbox(ctx, **given)`` the parameters the SDK publishes as its input schema:
    the create options an MCP session may set (sandbox_rt.options), each typed by its JSON kind and
    described for this server (its templates, its TTL bound, what its policy allows). Their values
    are checked by the runtime, as every door's (ConfigError: a tool error ``invalid_argument``)."""
    facts = {"templates": ", ".join(templates), "max_ttl_s": o.max_ttl_s}
    ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Context[Any, Any])
    params = [ctx]
    for opt in door_options("mcp"):
        kind = JSON_TYPES[opt.kind]  # what the SDK checks an argument against
        text = policy.describe(opt, (opt.mcp or opt.help).format(**facts))
        annotation = cast(Any, Annotated)[kind | None if opt.nullable else kind, Field(description=text)]
        default = opt.default_at("mcp")
        params.append(inspect.Parameter(opt.name, ctx.kind, default=default, annotation=annotation))

    def with_signature(fn: F) -> F:
        returns = inspect.signature(fn).return_annotation
        fn.__signature__ = inspect.Signature(params, return_annotation=returns)  # type: ignore[attr-defined]
        fn.__annotations__ = {p.name: p.annotation for p in params} | {"return": returns}
        return fn

    return with_signature


SandboxId = Annotated[str, Field(description="the sandbox's id, as create_sandbox returned it (sbx-...)")]
Path = Annotated[str, Field(description="an absolute path in the sandbox, e.g. /home/sandbox/main.py")]
Encoding = Literal["text", "base64"]


class SandboxMcp:
    """The MCP server over one manager. :meth:`close` destroys what its sessions still hold.
    ``policy``: what sessions may ask of create_sandbox (default: no root, caps at most the host's
    defaults; ``sandbox-rt mcp --allow-root`` / ``--allow-uncapped``)."""

    def __init__(
        self, manager: ManagerLike, options: McpOptions | None = None, policy: DoorPolicy | None = None
    ) -> None:
        self.options = options if options is not None else McpOptions()
        self.policy = policy if policy is not None else DoorPolicy.of(manager, door="sandbox-rt mcp")
        self.manager = manager
        self.server_id = secrets.token_hex(5)
        self.sessions = SessionSandboxes(
            manager, max_per_session=self.options.max_sandboxes, keep_snapshots=self.options.keep_snapshots
        )
        self.server: MCPServer[Any] = MCPServer(
            "sandbox-rt", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING"
        )
        self._register()

    def close(self, timeout: float | None = None) -> None:
        """End every session: their sandboxes (and snapshots) are destroyed before this returns."""
        self.sessions.close(timeout)

    # -- plumbing --------------------------------------------------------------------------------
    def session_key(self, ctx: Context[Any, Any]) -> str:
        """The scope of a tool call: its handshake connection (a session, whose end is hooked on the
        SDK's per-connection exit stack), else, for the sessionless 2026 protocol, the server."""
        # the SDK (2.3) keeps a request's connection private; without it, the server's scope
        connection = getattr(ctx.request_context.session, "_connection", None)
        if connection is None or getattr(connection, "protocol_version", None) in MODERN_PROTOCOL_VERSIONS:
            return self.server_id
        key = connection.state.get(_STATE_KEY)
        if not isinstance(key, str):
            key = str(connection.session_id or secrets.token_hex(8))
            connection.state[_STATE_KEY] = key
            connection.exit_stack.callback(self.sessions.end, key)
        return key

    async def _run(
        self,
        ctx: Context[Any, Any],
        work: Callable[[str], T],
        answer: Callable[[T], CallToolResult],
        cap: int,
    ) -> CallToolResult:
        """Run ``work(session)`` on a worker thread; its value through ``answer``, its error through
        :func:`tool_error`."""
        key = self.session_key(ctx)
        try:
            value = await anyio.to_thread.run_sync(functools.partial(work, key))
        except SandboxError as exc:
            log.info("MCP tool error: %s: %s", type(exc).__name__, exc)
            return tool_error(exc, cap)
        except Exception:
            log.exception("MCP tool crashed")
            return internal_error()
        return answer(value)

    def _cap(self, value: int | None, default: int, limit: int, name: str) -> int:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise ConfigError(f"{name}={value!r} must be a whole number from 1 to {limit}")
        return value

    # -- work (on worker threads) ----------------------------------------------------------------
    def _create(self, key: str, given: dict[str, Any]) -> SandboxView:
        o = self.options
        # root and caps: what the operator allows this server's clients; detached: never (the session's)
        kwargs = self.policy.admit(given, "mcp")
        labels = dict(kwargs.pop("labels", None) or {})
        for reserved in (SESSION_LABEL, SERVER_LABEL):
            if reserved in labels:
                raise ConfigError(f"label {reserved!r} is set by the MCP server")
        kwargs["labels"] = {**labels, SESSION_LABEL: key, SERVER_LABEL: self.server_id}
        kwargs["ttl_s"] = self._cap(kwargs.get("ttl_s"), o.default_ttl_s, o.max_ttl_s, "ttl_s")
        snapshot = named(kwargs, "snapshot_name")  # the one it forks: the operator's or this session's
        if isinstance(snapshot, str) and not (
            snapshot in o.base_snapshots or self.sessions.has_snapshot(key, snapshot)
        ):
            raise SnapshotNotFound(snapshot)  # another session's snapshots are not this one's to fork
        self.sessions.reserve(key)
        try:
            sandbox = self.manager.create(**kwargs)
        except BaseException:
            self.sessions.release(key)
            raise
        self.sessions.admit(key, sandbox)
        try:
            return view(sandbox.status())
        except BaseException:  # all or nothing: the caller never learnt the id
            with contextlib.suppress(SandboxError):
                self.sessions.forget(key, sandbox.id).destroy()
            raise

    def _read(self, key: str, sandbox_id: str, path: str, encoding: Encoding, cap: int) -> FileContent:
        data = self.sessions.get(key, sandbox_id).read_file(path, max_bytes=cap)
        if encoding == "base64":
            content = base64.b64encode(data).decode("ascii")
            return FileContent(path=path, size=len(data), encoding="base64", content=content, binary=False)
        try:
            text, binary = data.decode("utf-8"), False
        except UnicodeDecodeError:
            text, binary = data.decode("utf-8", "replace"), True
        return FileContent(path=path, size=len(data), encoding="text", content=text, binary=binary)

    def _write(
        self, key: str, sandbox_id: str, path: str, content: str, encoding: Encoding, mode: str | None
    ) -> Entry:
        if encoding == "base64":
            try:
                data = base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ConfigError(f"content is not valid base64: {exc}") from exc
        else:
            data = content.encode("utf-8", "surrogatepass")
        if len(data) > self.options.write_max_bytes:
            raise ConfigError(f"content of {len(data)} bytes is larger than {self.options.write_max_bytes}")
        bits: int | None = None
        if mode is not None:
            if not _MODE.fullmatch(mode):
                raise ConfigError(f"mode={mode!r} must be octal permissions, e.g. 644 or 0755")
            bits = int(mode, 8)
        return entry(self.sessions.get(key, sandbox_id).files.write(path, data, mode=bits))

    def _snapshot(self, key: str, sandbox_id: str, name: str) -> SnapshotView:
        info: SnapshotInfo = self.sessions.get(key, sandbox_id).snapshot(name)
        self.sessions.add_snapshot(key, info.name)
        return SnapshotView(**dataclasses.asdict(info))

    def _destroy(self, key: str, sandbox_id: str) -> Destroyed:
        self.sessions.forget(key, sandbox_id).destroy()
        return Destroyed(id=sandbox_id, destroyed=True)

    # -- the tools -------------------------------------------------------------------------------
    def _register(self) -> None:
        tool = self.server.tool
        o = self.options
        sessions = self.sessions

        @tool(
            name="create_sandbox",
            description=(
                "Create a fresh isolated Linux sandbox and return its id (and IP, limits, expiry). "
                f"It is destroyed when this session ends or after ttl_s seconds (default {o.default_ttl_s}). "
                "The internet is off unless internet=true; egress allows only the listed domains, "
                "addresses or networks."
            ),
            annotations=ToolAnnotations(destructive_hint=False, open_world_hint=False),
        )
        @create_tool_signature(self.manager.templates(), o, self.policy)
        async def create_sandbox(
            ctx: Context[Any, Any], **given: Any
        ) -> Annotated[CallToolResult, SandboxView]:
            return await self._run(ctx, lambda key: self._create(key, given), ok, o.max_output)

        @tool(
            name="run_command",
            description=(
                "Run a command in a sandbox and wait for it: a string runs in bash, a list is an exact "
                "argv. Returns the exit code, stdout and stderr (each capped at max_output bytes, "
                f"default {o.max_output}; what is cut is said). A non-zero exit is a result, not an "
                "error; a timeout kills the command's processes and is an error with the output so far."
            ),
            annotations=ToolAnnotations(destructive_hint=True, open_world_hint=False),
        )
        async def run_command(
            ctx: Context[Any, Any],
            sandbox_id: SandboxId,
            command: Annotated[str | list[str], Field(description="bash command line, or an argv list")],
            timeout: Annotated[float | None, Field(gt=0, description="seconds; default: the host's")] = None,
            cwd: Annotated[str | None, Field(description="working directory (absolute)")] = None,
            env: Annotated[dict[str, str] | None, Field(description="extra environment variables")] = None,
            stdin: Annotated[str | None, Field(description="text fed to the command's stdin")] = None,
            max_output: Annotated[
                int | None, Field(description=f"bytes kept of each stream, at most {o.max_output_limit}")
            ] = None,
            user: Annotated[
                str | None, Field(description="root, in a sandbox made with root=true (default: the user)")
            ] = None,
        ) -> Annotated[CallToolResult, CommandResult]:
            try:
                cap = self._cap(max_output, o.max_output, o.max_output_limit, "max_output")
            except ConfigError as exc:
                return tool_error(exc)

            def work(key: str) -> ExecResult:
                sandbox = sessions.get(key, sandbox_id)
                return sandbox.exec(
                    command, timeout=timeout, cwd=cwd, env=env, stdin=stdin, max_output=cap, user=user
                )

            return await self._run(ctx, work, lambda r: command_answer(r, cap), cap)

        @tool(
            name="read_file",
            description=(
                "Read a file of a sandbox. encoding=text (default) decodes UTF-8; base64 gives the exact "
                f"bytes. Files larger than max_bytes (default {o.read_max_bytes}) are refused."
            ),
            annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
        )
        async def read_file(
            ctx: Context[Any, Any],
            sandbox_id: SandboxId,
            path: Path,
            encoding: Encoding = "text",
            max_bytes: Annotated[
                int | None, Field(description=f"the largest file returned, at most {o.read_max_limit}")
            ] = None,
        ) -> Annotated[CallToolResult, FileContent]:
            try:
                cap = self._cap(max_bytes, o.read_max_bytes, o.read_max_limit, "max_bytes")
            except ConfigError as exc:
                return tool_error(exc)
            return await self._run(
                ctx, lambda key: self._read(key, sandbox_id, path, encoding, cap), ok, o.max_output
            )

        @tool(
            name="write_file",
            description=(
                "Write a file in a sandbox (parent directories are made; an existing file is replaced). "
                "content is text, or base64 with encoding=base64; mode is octal, e.g. 755."
            ),
            annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True, open_world_hint=False),
        )
        async def write_file(
            ctx: Context[Any, Any],
            sandbox_id: SandboxId,
            path: Path,
            content: Annotated[str, Field(description="the file's content")],
            encoding: Encoding = "text",
            mode: Annotated[str | None, Field(description="permissions in octal, e.g. 644 or 0755")] = None,
        ) -> Annotated[CallToolResult, Entry]:
            return await self._run(
                ctx, lambda key: self._write(key, sandbox_id, path, content, encoding, mode), ok, o.max_output
            )

        @tool(
            name="list_files",
            description=(
                "List a directory of a sandbox (name, path, type, size, mode, mtime), depth levels deep "
                f"(default 1), at most max_entries entries (default {o.list_max_entries})."
            ),
            annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
        )
        async def list_files(
            ctx: Context[Any, Any],
            sandbox_id: SandboxId,
            path: Path,
            depth: Annotated[int, Field(ge=1, le=16, description="directory levels")] = 1,
            max_entries: Annotated[int | None, Field(description="entries at most")] = None,
        ) -> Annotated[CallToolResult, FileList]:
            try:
                cap = self._cap(max_entries, o.list_max_entries, LIST_MAX_ENTRIES, "max_entries")
            except ConfigError as exc:
                return tool_error(exc)

            def work(key: str) -> FileList:
                entries = sessions.get(key, sandbox_id).files.list(path, depth, max_entries=cap)
                return FileList(path=path, entries=[entry(e) for e in entries])

            return await self._run(ctx, work, ok, o.max_output)

        @tool(
            name="set_internet",
            description="Turn a sandbox's internet access (HTTP/HTTPS) on or off.",
            annotations=ToolAnnotations(idempotent_hint=True, open_world_hint=True),
        )
        async def set_internet(
            ctx: Context[Any, Any], sandbox_id: SandboxId, enabled: bool
        ) -> Annotated[CallToolResult, InternetState]:
            def work(key: str) -> InternetState:
                sessions.get(key, sandbox_id).set_internet(enabled)
                return InternetState(id=sandbox_id, internet=enabled)

            return await self._run(ctx, work, ok, o.max_output)

        @tool(
            name="set_egress",
            description=(
                "Replace what a sandbox may reach while its internet is off: domain names (with their "
                "subdomains), IPv4 addresses and networks (TCP 80/443). [] closes it again."
            ),
            annotations=ToolAnnotations(idempotent_hint=True, open_world_hint=True),
        )
        async def set_egress(
            ctx: Context[Any, Any],
            sandbox_id: SandboxId,
            egress: Annotated[list[str], Field(description='e.g. ["pypi.org", "192.0.2.0/24"]')],
        ) -> Annotated[CallToolResult, EgressState]:
            def work(key: str) -> EgressState:
                entries = sessions.get(key, sandbox_id).set_egress(egress)
                return EgressState(id=sandbox_id, egress=list(entries))

            return await self._run(ctx, work, ok, o.max_output)

        @tool(
            name="snapshot_sandbox",
            description=(
                "Save a sandbox's files as a named snapshot; create_sandbox(from_snapshot=name) forks "
                "new sandboxes from it. Names: a letter, then 1-39 letters, digits, _ or -."
            ),
            annotations=ToolAnnotations(destructive_hint=False, open_world_hint=False),
        )
        async def snapshot_sandbox(
            ctx: Context[Any, Any],
            sandbox_id: SandboxId,
            name: Annotated[str, Field(description="snapshot name")],
        ) -> Annotated[CallToolResult, SnapshotView]:
            return await self._run(ctx, lambda key: self._snapshot(key, sandbox_id, name), ok, o.max_output)

        @tool(
            name="sandbox_status",
            description="A sandbox's state, limits, IP, internet/egress, labels and expiry.",
            annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
        )
        async def sandbox_status(
            ctx: Context[Any, Any], sandbox_id: SandboxId
        ) -> Annotated[CallToolResult, SandboxView]:
            def work(key: str) -> SandboxView:
                return view(sessions.get(key, sandbox_id).status())

            return await self._run(ctx, work, ok, o.max_output)

        @tool(
            name="list_sandboxes",
            description="The sandboxes this session made and has not destroyed.",
            annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
        )
        async def list_sandboxes(ctx: Context[Any, Any]) -> Annotated[CallToolResult, SandboxList]:
            def work(key: str) -> SandboxList:
                items = [brief(s) for s in sessions.listing(key)]
                return SandboxList(sandboxes=sorted(items, key=lambda b: b.id))

            return await self._run(ctx, work, ok, o.max_output)

        @tool(
            name="destroy_sandbox",
            description="Destroy a sandbox and everything in it.",
            annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False, open_world_hint=False),
        )
        async def destroy_sandbox(
            ctx: Context[Any, Any], sandbox_id: SandboxId
        ) -> Annotated[CallToolResult, Destroyed]:
            return await self._run(ctx, lambda key: self._destroy(key, sandbox_id), ok, o.max_output)
