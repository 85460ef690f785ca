"""``status().usage.disk_bytes``: what the sandbox's root filesystem holds of its own, on both backends."""

from __future__ import annotations

from sandbox_rt import Sandbox

MB = 1024 * 1024


def test_disk_bytes_grow_with_what_the_sandbox_writes(sandbox: Sandbox) -> None:
    before = sandbox.status().usage.disk_bytes
    assert before is not None and before >= 0
    sandbox.exec("head -c $((20 * 1024 * 1024)) /dev/urandom > ~/blob && sync", check=True, timeout=60)
    after = sandbox.status().usage.disk_bytes
    assert after is not None and after - before >= 20 * MB, (before, after)
    sandbox.exec("rm ~/blob && sync", check=True)
    freed = sandbox.status().usage.disk_bytes
    assert freed is not None and freed < after - 10 * MB, (after, freed)
