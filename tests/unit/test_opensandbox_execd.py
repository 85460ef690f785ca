"""OpenSandbox's execd and egress ``/policy`` on the dialect's port (issue 25 item 3), against a
runtime fake whose sandboxes run commands with the local bash (tests/unit/execd_fake.py): raw HTTP
for the framing (SSE events, multipart, ranges, errors), the pure parsers and mappings directly,
and the published ``opensandbox`` SDK's execd clients pointed at the route the lifecycle API names.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.exceptions import SandboxException
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.execd_sync import ExecutionHandlersSync
from opensandbox.models.filesystem import (
    ContentReplaceEntry,
    DirectoryListEntry,
    MoveEntry,
    SearchEntry,
    SetPermissionEntry,
    WriteEntry,
)
from opensandbox.models.sandboxes import NetworkRule, SandboxEndpoint
from opensandbox.sync.adapters.factory import AdapterFactorySync

from sandbox_rt import ConfigError, ExecResult
from sandbox_rt.web.errors import HttpError
from sandbox_rt.web.opensandbox import execd, state
from sandbox_rt.web.opensandbox.egress_policy import Rule, merge_rules, remove_targets, rules_of, to_egress
from sandbox_rt.web.opensandbox.execd_download import byte_range
from sandbox_rt.web.opensandbox.execd_models import octal_mode
from sandbox_rt.web.opensandbox.execd_multipart import boundary_of, parse_multipart
from sandbox_rt.web.opensandbox.execd_runtime import EGRESS_PREFIX, EXECD_PREFIX
from sandbox_rt.web.opensandbox.execd_sessions import STATE_MAX, StateError, parse_state
from sandbox_rt.web.server import ApiServer
from tests.unit.execd_fake import LocalManager
from tests.unit.test_http_api import TOKEN

KEY = {"OPEN-SANDBOX-API-KEY": TOKEN}


# -- fixtures ----------------------------------------------------------------------------------------
@pytest.fixture
def mgr(tmp_path: Path) -> LocalManager:
    return LocalManager(tmp_path / "boxes")


@pytest.fixture
def server(mgr: LocalManager) -> Iterator[ApiServer]:
    with ApiServer(mgr, token=TOKEN, port=0, opensandbox_port=0) as srv:
        yield srv


@pytest.fixture
def sid(mgr: LocalManager) -> str:
    return mgr.create().id


@pytest.fixture
def base(server: ApiServer, sid: str) -> str:
    assert server.opensandbox_url is not None
    return server.opensandbox_url + state.execd_base_path(sid)


@pytest.fixture
def http() -> Iterator[requests.Session]:
    session = requests.Session()
    session.headers.update(KEY)
    yield session
    session.close()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The directory the tests' files live in (the fake sandbox sees the host's paths)."""
    d = tmp_path / "work"
    d.mkdir()
    return d


def frames(body: bytes) -> list[dict[str, Any]]:
    """execd's framing: JSON objects, each followed by a blank line (no ``data:`` prefix)."""
    assert body.endswith(b"\n\n"), body[-80:]
    return [json.loads(f) for f in body.split(b"\n\n") if f]


def error_of(r: requests.Response, status: int, code: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"code", "message"} and body["code"] == code, body
    return str(body["message"])


