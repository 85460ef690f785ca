"""The runtime raises its own soft open-files limit (one socket per attached sandbox), once, to the
hard limit, and never lowers either (sandbox_rt.process_limits). Each case runs in a fresh
interpreter: the limit and the once-per-process flag are process-wide."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def _run(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def hard() -> int:
    import resource

    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if limit == resource.RLIM_INFINITY or limit < 512:
        pytest.fail(f"this host's hard RLIMIT_NOFILE ({limit}) leaves nothing to raise to", pytrace=False)
    return limit


def test_the_soft_limit_is_raised_to_the_hard_one(hard: int) -> None:
    out = _run(
        """
        import resource
        from sandbox_rt.process_limits import raise_open_files_limit
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        print(raise_open_files_limit(), resource.getrlimit(resource.RLIMIT_NOFILE))
        """
    )
    assert out == f"(256, {hard}) ({hard}, {hard})"


def test_a_manager_raises_it(hard: int) -> None:
    out = _run(
        """
        import resource
        from sandbox_rt import Manager, Settings
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, hard))
        class NoBackend:
            pass
        Manager(Settings(), backend=NoBackend())
        print(resource.getrlimit(resource.RLIMIT_NOFILE))
        """
    )
    assert out == f"({hard}, {hard})"


def test_once_per_process_and_never_lowered(hard: int) -> None:
    out = _run(
        """
        import resource
        from sandbox_rt.process_limits import raise_open_files_limit
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        first = raise_open_files_limit()
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, hard))  # the caller lowered it on purpose
        print(first, raise_open_files_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        """
    )
    assert out == f"({hard}, {hard}) (200, 200) 200"
