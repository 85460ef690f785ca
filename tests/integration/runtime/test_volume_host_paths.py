"""Host paths given to sandboxes cannot be written through or redirected (issue 35, attacks 6 and 7),
on real LXC sandboxes: nothing is made inside a read-only host path, and an allowed directory a
sandbox replaced with a link (itself, or a directory on its way) is never mounted, whether it is
asked for by its own name or by the link's target. Every host directory is made under a temp dir
this module removes; every sandbox carries the session's label."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import sandbox_rt
from sandbox_rt import ConfigError, Manager, Settings, VolumeMount, VolumeNotAllowed
from tests.integration.provision_helpers import destroy_labelled

from .conftest import SESSION_LABEL

Managers = Callable[[list[Path]], Manager]


@pytest.fixture
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sandbox-rt-hostpaths-"))
    os.chmod(path, 0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def managers(settings: Settings, scratch: Path) -> Iterator[Managers]:
    """``managers([allowed dirs])``: a Manager whose operator allows those host directories."""
    made: list[Manager] = []

    def make(allowed: list[Path]) -> Manager:
        host_dirs = [str(p) for p in allowed]
        mgr = Manager(
            dataclasses.replace(settings, volume_dir=scratch / "volumes", volume_host_dirs=host_dirs)
        )
        made.append(mgr)
        return mgr

    yield make
    for mgr in made:
        destroy_labelled(mgr, SESSION_LABEL)


def _create(mgr: Manager, *mounts: VolumeMount) -> sandbox_rt.Sandbox:
    return mgr.create(labels=SESSION_LABEL, memory_mb=256, volumes=list(mounts))


def _ids(mgr: Manager) -> set[str]:
    return {r.id for r in mgr.list(labels=SESSION_LABEL)}


def _refused(mgr: Manager, mounts: list[VolumeMount], error: type[Exception], message: str) -> str | None:
    """None if creating a sandbox with ``mounts`` raises ``error`` matching ``message`` and makes
    nothing; else what went wrong (if it was made: what the sandbox got at its first mount path)."""
    before = _ids(mgr)
    try:
        sb = _create(mgr, *mounts)
    except error as exc:
        if not re.search(message, str(exc)):
            return f"{mounts}: {exc!r} does not say {message!r}"
        return None if _ids(mgr) == before else f"{mounts}: refused, but a sandbox was left"
    try:
        seen = sb.exec(f"ls -la {mounts[0].mount_path}", timeout=60).stdout.decode()
    finally:
        sb.destroy()
    return f"{mounts} was mounted (expected {error.__name__}: {message}); the sandbox saw:\n{seen}"


def test_nothing_is_made_inside_a_read_only_host_path(managers: Managers, scratch: Path) -> None:
    """Attack 6: ``/h`` a read-only host path and a volume at ``/h/made/by/api`` made
    ``made/by/api`` in the host directory, owned by the sandbox user. Now: a ConfigError before
    anything is made, for a named volume or a host path inside it; the read-only mount alone
    still works and leaves the directory as it was."""
    host = scratch / "ro-host"
    host.mkdir()
    (host / "data.txt").write_text("operator's\n")
    other = scratch / "other"
    other.mkdir()
    mgr = managers([host, other])
    mgr.volumes.create("nested-out")
    problems = []
    for inner in (
        VolumeMount("/h/made/by/api", volume="nested-out"),
        VolumeMount("/h/made/by/api", host_path=str(other)),
    ):
        mounts = [VolumeMount("/h", host_path=str(host), read_only=True), inner]
        problems.append(_refused(mgr, mounts, ConfigError, "inside the read-only mount at '/h'"))
        made = [os.path.relpath(d, host) for d, _, _ in os.walk(host)][1:]
        if made:
            problems.append(f"{inner}: made in the read-only host path: {made}")
            shutil.rmtree(host / made[0])
    failed = [p for p in problems if p]
    assert not failed, "\n".join(failed)
    assert os.listdir(other) == []
    sb = _create(mgr, VolumeMount("/h", host_path=str(host), read_only=True))
    try:
        r = sb.exec("cat /h/data.txt; mkdir /h/x", timeout=60)
        assert r.stdout == b"operator's\n" and b"Read-only file system" in r.stderr, r
    finally:
        sb.destroy()
    assert sorted(os.listdir(host)) == ["data.txt"]


def test_an_allowed_dir_a_sandbox_replaced_with_a_link_is_never_mounted(
    managers: Managers, scratch: Path, settings: Settings
) -> None:
    """Attack 7: allowed directories inside another allowed one that sandboxes can write (the
    sandbox user owns them, as attack 6 left them). A sandbox replaces one with a link, and a
    directory on the way to another: asking for either, or for where a link points, is refused
    (the allowed bases are opened without following links at any component, the allow-list
    compares the path as written), and the link's target never reaches a sandbox."""
    user = settings.idmap_base + 1000  # the sandbox user, as stored on the host
    outer = scratch / "outer"
    for d in (outer, outer / "inner", outer / "deep", outer / "deep" / "inner"):
        d.mkdir()
        os.chown(d, user, user)
    secret = scratch / "secret"
    (secret / "inner").mkdir(parents=True)
    (secret / "key").write_text("not for sandboxes\n")
    (secret / "inner" / "key").write_text("not for sandboxes either\n")
    # the inner ones first: the order in which the old allow-list check took them as bases
    mgr = managers([outer / "inner", outer / "deep" / "inner", outer])
    for asked in (outer / "inner", outer / "deep" / "inner"):  # they work while they are directories
        _create(mgr, VolumeMount("/x", host_path=str(asked))).destroy()
    writer = _create(mgr, VolumeMount("/o", host_path=str(outer)))
    try:
        r = writer.exec(
            f"mv /o/inner /o/was-inner && ln -s {secret} /o/inner && mv /o/deep /o/was-deep && "
            f"ln -s {secret} /o/deep",
            timeout=60,
        )
        assert r.exit_code == 0, r
    finally:
        writer.destroy()
    assert (outer / "inner").is_symlink() and (outer / "deep").is_symlink()  # planted on the host
    problems = [
        _refused(mgr, [VolumeMount("/x", host_path=str(asked))], VolumeNotAllowed, message)
        for asked, message in (
            (outer / "inner", "symbolic link"),
            (outer / "deep" / "inner", "symbolic link"),
            (secret, "not under a directory this host allows"),
            (secret / "inner", "not under a directory this host allows"),
        )
    ]
    failed = [p for p in problems if p]
    assert not failed, "\n".join(failed)
    assert sorted(os.listdir(secret)) == ["inner", "key"]


def test_a_mount_point_made_in_a_writable_host_path_belongs_to_its_directory_owner(
    managers: Managers, scratch: Path, settings: Settings
) -> None:
    """A mount inside a writable host path gets its mount point made there, owned like the directory
    it is made in: a sandbox is given no directory in the host's tree it could not make itself (the
    sandbox-owned directories attack 7 started from)."""
    host = scratch / "rw-host"
    (host / "team").mkdir(parents=True)
    os.chown(host / "team", settings.idmap_base + 1000, settings.idmap_base + 1000)
    mgr = managers([host])
    mgr.volumes.create("nested-in-rw")
    sb = _create(
        mgr,
        VolumeMount("/h", host_path=str(host)),
        VolumeMount("/h/made/by/api", volume="nested-in-rw"),
        VolumeMount("/h/team/out", volume="nested-in-rw"),
    )
    try:
        assert sb.exec("touch /h/team/out/x && ls /h/made/by/api", timeout=60).stdout == b"x\n"
    finally:
        sb.destroy()
    owners = {d: os.stat(host / d).st_uid for d in ("made", "made/by", "made/by/api", "team/out")}
    assert owners == {"made": 0, "made/by": 0, "made/by/api": 0, "team/out": settings.idmap_base + 1000}