def run(http: requests.Session, base: str, **body: Any) -> list[dict[str, Any]]:
    r = http.post(base + "/command", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/event-stream")
    return frames(r.content)


def output(events: list[dict[str, Any]], kind: str = "stdout") -> str:
    return "".join(e["text"] for e in events if e["type"] == kind)


def wait_for(predicate: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


# -- routes ------------------------------------------------------------------------------------------
def test_routes_follow_the_base_paths_state_names() -> None:
    assert state.execd_base_path("sbx-0123456789") == EXECD_PREFIX.replace("{id}", "sbx-0123456789")
    assert state.egress_base_path("sbx-0123456789") == EGRESS_PREFIX.replace("{id}", "sbx-0123456789")
    paths = {getattr(r, "path", "") for r in execd.router.routes}
    for tail in (
        "/ping",
        "/command",
        "/session",
        "/files/upload",
        "/directories/list",
        "/metrics",
        "/policy",
    ):
        assert EXECD_PREFIX + tail in paths, tail
    assert EGRESS_PREFIX + "/policy" in paths


def test_ping_needs_the_key_and_a_known_sandbox(http: requests.Session, base: str, server: ApiServer) -> None:
    assert http.get(base + "/ping").status_code == 200
    r = requests.get(base + "/ping", timeout=10)
    error_of(r, 401, "UNAUTHORIZED")
    r = requests.get(base + "/ping", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert r.status_code == 200 and r.headers["X-Request-ID"]
    other = f"{server.opensandbox_url}{state.execd_base_path('sbx-00000000ff')}/ping"
    error_of(http.get(other), 404, "NOT_FOUND")
    error_of(http.get(base + "/nothing"), 404, "NOT_FOUND")


# -- foreground commands -----------------------------------------------------------------------------
def test_a_command_streams_execd_events_in_order(http: requests.Session, base: str) -> None:
    r = http.post(base + "/command", json={"command": "echo a; echo b >&2; sleep 0.1; echo c"}, timeout=30)
    assert not r.content.startswith(b"data:"), "execd's framing is bare JSON + a blank line"
    events = frames(r.content)
    assert events[0]["type"] == "init" and events[0]["text"].startswith("cmd-")
    assert all(isinstance(e["timestamp"], int) for e in events)
    assert output(events) == "a\nc\n" and output(events, "stderr") == "b\n"
    kinds = [e["type"] for e in events]
    assert kinds.index("stderr") < max(i for i, k in enumerate(kinds) if k == "stdout")
    assert events[-1]["type"] == "execution_complete" and events[-1]["execution_time"] >= 100
    status = http.get(f"{base}/command/status/{events[0]['text']}").json()
    assert status["running"] is False and status["exit_code"] == 0 and status["finished_at"].endswith("Z")
    assert status["content"] == "echo a; echo b >&2; sleep 0.1; echo c"


def test_a_non_zero_exit_is_an_error_event_carrying_the_status(http: requests.Session, base: str) -> None:
    events = run(http, base, command="echo out; exit 3")
    assert output(events) == "out\n"
    last = events[-1]
    assert last["type"] == "error" and last["error"]["ename"] == "CommandExecError"
    assert last["error"]["evalue"] == "3"
    assert not any(e["type"] == "execution_complete" for e in events)


def test_env_merges_over_the_create_time_env_and_cwd_is_honoured(
    http: requests.Session, base: str, sid: str, work: Path, mgr: LocalManager
) -> None:
    state.put_notes(sid, state.SandboxNotes(env={"GREETING": "hi", "WHO": "default"}))
    try:
        events = run(http, base, command='echo "$GREETING $WHO"; pwd', cwd=str(work), envs={"WHO": "me"})
    finally:
        state.drop_notes(sid)
    assert output(events) == f"hi me\n{work}\n"
    env = next(c[1]["env"] for c in mgr.handed[-1].calls if c[0] == "exec_stream")
    assert env["SANDBOX_RT_EXECD_ID"].startswith("cmd-")


def test_an_argv_command_is_quoted_word_by_word(http: requests.Session, base: str) -> None:
    events = run(http, base, argv=["printf", "%s|", "a b", "$HOME"])
    assert output(events) == "a b|$HOME|"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"command": "true", "argv": ["true"]}, "exactly one of"),
        ({}, "exactly one of"),
        ({"command": "  "}, "empty"),
        ({"command": "true", "cwd": "relative"}, "absolute"),
        ({"command": "true", "uid": 1000}, "uid=1000"),
        ({"command": "true", "gid": 0}, "gid needs uid"),
        ({"command": "true", "timeout": "5"}, "'timeout' must be a whole number"),
        ({"command": "true", "envs": {"1BAD": "x"}}, "not valid"),
        ({"command": "true", "shell": "zsh"}, "unknown field"),
        ({"command": "true", "background": True, "uid": 0}, "background commands run as the sandbox user"),
    ],
)
def test_a_bad_command_request_is_a_clear_400(
    http: requests.Session, base: str, body: dict[str, Any], needle: str
) -> None:
    r = http.post(base + "/command", json=body)
    assert needle in error_of(r, 400, "INVALID_REQUEST")


def test_a_command_past_its_timeout_ends_with_a_timeout_error(http: requests.Session, base: str) -> None:
    events = run(http, base, command="echo started; sleep 5", timeout=400)
    assert output(events) == "started\n"
    assert events[-1]["type"] == "error" and events[-1]["error"]["ename"] == "CommandTimeout"
    status = http.get(f"{base}/command/status/{events[0]['text']}").json()
    assert status["running"] is False and "timed out" in status["error"]


def _stream_in_thread(
    http: requests.Session, url: str, body: dict[str, Any]
) -> tuple[threading.Thread, list[Any]]:
    got: list[Any] = []

    def reader() -> None:
        with requests.post(url, json=body, headers=KEY, stream=True, timeout=30) as r:
            for line in r.iter_lines(delimiter=b"\n\n"):
                if line:
                    got.append(json.loads(line))

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    return thread, got


def test_interrupt_stops_a_foreground_command_and_its_children(http: requests.Session, base: str) -> None:
    thread, got = _stream_in_thread(
        http, base + "/command", {"command": "sleep 30.417 & sleep 31.417; echo never"}
    )
    init = wait_for(lambda: got and got[0])
    assert http.get(f"{base}/command/status/{init['text']}").json()["running"] is True
    started = time.monotonic()
    r = http.delete(base + "/command", params={"id": init["text"]})
    assert r.status_code == 200, r.text
    thread.join(10)
    assert time.monotonic() - started < 5
    assert got[-1]["type"] == "error" and got[-1]["error"]["evalue"] in ("143", "137")
    assert "never" not in output(got)
    status = http.get(f"{base}/command/status/{init['text']}").json()
    assert status["running"] is False
    assert os.system("pgrep -f 'sleep 3[01][.]417$' >/dev/null") != 0, "the background child is gone too"
    # interrupting what has ended is fine; an unknown id is a 404
    assert http.delete(base + "/command", params={"id": init["text"]}).status_code == 200
    error_of(http.delete(base + "/command", params={"id": "cmd-nope"}), 404, "NOT_FOUND")
    error_of(http.get(f"{base}/command/status/cmd-nope"), 404, "NOT_FOUND")


def test_a_client_that_goes_away_leaves_the_command_running_to_its_end(
    http: requests.Session, base: str
) -> None:
    with http.post(base + "/command", json={"command": "sleep 0.5; echo done"}, stream=True, timeout=30) as r:
        first = next(r.iter_lines(delimiter=b"\n\n"))
    command_id = json.loads(first)["text"]
    status = wait_for(
        lambda: (s := http.get(f"{base}/command/status/{command_id}").json())["running"] is False and s
    )
    assert status["exit_code"] == 0


