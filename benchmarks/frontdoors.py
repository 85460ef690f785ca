"""What each front door adds to a command: the same ``true`` in the same sandbox, in-process, over
the HTTP API (JSON and server-sent events, through ``sandbox_rt.remote.Client`` and raw HTTP), and
OpenSSH through a ControlMaster (the raw floor), measured in the same run.

    python -m benchmarks --only frontdoors

- ``exec_true``: ``Sandbox.exec('true')`` in-process (the runtime's own cost over SSH);
- ``http_exec_json``: ``remote.Client`` ``sb.exec('true')`` against ``ApiServer`` on loopback
  (FastAPI routes behind the gate, the hardened uvicorn transport, the answer checked by the client);
- ``http_exec_raw``: the same request with a kept-alive ``http.client`` connection (no client-side
  checks: what the server costs);
- ``http_exec_sse``: the streamed exec (``"stream": true``) read to its ``exit`` event;
- ``http_status``: ``GET /v1/sandboxes/{id}`` vs ``Sandbox.status()`` in-process;
- ``opensandbox_command``: the OpenSandbox dialect's execd ``POST .../proxy/44772/command`` (its
  own event stream, read to the end) on the dialect's port of the same server (issue 25: the
  dialect's added latency per command, against the native API in the same run);
- ``raw_openssh_controlmaster``: OpenSSH ``ssh true`` through a ControlMaster.
Samples alternate between the doors, so drift on a shared machine hits all alike.
"""

from __future__ import annotations

import http.client
import json
import secrets
import subprocess
from typing import Any

from sandbox_rt import remote
from sandbox_rt.web.opensandbox.state import execd_base_path
from sandbox_rt.web.server import ApiServer

from .context import Bench
from .raw import OpenSSH
from .stats import compare, summary, timed

__all__ = ["run"]

WHAT = {
    "exec_true": "Sandbox.exec('true') in-process",
    "http_exec_json": "remote.Client sb.exec('true') over the HTTP API",
    "http_exec_raw": "POST /v1/sandboxes/{id}/exec on a kept-alive connection",
    "http_exec_sse": "POST .../exec with stream=true, read to the exit event",
    "status": "Sandbox.status() in-process",
    "http_status": "GET /v1/sandboxes/{id} on a kept-alive connection",
    "opensandbox_command": "OpenSandbox execd POST /command (the dialect's port), read to the end",
    "raw_openssh_controlmaster": "OpenSSH `ssh true` through a ControlMaster",
}
RAW = {k for k in WHAT if k.startswith("raw_")}


def _request(
    conn: http.client.HTTPConnection, method: str, path: str, headers: dict[str, str], body: Any
) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={**headers, "Content-Type": "application/json"})
    answer = conn.getresponse()
    content = answer.read()
    if answer.status >= 300:
        raise RuntimeError(f"{method} {path}: HTTP {answer.status}: {content[:200]!r}")
    return content


def run(b: Bench) -> dict[str, Any]:
    count = max(b.opts.runs * 5, 20)
    res: dict[str, list[float]] = {k: [] for k in WHAT}
    token = secrets.token_urlsafe(32)
    auth = {"Authorization": f"Bearer {token}"}
    with b.sandbox() as sb, ApiServer(b.mgr, token=token, port=0, opensandbox_port=0) as server:
        ossh = OpenSSH(sb.ip, sb.record.host_key, b.settings.ssh_key, b.settings.ssh_user, b.tmp / "doors")
        exec_path = f"/v1/sandboxes/{sb.id}/exec"
        conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
        assert server.opensandbox_url is not None
        dialect_port = int(server.opensandbox_url.rsplit(":", 1)[1])
        dialect = http.client.HTTPConnection(server.host, dialect_port, timeout=60)
        command_path = execd_base_path(sb.id) + "/command"
        with ossh.master(), remote.Client(server.url, token=token) as client:
            rsb = client.attach(sb.id)
            # warm every door once: sshd's post-auth set-up, the server's attach, imports, threads
            sb.exec("true")
            rsb.exec("true")
            _request(conn, "POST", exec_path, auth, {"command": "true"})
            _request(dialect, "POST", command_path, auth, {"command": "true"})
            subprocess.run(ossh.ssh("true", mux=True), check=True, capture_output=True)
            for _ in range(count):
                b.checkpoint()
                res["exec_true"].append(timed(lambda: sb.exec("true")))
                res["http_exec_json"].append(timed(lambda: rsb.exec("true")))
                res["http_exec_raw"].append(
                    timed(lambda: _request(conn, "POST", exec_path, auth, {"command": "true"}))
                )
                sse = timed(
                    lambda: _request(conn, "POST", exec_path, auth, {"command": "true", "stream": True})
                )
                res["http_exec_sse"].append(sse)
                res["status"].append(timed(sb.status))
                res["http_status"].append(
                    timed(lambda: _request(conn, "GET", f"/v1/sandboxes/{sb.id}", auth, None))
                )
                res["opensandbox_command"].append(
                    timed(lambda: _request(dialect, "POST", command_path, auth, {"command": "true"}))
                )
                res["raw_openssh_controlmaster"].append(
                    timed(lambda: subprocess.run(ossh.ssh("true", mux=True), check=True, capture_output=True))
                )
        conn.close()
        dialect.close()
    measures = {k: summary(v, WHAT[k], raw=k in RAW) for k, v in res.items()}
    comparisons = [
        compare(measures, "exec_true", "raw_openssh_controlmaster"),
        compare(measures, "http_exec_json", "raw_openssh_controlmaster"),
        compare(measures, "http_exec_json", "exec_true", against="variant"),
        compare(measures, "http_exec_raw", "exec_true", against="variant"),
        compare(measures, "http_exec_sse", "exec_true", against="variant"),
        compare(measures, "http_status", "status", against="variant"),
        compare(measures, "opensandbox_command", "http_exec_sse", against="variant"),
    ]
    return {"measures": measures, "comparisons": comparisons, "facts": {"samples": count}}
