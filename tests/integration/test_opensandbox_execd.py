"""OpenSandbox's execd end to end (issue 25 item 3): a real LXC sandbox made with the native Manager,
then the published ``opensandbox`` SDK, unchanged, connecting through the dialect's lifecycle API
and driving commands, sessions, files, directories, metrics and the egress policy over
``sandbox-rt``'s dialect port; real results asserted (exit codes, the order and timing of streamed
output, bytes round-tripped, search results). Everything made is destroyed, even on failure."""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
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
    WriteEntry,
)
from opensandbox.models.sandboxes import NetworkRule
from opensandbox.sync.sandbox import SandboxSync

import sandbox_rt
from sandbox_rt.web.opensandbox import state
from sandbox_rt.web.server import ApiServer
from tests.integration.prepared import labelled_manager

pytestmark = pytest.mark.slow

TOKEN = secrets.token_urlsafe(32)
LABEL = {"test-opensandbox-execd": uuid.uuid4().hex[:12]}


@pytest.fixture(scope="module")
def manager() -> Iterator[sandbox_rt.Manager]:
    with labelled_manager(LABEL) as mgr:
        yield mgr


@pytest.fixture(scope="module")
def server(manager: sandbox_rt.Manager) -> Iterator[ApiServer]:
    with ApiServer(manager, token=TOKEN, host="127.0.0.1", port=0, opensandbox_port=0) as srv:
        yield srv


@pytest.fixture(scope="module")
def sandbox(manager: sandbox_rt.Manager, server: ApiServer) -> Iterator[SandboxSync]:
    """A sandbox made by the native runtime, then reached the way an OpenSandbox program does:
    ``SandboxSync.connect`` (lifecycle get, endpoint of port 44772, execd ping)."""
    made = manager.create(labels=LABEL, ttl_s=600, memory_mb=512, detached=True)
    made.close()
    assert server.opensandbox_url is not None
    config = ConnectionConfigSync(
        domain=server.opensandbox_url.removeprefix("http://"),
        api_key=TOKEN,
        use_server_proxy=True,  # uploads with a Content-Length (see docs/opensandbox.md, execd)
        request_timeout=timedelta(seconds=60),
        disable_metrics=True,
    )
    sb = None
    try:
        sb = SandboxSync.connect(made.id, connection_config=config, skip_health_check=False)
        yield sb
    finally:
        if sb is not None:
            with contextlib.suppress(Exception):
                sb.close()
        with contextlib.suppress(sandbox_rt.SandboxError):
            manager.destroy(made.id)


def test_commands_stream_in_order_with_env_cwd_and_exit_codes(sandbox: SandboxSync) -> None:
    arrivals: list[tuple[float, str]] = []
    handlers = ExecutionHandlersSync(
        on_stdout=lambda m: arrivals.append((time.monotonic(), "out:" + m.text)),
        on_stderr=lambda m: arrivals.append((time.monotonic(), "err:" + m.text)),
    )
    t0 = time.monotonic()
    ex = sandbox.commands.run("echo a; sleep 0.4; echo b >&2; sleep 0.4; echo c", handlers=handlers)
    assert ex.exit_code == 0 and ex.id
    assert [text for _, text in arrivals] == ["out:a\n", "err:b\n", "out:c\n"]
    assert arrivals[0][0] - t0 < 0.4 < arrivals[2][0] - arrivals[0][0], "streamed as printed, not at the end"

    ex = sandbox.commands.run(
        'echo "$GREETING"; pwd; id -un; exit 3',
        opts=RunCommandOpts(envs={"GREETING": "hi"}, working_directory="/tmp"),
    )
    assert ex.exit_code == 3 and ex.error is not None and ex.error.value == "3"
    assert "".join(m.text for m in ex.logs.stdout) == "hi\n/tmp\nsandbox\n"
    status = sandbox.commands.get_command_status(ex.id or "")
    assert status.running is False and status.exit_code == 3


def test_background_commands_status_logs_and_interrupt(sandbox: SandboxSync) -> None:
    commands = sandbox.commands
    bg = commands.run("echo one; sleep 0.5; echo two >&2; exit 4", opts=RunCommandOpts(background=True))
    assert bg.id and commands.get_command_status(bg.id).running is True
    deadline = time.monotonic() + 20
    while (status := commands.get_command_status(bg.id)).running and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status.running is False and status.exit_code == 4
    logs = commands.get_background_command_logs(bg.id)
    assert logs.content == "one\ntwo\n" and logs.cursor == 8
    assert commands.get_background_command_logs(bg.id, cursor=4).content == "two\n"

    # a foreground command interrupted from another thread: its stream ends with its signal status
    started = threading.Event()
    command_id: list[str] = []

    def on_init(event: Any) -> None:
        command_id.append(event.id)
        started.set()

    result: list[Any] = []
    runner = threading.Thread(
        target=lambda: result.append(
            commands.run("sleep 60", handlers=ExecutionHandlersSync(on_init=on_init))
        ),
        daemon=True,
    )
    runner.start()
    assert started.wait(20)
    t0 = time.monotonic()
    commands.interrupt(command_id[0])
    runner.join(20)
    assert time.monotonic() - t0 < 10 and result and result[0].exit_code == 143
    assert commands.get_command_status(command_id[0]).running is False


