"""A front door's server as its own process (``sandbox-rt serve``, ``sandbox-rt mcp --transport
http``) for the integration tests: its token in a 0600 file, the URLs it names on stderr, and
SIGTERM (then SIGKILL) when the test is done with it."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

READY_WAIT = 60.0  # seconds a server may take to say where it listens


@dataclasses.dataclass(frozen=True)
class Served:
    urls: list[str]
    proc: subprocess.Popen[str]
    token_file: Path


@contextlib.contextmanager
def served(
    command: Sequence[str], token: str, directory: Path, ready: str, *, count: int = 1
) -> Iterator[Served]:
    """Run ``command --token-file F`` (``F`` in ``directory``, holding ``token``) until the first
    group of ``ready`` (a regex) has matched ``count`` lines of its stderr; yields those URLs. The
    rest of its stderr is read and dropped, so a server that logs much never blocks on the pipe."""
    token_file = directory / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    proc = subprocess.Popen(
        [*command, "--token-file", str(token_file)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    drain = threading.Thread(target=proc.stderr.read, daemon=True)
    try:
        urls: list[str] = []
        deadline = time.monotonic() + READY_WAIT
        while len(urls) < count:
            assert time.monotonic() < deadline, f"{command} did not say where it listens"
            line = proc.stderr.readline()
            assert line, f"{command} exited: {proc.poll()}"
            if m := re.search(ready, line):
                urls.append(m.group(1))
        drain.start()
        yield Served(urls, proc, token_file)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if drain.is_alive():
            drain.join(10)  # the pipe's end: the process has exited
        proc.stderr.close()
