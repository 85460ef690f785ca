"""The HTTP control API (``sandbox-rt serve``): create, list, status, exec (with SSE streaming),
files, internet and destroy over JSON, for callers that are not Python.

Stdlib only (``http.server.ThreadingHTTPServer``). Bound to loopback by default; every route but
``/healthz`` and ``/openapi.json`` needs ``Authorization: Bearer <token>``. The server keeps one
attached :class:`~sandbox_rt.Sandbox` per id, so consecutive execs reuse its SSH transport.
What a client may cost (head and body sizes, connections, timeouts) is a
:class:`~sandbox_rt.limits.HttpLimits`: a request without a valid token never makes the server read
more than a small head and a few KiB of body, nor hold a connection past the head deadline.
The routes, bodies and errors are documented in ``docs/http-api.md`` and served as an OpenAPI 3.1
document (:mod:`sandbox_rt.http_openapi`).

Usage::

    serve(sandbox_rt.Manager.from_env(), token=load_token("/etc/sandbox_rt/api.token"))  # blocks
    with ApiServer(manager, token=token, port=0) as server:  # a thread, a free port
        requests.get(server.url + "/healthz")
"""

from __future__ import annotations

import base64
import binascii
import builtins
import codecs
import contextlib
import dataclasses
import errno
import hmac
import http.client
import http.server
import io
import ipaddress
import json
import logging
import os
import re
import signal
import socket
import socketserver
import stat
import threading
import time
import types
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from . import __version__
from .errors import (
    BackendError,
    CommandTimeout,
    ConfigError,
    ConnectionLost,
    FileOperationError,
    PermissionDenied,
    SandboxError,
    SandboxNotFound,
    SandboxNotReady,
    SnapshotNotFound,
)
from .http_openapi import openapi_document
from .limits import HTTP_LIMITS, HttpLimits
from .models import (
    DEFAULT_CPUS,
    DEFAULT_DISK_GB,
    DEFAULT_MEMORY_MB,
    DEFAULT_PIDS_MAX,
    EntryInfo,
    ExecResult,
    OutputChunk,
    SandboxRecord,
    SandboxStatus,
    SnapshotInfo,
)
from .validation import check_sandbox_id, check_snapshot_name

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

    from .manager import Manager
    from .sandbox import ExecStream

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_PORT",
    "ROUTES",
    "TOKEN_ENV",
    "ApiServer",
    "HttpLimits",
    "ManagerLike",
    "SandboxLike",
    "load_token",
    "serve",
]

log = logging.getLogger(__name__)

TOKEN_ENV = "SANDBOX_RT_API_TOKEN"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787
DEFAULT_MAX_BODY_BYTES = HTTP_LIMITS.max_body_bytes  # the limits themselves live in sandbox_rt.limits
MIN_TOKEN_LENGTH = 16
TOKEN_FILE_MAX_BYTES = 4096

# every pattern here is used with fullmatch: "$" alone would accept a trailing newline
_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces: safe in a header
_CONTENT_LENGTH = re.compile(r"[0-9]{1,18}")  # ASCII digits only (str.isdigit also takes "²")


# -- what the server needs from the runtime (sandbox_rt.Manager / Sandbox fit; tests use fakes) ----
class ExecStreamLike(Protocol):
    @property
    def result(self) -> ExecResult | None: ...

    def __iter__(self) -> Iterator[OutputChunk]: ...


class FilesLike(Protocol):
    """What the API uses of ``sb.files`` (sandbox_rt/files.py)."""

    def list(self, path: str, depth: int = 1) -> builtins.list[EntryInfo]: ...

    def stat(self, path: str, *, follow_symlinks: bool = True) -> EntryInfo: ...

    def remove(self, path: str, *, recursive: bool = False) -> None: ...

    def mkdir(self, path: str, *, parents: bool = True, mode: int = 0o755) -> bool: ...

    def rename(self, src: str, dst: str) -> EntryInfo: ...