def test_a_session_keeps_cwd_and_exports(sandbox: SandboxSync) -> None:
    commands = sandbox.commands
    session = commands.create_session(working_directory="/tmp")
    try:
        commands.run_in_session(session, "mkdir -p s1 && cd s1 && export ANSWER=42")
        ex = commands.run_in_session(session, 'pwd; echo "$ANSWER"')
        assert ex.exit_code == 0 and "".join(m.text for m in ex.logs.stdout) == "/tmp/s1\n42\n"
    finally:
        commands.delete_session(session)


def test_files_round_trip_search_and_directories(sandbox: SandboxSync) -> None:
    files = sandbox.files
    blob = os.urandom(1 << 20)
    files.write_files(
        [
            WriteEntry(path="/tmp/xfer/data.bin", data=blob, mode=600),
            WriteEntry(path="/tmp/xfer/src/a.py", data="print('a')\n"),
            WriteEntry(path="/tmp/xfer/src/deep/b.py", data="x = 'localhost'\n"),
            WriteEntry(path="/tmp/xfer/notes.txt", data="n"),
        ]
    )
    assert files.read_bytes("/tmp/xfer/data.bin") == blob
    assert files.read_bytes("/tmp/xfer/data.bin", range_header="bytes=1000-1999") == blob[1000:2000]
    info = files.get_file_info(["/tmp/xfer/data.bin"])["/tmp/xfer/data.bin"]
    assert info.size == len(blob) and info.mode == 600 and info.owner == "sandbox"
    found = files.search(SearchEntry(path="/tmp/xfer", pattern="*.py"))
    assert [e.path for e in found] == ["/tmp/xfer/src/a.py", "/tmp/xfer/src/deep/b.py"]
    files.replace_contents(
        [ContentReplaceEntry(path="/tmp/xfer/src/deep/b.py", old_content="localhost", new_content="::1")]
    )
    assert files.read_file("/tmp/xfer/src/deep/b.py") == "x = '::1'\n"
    files.move_files([MoveEntry(src="/tmp/xfer/notes.txt", dest="/tmp/xfer/src/notes.txt")])
    files.create_directories([WriteEntry(path="/tmp/xfer/made/inner", mode=755)])
    listed = files.list_directory(DirectoryListEntry(path="/tmp/xfer", depth=2))
    assert [(e.path, e.entry_type) for e in listed] == [
        ("/tmp/xfer/data.bin", "file"),
        ("/tmp/xfer/made", "directory"),
        ("/tmp/xfer/made/inner", "directory"),
        ("/tmp/xfer/src", "directory"),
        ("/tmp/xfer/src/a.py", "file"),
        ("/tmp/xfer/src/deep", "directory"),
        ("/tmp/xfer/src/notes.txt", "file"),
    ]
    files.delete_files(["/tmp/xfer/data.bin"])
    files.delete_directories(["/tmp/xfer"])
    with pytest.raises(SandboxException):
        files.get_file_info(["/tmp/xfer"])


def test_metrics_and_the_egress_policy(sandbox: SandboxSync, server: ApiServer) -> None:
    metrics = sandbox.get_metrics()
    assert metrics.cpu_count >= 0.01 and metrics.memory_total_in_mib == 512
    assert 0 < metrics.memory_used_in_mib < 512 and 0 <= metrics.cpu_used_percentage <= 100
    policy = sandbox.get_egress_policy()
    assert policy.default_action == "deny" and not policy.egress
    sandbox.patch_egress_rules(
        [
            NetworkRule(action="allow", target="example.org"),
            NetworkRule(action="allow", target="*.example.org"),
        ]
    )
    assert [r.target for r in sandbox.get_egress_policy().egress or []] == ["example.org", "*.example.org"]
    with pytest.raises(SandboxException):  # a lone exact name would allow its subdomains too: refused
        sandbox.patch_egress_rules([NetworkRule(action="allow", target="pypi.org")])
    sandbox.delete_egress_rules(["example.org", "*.example.org"])
    assert not sandbox.get_egress_policy().egress
    # the raw route answers execd's framing: JSON objects followed by blank lines
    url = f"{server.opensandbox_url}{state.execd_base_path(sandbox.id)}/command"
    r = requests.post(url, json={"command": "echo raw"}, headers={"OPEN-SANDBOX-API-KEY": TOKEN}, timeout=60)
    assert r.status_code == 200 and r.content.startswith(b'{"type": "init"') and r.content.endswith(b"}\n\n")