# -- background commands -----------------------------------------------------------------------------
def test_a_background_command_has_a_status_and_a_log_read_by_cursor(
    http: requests.Session, base: str, work: Path
) -> None:
    events = run(
        http,
        base,
        command="echo one; echo two >&2; sleep 0.3; echo three; exit 5",
        background=True,
        cwd=str(work),
    )
    assert [e["type"] for e in events] == ["init", "execution_complete"]
    command_id = events[0]["text"]
    assert command_id.startswith("bg-")
    status = http.get(f"{base}/command/status/{command_id}").json()
    assert status["running"] is True and status["exit_code"] is None and status["finished_at"] is None
    done = wait_for(
        lambda: (s := http.get(f"{base}/command/status/{command_id}").json())["running"] is False and s
    )
    assert done["exit_code"] == 5 and done["content"].startswith("echo one")
    r = http.get(f"{base}/command/{command_id}/logs")
    assert r.text == "one\ntwo\nthree\n", "stderr goes into the one log, in order"
    assert r.headers["EXECD-COMMANDS-TAIL-CURSOR"] == str(len(r.content))
    r = http.get(f"{base}/command/{command_id}/logs", params={"cursor": 4})
    assert r.text == "two\nthree\n" and r.headers["EXECD-COMMANDS-TAIL-CURSOR"] == "14"
    r = http.get(f"{base}/command/{command_id}/logs", params={"cursor": 14})
    assert r.text == "" and r.headers["EXECD-COMMANDS-TAIL-CURSOR"] == "14"
    assert "cursor" in error_of(
        http.get(f"{base}/command/{command_id}/logs", params={"cursor": -1}), 400, "INVALID_REQUEST"
    )


def test_a_background_command_is_interrupted_and_a_timeout_kills_it(
    http: requests.Session, base: str
) -> None:
    command_id = run(http, base, command="sleep 30", background=True)[0]["text"]
    assert http.delete(base + "/command", params={"id": command_id}).status_code == 200
    status = http.get(f"{base}/command/status/{command_id}").json()
    assert status["running"] is False and status["exit_code"] == 143
    command_id = run(http, base, command="echo hi; sleep 30", background=True, timeout=300)[0]["text"]
    done = wait_for(
        lambda: (s := http.get(f"{base}/command/status/{command_id}").json())["running"] is False and s
    )
    assert done["exit_code"] == 124
    # the id names the process: a made-up one is a 404, a foreground one has no log
    error_of(http.get(f"{base}/command/status/bg-0123456789abcdef-4000000"), 404, "NOT_FOUND")
    foreground = run(http, base, command="true")[0]["text"]
    assert "foreground" in error_of(http.get(f"{base}/command/{foreground}/logs"), 400, "INVALID_REQUEST")


# -- bash sessions -----------------------------------------------------------------------------------
def test_a_session_keeps_its_directory_and_exports_between_runs(
    http: requests.Session, base: str, work: Path
) -> None:
    (work / "sub").mkdir()
    r = http.post(base + "/session", json={"cwd": str(work)})
    assert r.status_code == 200, r.text
    session = r.json()["session_id"]

    def srun(command: str, **extra: Any) -> list[dict[str, Any]]:
        r = http.post(f"{base}/session/{session}/run", json={"command": command, **extra}, timeout=30)
        assert r.status_code == 200, r.text
        return frames(r.content)

    assert output(srun("pwd; cd sub; export A=1 B='two words'; C=local")) == f"{work}\n"
    events = srun('pwd; echo "$A|$B|${C:-unset}"')
    assert output(events) == f"{work}/sub\n1|two words|unset\n"
    assert events[-1]["type"] == "execution_complete"
    srun("unset A; cd ..")
    assert output(srun('echo "${A:-gone} $B"; pwd')) == f"gone two words\n{work}\n"
    events = srun("export D=4; exit 4")
    assert events[-1]["error"]["evalue"] == "4"
    assert output(srun('echo "$D"')) == "4\n", "an exit saves the state too"
    assert output(srun("pwd", cwd=str(work / "sub"))) == f"{work}/sub\n"
    srun(f"export HOME={work}/home E=5")  # the state is saved under the HOME the run started with
    assert output(srun('echo "$HOME $E"; export E=6')) == f"{work}/home 5\n"
    assert output(srun('echo "$E"')) == "6\n"
    assert http.delete(f"{base}/session/{session}").status_code == 200
    error_of(http.post(f"{base}/session/{session}/run", json={"command": "true"}), 404, "NOT_FOUND")
    error_of(http.delete(f"{base}/session/{session}"), 404, "NOT_FOUND")


def test_a_session_runs_one_command_at_a_time(http: requests.Session, base: str) -> None:
    session = http.post(base + "/session").json()["session_id"]
    thread, got = _stream_in_thread(http, f"{base}/session/{session}/run", {"command": "sleep 1"})
    wait_for(lambda: got)
    r = http.post(f"{base}/session/{session}/run", json={"command": "true"})
    assert "wait for it" in error_of(r, 409, "CONFLICT")
    thread.join(10)
    assert got[-1]["type"] == "execution_complete"
    r = http.post(f"{base}/session/{session}/run", json={"command": "true"})
    assert r.status_code == 200


def test_session_state_is_parsed_strictly() -> None:
    cwd, env = parse_state(b"/home/u\n\0A=1\0B=x=y\0PWD=/x\0_=/bin/env\0bad name=1\0C=\xff\0")
    assert cwd == "/home/u" and env == {"A": "1", "B": "x=y"}
    for raw in (b"", b"/home/u\n", b"rel\n\0A=1\0", b"/home/u\n\0A=1", b"\xff\n\0"):
        with pytest.raises(StateError):
            parse_state(raw)
    with pytest.raises(StateError, match="larger"):
        parse_state(b"/\n\0" + b"A=" + b"x" * STATE_MAX + b"\0")


def test_a_session_too_large_to_carry_stays_as_it_was(http: requests.Session, base: str) -> None:
    session = http.post(base + "/session").json()["session_id"]
    url = f"{base}/session/{session}/run"
    frames(http.post(url, json={"command": "export KEEP=1"}).content)
    events = frames(
        http.post(url, json={"command": "export BIG=$(head -c 70000 /dev/zero | tr '\\0' x)"}).content
    )
    assert "not saved" in output(events, "stderr")
    assert output(frames(http.post(url, json={"command": 'echo "$KEEP ${#BIG}"'}).content)) == "1 0\n"


