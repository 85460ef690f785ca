"""Day-2 conventions (issue 20 items 4-5), fast: lifecycle events through logging with the sandbox
id as a field (text or JSON lines), never a secret; ``python -m sandbox_rt``; -q/--json/--log-format
before or after the command; every option's help shows its default. The real thing (a JSON log of
a real run) is in tests/integration/runtime/test_crash_and_cli.py."""

from __future__ import annotations

import argparse
import io
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from test_manager_cleanup import FakeBackend, _key

from sandbox_rt import BackendError, Manager, Settings, __version__, logs
from sandbox_rt.cli import _Formatter, _parser, main
from sandbox_rt.models import SandboxSpec


def _events(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str | None, int]]:
    return [
        (r.event, r.sandbox_id, r.levelno)  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "sandbox_rt.events"
    ]


def test_create_and_destroy_are_events_with_the_sandbox_id(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = FakeBackend()
    mgr = Manager(Settings(ssh_ready_timeout_s=0.3), backend=backend, ssh_key=_key())
    monkeypatch.setattr(Manager, "_connect", lambda self, record, key: _Box(record.id))
    caplog.set_level(logging.INFO, logger="sandbox_rt")
    sb = mgr.create()
    mgr.destroy(sb.id)
    assert _events(caplog) == [("create", sb.id, logging.INFO), ("destroy", sb.id, logging.INFO)]
    create = next(r for r in caplog.records if getattr(r, "event", "") == "create")
    assert create.backend == "fake" and create.pooled is False and create.duration_s >= 0  # type: ignore[attr-defined]


class _Box:
    """What create() hands back, without SSH (the fake backend has no sandbox to connect to)."""

    def __init__(self, sandbox_id: str) -> None:
        self.id = sandbox_id


def test_a_failed_create_says_where_and_what_but_no_secret(caplog: pytest.LogCaptureFixture) -> None:
    key = _key()
    mgr = Manager(Settings(ssh_ready_timeout_s=0.3), backend=FakeBackend(fail_at="start"), ssh_key=key)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(BackendError):
        mgr.create()
    (name, sid, level), *_ = _events(caplog)
    assert (name, level) == ("create_failed", logging.WARNING) and sid is not None
    failed = next(r for r in caplog.records if getattr(r, "event", "") == "create_failed")
    assert (failed.step, failed.error) == ("start", "BackendError")  # type: ignore[attr-defined]
    text = "\n".join(r.getMessage() + repr(vars(r)) for r in caplog.records)
    assert key.get_base64() not in text and "PRIVATE KEY" not in text


def test_gc_logs_what_it_removed_and_why(caplog: pytest.LogCaptureFixture) -> None:
    backend = FakeBackend()
    backend.clone("sbx-00000000c1", SandboxSpec())
    mgr = Manager(Settings(), backend=backend, ssh_key=_key())
    caplog.set_level(logging.INFO, logger="sandbox_rt")
    assert [g.sandbox_id for g in mgr.gc(dry_run=True)] == ["sbx-00000000c1"]
    assert _events(caplog) == []  # a dry run removes nothing and says nothing
    mgr.gc()
    assert _events(caplog) == [("gc", "sbx-00000000c1", logging.INFO)]


def test_json_lines_carry_the_fields() -> None:
    stream = io.StringIO()
    logs.configure("json", stream=stream)
    try:
        logs.event("gc", "sbx-00000000d1", reason="expired", backend="lxc")
        logging.getLogger("sandbox_rt.other").info("plain %s", "text")
    finally:
        logs.configure("text", level=logging.WARNING, stream=io.StringIO())
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["event"] == "gc" and first["sandbox_id"] == "sbx-00000000d1" and first["reason"] == "expired"
    assert (
        first["level"] == "info"
        and first["logger"] == "sandbox_rt.events"
        and first["time"].endswith("+00:00")
    )
    assert second["message"] == "plain text" and "event" not in second


def test_a_log_file_is_reopened_after_logrotate_moved_it(tmp_path: Path) -> None:
    log = tmp_path / "log" / "sandbox-rt-reaper.log"
    logs.configure("json", file=log)
    try:
        logs.event("gc", "sbx-00000000e1", reason="expired")
        log.rename(log.with_name("sandbox-rt-reaper.log.1"))  # what logrotate does (no copytruncate)
        logs.event("gc", "sbx-00000000e2", reason="expired")
    finally:
        logs.configure("text", level=logging.WARNING, stream=io.StringIO())
    old = log.with_name("sandbox-rt-reaper.log.1")
    ids = [[json.loads(line)["sandbox_id"] for line in f.read_text().splitlines()] for f in (old, log)]
    assert ids == [["sbx-00000000e1"], ["sbx-00000000e2"]]
    assert [f.stat().st_mode & 0o777 for f in (old, log)] == [0o640, 0o640]


def test_an_unwritable_log_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    assert main(["--log-file", str(blocker / "x.log"), "reaper", "--once"]) == 2
    err = capsys.readouterr().err
    assert "cannot write the log file" in err and "Traceback" not in err


def test_the_log_file_option_is_taken_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_RT_LOG_FILE", "/var/log/sandbox_rt/x.log")
    assert _parser().parse_args(["ls"]).log_file == "/var/log/sandbox_rt/x.log"
    assert _parser().parse_args(["ls", "--log-file", "/tmp/y.log"]).log_file == "/tmp/y.log"


def test_an_unknown_field_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="token"):
        logs.event("create", "sbx-00000000d2", token="s3cret")


def test_python_dash_m_is_the_cli() -> None:
    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run(
        [sys.executable, "-m", "sandbox_rt", "--version"], capture_output=True, text=True, cwd=repo
    )
    assert (r.returncode, r.stdout.strip()) == (0, f"sandbox-rt {__version__}")


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["ls", "--json", "-q"], (True, True, "text")),
        (["--json", "ls"], (True, False, "text")),
        (["--json", "ls", "-q"], (True, True, "text")),  # after the command never undoes before it
        (["ls", "--log-format", "json"], (False, False, "json")),
        (["-q", "run", "--json", "--", "true"], (True, True, "text")),
    ],
)
def test_common_options_before_or_after_the_command(argv: list[str], want: tuple[bool, bool, str]) -> None:
    a = _parser().parse_args(argv)
    assert (a.json, a.quiet, a.log_format) == want


def test_every_option_says_its_default() -> None:
    parser = _parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in [("", parser), *subparsers.choices.items()]:
        formatter = _Formatter(prog=name)
        for action in sub._actions:
            if not action.option_strings or action.default is argparse.SUPPRESS:
                continue  # positionals; -h, --version, and the common flags after the command
            text = formatter._get_help_string(action) or ""
            assert "default" in text, f"sandbox-rt {name} {action.option_strings[0]}: {text!r}"
