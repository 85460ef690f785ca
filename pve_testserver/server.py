"""The HTTPS front: threaded stdlib server + TLS, ``/api2/json`` and the ``/_test`` admin API.

>>> with PVETestServer() as srv:                      # memory engine, 127.0.0.1, free port
...     token_id, secret = srv.root_token            # root@pam!bootstrap (privsep=0)
...     srv.url, srv.ca_file, srv.fingerprint

Admin API (root@pam tokens only), outside ``/api2``: ``GET|POST|DELETE /_test/faults`` (see
``faults``), ``GET /_test/state`` (the state, token hashes removed).
"""

from __future__ import annotations

import collections
import ipaddress
import json
import os
import re
import socket
import socketserver
import ssl
import sys
import tempfile
import threading
import urllib.parse
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from .api_access import create_token
from .auth import ROOT, hash_secret
from .core import Core, Response
from .engine import Engine
from .engine_memory import MemoryEngine
from .errors import PVEError
from .faults import Faults
from .schema import Schema
from .state import State
from .tls import TlsFiles, make_certificates

BOOTSTRAP_TOKEN = "bootstrap"


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], ctx: ssl.SSLContext, app: PVETestServer) -> None:
        self.ssl_context = ctx
        self.app = app
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # No getfqdn(): its reverse lookup can stall for seconds in a netns without DNS.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        # Headers and body go out in separate writes: without TCP_NODELAY, Nagle + delayed ACK
        # cost ~40 ms per keep-alive request.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The TLS handshake happens in the handler thread, not in the accept loop.
        return self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ssl.SSLError, ConnectionError, TimeoutError, OSError)):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "pve-api-daemon/3.0"
    timeout = 120
    server: _HTTPServer

    def version_string(self) -> str:
        return self.server_version

    def setup(self) -> None:
        super().setup()
        conn = self.connection
        if isinstance(conn, ssl.SSLSocket):
            conn.do_handshake()

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.app.verbose:
            sys.stderr.write(f"pve-test-server: {self.address_string()} {format % args}\n")

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, resp: Response) -> None:
        self.send_response(resp.status, resp.reason)
        ctype = "application/json;charset=UTF-8" if resp.body else None
        if ctype:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(resp.body)))
        self.send_header("Cache-Control", "max-age=0")
        if resp.status >= 400:
            self.send_header("Connection", "close")
            self.close_connection = True
        for key, value in resp.headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(resp.body)

    def _dispatch(self) -> None:
        body = self._body()
        url = urllib.parse.urlsplit(self.path)
        app = self.server.app
        if url.path.startswith("/_test/"):
            resp = app.admin(self.command, url.path, body, self.headers.get("Authorization"))
        else:
            resp = app.core.handle(
                self.command,
                url.path,
                url.query,
                body,
                self.headers.get("Content-Type"),
                self.headers.get("Authorization"),
            )
            app.count_request(self.command, url.path, resp.status, resp.reason)
        self._send(resp)

    do_GET = do_POST = do_PUT = do_DELETE = _dispatch