class SandboxLike(Protocol):
    @property
    def id(self) -> str: ...

    def exec(
        self,
        command: str | builtins.list[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        user: str | None = None,
    ) -> ExecResult: ...

    def exec_stream(
        self,
        command: str | builtins.list[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        user: str | None = None,
    ) -> ExecStreamLike: ...

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None: ...

    def read_file(self, path: str) -> bytes: ...

    def set_internet(self, enabled: bool) -> None: ...

    def set_egress(self, egress: Sequence[str]) -> tuple[str, ...]: ...

    def extend(self, ttl_s: int) -> None: ...

    @property
    def files(self) -> FilesLike: ...

    def status(self) -> SandboxStatus: ...

    def is_connected(self) -> bool: ...

    def close(self) -> None: ...


class ManagerLike(Protocol):
    def create(
        self,
        *,
        hostname: str | None = None,
        cpus: float = DEFAULT_CPUS,
        memory_mb: int = DEFAULT_MEMORY_MB,
        disk_gb: int = DEFAULT_DISK_GB,
        pids_max: int = DEFAULT_PIDS_MAX,
        internet: bool = False,
        labels: Mapping[str, str] | None = None,
        ttl_s: int | None = None,
        detached: bool = False,
        egress: Sequence[str] | None = None,
        net_mbps: int | None = None,
        disk_mbps: int | None = None,
        disk_iops: int | None = None,
        root: bool = False,
        template: str | None = None,
        from_snapshot: str | None = None,
    ) -> SandboxLike: ...

    def templates(self) -> builtins.list[str]: ...

    def attach(self, sandbox_id: str) -> SandboxLike: ...

    def snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo: ...

    def list_snapshots(self) -> builtins.list[SnapshotInfo]: ...

    def delete_snapshot(self, name: str) -> None: ...

    def destroy(self, sandbox_id: str) -> None: ...

    def list(self, labels: Mapping[str, str] | None = None) -> builtins.list[SandboxRecord]: ...


if TYPE_CHECKING:  # mypy proves the real classes fit the protocols

    def _manager_fits(m: Manager) -> ManagerLike:
        return m

    def _stream_fits(s: ExecStream) -> ExecStreamLike:
        return s


# -- the token -------------------------------------------------------------------------------------
def _check_token(token: str, source: str) -> str:
    if not isinstance(token, str) or not token:
        raise ConfigError(f"the API token from {source} is empty")
    if not _TOKEN_CHARS.fullmatch(token):
        raise ConfigError(f"the API token from {source} must be printable ASCII without spaces")
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(
            f"the API token from {source} is shorter than {MIN_TOKEN_LENGTH} characters "
            "(make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token


def load_token(token_file: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> str:
    """The bearer token: the first line of ``token_file`` if given, else ``$SANDBOX_RT_API_TOKEN``.

    ConfigError if there is none, if it is shorter than 16 characters, or if the file is not a
    regular file of mode 0600 (or stricter) owned by root or by the user running the server. The
    checks are made on the file that was opened. The token is never logged or printed.
    """
    if token_file is not None:
        path = Path(token_file)
        text = _read_token_file(path)
        lines = text.strip().splitlines()
        return _check_token(lines[0].strip() if lines else "", f"token file {path}")
    value = (os.environ if env is None else env).get(TOKEN_ENV)
    if value is None:
        raise ConfigError(f"no API token: pass --token-file FILE or set {TOKEN_ENV}")
    return _check_token(value.strip(), TOKEN_ENV)


def _read_token_file(path: Path) -> str:
    try:  # O_NONBLOCK: a FIFO put in its place does not hang the start
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"cannot read token file {path}: {exc.strerror or exc}") from exc
    try:  # every check is made on the file that was opened, not on the name
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"token file {path} is not a regular file")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise ConfigError(
                f"token file {path} has mode {mode:04o}: other users than its owner may read or change "
                f"it (chmod 600 {path})"
            )
        uid = os.geteuid()
        if st.st_uid not in (0, uid):
            raise ConfigError(
                f"token file {path} is owned by uid {st.st_uid}, not by root or the user running the "
                f"server (uid {uid}): chown it"
            )
        try:
            data = os.read(fd, TOKEN_FILE_MAX_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"cannot read token file {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(data) > TOKEN_FILE_MAX_BYTES:
        raise ConfigError(f"token file {path} is larger than {TOKEN_FILE_MAX_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"token file {path} is not UTF-8 text") from exc


# -- errors ----------------------------------------------------------------------------------------
class HttpError(Exception):
    """An error answered with ``status`` and the JSON body ``{"error": {"code", "message", ...}}``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})
        self.close = close  # the request body was not read: the connection cannot be reused

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.extra}}


_FILE_ERRNO: dict[int, tuple[int, str]] = {
    errno.ENOENT: (404, "file_not_found"),
    errno.EACCES: (403, "file_permission_denied"),
    errno.EPERM: (403, "file_permission_denied"),
    errno.EISDIR: (409, "file_conflict"),
    errno.ENOTDIR: (409, "file_conflict"),
    errno.EEXIST: (409, "file_conflict"),
    errno.ENOSPC: (507, "insufficient_storage"),
    errno.EDQUOT: (507, "insufficient_storage"),
    errno.EFBIG: (413, "file_too_large"),
    errno.EINVAL: (409, "file_conflict"),  # not a regular file (a device, FIFO or socket)
    errno.ENOTEMPTY: (409, "file_conflict"),  # a directory removed without recursive
    errno.E2BIG: (413, "too_many_entries"),  # a listing past its bound
}


def error_for(exc: SandboxError, encoding: str = "utf-8") -> HttpError:
    """The HTTP answer for a runtime error (see the table in docs/http-api.md)."""
    message = str(exc)
    extra: dict[str, Any] = {"type": type(exc).__name__}
    if isinstance(exc, ConfigError):
        return HttpError(400, "invalid_argument", message, extra=extra)
    if isinstance(exc, SandboxNotFound | SnapshotNotFound):
        return HttpError(404, "not_found", message, extra=extra)
    if isinstance(exc, CommandTimeout):
        # 504, not 408: clients and proxies may silently retry a 408, which would run the command again
        extra.update(
            timeout_s=exc.timeout,
            encoding=encoding,
            stdout=_encode(exc.stdout, encoding),
            stderr=_encode(exc.stderr, encoding),
        )
        return HttpError(504, "command_timeout", message, extra=extra)
    if isinstance(exc, FileOperationError):
        status, code = _FILE_ERRNO.get(exc.errno or 0, (500, "file_error"))
        if exc.filename is not None:
            extra["path"] = exc.filename
        return HttpError(status, code, message, extra=extra)
    if isinstance(exc, SandboxNotReady):
        return HttpError(503, "sandbox_not_ready", message, extra=extra)
    if isinstance(exc, ConnectionLost):
        return HttpError(502, "connection_lost", message, extra=extra)
    if isinstance(exc, PermissionDenied):  # the engine refused *our* credentials: not the caller's fault
        return HttpError(502, "backend_permission_denied", message, extra=extra)
    if isinstance(exc, BackendError):
        return HttpError(502, "backend_error", message, extra=extra)
    # plain SandboxError: e.g. "sandbox ... is stopped, not running"
    return HttpError(409, "conflict", message, extra=extra)


# -- request validation ------------------------------------------------------------------------------
_KINDS: dict[str, str] = {
    "string": "a string",
    "number": "a number",
    "integer": "a whole number",
    "boolean": "true or false",
    "string_map": "an object whose values are strings",
    "command": "a non-empty string or a non-empty array of strings",
    "string_list": "an array of strings",
}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, builtins.list):
        return "array"
    return "object"


def _is(kind: str, value: Any) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "integer":
        return _is("number", value) and float(value).is_integer()
    if kind == "string_map":
        return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
    if kind == "string_list":
        return isinstance(value, builtins.list) and all(isinstance(w, str) for w in value)
    if kind == "command":
        if isinstance(value, str):
            return bool(value.strip())
        return isinstance(value, builtins.list) and bool(value) and all(isinstance(w, str) for w in value)
    raise AssertionError(kind)


def _check_body(body: Mapping[str, Any], fields: Mapping[str, tuple[str, bool]], what: str) -> None:
    """``fields``: name -> (kind, nullable). Unknown fields and wrong types are 400s naming the field."""
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise ConfigError(f"unknown field(s) in the {what} body: {', '.join(unknown)}")
    for name, value in body.items():
        kind, nullable = fields[name]
        if value is None and nullable:
            continue
        if not _is(kind, value):
            raise ConfigError(f"field {name!r} must be {_KINDS[kind]}, not {_json_type(value)} {value!r:.60}")


CREATE_FIELDS: dict[str, tuple[str, bool]] = {
    "hostname": ("string", True),
    "cpus": ("number", False),
    "memory_mb": ("integer", False),
    "disk_gb": ("integer", False),
    "pids_max": ("integer", False),
    "internet": ("boolean", False),
    "labels": ("string_map", True),
    "ttl_s": ("integer", True),
    "detached": ("boolean", False),
    "egress": ("string_list", True),
    "from_snapshot": ("string", True),
    "net_mbps": ("integer", True),
    "disk_mbps": ("integer", True),
    "disk_iops": ("integer", True),
    "root": ("boolean", False),
    "template": ("string", True),
}
EXEC_FIELDS: dict[str, tuple[str, bool]] = {
    "command": ("command", False),
    "timeout": ("number", True),
    "cwd": ("string", True),
    "user": ("string", True),
    "env": ("string_map", True),
    "stdin": ("string", True),
    "stdin_b64": ("string", True),
    "encoding": ("string", False),
    "stream": ("boolean", False),
    "max_output": ("integer", True),
}
INTERNET_FIELDS: dict[str, tuple[str, bool]] = {"enabled": ("boolean", False)}
EGRESS_FIELDS: dict[str, tuple[str, bool]] = {"egress": ("string_list", False)}
SNAPSHOT_FIELDS: dict[str, tuple[str, bool]] = {"name": ("string", False)}
EXTEND_FIELDS: dict[str, tuple[str, bool]] = {"ttl_s": ("integer", False)}
MKDIR_FIELDS: dict[str, tuple[str, bool]] = {"path": ("string", False), "parents": ("boolean", False)}
RENAME_FIELDS: dict[str, tuple[str, bool]] = {"src": ("string", False), "dst": ("string", False)}
ENCODINGS = ("utf-8", "base64")


def _encode(data: bytes, encoding: str) -> str:
    return base64.b64encode(data).decode("ascii") if encoding == "base64" else data.decode("utf-8", "replace")


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def record_json(r: SandboxRecord) -> dict[str, Any]:
    """A list entry: what the backend knows without connecting (no host key, no live state)."""
    return {
        "id": r.id,
        "hostname": r.hostname,
        "ip": r.ip,
        "backend": r.backend,
        "created_at": r.created_at,
        "expires_at": r.expires_at,
        "labels": dict(r.spec.labels),
        "cpus": r.spec.cpus,
        "memory_mb": r.spec.memory_mb,
        "disk_gb": r.spec.disk_gb,
        "pids_max": r.spec.pids_max,
        "net_mbps": r.spec.net_mbps,
        "disk_mbps": r.spec.disk_mbps,
        "disk_iops": r.spec.disk_iops,
        "root": r.spec.root,
        "template": r.spec.template,
    }


def status_json(s: SandboxStatus) -> dict[str, Any]:
    return dataclasses.asdict(s)


# -- the attached-sandbox cache ----------------------------------------------------------------------
class SandboxCache:
    """One attached sandbox per id, shared by all requests (one SSH transport, channels per exec)."""

    def __init__(self, manager: ManagerLike) -> None:
        self._manager = manager
        self._lock = threading.Lock()
        self._items: dict[str, SandboxLike] = {}
        self._attaching: dict[str, threading.Lock] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def put(self, sb: SandboxLike) -> None:
        with self._lock:
            old = self._items.get(sb.id)
            self._items[sb.id] = sb
        if old is not None and old is not sb:
            _quiet_close(old)

    def get(self, sandbox_id: str) -> SandboxLike:
        with self._lock:
            sb = self._items.get(sandbox_id)
            if sb is not None and sb.is_connected():
                return sb
            gate = self._attaching.setdefault(sandbox_id, threading.Lock())
        with gate:  # one attach per id at a time; the others wait and share its result
            with self._lock:
                sb = self._items.get(sandbox_id)
                if sb is not None and sb.is_connected():
                    return sb
                stale = self._items.pop(sandbox_id, None)
            if stale is not None:
                _quiet_close(stale)
            try:
                sb = self._manager.attach(sandbox_id)
            finally:
                with self._lock:
                    self._attaching.pop(sandbox_id, None)
            self.put(sb)
            return sb

    def drop(self, sandbox_id: str) -> None:
        """Forget (and disconnect from) a sandbox; it keeps running."""
        with self._lock:
            sb = self._items.pop(sandbox_id, None)
        if sb is not None:
            _quiet_close(sb)

    def close_all(self) -> None:
        with self._lock:
            items = builtins.list(self._items.values())
            self._items.clear()
        for sb in items:
            _quiet_close(sb)


def _quiet_close(sb: SandboxLike) -> None:
    try:
        sb.close()
    except Exception:  # closing a dead connection must not fail a request
        log.debug("closing the connection to %s failed", sb.id, exc_info=True)


# -- routing -----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Route:
    method: str
    template: str  # OpenAPI path template, e.g. /v1/sandboxes/{id}
    handler: str  # _Handler method name
    auth: bool = True

    @property
    def pattern(self) -> re.Pattern[str]:
        """The template as a regex, for ``fullmatch`` (the whole path, nothing before or after)."""
        return re.compile(re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(self.template)))


ROUTES: tuple[Route, ...] = (
    Route("GET", "/healthz", "health", auth=False),
    Route("GET", "/openapi.json", "openapi", auth=False),
    Route("GET", "/v1/templates", "templates"),
    Route("POST", "/v1/sandboxes", "create"),
    Route("GET", "/v1/sandboxes", "list_sandboxes"),
    Route("GET", "/v1/sandboxes/{id}", "get_status"),
    Route("DELETE", "/v1/sandboxes/{id}", "delete"),
    Route("POST", "/v1/sandboxes/{id}/exec", "exec"),
    Route("GET", "/v1/sandboxes/{id}/files", "read_file"),
    Route("PUT", "/v1/sandboxes/{id}/files", "write_file"),
    Route("DELETE", "/v1/sandboxes/{id}/files", "remove_file"),
    Route("GET", "/v1/sandboxes/{id}/files/list", "list_files"),
    Route("GET", "/v1/sandboxes/{id}/files/stat", "stat_file"),
    Route("POST", "/v1/sandboxes/{id}/files/mkdir", "mkdir"),
    Route("POST", "/v1/sandboxes/{id}/files/rename", "rename_file"),
    Route("POST", "/v1/sandboxes/{id}/internet", "internet"),
    Route("PUT", "/v1/sandboxes/{id}/egress", "egress"),
    Route("POST", "/v1/sandboxes/{id}/snapshots", "snapshot"),
    Route("POST", "/v1/sandboxes/{id}/extend", "extend"),
    Route("GET", "/v1/snapshots", "list_snapshots"),
    Route("DELETE", "/v1/snapshots/{name}", "delete_snapshot"),
)
_COMPILED = [(r, r.pattern) for r in ROUTES]


def match_route(method: str, path: str) -> tuple[Route, dict[str, str]]:
    """The route for ``method path``; HttpError 404 (no such path) or 405 (path exists, not method)."""
    allowed: builtins.list[str] = []
    for route, pattern in _COMPILED:
        m = pattern.fullmatch(path)
        if m is None:
            continue
        if route.method == method:
            return route, {k: urllib.parse.unquote(v) for k, v in m.groupdict().items()}
        allowed.append(route.method)
    if allowed:
        allow = ", ".join(sorted(set(allowed)))
        raise HttpError(
            405,
            "method_not_allowed",
            f"{method} is not allowed on {path} (allowed: {allow})",
            headers={"Allow": allow},
        )
    raise HttpError(404, "route_not_found", f"no route {path}")


# -- the server --------------------------------------------------------------------------------------
class _HttpServer(http.server.ThreadingHTTPServer):
    """One thread per connection, at most ``app.limits.max_connections`` of them: a connection
    beyond is answered 503 from the accepting thread without blocking, then closed."""

    daemon_threads = True  # an SSE stream or an idle keep-alive connection never blocks shutdown
    allow_reuse_address = True
    request_queue_size = 128  # the listen backlog: a burst waits for accept() instead of a SYN retry

    def __init__(self, address: tuple[str, int], app: _App) -> None:
        self.app = app
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self.refused = 0  # connections answered 503 (the cap was reached)
        self._saturated = False
        self._busy_answer = _busy_answer(app.limits.max_connections)
        try:
            if ipaddress.ip_address(address[0]).version == 6:
                self.address_family = socket.AF_INET6
        except ValueError:
            pass  # a name: AF_INET
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls getfqdn(), which can stall for seconds without DNS
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            full = len(self._conns) >= self.app.limits.max_connections
            if not full:
                self._conns.add(request)
        if full:
            self._refuse(request)
            return
        self._saturated = False
        super().process_request(request, client_address)

    def _refuse(self, request: socket.socket) -> None:
        """The cap is reached: a 503 written without blocking (the open connections keep working)."""
        self.refused += 1
        if not self._saturated:  # once per episode, not once per connection
            self._saturated = True
            log.warning(
                "%d connections open, the limit: new connections get 503 until one closes",
                self.app.limits.max_connections,
            )
        with contextlib.suppress(OSError):
            request.setblocking(False)
            # what the client sent already is read, so that closing does not reset the connection
            # before the client has read the answer
            with contextlib.suppress(BlockingIOError):
                request.recv(self.app.limits.max_head_bytes)
            request.send(self._busy_answer)
        self.shutdown_request(request)

    def connection_count(self) -> int:
        with self._conns_lock:
            return len(self._conns)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        with self._conns_lock:
            conns = builtins.list(self._conns)
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _busy_answer(limit: int) -> bytes:
    body = (
        json.dumps(
            {
                "error": {
                    "code": "server_busy",
                    "message": f"the server has {limit} connections open, its limit; retry later",
                    "limit": limit,
                }
            }
        ).encode()
        + b"\n"
    )
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Retry-After: 1\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


@dataclasses.dataclass
class _App:
    manager: ManagerLike
    token: bytes
    cache: SandboxCache
    limits: HttpLimits


class ApiServer:
    """The HTTP API on ``host:port`` (port 0: a free one; see :attr:`url`).

    The socket is bound on construction; :meth:`start` serves in a background thread (tests),
    :meth:`serve_forever` in the calling one. :meth:`stop` closes the SSH connections of the
    cached sandboxes; it never destroys a sandbox. ``limits`` (default :data:`HTTP_LIMITS`) bound
    what a client may cost; ``max_body_bytes`` overrides its ``max_body_bytes``.
    """

    def __init__(
        self,
        manager: ManagerLike,
        *,
        token: str,
        host: str = DEFAULT_HOST,
        port: int = 0,
        max_body_bytes: int | None = None,
        limits: HttpLimits = HTTP_LIMITS,
    ) -> None:
        token = _check_token(token, "the token argument")  # refuse to start without a usable token
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"port={port!r} must be a TCP port number")
        if not isinstance(limits, HttpLimits):
            raise ConfigError(f"limits={limits!r} must be a sandbox_rt.limits.HttpLimits")
        if max_body_bytes is not None:
            limits = dataclasses.replace(limits, max_body_bytes=max_body_bytes)  # validated there
        self.limits = limits
        self.cache = SandboxCache(manager)
        app = _App(manager, token.encode("ascii"), self.cache, limits)
        try:
            self._server = _HttpServer((host, port), app)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        if not _is_loopback(host):
            log.warning("the HTTP API listens on %s, not loopback: the token travels in clear text", host)
        self._thread: threading.Thread | None = None
        self._stopped = False

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def connections(self) -> int:
        """Connections open now (each holds a handler thread)."""
        return self._server.connection_count()

    @property
    def refused(self) -> int:
        """Connections answered 503 because ``limits.max_connections`` were open."""
        return self._server.refused

    def start(self) -> ApiServer:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever, args=(0.05,), name="sandbox-rt-http", daemon=True
            )
            self._thread.start()
            log.info("HTTP API listening on %s", self.url)
        return self

    def serve_forever(self) -> None:
        log.info("HTTP API listening on %s", self.url)
        try:
            self._server.serve_forever()
        finally:
            self._close()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._close()

    def _close(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._server.server_close()
        self._server.drop_connections()
        self.cache.close_all()

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    manager: ManagerLike,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    token: str,
    max_body_bytes: int | None = None,
    limits: HttpLimits = HTTP_LIMITS,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the HTTP API until SIGINT/SIGTERM (blocking). ``on_ready(url)`` is called once listening.

    Refuses to start (ConfigError) without a token of at least 16 characters.
    """
    server = ApiServer(
        manager, token=token, host=host, port=port, max_body_bytes=max_body_bytes, limits=limits
    )
    previous: Any = None
    in_main = threading.current_thread() is threading.main_thread()

    def on_term(signum: int, frame: types.FrameType | None) -> NoReturn:
        raise KeyboardInterrupt

    if in_main:
        previous = signal.signal(signal.SIGTERM, on_term)
    try:
        if on_ready is not None:
            on_ready(server.url)
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("HTTP API stopping")
    finally:
        server.stop()
        if in_main and previous is not None:
            signal.signal(signal.SIGTERM, previous)


# -- requests ----------------------------------------------------------------------------------------
class _SocketReader(io.RawIOBase):
    """The raw side of a connection's ``rfile``. Each receive waits at most ``io_timeout`` seconds
    and never past ``deadline`` (a :func:`time.monotonic` time, or None): a client that trickles
    one byte at a time cannot stretch a phase that has a deadline (the head, an unauthenticated
    body). Writes are not affected: the socket's timeout is ``io_timeout`` again after each read.
    """

    def __init__(self, sock: socket.socket, io_timeout: float) -> None:
        super().__init__()
        self._sock = sock
        self.io_timeout = io_timeout
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        timeout = self.io_timeout
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - time.monotonic())
            if timeout <= 0:
                raise TimeoutError("the read deadline has passed")
        self._sock.settimeout(timeout)
        try:
            return self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(self.io_timeout)


class _HeadBudget:
    """Stands in for ``rfile`` while http.server parses the header lines: together they get
    ``left`` bytes; one more raises LineTooLong, which http.server answers with 431."""

    def __init__(self, rfile: io.BufferedIOBase, left: int, limit: int) -> None:
        self._rfile = rfile
        self.left = left
        self._limit = limit

    def readline(self, size: int = -1) -> bytes:
        want = self.left + 1 if size < 0 else min(size, self.left + 1)
        line = self._rfile.readline(max(want, 0))
        self.left -= len(line)
        if self.left < 0:
            raise http.client.LineTooLong(f"the request head is larger than {self._limit} bytes")
        return line


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"sandbox-rt/{__version__}"
    sys_version = ""
    timeout = None  # set per read by _SocketReader (and to limits.io_timeout_s for writes) in setup()
    server: _HttpServer

    # -- plumbing --------------------------------------------------------------------------------
    def setup(self) -> None:
        self._accepted_at = time.monotonic()
        self._requests = 0
        self._continue_pending = False
        self._authenticated = False
        super().setup()
        limits = self.app.limits
        self.connection.settimeout(limits.io_timeout_s)
        # headers and body go out in separate writes: without this, Nagle + delayed ACK add ~40 ms
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rfile.close()  # the stdlib's reader, replaced by one that keeps the deadlines
        self._reader = _SocketReader(self.connection, limits.io_timeout_s)
        self._buffered = io.BufferedReader(self._reader)
        self.rfile = self._buffered

    @property
    def app(self) -> _App:
        return self.server.app

    def log_message(self, format: str, *args: Any) -> None:  # request lines only: never headers
        log.info("%s %s", self.address_string(), format % args)

    def handle_one_request(self) -> None:
        """http.server's loop step with deadlines: the first byte of a request within the idle
        timeout (the head timeout for a new connection), its head within the head timeout and
        ``max_head_bytes``; then the handler (which lifts the deadline once the token is valid)."""
        limits = self.app.limits
        self.command, self.request_version, self.requestline = "", "HTTP/1.1", ""
        self._continue_pending = False
        self._authenticated = False
        if self._requests == 0:
            self._reader.deadline = self._accepted_at + limits.header_timeout_s
        else:
            self._reader.deadline = time.monotonic() + limits.idle_timeout_s
        try:
            if not self._buffered.peek(1):  # the client closed the connection
                self.close_connection = True
                return
        except OSError:  # idle too long (closed without an answer, as keep-alive allows), or reset
            self.close_connection = True
            return
        if self._requests > 0:
            self._reader.deadline = time.monotonic() + limits.header_timeout_s
        self._requests += 1
        try:
            self.raw_requestline = self.rfile.readline(limits.max_head_bytes + 1)
            if len(self.raw_requestline) > limits.max_head_bytes:
                self.send_error(414, f"the request line is longer than {limits.max_head_bytes} bytes")
                return
            if not self.parse_request():
                return
        except TimeoutError:
            self.send_error(408, f"the request head did not arrive within {limits.header_timeout_s:g} s")
            return
        except OSError:
            self.close_connection = True
            return
        method = getattr(self, "do_" + self.command, None)
        if method is None:
            self.send_error(501, f"unsupported method ({self.command!r})")
            return
        method()
        self.wfile.flush()

    def parse_request(self) -> bool:
        rfile = self.rfile
        limit = self.app.limits.max_head_bytes
        self.rfile = _HeadBudget(rfile, limit - len(self.raw_requestline), limit)  # type: ignore[assignment]
        try:
            return super().parse_request()
        finally:
            self.rfile = rfile

    def handle_expect_100(self) -> bool:
        """``Expect: 100-continue``: the 100 is sent by :meth:`_read_body`, once the token and the
        length are accepted, so that a refused client never sends its body."""
        self._continue_pending = True
        return True

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (bad request line, unsupported method, ...) as JSON too; the
        connection is closed after them."""
        with contextlib.suppress(OSError):
            self.close_connection = True
            try:
                phrase = HTTPStatus(code).phrase
            except ValueError:
                phrase = "Error"
            text = message or phrase
            if explain and code == 431:  # "Line too long": say which limit
                text = f"{text}: {explain}"
            err = HttpError(code, phrase.lower().replace(" ", "_"), text)
            self._send_json(code, err.body(), {"Connection": "close"})

    def _dispatch(self) -> None:
        self._body_read = False
        self._encoding = "utf-8"
        split = urllib.parse.urlsplit(self.path)
        self._query = split.query
        sid: str | None = None
        try:
            public = any(r.template == split.path and not r.auth for r in ROUTES)
            if not public:
                self._authenticate()
            route, params = match_route(self.command, split.path)
            sid = params.get("id")
            if sid is not None:
                check_sandbox_id(sid)  # fullmatch: "sbx-0123456789%0A" is a 400, not a lookup
            getattr(self, "_h_" + route.handler)(**params)
        except HttpError as exc:
            self._send_error_response(exc)
        except SandboxError as exc:
            if sid is not None and isinstance(exc, SandboxNotFound | ConnectionLost):
                self.app.cache.drop(sid)
            self._send_error_response(error_for(exc, self._encoding))
        except OSError:  # the client went away or stalled (socket timeout)
            self.close_connection = True
        except Exception:
            log.exception("internal error on %s %s", self.command, split.path)
            self._send_error_response(HttpError(500, "internal_error", "internal server error (see the log)"))

    def _authenticate(self) -> None:
        header = self.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        given = value.strip().encode("utf-8", "surrogateescape")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, self.app.token):
            raise HttpError(
                401,
                "unauthorized",
                "missing or wrong bearer token (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": 'Bearer realm="sandbox-rt"'},
            )
        self._authenticated = True
        self._reader.deadline = None  # a valid token: the body may be large, each read has io_timeout_s

    def _send_error_response(self, err: HttpError) -> None:
        headers = dict(err.headers)
        if err.close:  # the request's framing is broken, or its body was not (fully) read
            self.close_connection = True
        elif not self._body_read:
            self._drain_or_close()
        if self.close_connection:
            headers["Connection"] = "close"
        try:
            self._send_json(err.status, err.body(), headers)
        except OSError:
            self.close_connection = True

    def _drain_or_close(self) -> None:
        """Before an early error answer: read a small unread body to keep the connection (at most
        ``max_unauth_body_bytes`` without a valid token), else close the connection after it."""
        self._body_read = True
        if self._continue_pending:  # the client waits for "100 Continue", which it will not get
            self.close_connection = True
            return
        try:
            length = self._body_length()
        except HttpError:
            self.close_connection = True
            return
        limits = self.app.limits
        cap = limits.max_drain_bytes if self._authenticated else limits.max_unauth_body_bytes
        if length > cap:
            self.close_connection = True
        elif length > 0:
            try:
                if len(self.rfile.read(length)) != length:
                    self.close_connection = True
            except OSError:
                self.close_connection = True

    def _send_json(self, status: int, data: Any, headers: Mapping[str, str] | None = None) -> None:
        body = json.dumps(data, ensure_ascii=False).encode("utf-8") + b"\n"
        self._send_bytes(status, body, "application/json", headers)

    def _send_bytes(
        self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    # -- request parts ---------------------------------------------------------------------------
    def _body_length(self) -> int:
        """The declared body length. Framing that could be read two ways is refused (the connection
        is closed): a Transfer-Encoding (411), several or non-numeric Content-Length headers (400)."""
        if self.headers.get("Transfer-Encoding") is not None:
            raise HttpError(
                411,
                "length_required",
                "send the body with a Content-Length (no chunked uploads, no Transfer-Encoding)",
                close=True,
            )
        values = self.headers.get_all("Content-Length") or []
        if not values:
            return 0
        if len(values) > 1:
            raise HttpError(400, "invalid_argument", "more than one Content-Length header", close=True)
        raw = values[0].strip()
        if _CONTENT_LENGTH.fullmatch(raw) is None:
            raise HttpError(
                400, "invalid_argument", f"Content-Length {raw!r:.40} is not a number", close=True
            )
        return int(raw)

    def _read_body(self) -> bytes:
        self._body_read = True
        length = self._body_length()
        limits = self.app.limits
        limit = limits.max_body_bytes if self._authenticated else limits.max_unauth_body_bytes
        if length > limit:
            why = "" if self._authenticated else " of a request without a valid token"
            raise HttpError(
                413,
                "payload_too_large",
                f"request body of {length} bytes is larger than the limit{why}, {limit} bytes",
                extra={"limit_bytes": limit},
                close=True,
            )
        if length == 0:
            return b""
        if self._continue_pending:
            self._continue_pending = False
            self.send_response_only(100)
            self.end_headers()
        try:
            data = self.rfile.read(length)
        except TimeoutError:
            raise HttpError(
                408, "request_timeout", "the request body stopped arriving (connection closed)", close=True
            ) from None
        if len(data) != length:
            raise HttpError(
                400,
                "invalid_argument",
                f"request body ended early: {len(data)} of {length} bytes (connection closed)",
                close=True,
            )
        return data

    def _json_body(self, what: str, *, required: bool = True) -> dict[str, Any]:
        raw = self._read_body()
        if not raw.strip():
            if required:
                raise ConfigError(f"the {what} request needs a JSON object body")
            return {}
        try:
            data = json.loads(raw)
            json.dumps(data, ensure_ascii=False).encode("utf-8")  # lone surrogates ("\ud800") fail here
        except (ValueError, UnicodeError) as exc:
            raise ConfigError(f"the {what} body is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"the {what} body must be a JSON object, not {_json_type(data)}")
        return data

    def _query_params(self, allowed: set[str]) -> dict[str, builtins.list[str]]:
        try:
            pairs = urllib.parse.parse_qsl(
                self._query, keep_blank_values=True, strict_parsing=bool(self._query), errors="strict"
            )
        except (ValueError, UnicodeError) as exc:
            raise ConfigError(f"malformed query string: {exc}") from exc
        out: dict[str, builtins.list[str]] = {}
        for key, value in pairs:
            if key not in allowed:
                raise ConfigError(f"unknown query parameter {key!r} (allowed: {', '.join(sorted(allowed))})")
            out.setdefault(key, []).append(value)
        return out

    def _path_param(self, params: Mapping[str, builtins.list[str]]) -> str:
        values = params.get("path")
        if not values:
            raise ConfigError("query parameter 'path' is required (an absolute path in the sandbox)")
        if len(values) > 1:
            raise ConfigError("query parameter 'path' is given more than once")
        return values[0]

    # -- handlers --------------------------------------------------------------------------------
    def _h_health(self) -> None:
        self._read_body()
        self._send_json(200, {"status": "ok", "version": __version__})

    def _h_openapi(self) -> None:
        self._read_body()
        self._send_json(200, openapi_document())

    def _h_templates(self) -> None:
        self._read_body()
        self._send_json(200, {"templates": self.app.manager.templates()})

    def _h_create(self) -> None:
        body = self._json_body("create", required=False)
        _check_body(body, CREATE_FIELDS, "create")
        kwargs = {k: _integral(v) for k, v in body.items() if v is not None}
        kwargs.setdefault("detached", True)  # lives by its TTL, not by this server process
        sb = self.app.manager.create(**kwargs)
        try:
            status = status_json(sb.status())
        except BaseException:  # all or nothing, like create(): the caller never learnt the id
            _quiet_close(sb)
            with contextlib.suppress(SandboxError):
                self.app.manager.destroy(sb.id)
            raise
        self.app.cache.put(sb)
        self._send_json(201, status, {"Location": f"/v1/sandboxes/{sb.id}"})

    def _h_list_sandboxes(self) -> None:
        self._read_body()
        labels: dict[str, str] = {}
        for item in self._query_params({"label"}).get("label", []):
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"query parameter label={item!r} must be KEY=VALUE")
            labels[key] = value
        records = self.app.manager.list(labels=labels)
        self._send_json(200, {"sandboxes": [record_json(r) for r in records]})

    def _h_get_status(self, id: str) -> None:
        self._read_body()
        self._send_json(200, status_json(self.app.cache.get(id).status()))

    def _send_no_content(self) -> None:
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _h_delete(self, id: str) -> None:
        self._read_body()
        self.app.cache.drop(id)
        self.app.manager.destroy(id)
        self._send_no_content()

    def _h_internet(self, id: str) -> None:
        body = self._json_body("internet")
        _check_body(body, INTERNET_FIELDS, "internet")
        if "enabled" not in body:
            raise ConfigError("field 'enabled' is required (true or false)")
        self.app.cache.get(id).set_internet(body["enabled"])
        self._send_json(200, {"id": id, "internet": body["enabled"]})

    def _h_egress(self, id: str) -> None:
        body = self._json_body("egress")
        _check_body(body, EGRESS_FIELDS, "egress")
        if "egress" not in body:
            raise ConfigError("field 'egress' is required (an array; [] closes the list)")
        entries = self.app.cache.get(id).set_egress(body["egress"])
        self._send_json(200, {"id": id, "egress": list(entries)})

    def _h_snapshot(self, id: str) -> None:
        body = self._json_body("snapshot")
        _check_body(body, SNAPSHOT_FIELDS, "snapshot")
        if "name" not in body:
            raise ConfigError("field 'name' is required (the snapshot's name)")
        info = self.app.manager.snapshot(id, body["name"])
        self._send_json(201, dataclasses.asdict(info))

    def _h_extend(self, id: str) -> None:
        body = self._json_body("extend")
        _check_body(body, EXTEND_FIELDS, "extend")
        if "ttl_s" not in body:
            raise ConfigError("field 'ttl_s' is required (seconds from now)")
        sb = self.app.cache.get(id)
        sb.extend(_integral(body["ttl_s"]))
        self._send_json(200, status_json(sb.status()))

    def _h_list_snapshots(self) -> None:
        self._read_body()
        infos = self.app.manager.list_snapshots()
        self._send_json(200, {"snapshots": [dataclasses.asdict(i) for i in infos]})

    def _h_delete_snapshot(self, name: str) -> None:
        self._read_body()
        self.app.manager.delete_snapshot(check_snapshot_name(name))
        self._send_no_content()

    def _flag(self, params: Mapping[str, builtins.list[str]], name: str, default: bool) -> bool:
        values = params.get(name)
        if not values:
            return default
        if len(values) > 1 or values[0] not in ("true", "false"):
            raise ConfigError(f"query parameter {name!r} must be given once, as true or false")
        return values[0] == "true"

    def _h_list_files(self, id: str) -> None:
        self._read_body()
        params = self._query_params({"path", "depth"})
        path = self._path_param(params)
        depth_text = (params.get("depth") or ["1"])[-1]
        if len(params.get("depth") or []) > 1 or not depth_text.isdigit():
            raise ConfigError(f"query parameter depth={depth_text!r:.30} must be a whole number, given once")
        entries = self.app.cache.get(id).files.list(path, int(depth_text))
        self._send_json(200, {"entries": [dataclasses.asdict(e) for e in entries]})

    def _h_stat_file(self, id: str) -> None:
        self._read_body()
        params = self._query_params({"path", "follow_symlinks"})
        follow = self._flag(params, "follow_symlinks", True)
        info = self.app.cache.get(id).files.stat(self._path_param(params), follow_symlinks=follow)
        self._send_json(200, dataclasses.asdict(info))

    def _h_remove_file(self, id: str) -> None:
        self._read_body()
        params = self._query_params({"path", "recursive"})
        recursive = self._flag(params, "recursive", False)
        self.app.cache.get(id).files.remove(self._path_param(params), recursive=recursive)
        self._send_no_content()

    def _h_mkdir(self, id: str) -> None:
        body = self._json_body("mkdir")
        _check_body(body, MKDIR_FIELDS, "mkdir")
        if "path" not in body:
            raise ConfigError("field 'path' is required (an absolute path in the sandbox)")
        created = self.app.cache.get(id).files.mkdir(body["path"], parents=body.get("parents", True))
        self._send_json(200, {"path": body["path"], "created": created})

    def _h_rename_file(self, id: str) -> None:
        body = self._json_body("rename")
        _check_body(body, RENAME_FIELDS, "rename")
        if "src" not in body or "dst" not in body:
            raise ConfigError("fields 'src' and 'dst' are required (absolute paths in the sandbox)")
        info = self.app.cache.get(id).files.rename(body["src"], body["dst"])
        self._send_json(200, dataclasses.asdict(info))

    def _h_read_file(self, id: str) -> None:
        self._read_body()
        path = self._path_param(self._query_params({"path"}))
        data = self.app.cache.get(id).read_file(path)
        self._send_bytes(200, data, "application/octet-stream")

    def _h_write_file(self, id: str) -> None:
        params = self._query_params({"path", "mode"})
        path = self._path_param(params)
        mode: int | None = None
        if "mode" in params:
            text = params["mode"][-1]
            if not re.fullmatch(r"0?[0-7]{3,4}", text):
                raise ConfigError(
                    f"query parameter mode={text!r} must be octal permissions, e.g. 644 or 0755"
                )
            mode = int(text, 8)
        data = self._read_body()
        self.app.cache.get(id).write_file(path, data, mode=mode)
        self._send_json(200, {"path": path, "size": len(data)})

    def _h_exec(self, id: str) -> None:
        body = self._json_body("exec")
        _check_body(body, EXEC_FIELDS, "exec")
        if "command" not in body:
            raise ConfigError("field 'command' is required (a string run by bash, or an argv array)")
        encoding = body.get("encoding", "utf-8")
        if encoding not in ENCODINGS:
            raise ConfigError(f"field 'encoding' must be one of {', '.join(ENCODINGS)}, not {encoding!r}")
        self._encoding = encoding
        stdin: bytes | None = None
        if body.get("stdin") is not None and body.get("stdin_b64") is not None:
            raise ConfigError("give at most one of the fields 'stdin' and 'stdin_b64'")
        if body.get("stdin") is not None:
            stdin = body["stdin"].encode("utf-8")
        elif body.get("stdin_b64") is not None:
            try:
                stdin = base64.b64decode(body["stdin_b64"], validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ConfigError(f"field 'stdin_b64' is not valid base64: {exc}") from exc
        stream = body.get("stream")
        if stream is None:
            stream = "text/event-stream" in self.headers.get("Accept", "").lower()
        sb = self.app.cache.get(id)
        kwargs: dict[str, Any] = {
            "timeout": body.get("timeout"),
            "cwd": body.get("cwd"),
            "env": body.get("env"),
            "stdin": stdin,
        }
        if body.get("max_output") is not None:
            kwargs["max_output"] = body["max_output"]
        if body.get("user") is not None:
            kwargs["user"] = body["user"]
        if not stream:
            r = sb.exec(body["command"], **kwargs)
            self._send_json(200, self._result_json(r, encoding, with_output=True))
            return
        self._stream(sb.exec_stream(body["command"], **kwargs), encoding)

    @staticmethod
    def _result_json(r: ExecResult, encoding: str, *, with_output: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "command": r.command,
            "exit_code": r.exit_code,
            "duration_s": r.duration_s,
            "truncated": r.truncated,
            "stdout_dropped": r.stdout_dropped,
            "stderr_dropped": r.stderr_dropped,
        }
        if with_output:
            out.update(
                encoding=encoding, stdout=_encode(r.stdout, encoding), stderr=_encode(r.stderr, encoding)
            )
        return out

    # -- server-sent events ----------------------------------------------------------------------
    def _stream(self, stream: ExecStreamLike, encoding: str) -> None:
        """``event: stdout|stderr`` chunks as they come, then ``event: exit`` (or ``event: error``).

        Each event is written (chunked transfer encoding) and sent at once. If the client goes
        away the command is not killed: it runs on until it ends or its timeout.
        """
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Accel-Buffering", "no")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        decoders = {
            name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in ("stdout", "stderr")
        }

        def text(name: str, data: bytes, final: bool = False) -> str:
            if encoding == "base64":
                return base64.b64encode(data).decode("ascii")
            return str(decoders[name].decode(data, final))

        try:
            try:
                for chunk in stream:
                    piece = text(chunk.stream, chunk.data)
                    if piece:
                        self._event(chunk.stream, {"data": piece})
                if encoding != "base64":
                    for name in ("stdout", "stderr"):  # a trailing partial UTF-8 sequence
                        rest = text(name, b"", final=True)
                        if rest:
                            self._event(name, {"data": rest})
                result = stream.result
                if result is None:
                    raise SandboxError("the command's stream ended without a result")
                self._event("exit", self._result_json(result, encoding, with_output=False))
            except SandboxError as exc:
                err = error_for(exc, encoding)
                err.extra.pop("stdout", None)  # already streamed
                err.extra.pop("stderr", None)
                self._event("error", {"status": err.status, **err.body()})
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                raise
            except Exception:
                log.exception("internal error while streaming")
                self._event(
                    "error",
                    {
                        "status": 500,
                        **HttpError(500, "internal_error", "internal server error (see the log)").body(),
                    },
                )
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client went away
            self.close_connection = True

    def _event(self, name: str, data: Mapping[str, Any]) -> None:
        payload = f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