# -- files -------------------------------------------------------------------------------------------
def test_files_info_reports_execd_file_infos(http: requests.Session, base: str, work: Path) -> None:
    (work / "f.txt").write_bytes(b"12345")
    os.chmod(work / "f.txt", 0o640)
    (work / "link").symlink_to(work / "f.txt")
    r = http.get(
        base + "/files/info",
        params=[("path", str(work / "f.txt")), ("path", str(work)), ("path", str(work / "link"))],
    )
    assert r.status_code == 200, r.text
    info = r.json()
    f = info[str(work / "f.txt")]
    assert f["type"] == "file" and f["size"] == 5 and f["mode"] == 640 and f["path"] == str(work / "f.txt")
    assert f["owner"] and f["group"] and f["modified_at"].endswith("Z") and f["created_at"].endswith("Z")
    assert info[str(work)]["type"] == "directory" and info[str(work / "link")]["type"] == "symlink"
    error_of(http.get(base + "/files/info", params={"path": str(work / "missing")}), 404, "NOT_FOUND")
    assert "absolute" in error_of(
        http.get(base + "/files/info", params={"path": "rel"}), 400, "INVALID_REQUEST"
    )
    error_of(http.get(base + "/files/info"), 400, "INVALID_REQUEST")


def _multipart(files: list[tuple[dict[str, Any], bytes]]) -> list[tuple[str, tuple[str, bytes, str]]]:
    out = []
    for meta, data in files:
        out.append(("metadata", ("metadata", json.dumps(meta).encode(), "application/json")))
        out.append(("file", (os.path.basename(meta["path"]), data, "application/octet-stream")))
    return out


def test_upload_then_download_whole_and_by_range(http: requests.Session, base: str, work: Path) -> None:
    blob = bytes(range(256)) * 40
    target = work / "deep" / "blob.bin"
    r = http.post(
        base + "/files/upload",
        files=_multipart(
            [({"path": str(target), "mode": 600}, blob), ({"path": str(work / "t.txt")}, b"a\nb\nc\n")]
        ),
    )
    assert r.status_code == 200, r.text
    assert target.read_bytes() == blob and (target.stat().st_mode & 0o777) == 0o600
    r = http.get(base + "/files/download", params={"path": str(target)})
    assert r.status_code == 200 and r.content == blob
    assert r.headers["Content-Length"] == str(len(blob)) and r.headers["Accept-Ranges"] == "bytes"
    assert 'filename="blob.bin"' in r.headers["Content-Disposition"]
    r = http.get(base + "/files/download", params={"path": str(target)}, headers={"Range": "bytes=10-19"})
    assert r.status_code == 206 and r.content == blob[10:20]
    assert r.headers["Content-Range"] == f"bytes 10-19/{len(blob)}"
    r = http.get(base + "/files/download", params={"path": str(target)}, headers={"Range": "bytes=-5"})
    assert r.status_code == 206 and r.content == blob[-5:]
    r = http.get(
        base + "/files/download", params={"path": str(target)}, headers={"Range": f"bytes={len(blob)}-"}
    )
    error_of(r, 416, "RANGE_NOT_SATISFIABLE")
    assert r.headers["Content-Range"] == f"bytes */{len(blob)}"
    r = http.get(base + "/files/download", params={"path": str(work / "t.txt"), "offset": 2, "limit": 1})
    assert r.status_code == 200 and r.text == "b\n"
    error_of(http.get(base + "/files/download", params={"path": str(work)}), 409, "FILE_CONFLICT")
    error_of(http.get(base + "/files/download", params={"path": str(work / "nope")}), 404, "NOT_FOUND")


def test_a_file_that_cannot_be_read_is_an_error_before_the_answer_starts(
    http: requests.Session, base: str, work: Path, mgr: LocalManager
) -> None:
    (work / "secret").write_text("x")
    denied = b"tail: cannot open 'secret' for reading: Permission denied\n"
    mgr.lies = lambda text: ExecResult(text, b"", denied, 1, 0.0) if "tail -c" in text else None
    r = http.get(base + "/files/download", params={"path": str(work / "secret")})
    assert "permission denied" in error_of(r, 403, "FILE_PERMISSION_DENIED")


def test_a_download_larger_than_a_chunk_is_sent_in_chunks(
    http: requests.Session, base: str, work: Path, mgr: LocalManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox_rt.web.opensandbox import execd_download

    monkeypatch.setattr(execd_download, "CHUNK_BYTES", 1000)
    blob = os.urandom(4500)
    (work / "big").write_bytes(blob)
    r = http.get(
        base + "/files/download", params={"path": str(work / "big")}, headers={"Range": "bytes=100-"}
    )
    assert r.status_code == 206 and r.content == blob[100:]
    reads = [c for c in mgr.handed[-1].calls if c[0] == "exec" and "tail -c" in c[1]["command"]]
    assert len(reads) == 5


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        ("bytes=0-0", 10, (0, 0)),
        ("bytes=5-", 10, (5, 9)),
        ("bytes=-3", 10, (7, 9)),
        ("bytes=2-99", 10, (2, 9)),
    ],
)
def test_byte_ranges(header: str, size: int, expected: tuple[int, int]) -> None:
    assert byte_range(header, size) == expected


@pytest.mark.parametrize("header", ["bytes=10-", "bytes=5-2", "bytes=-0", "bytes=0-1,3-4"])
def test_unsatisfiable_byte_ranges_are_416(header: str) -> None:
    with pytest.raises(HttpError) as err:
        byte_range(header, 10)
    assert err.value.status == 416


