"""Background commands over HTTP (/v1/sandboxes/{id}/processes), on the fake runtime of
test_http_api: start, list, one, logs from offsets, stdin, wait, kill, and the errors."""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest
import requests
from test_http_api import FakeManager, api, error_of, make_box, mgr, server  # noqa: F401

Api = Callable[..., requests.Response]


def start(call: Api, sid: str, **body: object) -> dict[str, object]:
    r = call("POST", f"/v1/sandboxes/{sid}/processes", json=body)
    assert r.status_code == 201, r.text
    assert r.headers["Location"] == f"/v1/sandboxes/{sid}/processes/{r.json()['pid']}"
    data: dict[str, object] = r.json()
    return data


def test_start_list_and_one(api: Api, mgr: FakeManager) -> None:  # noqa: F811
    sid = make_box(api)
    p = start(api, sid, command=["python3", "-m", "http.server"], cwd="/tmp", env={"A": "1"})
    assert p == {"pid": 100, "handle": f"{100:016x}", "command": "python3 -m http.server", "running": True,
                 "exit_code": None}  # fmt: skip
    proc = mgr.boxes[sid].processes[100]
    assert (proc.cwd, proc.env) == ("/tmp", {"A": "1"})
    start(api, sid, command="sleep 1")
    r = api("GET", f"/v1/sandboxes/{sid}/processes")
    assert r.status_code == 200 and [q["pid"] for q in r.json()["processes"]] == [101, 100]
    r = api("GET", f"/v1/sandboxes/{sid}/processes/100")
    assert r.status_code == 200 and r.json()["running"] is True
    r = api("GET", f"/v1/sandboxes/{sid}/processes/4242")
    assert r.status_code == 404 and error_of(r)["type"] == "ProcessNotFound"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({}, "'command' is required"),
        ({"command": ""}, "'command' must be a non-empty string"),
        ({"command": "x", "cwd": 3}, "'cwd' must be a string"),
        ({"command": "x", "env": {"A": 1}}, "'env' must be an object whose values are strings"),
        ({"command": "x", "stdin": "y"}, "unknown field(s) in the process body: stdin"),
    ],
)
def test_start_validation_names_the_field(api: Api, body: dict[str, object], needle: str) -> None:  # noqa: F811
    sid = make_box(api)
    r = api("POST", f"/v1/sandboxes/{sid}/processes", json=body)
    assert r.status_code == 400 and needle in error_of(r)["message"], r.text


def test_logs_from_offsets_bounded_and_in_either_encoding(api: Api, mgr: FakeManager) -> None:  # noqa: F811
    sid = make_box(api)
    start(api, sid, command="x")
    proc = mgr.boxes[sid].processes[100]
    proc.out, proc.err = b"hello \xff world", b"warn"
    url = f"/v1/sandboxes/{sid}/processes/100/logs"
    r = api("GET", url)
    assert r.json() == {"encoding": "utf-8", "stdout": "hello \ufffd world", "stderr": "warn",
                        "stdout_offset": 13, "stderr_offset": 4}  # fmt: skip
    proc.out += b"!"
    r = api("GET", url, params={"stdout_offset": 13, "stderr_offset": 4})
    assert (r.json()["stdout"], r.json()["stderr"], r.json()["stdout_offset"]) == ("!", "", 14)
    r = api("GET", url, params={"max_bytes": 3, "encoding": "base64"})
    data = r.json()
    assert base64.b64decode(data["stdout"]) == b"hel" and data["stdout_offset"] == 3
    for query, needle in (
        ({"stdout_offset": -1}, "stdout_offset"),
        ({"max_bytes": 0}, "max_bytes"),
        ({"encoding": "latin-1"}, "utf-8 or base64"),
        ({"offset": 1}, "unknown query parameter 'offset'"),
    ):
        r = api("GET", url, params=query)
        assert r.status_code == 400 and needle in error_of(r)["message"], (query, r.text)


def test_stdin_wait_and_kill(api: Api, mgr: FakeManager) -> None:  # noqa: F811
    sid = make_box(api)
    start(api, sid, command="cat")
    proc = mgr.boxes[sid].processes[100]
    base = f"/v1/sandboxes/{sid}/processes/100"
    assert api("POST", f"{base}/stdin", data=b"line\x00\n").status_code == 204
    assert proc.stdin == b"line\x00\n"
    assert api("DELETE", f"{base}/stdin").status_code == 204 and not proc.stdin_open
    r = api("POST", f"{base}/stdin", data=b"more")
    assert r.status_code == 409 and "closed" in error_of(r)["message"]
    r = api("POST", f"{base}/wait", json={"timeout": 0.5})
    assert r.status_code == 504 and error_of(r)["code"] == "command_timeout"
    r = api("POST", f"{base}/kill", json={"signal": 15})
    assert r.status_code == 200 and r.json()["exit_code"] == 143 and r.json()["running"] is False
    assert proc.signals == [15]
    r = api("POST", f"{base}/wait")
    assert r.status_code == 200 and r.json() == {"pid": 100, "exit_code": 143}
    assert api("POST", f"{base}/kill").status_code == 200 and proc.signals == [15, 9]  # SIGKILL by default
    for body in ({"signal": 0}, {"signal": "TERM"}, {"signal": 99}):
        r = api("POST", f"{base}/kill", json=body)
        assert r.status_code == 400, body


@pytest.mark.parametrize("pid", ["1", "0", "x", str(1 << 23)])
def test_a_pid_out_of_range_is_400(api: Api, pid: str) -> None:  # noqa: F811
    sid = make_box(api)
    r = api("GET", f"/v1/sandboxes/{sid}/processes/{pid}")
    assert r.status_code == 400 and "pid" in error_of(r)["message"]
