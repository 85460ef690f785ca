"""The call sequence of the seed's Go OpenSandbox client (../shared/seeds/opensandbox-go-client.txt),
in raw HTTP against ``sandbox-rt serve --opensandbox-port`` on real LXC sandboxes: CreateSandbox
(202, then WaitReady polls GetSandbox until Running), DiscoverExecD (the endpoint of port 44772 and
its headers), Ping, RunCommand (execd's event stream), UploadFiles (multipart: a metadata part,
then the file), SearchFiles, DownloadFile (whole and a Range), DeleteSandbox (204). No SDK: what a
client in another language sends and reads."""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests

import sandbox_rt
from sandbox_rt.web.server import ApiServer
from tests.integration.prepared import labelled_manager

pytestmark = pytest.mark.slow

TOKEN = secrets.token_urlsafe(32)
KEY = {"OPEN-SANDBOX-API-KEY": TOKEN}
TAG = uuid.uuid4().hex[:12]


@pytest.fixture(scope="module")
def manager() -> Iterator[sandbox_rt.Manager]:
    with labelled_manager({"go-sequence": TAG}) as mgr:
        yield mgr


@pytest.fixture(scope="module")
def lifecycle(manager: sandbox_rt.Manager) -> Iterator[str]:
    with ApiServer(manager, token=TOKEN, port=0, opensandbox_port=0) as srv:
        assert srv.opensandbox_url is not None
        yield srv.opensandbox_url + "/v1"


def _events(body: bytes) -> list[dict[str, Any]]:
    """execd's stream: one JSON object per event (SSE ``data:`` lines or bare JSON lines)."""
    out: list[dict[str, Any]] = []
    for line in body.decode().splitlines():
        line = line.removeprefix("data:").strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def test_the_go_clients_sequence(lifecycle: str) -> None:
    body = {
        "image": {"uri": "default"},
        "entrypoint": ["tail", "-f", "/dev/null"],
        "env": {"GREETING": "hello"},
        "metadata": {"go-sequence": TAG},
        "timeout": 600,
        "resourceLimits": {"cpu": "500m", "memory": "256Mi"},
    }
    r = requests.post(f"{lifecycle}/sandboxes", json=body, headers=KEY, timeout=120)
    assert r.status_code == 202, r.text
    sid = r.json()["id"]
    try:
        deadline = time.monotonic() + 60  # WaitReady
        while (state := requests.get(f"{lifecycle}/sandboxes/{sid}", headers=KEY, timeout=30).json())[
            "status"
        ]["state"] != "Running":
            assert time.monotonic() < deadline, state
            time.sleep(0.2)  # the client's own poll interval: a client behaviour, not a synchronisation
        assert state["metadata"]["go-sequence"] == TAG
        listed = requests.get(
            f"{lifecycle}/sandboxes", params={"metadata": f"go-sequence={TAG}"}, headers=KEY, timeout=30
        )
        assert [s["id"] for s in listed.json()["items"]] == [sid]

        ep = requests.get(f"{lifecycle}/sandboxes/{sid}/endpoints/44772", headers=KEY, timeout=30).json()
        base = ep["endpoint"] if ep["endpoint"].startswith("http") else f"http://{ep['endpoint']}"
        headers = {**KEY, **(ep.get("headers") or {})}
        assert requests.get(f"{base}/ping", headers=headers, timeout=30).status_code == 200

        r = requests.post(
            f"{base}/command",
            json={
                "command": 'echo "$GREETING from $(pwd)"; echo oops >&2; exit 3',
                "cwd": "/tmp",
                "timeout": 30000,
            },
            headers=headers,
            timeout=60,
        )
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _events(r.content)
        kinds = [e.get("type") for e in events]
        stdout = "".join(e.get("text", "") for e in events if e.get("type") == "stdout")
        stderr = "".join(e.get("text", "") for e in events if e.get("type") == "stderr")
        assert stdout.strip() == "hello from /tmp" and stderr.strip() == "oops", events
        assert kinds[0] == "init" and kinds[-1] in ("error", "execution_complete"), kinds

        meta = json.dumps({"path": "/tmp/up/a.txt", "mode": 644})
        files = [
            ("metadata", ("metadata", meta, "application/json")),
            ("file", ("a.txt", b"0123456789", "application/octet-stream")),
        ]
        r = requests.post(f"{base}/files/upload", files=files, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        found = requests.get(
            f"{base}/files/search",
            params={"path": "/tmp/up", "pattern": "*.txt"},
            headers=headers,
            timeout=30,
        )
        assert found.status_code == 200 and [f["path"] for f in found.json()] == ["/tmp/up/a.txt"], found.text
        whole = requests.get(
            f"{base}/files/download", params={"path": "/tmp/up/a.txt"}, headers=headers, timeout=30
        )
        assert whole.status_code == 200 and whole.content == b"0123456789"
        part = requests.get(
            f"{base}/files/download",
            params={"path": "/tmp/up/a.txt"},
            headers={**headers, "Range": "bytes=2-4"},
            timeout=30,
        )
        assert part.status_code == 206 and part.content == b"234"
    finally:
        r = requests.delete(f"{lifecycle}/sandboxes/{sid}", headers=KEY, timeout=120)
    assert r.status_code == 204
    assert requests.get(f"{lifecycle}/sandboxes/{sid}", headers=KEY, timeout=30).status_code == 404