@pytest.mark.parametrize("header", ["items=0-1", "bytes=a-b", "bytes=-", "bytes 0-1"])
def test_malformed_byte_ranges_are_400(header: str) -> None:
    with pytest.raises(ConfigError):
        byte_range(header, 10)


def test_upload_refuses_a_malformed_multipart_body(http: requests.Session, base: str, work: Path) -> None:
    url = base + "/files/upload"
    r = http.post(url, data=b"x", headers={"Content-Type": "application/octet-stream"})
    assert "multipart/form-data" in error_of(r, 400, "INVALID_REQUEST")
    r = http.post(url, files=[("file", ("f", b"x", "application/octet-stream"))])
    assert "without a metadata part" in error_of(r, 400, "INVALID_REQUEST")
    r = http.post(
        url, files=[("metadata", ("m", b'{"path": "rel"}', "application/json")), ("file", ("f", b"x"))]
    )
    assert "absolute" in error_of(r, 400, "INVALID_REQUEST")
    meta = json.dumps({"path": str(work / "x"), "mode": 999}).encode()
    r = http.post(url, files=[("metadata", ("m", meta, "application/json")), ("file", ("f", b"x"))])
    assert "octal" in error_of(r, 400, "INVALID_REQUEST")
    assert not (work / "x").exists()


def test_the_multipart_reader_is_strict() -> None:
    assert boundary_of('multipart/form-data; boundary="a b"') == b"a b"
    for bad in (
        "multipart/mixed; boundary=x",
        "multipart/form-data",
        "multipart/form-data; boundary=" + "x" * 71,
    ):
        with pytest.raises(ConfigError):
            boundary_of(bad)
    body = (
        b'preamble\r\n--B\r\nContent-Disposition: form-data; name="metadata"\r\n\r\n{}\r\n'
        b'--B\r\nContent-Disposition: form-data; name="file"; filename="a\\"b"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\nx\r\n--B\r\nContent-Type: text/plain\r\n\r\ny\r\n"
        b"--B--\r\nepilogue"
    )
    with pytest.raises(ConfigError, match="form-data"):  # the third part has no Content-Disposition
        parse_multipart(body, b"B")
    parts = parse_multipart(body.replace(b"--B\r\nContent-Type: text/plain\r\n\r\ny\r\n", b""), b"B")
    assert [(p.name, p.filename, p.data) for p in parts] == [("metadata", None, b"{}"), ("file", 'a"b', b"x")]
    for bad in (b"--B\r\nContent-Disposition: form-data; name=a\r\n\r\nx", b"nothing", b"--Bx"):
        with pytest.raises(ConfigError):
            parse_multipart(bad, b"B")
    part = b'--B\r\nContent-Disposition: form-data; name="a"\r\n\r\nx\r\n'
    assert len(parse_multipart(part + b"--B--", b"B", max_parts=1)) == 1
    with pytest.raises(ConfigError, match="more than 1 parts"):
        parse_multipart(part * 2 + b"--B--", b"B", max_parts=1)


def test_delete_move_chmod_and_replace(http: requests.Session, base: str, work: Path) -> None:
    (work / "a.txt").write_text("host localhost, localhost\n")
    (work / "d").mkdir()
    r = http.post(base + "/files/mv", json=[{"src": str(work / "a.txt"), "dest": str(work / "d" / "b.txt")}])
    assert r.status_code == 200 and (work / "d" / "b.txt").is_file()
    b = str(work / "d" / "b.txt")
    assert http.post(base + "/files/permissions", json={b: {"mode": 600}}).status_code == 200
    assert (work / "d" / "b.txt").stat().st_mode & 0o777 == 0o600
    r = http.post(
        base + "/files/replace", params={"verbose": "true"}, json={b: {"old": "localhost", "new": "0.0.0.0"}}
    )
    assert r.json() == {b: {"replacedCount": 2}}
    assert (work / "d" / "b.txt").read_text() == "host 0.0.0.0, 0.0.0.0\n"
    assert (work / "d" / "b.txt").stat().st_mode & 0o777 == 0o600, "the mode stays"
    r = http.post(base + "/files/replace", json={b: {"old": "", "new": "x"}})
    assert "'old'" in error_of(r, 400, "INVALID_REQUEST")
    r = http.post(base + "/files/replace", json={b: {"old": "zzz", "new": "x"}})
    assert r.status_code == 200 and r.content == b""
    assert "octal" in error_of(
        http.post(base + "/files/permissions", json={b: {"mode": 800}}), 400, "INVALID_REQUEST"
    )
    r = http.post(base + "/files/permissions", json={b: {"mode": 644, "owner": "no such user"}})
    assert "not a user" in error_of(r, 400, "INVALID_REQUEST")
    error_of(http.post(base + "/files/mv", json={"src": "/a", "dest": "/b"}), 400, "INVALID_REQUEST")
    r = http.delete(base + "/files", params={"path": str(work / "d")})
    assert "DELETE /directories" in error_of(r, 409, "FILE_CONFLICT")
    r = http.delete(base + "/files", params=[("path", b), ("path", str(work / "absent"))])
    assert r.status_code == 200 and not (work / "d" / "b.txt").exists()


def test_search_matches_names_below_a_directory(http: requests.Session, base: str, work: Path) -> None:
    for rel in ("a.py", "src/b.py", "src/deep/c.py", "src/d.txt", "x.py/inner.txt"):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text("x")
    r = http.get(base + "/files/search", params={"path": str(work), "pattern": "*.py"})
    assert r.status_code == 200, r.text
    assert [e["path"] for e in r.json()] == [str(work / p) for p in ("a.py", "src/b.py", "src/deep/c.py")]
    r = http.get(base + "/files/search", params={"path": str(work / "src"), "pattern": "**/*.txt"})
    assert [e["path"] for e in r.json()] == [str(work / "src/d.txt")]
    assert len(http.get(base + "/files/search", params={"path": str(work)}).json()) == 5
    r = http.get(base + "/files/search", params={"path": str(work), "pattern": "src/*.py"})
    assert "must match file names" in error_of(r, 400, "INVALID_REQUEST")
    error_of(http.get(base + "/files/search", params={"path": str(work / "none")}), 404, "NOT_FOUND")


