"""Request pipeline, independent of HTTP: what pve-proxy + pvedaemon do with one API call.

Order, as in PVE (pve-http-server + PVE::HTTPServer::rest_handler + RESTHandler::handle):

1. ``/api2/json`` prefix (an armed ``http_error`` fault answers here, as pveproxy does when
   pvedaemon is down), request body (form-encoded or JSON; query parameters win);
2. authentication (``Authorization: PVEAPIToken=...``) -> 401 ``No ticket`` /
   ``Authentication failed!`` with an empty body;
3. route lookup in the schema -> 501 ``Method 'GET /foo' not implemented``;
4. URI parameters merged (a conflicting body parameter -> 400), ``allowtoken``;
5. the method's ``permissions`` -> 403 ``Permission check failed (/vms/100, VM.Clone)``;
6. ``proxyto: node`` -> unknown node 500, offline node (fault switch) 595;
7. schema validation -> 400 ``Parameter verification failed.`` + ``errors``;
8. the handler; schema paths the server does not implement -> 501 naming the method.

Errors render as ``{"data": null, "message": "...", "errors": {...}}`` with the message's first
line as HTTP reason phrase.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
import traceback
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path
from typing import Any

from .auth import AccessControl
from .engine import ConfigFileBacked, Engine
from .errors import PVEError, fail, not_implemented, param_error
from .faults import Faults
from .pvefw import FirewallProgrammer, render
from .schema import Method, Schema
from .state import State
from .tasks import TaskManager

API_PREFIX = "/api2/json"


@dataclass
class Response:
    status: int
    reason: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Call:
    """One validated API call as handlers see it."""

    core: Core
    authid: str
    method: Method
    params: dict[str, Any]
    total: int | None = None

    @property
    def state(self) -> State:
        return self.core.state

    @property
    def acl(self) -> AccessControl:
        return self.core.acl

    @property
    def engine(self) -> Engine:
        """The engine of the addressed node (each node of a cluster has its own)."""
        return self.core.engine_for(self.node)

    @property
    def tasks(self) -> TaskManager:
        return self.core.tasks

    @property
    def faults(self) -> Faults:
        return self.core.faults

    @property
    def node(self) -> str:
        return str(self.params.get("node", self.core.local_node))

    @contextmanager
    def mutate(self) -> Iterator[State]:
        """Hold the state lock; persist the state if the block succeeds, else roll it back."""
        with self.state.lock:
            backup = self.state.snapshot()
            try:
                yield self.state
            except BaseException:
                self.state.restore(backup)
                raise
            self.state.save()
            self.core.after_change()


Handler = Callable[[Call], Any]
HANDLERS: dict[tuple[str, str], Handler] = {}


def route(verb: str, template: str) -> Callable[[Handler], Handler]:
    """Register a handler for a schema path template and HTTP method."""

    def register(fn: Handler) -> Handler:
        HANDLERS[(verb, template)] = fn
        return fn

    return register


def _decode_urlencoded(data: str) -> dict[str, Any]:
    """pve-http-server's decode_urlencoded (repeated keys become lists, ``k`` alone is undef)."""
    out: dict[str, Any] = {}
    if not data:
        return out
    for kv in data.replace(";", "&").split("&"):
        parts = kv.split("=")
        key = urllib.parse.unquote_plus(parts[0])
        if len(parts) < 2:
            out[key] = None
            continue
        val: Any = urllib.parse.unquote_plus(parts[1])
        old = out.get(key)
        if old is not None:
            val = [*old, val] if isinstance(old, list) else [old, val]
        out[key] = val
    return out


