"""The runtime of a host prepared by site.yml, for the integration tests of the front doors: a test
module's Manager, with every sandbox still carrying its labels destroyed afterwards; a front door's
server run as the command line in a subprocess."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

import sandbox_rt
from tests.integration.provision_helpers import destroy_labelled


def check_prepared() -> None:
    """Fail (saying how to fix it) unless site.yml prepared this host: the template and the key."""
    s = sandbox_rt.Settings.load()
    if not (s.lxc_path / s.template / "config").is_file() or not s.ssh_key.is_file():
        pytest.fail(
            "this host is not prepared: run `ansible-playbook -i inventories/local site.yml`", pytrace=False
        )


@contextlib.contextmanager
def labelled_manager(labels: Mapping[str, str], **settings: Any) -> Iterator[sandbox_rt.Manager]:
    """``Manager.from_env()`` (with ``settings`` replaced); afterwards every sandbox with ``labels``
    (what a failed test left behind) is destroyed, and none may remain."""
    check_prepared()
    mgr = sandbox_rt.Manager(dataclasses.replace(sandbox_rt.Settings.load(), **settings))
    try:
        yield mgr
    finally:
        destroy_labelled(mgr, labels)
    assert not mgr.list(labels=labels), "sandboxes of this test module survived their cleanup"


@contextlib.contextmanager
def cli_server(
    argv: Sequence[str], ready: str, count: int = 1
) -> Iterator[tuple[list[str], subprocess.Popen[str]]]:
    """``argv`` (``sandbox-rt serve`` or ``mcp``) in a subprocess until it said ``count`` times where
    it listens (``ready``: a pattern with the URL as group 1, read from its stderr): (the URLs, the
    process). SIGTERM afterwards (SIGKILL if it is still there a minute later)."""
    proc = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    try:
        urls: list[str] = []
        seen: list[str] = []
        deadline = time.monotonic() + 60
        while len(urls) < count and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, f"{argv[1:]} exited {proc.poll()}: {''.join(seen)[-2000:]}"
            seen.append(line)
            if m := re.search(ready, line):
                urls.append(m.group(1))
        assert len(urls) == count, f"{argv[1:]} did not say where it listens: {''.join(seen)[-2000:]}"
        yield urls, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(60)
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        proc.stderr.close()