def test_directories_list_create_and_remove(http: requests.Session, base: str, work: Path) -> None:
    new = str(work / "p" / "q" / "r")
    assert http.post(base + "/directories", json={new: {"mode": 700}}).status_code == 200
    assert os.path.isdir(new) and os.stat(new).st_mode & 0o777 == 0o700
    (work / "p" / "b.txt").write_text("b")
    (work / "p" / "A").mkdir()
    (work / "p" / "link").symlink_to(work)
    r = http.get(base + "/directories/list", params={"path": str(work / "p"), "depth": 2})
    assert r.status_code == 200, r.text
    listed = [(e["path"].removeprefix(str(work / "p")), e["type"]) for e in r.json()]
    assert listed == [
        ("/A", "directory"),
        ("/b.txt", "file"),
        ("/link", "symlink"),
        ("/q", "directory"),
        ("/q/r", "directory"),
    ]
    one = http.get(base + "/directories/list", params={"path": str(work / "p")}).json()
    assert len(one) == 4
    r = http.get(base + "/directories/list", params={"path": str(work / "p" / "link")})
    assert "symbolic link" in error_of(r, 400, "INVALID_REQUEST")
    error_of(
        http.get(base + "/directories/list", params={"path": str(work / "p" / "b.txt")}), 409, "FILE_CONFLICT"
    )
    error_of(http.get(base + "/directories/list", params={"path": str(work / "none")}), 404, "NOT_FOUND")
    error_of(
        http.get(base + "/directories/list", params={"path": str(work), "depth": 65}), 400, "INVALID_REQUEST"
    )
    assert (
        http.delete(
            base + "/directories", params=[("path", str(work / "p")), ("path", str(work / "gone"))]
        ).status_code
        == 200
    )
    assert not (work / "p").exists() and work.exists()


# -- hostile input: what a lying sandbox prints ------------------------------------------------------
def _record(
    path: bytes, kind: bytes = b"f", size: bytes = b"1", mode: bytes = b"644", user: bytes = b"u"
) -> bytes:
    return (
        b"\0".join([kind, size, b"1700000000.5", b"1700000000.5", b"1000", b"1000", user, b"g", mode, path])
        + b"\0"
    )


def test_a_listing_keeps_only_what_is_below_the_directory(
    http: requests.Session, base: str, work: Path, mgr: LocalManager
) -> None:
    root = str(work).encode()
    lies = (
        _record(root + b"/ok")
        + _record(b"/etc/passwd")  # outside
        + _record(root + b"/../escape")  # not a plain name
        + _record(root + b"/a/b/c")  # deeper than asked
        + _record(root + b"/\xff")  # not UTF-8
        + _record(root + b"/badmode", mode=b"9999")
        + _record(root + b"/name", user=b"x;rm -rf /")  # a user name that is not one: its number instead
        + b"f\0cut"
    )
    mgr.lies = lambda text: ExecResult(text, lies, b"", 0, 0.0) if "find -P" in text else None
    r = http.get(base + "/directories/list", params={"path": str(work), "depth": 2})
    assert r.status_code == 200, r.text
    got = r.json()
    assert [e["path"] for e in got] == [str(work / "name"), str(work / "ok")]
    assert got[0]["owner"] == "1000"