class Core:
    """Everything behind the HTTP socket."""

    def __init__(
        self,
        schema: Schema,
        state: State,
        engine: Engine,
        faults: Faults | None = None,
        release: str = "9.0",
        version: str = "9.0.11",
        engines: dict[str, Engine] | None = None,
    ) -> None:
        """``engine`` runs the CTs of the first (local) node; ``engines`` those of other nodes of
        the cluster (a node without one shares ``engine``)."""
        from . import (  # noqa: F401  (register the handlers)
            api_access,
            api_cluster,
            api_firewall,
            api_lxc,
            api_lxc_status,
            api_snapshot,
            api_tasks,
        )

        self.schema = schema
        self.state = state
        self.engine = engine
        self.engines: dict[str, Engine] = dict(engines or {})
        # each node's memory as /cluster/resources and /nodes/{node}/status report it: (used
        # without the running CTs, total) in bytes; the running CTs' memory is added (api_cluster)
        self.node_memory: dict[str, tuple[int, int]] = {}
        self.faults = faults or Faults()
        self.acl = AccessControl(state)
        self.tasks = TaskManager(self.faults)
        self.release = release
        self.version = version
        self.first_vmid = 100  # where /cluster/nextid starts (PVETestServer(first_vmid=...))
        self.started = time.time()
        self.uploads: dict[str, Path] = {}  # tmpfilename (as PVE names it) -> the uploaded bytes
        with state.lock:
            for key, ct in state.cts.items():
                self.engine_for(str(ct.get("node", ""))).restore(
                    int(key), ct["config"], ct.get("status") == "running"
                )
            self.after_change()

    def after_change(self) -> None:
        """After every change of the state (lock held): an engine that runs pve-firewall (the node
        engine) gets the whole firewall recompiled; it reloads it only when the text changed. One
        that keeps the CTs' config files gets them rewritten."""
        self.sync_config_files()
        if isinstance(self.engine, FirewallProgrammer):
            self.engine.apply_firewall(render(self.state.data, self.engine_nodes))

    @property
    def engine_nodes(self) -> tuple[str, ...]:
        """The nodes whose CTs the main engine runs (the local node first; all nodes without an
        engine of their own: one machine standing in for several nodes)."""
        return tuple(n for n in self.state.nodes if self.engine_for(n) is self.engine)

    def sync_config_files(self) -> None:
        """pmxcfs: root's hand edits of /etc/pve/nodes/<node>/lxc/<vmid>.conf on the node (raw lxc.*
        keys) become the CTs' configs; then the files are written from the state (the node engine
        only), for every node it runs the CTs of (/etc/pve/lxc links to the local node's)."""
        if not isinstance(self.engine, ConfigFileBacked):
            return
        with self.state.lock:
            changed = False
            for node in self.engine_nodes:
                changed = self.engine.sync_config_files(self.state.cts, node) or changed
            if changed:
                self.state.save()

    def engine_for(self, node: str) -> Engine:
        """The engine that runs the CTs of ``node``."""
        return self.engines.get(node, self.engine)

    @property
    def local_node(self) -> str:
        return self.state.nodes[0]

    # --- the pipeline -----------------------------------------------------------------------
    def handle(
        self,
        verb: str,
        raw_path: str,
        query: str,
        body: bytes,
        content_type: str | None,
        authorization: str | None,
    ) -> Response:
        path = urllib.parse.unquote(raw_path)
        uploaded: Any = None
        try:
            if not path.startswith(API_PREFIX + "/") and path != API_PREFIX:
                raise PVEError(501, "no such uri")
            rel = path[len(API_PREFIX) :] or "/"
            injected = self.faults.http_failure(verb, rel)  # the http_error fault switch
            if injected is not None:
                raise PVEError(injected[0], injected[1])
            params = self._params(verb, query, body, content_type)
            uploaded = params.get("tmpfilename")
            authid = self.acl.verify_api_token(authorization)
            data, total = self._dispatch(verb, rel, params, authid)
        except PVEError as exc:
            return self.error_response(exc)
        except Exception as exc:  # a bug in the server: say so, like PVE's 500 with the die text
            traceback.print_exc()
            return self.error_response(fail(f"internal error in PVE test server: {exc!r}"))
        finally:
            self._drop_upload(uploaded)
        out: dict[str, Any] = {"data": data}
        if total is not None:
            out["total"] = total
        return Response(200, "OK", json.dumps(out, ensure_ascii=False).encode())

    @staticmethod
    def error_response(exc: PVEError) -> Response:
        if exc.status == 401:
            return Response(401, exc.reason, b"")
        out: dict[str, Any] = {"data": None, "message": exc.message}
        if exc.errors:
            out["errors"] = exc.errors
        return Response(exc.status, exc.reason, json.dumps(out, ensure_ascii=False).encode())

    def _drop_upload(self, token: Any) -> None:
        """An upload the handler did not take is removed with its request."""
        path = self.uploads.pop(str(token), None) if token else None
        if path is not None:
            path.unlink(missing_ok=True)

    def _multipart(self, body: bytes, content_type: str) -> dict[str, Any]:
        """pveproxy's upload: the file part is spooled to a temporary file; the handler gets its
        client-side name as ``filename`` and the spool as ``tmpfilename`` (/var/tmp/pveupload-*)."""
        # Split on the boundary with bytes operations: the email parser takes many seconds over an
        # OS template of a few hundred MB (the client's read timeout is 5 s); headers are parsed
        # per part, and they are small.
        head = BytesParser(policy=HTTP).parsebytes(
            b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n"
        )
        boundary = head.get_param("boundary")
        if (
            not head.get_content_type() == "multipart/form-data"
            or not isinstance(boundary, str)
            or not boundary
        ):
            raise PVEError(400, "malformed multipart/form-data body")
        delimiter = b"\r\n--" + boundary.encode("latin-1")
        chunks = (b"\r\n" + body).split(delimiter)
        if len(chunks) < 3 or not chunks[-1].startswith(b"--"):
            raise PVEError(400, "malformed multipart/form-data body")
        params: dict[str, Any] = {}
        for chunk in chunks[1:-1]:
            headers, sep, data = chunk.partition(b"\r\n\r\n")
            if not sep:
                raise PVEError(400, "malformed multipart/form-data part")
            part = BytesParser(policy=HTTP).parsebytes(headers.lstrip(b"\r\n") + b"\r\n\r\n")
            name = part.get_param("name", header="content-disposition")
            if not isinstance(name, str):
                raise PVEError(400, "multipart/form-data part without a name")
            filename = part.get_filename()
            if filename is None:
                params[name] = data.decode("utf-8", errors="replace")
                continue
            fd, spool = tempfile.mkstemp(prefix="pve-test-upload-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            token = "/var/tmp/pveupload-" + secrets.token_hex(16)
            self.uploads[token] = Path(spool)
            params[name] = filename
            params["tmpfilename"] = token
        return params

    def _params(self, verb: str, query: str, body: bytes, content_type: str | None) -> dict[str, Any]:
        params: dict[str, Any] = {}
        query_params = _decode_urlencoded(query)
        if "tmpfilename" in query_params:
            raise param_error({"tmpfilename": "only pveproxy sets this (upload a file instead)"})
        if body:
            if verb not in ("PUT", "POST"):
                raise PVEError(501, f"Unexpected content for method '{verb}'")
            ctype = (content_type or "").split(";")[0].strip().lower()
            if ctype == "multipart/form-data":
                params = self._multipart(body, content_type or "")
            elif ctype == "application/json":
                try:
                    decoded = json.loads(body.decode("utf-8"))
                except ValueError as exc:
                    raise PVEError(400, f"malformed JSON string: {exc}") from None
                if not isinstance(decoded, dict):
                    raise PVEError(400, "malformed JSON: not an object")
                params = decoded
            else:
                params = _decode_urlencoded(body.decode("utf-8", errors="replace"))
            if ctype != "multipart/form-data" and "tmpfilename" in params:
                raise param_error({"tmpfilename": "only pveproxy sets this (upload a file instead)"})
        params.update(query_params)
        params.pop("_dc", None)
        return params

    def _dispatch(self, verb: str, rel: str, params: dict[str, Any], authid: str) -> tuple[Any, int | None]:
        found = self.schema.match(rel)
        if found is None or verb not in found[1]:
            raise not_implemented(verb, rel)
        template, methods, uri = found
        method = methods[verb]
        merged: dict[str, Any] = dict(uri)
        for key in sorted(params):
            if key in uri and params[key] != uri[key]:
                raise param_error(
                    {key: "duplicate parameter (already defined in URI) with conflicting values!"}
                )
            merged[key] = params[key]
        if not method.allowtoken:
            raise PVEError(
                403,
                f"Permission check failed (URI '{rel}' not available with API token, "
                "need proper ticket.\n)\n",
            )
        with self.state.lock:
            self.acl.check_api2(method.permissions, authid, merged)
        if method.proxyto:
            self._check_node(str(merged.get(method.proxyto, "")))
        typed = method.validate(merged)
        self.sync_config_files()  # a CT's file may have changed on the node since the last call
        handler = HANDLERS.get((verb, template))
        if handler is None:
            raise not_implemented(verb, rel, f"by the PVE test server (schema method '{method.name}')")
        call = Call(self, authid, method, typed)
        data = handler(call)
        return data, call.total

    def _check_node(self, node: str) -> None:
        if node in ("localhost", ""):
            return
        if node not in self.state.nodes:
            raise fail(
                f"hostname lookup '{node}' failed - failed to get address info for: {node}: "
                "Name or service not known"
            )
        if self.faults.is_offline(node):
            raise PVEError(595, "Errors during connection establishment, proxy handler: No route to host")