class PVETestServer:
    """A PVE API emulation on ``https://host:port/api2/json`` (see the package docstring)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        engine: Engine | None = None,
        state_file: Path | None = None,
        nodes: Sequence[str] = ("pve",),
        schema: Schema | None = None,
        tls_dir: Path | None = None,
        bootstrap_token_file: Path | None = None,
        verbose: bool = False,
        first_vmid: int = 100,
        engines: Mapping[str, Engine] | None = None,
    ) -> None:
        """``first_vmid``: where ``/cluster/nextid`` starts counting (PVE: 100); test sessions that
        share one machine's LXC path and bridge pick distinct ranges (VMIDs name containers, veths
        and, for the runtime, addresses).

        A cluster: ``engines`` maps each node to the engine that runs its CTs (e.g. one
        ``MemoryEngine`` each, or one ``LxcEngine`` each with its own container prefix); the nodes
        are then its keys, the first the local one (``nodes`` and ``engine`` need not be given)."""
        if engines:
            nodes = list(engines)
            engine = engine or engines[nodes[0]]
        self.host = host
        self._port = port
        self.verbose = verbose
        self.engine: Engine = engine or MemoryEngine()
        self.faults = Faults()
        self.state = State.open(state_file, list(nodes))
        self.core = Core(
            schema or Schema.load(), self.state, self.engine, self.faults, engines=dict(engines or {})
        )
        self.core.first_vmid = first_vmid
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if tls_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="pve-test-server-")
            tls_dir = Path(self._tmp.name)
        self.tls: TlsFiles = make_certificates(
            tls_dir, ["localhost", *self.state.nodes], [host] if _is_ip(host) else []
        )
        self._bootstrap_file = bootstrap_token_file
        self._secret = ""
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._served: collections.Counter[tuple[str, str, int, str]] = collections.Counter()
        self._served_lock = threading.Lock()

    def client(self, tokenid: str | None = None, secret: str | None = None, **options: Any) -> Any:
        """proxmoxer on this server as ``tokenid`` (default: the root token), TLS verified against
        the server's CA (never ``verify_ssl=False``); ``options`` go to ``ProxmoxAPI`` (timeout)."""
        from proxmoxer import ProxmoxAPI

        if tokenid is None:
            tokenid, secret = self.root_token
        user, name = tokenid.split("!")
        return ProxmoxAPI(
            self.host,
            port=self.port,
            user=user,
            token_name=name,
            token_value=secret,
            verify_ssl=str(self.ca_file),
            **options,
        )

    # --- requests served ----------------------------------------------------------------------
    def count_request(self, method: str, path: str, status: int, reason: str) -> None:
        with self._served_lock:
            self._served[(method, path, status, reason)] += 1

    def requests_served(self, method: str, path_pattern: str, reason_pattern: str = "") -> int:
        """How many API requests ``method`` on a path matching ``path_pattern`` were answered with
        a status line matching ``reason_pattern`` (regexes, searched; PVE puts an error's message
        in the reason phrase, e.g. ``CT 101 already exists on node 'pve'``)."""
        with self._served_lock:
            return sum(
                n
                for (m, path, code, reason), n in self._served.items()
                if m == method
                and re.search(path_pattern, path)
                and re.search(reason_pattern, f"{code} {reason}")
            )

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> PVETestServer:
        with self.state.lock:
            root = self.state.users[ROOT]
            root.setdefault("tokens", {}).pop(BOOTSTRAP_TOKEN, None)
            self._secret = _new_token(self.state, ROOT, BOOTSTRAP_TOKEN, privsep=False)
            self.state.save()
        if self._bootstrap_file is not None:
            write_secret(self._bootstrap_file, f"{ROOT}!{BOOTSTRAP_TOKEN}={self._secret}\n")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.tls.cert_file, self.tls.key_file)
        self._httpd = _HTTPServer((self.host, self._port), ctx, self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="pve-test-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self, task_timeout: float = 30.0) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        self.core.tasks.wait_all(task_timeout)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> PVETestServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- facts for clients ------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("server not started")
        return int(self._httpd.server_port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}/api2/json"

    @property
    def ca_file(self) -> Path:
        return self.tls.ca_file

    @property
    def fingerprint(self) -> str:
        return self.tls.fingerprint

    @property
    def root_token(self) -> tuple[str, str]:
        """(``root@pam!bootstrap``, secret) of this start."""
        return f"{ROOT}!{BOOTSTRAP_TOKEN}", self._secret

    # --- Python admin helpers (tests) -------------------------------------------------------
    def add_user(self, userid: str, **fields: Any) -> None:
        with self.state.lock:
            self.state.users.setdefault(userid, {"enable": True, "expire": 0, "tokens": {}}).update(fields)
            self.state.save()

    def add_token(self, userid: str, name: str, privsep: bool = True) -> str:
        """Create (or replace) a token; returns its secret."""
        with self.state.lock:
            secret = _new_token(self.state, userid, name, privsep)
            self.state.save()
        return secret

    def set_acl(
        self,
        path: str,
        role: str,
        *,
        users: Sequence[str] = (),
        tokens: Sequence[str] = (),
        propagate: bool = True,
    ) -> None:
        with self.state.lock:
            entry = self.state.acl.setdefault(path, {"users": {}, "groups": {}, "tokens": {}})
            for kind, ids in (("users", users), ("tokens", tokens)):
                for ugid in ids:
                    entry.setdefault(kind, {}).setdefault(ugid, {})[role] = int(propagate)
            self.state.save()

    # --- /_test admin API -------------------------------------------------------------------
    def admin(self, verb: str, path: str, body: bytes, authorization: str | None) -> Response:
        try:
            with self.state.lock:
                authid = self.core.acl.verify_api_token(authorization)
            if not authid.startswith(f"{ROOT}!"):
                raise PVEError(403, "Permission check failed (the test admin API needs a root@pam token)\n")
            data: Any
            if path == "/_test/faults":
                if verb == "POST":
                    self.faults.configure(json.loads(body or b"{}"))
                elif verb == "DELETE":
                    self.faults.clear()
                elif verb != "GET":
                    raise PVEError(501, f"Method '{verb} {path}' not implemented")
                data = self.faults.describe()
            elif path == "/_test/state" and verb == "GET":
                data = self.state.snapshot()
                for user in data.get("users", {}).values():
                    for tok in user.get("tokens", {}).values():
                        tok.pop("secret_sha256", None)
            else:
                raise PVEError(501, f"Method '{verb} {path}' not implemented")
        except PVEError as exc:
            return Core.error_response(exc)
        except (ValueError, KeyError, TypeError) as exc:
            return Core.error_response(PVEError(400, f"bad fault specification: {exc!r}"))
        return Response(200, "OK", json.dumps({"data": data}).encode())


def _new_token(state: State, userid: str, name: str, privsep: bool) -> str:
    return create_token(state, userid, name, privsep)


def write_secret(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 (created that way, never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    tmp.replace(path)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


__all__ = ["PVETestServer", "hash_secret", "write_secret"]