def test_a_listing_past_its_bound_is_413(
    http: requests.Session, base: str, work: Path, mgr: LocalManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox_rt.web.opensandbox import execd_fsinfo

    monkeypatch.setattr(execd_fsinfo, "LIST_MAX_ENTRIES", 3)
    for n in range(5):
        (work / f"f{n}").write_text("x")
    r = http.get(base + "/directories/list", params={"path": str(work)})
    assert "more than 3" in error_of(r, 413, "TOO_MANY_ENTRIES")
    mgr.lies = lambda text: (
        ExecResult(text, b"x" * 10, b"", 0, 0.0, stdout_dropped=1) if "find" in text else None
    )
    r = http.get(base + "/files/search", params={"path": str(work)})
    error_of(r, 413, "TOO_MANY_ENTRIES")


# -- metrics -----------------------------------------------------------------------------------------
def test_metrics_come_from_the_cgroup_the_host_reads(http: requests.Session, base: str) -> None:
    r = http.get(base + "/metrics")
    assert r.status_code == 200
    m = r.json()
    assert set(m) == {"cpu_count", "cpu_used_pct", "mem_total_mib", "mem_used_mib", "timestamp"}
    assert m["cpu_count"] == 1.0 and m["mem_total_mib"] == 1024.0 and m["mem_used_mib"] == 256.0
    assert 0 < m["cpu_used_pct"] <= 100
    with http.get(base + "/metrics/watch", stream=True, timeout=10) as r:
        lines = r.iter_lines()
        first, second = json.loads(next(lines)), json.loads(next(lines))
    assert second["timestamp"] - first["timestamp"] >= 900


# -- egress policy -----------------------------------------------------------------------------------
def test_egress_rules_map_exactly_or_not_at_all() -> None:
    assert rules_of(["pypi.org", "192.0.2.0/24"]) == [
        Rule("allow", "pypi.org"),
        Rule("allow", "*.pypi.org"),
        Rule("allow", "192.0.2.0/24"),
    ]
    assert to_egress("deny", rules_of(["pypi.org", "192.0.2.7"])) == (False, ["192.0.2.7", "pypi.org"])
    # covered names are redundant; a shadowing deny removes an allow whole
    rules = [Rule("allow", "example.com"), Rule("allow", "*.example.com"), Rule("allow", "a.example.com")]
    assert to_egress("deny", rules) == (False, ["example.com"])
    assert to_egress("deny", [Rule("deny", "x.org"), Rule("allow", "x.org")]) == (False, [])
    assert to_egress("deny", [Rule("allow", "x.org"), Rule("deny", "x.org"), Rule("allow", "*.x.org")])[
        1
    ] == ["x.org"]
    assert to_egress("allow", []) == (True, [])
    for default, bad, needle in [
        ("deny", [Rule("allow", "pypi.org")], "alone"),
        ("deny", [Rule("allow", "*.pypi.org")], "alone"),
        ("deny", [Rule("deny", "a.x.org"), *rules_of(["x.org"])], "exception"),
        ("deny", [Rule("deny", "10.0.0.1"), Rule("allow", "10.0.0.0/24")], "exception"),
        ("allow", [Rule("deny", "x.org")], "blocks nothing"),
        ("deny", [Rule("allow", "a.*.org")], "'*'"),
        ("deny", [Rule("allow", "not a name")], "egress entry"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            to_egress(default, bad)  # type: ignore[arg-type]
    merged = merge_rules(
        rules_of(["a.org"]), [Rule("deny", "a.org"), Rule("allow", "a.org"), Rule("allow", "b.org")]
    )
    assert merged == [Rule("deny", "a.org"), Rule("allow", "b.org"), Rule("allow", "*.a.org")]
    assert remove_targets(rules_of(["a.org", "b.org"]), ["A.org", "*.a.org", "c.org"]) == rules_of(["b.org"])


def test_policy_get_patch_delete(http: requests.Session, server: ApiServer, sid: str) -> None:
    for base_path in (state.egress_base_path(sid), state.execd_base_path(sid)):
        url = f"{server.opensandbox_url}{base_path}/policy"
        r = http.get(url)
        assert r.status_code == 200
        assert r.json()["policy"] == {"defaultAction": "deny", "egress": []}
        r = http.patch(
            url, json=[{"action": "allow", "target": "pypi.org"}, {"action": "allow", "target": "*.pypi.org"}]
        )
        assert r.status_code == 200, r.text
        assert r.json()["policy"]["egress"] == [
            {"action": "allow", "target": "pypi.org"},
            {"action": "allow", "target": "*.pypi.org"},
        ]
        r = http.patch(url, json=[{"action": "allow", "target": "files.org"}])
        assert "alone" in error_of(r, 400, "INVALID_REQUEST")
        assert len(http.get(url).json()["policy"]["egress"]) == 2, "a refused patch changes nothing"
        r = http.delete(url, json=["pypi.org", "*.pypi.org"])
        assert r.status_code == 200 and r.json()["policy"]["egress"] == []
        error_of(http.patch(url, json=[{"action": "maybe", "target": "x.org"}]), 400, "INVALID_REQUEST")
        error_of(http.patch(url, json=[]), 400, "INVALID_REQUEST")


def test_octal_modes_are_written_in_decimal_digits() -> None:
    assert (
        octal_mode(755) == 0o755
        and octal_mode(0) == 0
        and octal_mode(4755) == 0o4755
        and octal_mode(None) is None
    )
    for bad in (8, 799, 17777, -1):
        with pytest.raises(ConfigError):
            octal_mode(bad)


# -- the published SDK ---------------------------------------------------------------------------------
@pytest.fixture
def sdk(server: ApiServer, sid: str) -> AdapterFactorySync:
    return AdapterFactorySync(
        ConnectionConfigSync(api_key=TOKEN, use_server_proxy=True, request_timeout=timedelta(seconds=30))
    )


@pytest.fixture
def endpoint(server: ApiServer, sid: str) -> SandboxEndpoint:
    """What the lifecycle API's ``GET /v1/sandboxes/{id}/endpoints/44772`` answers."""
    assert server.opensandbox_url is not None
    authority = server.opensandbox_url.removeprefix("http://")
    return SandboxEndpoint(endpoint=authority + state.execd_base_path(sid), headers={})


def test_the_sdk_runs_commands_foreground_background_and_in_sessions(
    sdk: AdapterFactorySync, endpoint: SandboxEndpoint, work: Path
) -> None:
    commands = sdk.create_command_service(endpoint)
    seen: list[str] = []
    handlers = ExecutionHandlersSync(
        on_stdout=lambda m: seen.append("out:" + m.text), on_stderr=lambda m: seen.append("err:" + m.text)
    )
    ex = commands.run("echo one; sleep 0.05; echo two >&2; exit 0", handlers=handlers)
    assert ex.exit_code == 0 and ex.id and seen == ["out:one\n", "err:two\n"]
    ex = commands.run(
        "echo $X; pwd; exit 7", opts=RunCommandOpts(envs={"X": "y"}, working_directory=str(work))
    )
    assert ex.exit_code == 7 and "".join(m.text for m in ex.logs.stdout) == f"y\n{work}\n"
    ex = commands.run(["printf", "%s", "a b"])
    assert "".join(m.text for m in ex.logs.stdout) == "a b"
    bg = commands.run("echo bg; sleep 0.2", opts=RunCommandOpts(background=True))
    assert bg.id and bg.id.startswith("bg-")
    done = wait_for(lambda: (s := commands.get_command_status(bg.id or "")).running is False and s)
    assert done.exit_code == 0
    logs = commands.get_background_command_logs(bg.id)
    assert logs.content == "bg\n" and logs.cursor == 3
    slow = commands.run("sleep 30", opts=RunCommandOpts(background=True))
    commands.interrupt(slow.id or "")
    assert commands.get_command_status(slow.id or "").running is False
    session = commands.create_session(working_directory=str(work))
    commands.run_in_session(session, "export S=1; cd /")
    ex = commands.run_in_session(session, 'echo "$S"; pwd', timeout=timedelta(seconds=10))
    assert ex.exit_code == 0 and "".join(m.text for m in ex.logs.stdout) == "1\n/\n"
    commands.delete_session(session)
    with pytest.raises(SandboxException):
        commands.run_in_session(session, "true")


def test_the_sdk_reads_and_writes_files_and_directories(
    sdk: AdapterFactorySync, endpoint: SandboxEndpoint, work: Path
) -> None:
    files = sdk.create_filesystem_service(endpoint)
    path = str(work / "dir" / "hello.txt")
    files.write_files(
        [WriteEntry(path=path, data="hello world", mode=644), WriteEntry(path=path + ".bin", data=b"\0\1\2")]
    )
    assert files.read_file(path) == "hello world"
    assert files.read_bytes(path + ".bin") == b"\0\1\2"
    assert files.read_bytes(path, range_header="bytes=6-") == b"world"
    assert b"".join(files.read_bytes_stream(path, chunk_size=4)) == b"hello world"
    info = files.get_file_info([path])[path]
    assert info.size == 11 and info.mode == 644 and info.entry_type == "file"
    found = files.search(SearchEntry(path=str(work), pattern="*.txt"))
    assert [e.path for e in found] == [path]
    files.replace_contents([ContentReplaceEntry(path=path, old_content="world", new_content="there")])
    results = files.replace_contents_detailed(
        [ContentReplaceEntry(path=path, old_content="e", new_content="E")]
    )
    assert results[0].replaced_count == 3 and files.read_file(path) == "hEllo thErE"
    files.set_permissions([SetPermissionEntry(path=path, mode=600)])
    assert files.get_file_info([path])[path].mode == 600
    files.move_files([MoveEntry(src=path, dest=path + ".moved")])
    files.create_directories([WriteEntry(path=str(work / "made" / "deep"), mode=755)])
    listed = files.list_directory(DirectoryListEntry(path=str(work), depth=3))
    assert [e.path.removeprefix(str(work)) for e in listed] == [
        "/dir",
        "/dir/hello.txt.bin",
        "/dir/hello.txt.moved",
        "/made",
        "/made/deep",
    ]
    files.delete_files([path + ".moved"])
    files.delete_directories([str(work / "made")])
    assert sorted(os.listdir(work)) == ["dir"] and os.listdir(work / "dir") == ["hello.txt.bin"]
    with pytest.raises(SandboxException):
        files.read_file(str(work / "missing"))


def test_the_sdk_pings_reads_metrics_and_the_egress_policy(
    sdk: AdapterFactorySync, endpoint: SandboxEndpoint, server: ApiServer, sid: str
) -> None:
    assert sdk.create_health_service(endpoint).ping(sid) is True
    metrics = sdk.create_metrics_service(endpoint).get_metrics(sid)
    assert metrics.cpu_count == 1.0 and metrics.memory_total_in_mib == 1024.0
    authority = (server.opensandbox_url or "").removeprefix("http://")
    egress = sdk.create_egress_service(SandboxEndpoint(endpoint=authority + state.egress_base_path(sid)))
    assert egress.get_policy().default_action == "deny"
    egress.patch_rules(
        [
            NetworkRule(action="allow", target="example.org"),
            NetworkRule(action="allow", target="*.example.org"),
        ]
    )
    assert [r.target for r in egress.get_policy().egress or []] == ["example.org", "*.example.org"]
    with pytest.raises(SandboxException):
        egress.patch_rules([NetworkRule(action="deny", target="a.example.org")])
    egress.delete_rules(["example.org", "*.example.org"])
    assert not egress.get_policy().egress


def test_the_sdk_in_direct_mode_carries_the_key_the_endpoint_hands_it(
    endpoint: SandboxEndpoint, sid: str
) -> None:
    """Without use_server_proxy the SDK sends no API key of its own: the endpoint's headers do."""
    direct = AdapterFactorySync(ConnectionConfigSync(api_key=TOKEN, request_timeout=timedelta(seconds=30)))
    bare = direct.create_command_service(endpoint)
    with pytest.raises(SandboxException):
        bare.run("true")
    keyed = SandboxEndpoint(endpoint=endpoint.endpoint, headers=KEY)
    assert direct.create_command_service(keyed).run("echo ok").exit_code == 0


def test_the_sdk_in_direct_mode_uploads(endpoint: SandboxEndpoint, work: Path) -> None:
    direct = AdapterFactorySync(ConnectionConfigSync(api_key=TOKEN, request_timeout=timedelta(seconds=30)))
    keyed = SandboxEndpoint(endpoint=endpoint.endpoint, headers=KEY)
    direct.create_filesystem_service(keyed).write_files([WriteEntry(path=str(work / "x"), data="x")])
    assert (work / "x").read_text() == "x"


def test_the_async_sdk_runs_and_uploads_too(endpoint: SandboxEndpoint, work: Path) -> None:
    from opensandbox.adapters.factory import AdapterFactory
    from opensandbox.config import ConnectionConfig

    async def main() -> tuple[Any, bytes]:
        factory = AdapterFactory(ConnectionConfig(api_key=TOKEN, use_server_proxy=True))
        ex = await factory.create_command_service(endpoint).run("echo async; exit 2")
        files = factory.create_filesystem_service(endpoint)
        await files.write_files([WriteEntry(path=str(work / "a.bin"), data=b"\x00async")])
        return ex, await files.read_bytes(str(work / "a.bin"))

    ex, data = asyncio.run(main())
    assert ex.exit_code == 2 and "".join(m.text for m in ex.logs.stdout) == "async\n"
    assert data == b"\x00async"
