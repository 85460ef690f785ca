"""The HTTP control API (``sandbox-rt serve``): create, list, status, exec (with SSE streaming),
files, internet and destroy over JSON, for callers that are not Python.

Stdlib only (``http.server.ThreadingHTTPServer``). Bound to loopback by default; every route but
``/healthz`` and ``/openapi.json`` needs ``Authorization: Bearer <token>``. The server keeps one
attached :class:`~sandbox_rt.Sandbox` per id, so consecutive execs reuse its SSH transport.
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
import http.server
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
from .models import ExecResult, OutputChunk, SandboxRecord, SandboxStatus, SnapshotInfo

if TYPE_CHECKING:
    from .manager import Manager
    from .sandbox import ExecStream

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_PORT",
    "ROUTES",
    "TOKEN_ENV",
    "ApiServer",
    "ManagerLike",
    "SandboxLike",
    "load_token",
    "serve",
]

log = logging.getLogger(__name__)

TOKEN_ENV = "SANDBOX_RT_API_TOKEN"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
MIN_TOKEN_LENGTH = 16
IDLE_TIMEOUT_S = 120.0  # a keep-alive connection (or a client that stops reading) is dropped after this

_TOKEN_CHARS = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces: safe in a header


# -- what the server needs from the runtime (sandbox_rt.Manager / Sandbox fit; tests use fakes) ----
class ExecStreamLike(Protocol):
    @property
    def result(self) -> ExecResult | None: ...

    def __iter__(self) -> Iterator[OutputChunk]: ...


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
    ) -> ExecResult: ...

    def exec_stream(
        self,
        command: str | builtins.list[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecStreamLike: ...

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None: ...

    def read_file(self, path: str) -> bytes: ...

    def set_internet(self, enabled: bool) -> None: ...

    def set_egress(self, egress: Sequence[str]) -> tuple[str, ...]: ...

    def status(self) -> SandboxStatus: ...

    def is_connected(self) -> bool: ...

    def close(self) -> None: ...


class ManagerLike(Protocol):
    def create(
        self,
        *,
        hostname: str | None = None,
        cpus: float = 1,
        memory_mb: int = 1024,
        disk_gb: int = 8,
        pids_max: int = 1024,
        internet: bool = False,
        labels: Mapping[str, str] | None = None,
        ttl_s: int | None = None,
        detached: bool = False,
        egress: Sequence[str] | None = None,
        from_snapshot: str | None = None,
    ) -> SandboxLike: ...

    def attach(self, sandbox_id: str) -> SandboxLike: ...

    def snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo: ...

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
    if not _TOKEN_CHARS.match(token):
        raise ConfigError(f"the API token from {source} must be printable ASCII without spaces")
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(
            f"the API token from {source} is shorter than {MIN_TOKEN_LENGTH} characters "
            "(make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token


def load_token(token_file: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> str:
    """The bearer token: the first line of ``token_file`` if given, else ``$SANDBOX_RT_API_TOKEN``.

    ConfigError if there is none, if it is shorter than 16 characters, or if the file is readable by
    every user (``chmod 600`` it). The token is never logged or printed.
    """
    if token_file is not None:
        path = Path(token_file)
        try:
            st = path.stat()
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(f"token file {path} is not a regular file")
            if st.st_mode & stat.S_IROTH:
                raise ConfigError(f"token file {path} is readable by every user: chmod 600 it")
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read token file {path}: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"token file {path} is not UTF-8 text") from exc
        lines = text.strip().splitlines()
        return _check_token(lines[0].strip() if lines else "", f"token file {path}")
    value = (os.environ if env is None else env).get(TOKEN_ENV)
    if value is None:
        raise ConfigError(f"no API token: pass --token-file FILE or set {TOKEN_ENV}")
    return _check_token(value.strip(), TOKEN_ENV)


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
}
EXEC_FIELDS: dict[str, tuple[str, bool]] = {
    "command": ("command", False),
    "timeout": ("number", True),
    "cwd": ("string", True),
    "env": ("string_map", True),
    "stdin": ("string", True),
    "stdin_b64": ("string", True),
    "encoding": ("string", False),
    "stream": ("boolean", False),
}
INTERNET_FIELDS: dict[str, tuple[str, bool]] = {"enabled": ("boolean", False)}
EGRESS_FIELDS: dict[str, tuple[str, bool]] = {"egress": ("string_list", False)}
SNAPSHOT_FIELDS: dict[str, tuple[str, bool]] = {"name": ("string", False)}
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
        return re.compile("^" + re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(self.template)) + "$")


ROUTES: tuple[Route, ...] = (
    Route("GET", "/healthz", "health", auth=False),
    Route("GET", "/openapi.json", "openapi", auth=False),
    Route("POST", "/v1/sandboxes", "create"),
    Route("GET", "/v1/sandboxes", "list_sandboxes"),
    Route("GET", "/v1/sandboxes/{id}", "get_status"),
    Route("DELETE", "/v1/sandboxes/{id}", "delete"),
    Route("POST", "/v1/sandboxes/{id}/exec", "exec"),
    Route("GET", "/v1/sandboxes/{id}/files", "read_file"),
    Route("PUT", "/v1/sandboxes/{id}/files", "write_file"),
    Route("POST", "/v1/sandboxes/{id}/internet", "internet"),
    Route("PUT", "/v1/sandboxes/{id}/egress", "egress"),
    Route("POST", "/v1/sandboxes/{id}/snapshots", "snapshot"),
)
_COMPILED = [(r, r.pattern) for r in ROUTES]


def match_route(method: str, path: str) -> tuple[Route, dict[str, str]]:
    """The route for ``method path``; HttpError 404 (no such path) or 405 (path exists, not method)."""
    allowed: builtins.list[str] = []
    for route, pattern in _COMPILED:
        m = pattern.match(path)
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
    daemon_threads = True  # an SSE stream or an idle keep-alive connection never blocks shutdown
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], app: _App) -> None:
        self.app = app
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
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
            self._conns.add(request)
        super().process_request(request, client_address)

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


@dataclasses.dataclass
class _App:
    manager: ManagerLike
    token: bytes
    cache: SandboxCache
    max_body_bytes: int


class ApiServer:
    """The HTTP API on ``host:port`` (port 0: a free one; see :attr:`url`).

    The socket is bound on construction; :meth:`start` serves in a background thread (tests),
    :meth:`serve_forever` in the calling one. :meth:`stop` closes the SSH connections of the
    cached sandboxes; it never destroys a sandbox.
    """

    def __init__(
        self,
        manager: ManagerLike,
        *,
        token: str,
        host: str = DEFAULT_HOST,
        port: int = 0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        token = _check_token(token, "the token argument")  # refuse to start without a usable token
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"port={port!r} must be a TCP port number")
        if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
            raise ConfigError(f"max_body_bytes={max_body_bytes!r} must be a positive whole number")
        self.cache = SandboxCache(manager)
        app = _App(manager, token.encode("ascii"), self.cache, max_body_bytes)
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
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the HTTP API until SIGINT/SIGTERM (blocking). ``on_ready(url)`` is called once listening.

    Refuses to start (ConfigError) without a token of at least 16 characters.
    """
    server = ApiServer(manager, token=token, host=host, port=port, max_body_bytes=max_body_bytes)
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
class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"sandbox-rt/{__version__}"
    sys_version = ""
    timeout = IDLE_TIMEOUT_S
    server: _HttpServer

    # -- plumbing --------------------------------------------------------------------------------
    def setup(self) -> None:
        super().setup()
        # headers and body go out in separate writes: without this, Nagle + delayed ACK add ~40 ms
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @property
    def app(self) -> _App:
        return self.server.app

    def log_message(self, format: str, *args: Any) -> None:  # request lines only: never headers
        log.info("%s %s", self.address_string(), format % args)

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
        """http.server's own errors (bad request line, unsupported method, ...) as JSON too."""
        with contextlib.suppress(OSError):
            self.close_connection = True
            try:
                phrase = HTTPStatus(code).phrase
            except ValueError:
                phrase = "Error"
            err = HttpError(code, phrase.lower().replace(" ", "_"), message or phrase)
            self._send_json(code, err.body(), {"Connection": "close"})

    def _dispatch(self) -> None:
        self._body_read = False
        self._encoding = "utf-8"
        split = urllib.parse.urlsplit(self.path)
        self._query = split.query
        try:
            public = any(r.template == split.path and not r.auth for r in ROUTES)
            if not public:
                self._authenticate()
            route, params = match_route(self.command, split.path)
            getattr(self, "_h_" + route.handler)(**params)
        except HttpError as exc:
            self._send_error_response(exc)
        except SandboxError as exc:
            sid = self._sandbox_id_of(split.path)
            if sid is not None and isinstance(exc, SandboxNotFound | ConnectionLost):
                self.app.cache.drop(sid)
            self._send_error_response(error_for(exc, self._encoding))
        except OSError:  # the client went away or stalled (socket timeout)
            self.close_connection = True
        except Exception:
            log.exception("internal error on %s %s", self.command, split.path)
            self._send_error_response(HttpError(500, "internal_error", "internal server error (see the log)"))

    @staticmethod
    def _sandbox_id_of(path: str) -> str | None:
        m = re.match(r"^/v1/sandboxes/([^/]+)", path)
        return urllib.parse.unquote(m.group(1)) if m else None

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

    def _send_error_response(self, err: HttpError) -> None:
        headers = dict(err.headers)
        if err.close or not self._body_read:
            self._drain_or_close()
        if self.close_connection:
            headers["Connection"] = "close"
        try:
            self._send_json(err.status, err.body(), headers)
        except OSError:
            self.close_connection = True

    def _drain_or_close(self) -> None:
        """Before an early error answer: read a small unread body, else drop the connection after."""
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding") or (length and not length.isdigit()):
            self.close_connection = True
        elif length and int(length) > 0:
            if int(length) <= 1 << 16:
                with contextlib.suppress(OSError):
                    self.rfile.read(int(length))
            else:
                self.close_connection = True
        self._body_read = True

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
    def _read_body(self) -> bytes:
        self._body_read = True
        if self.headers.get("Transfer-Encoding"):
            raise HttpError(
                411, "length_required", "send the body with a Content-Length (no chunked uploads)", close=True
            )
        raw = self.headers.get("Content-Length")
        if raw is None:
            return b""
        if not raw.isdigit():
            raise HttpError(400, "invalid_argument", f"Content-Length {raw!r} is not a number", close=True)
        length = int(raw)
        if length > self.app.max_body_bytes:
            self.close_connection = True
            raise HttpError(
                413,
                "payload_too_large",
                f"request body of {length} bytes is larger than the limit of {self.app.max_body_bytes}",
                extra={"limit_bytes": self.app.max_body_bytes},
                close=True,
            )
        data = self.rfile.read(length)
        if len(data) != length:
            self.close_connection = True
            raise HttpError(400, "invalid_argument", "request body ended early", close=True)
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

    def _h_delete(self, id: str) -> None:
        self._read_body()
        self.app.cache.drop(id)
        self.app.manager.destroy(id)
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

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
        if not stream:
            r = sb.exec(body["command"], **kwargs)
            self._send_json(200, self._result_json(r, encoding, with_output=True))
            return
        self._stream(sb.exec_stream(body["command"], **kwargs), encoding)

    @staticmethod
    def _result_json(r: ExecResult, encoding: str, *, with_output: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"command": r.command, "exit_code": r.exit_code, "duration_s": r.duration_s}
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
