"""Volumes on real LXC sandboxes: named volumes outlive sandboxes and are shared between them as
each one's own user; read-only holds against root; nothing outside what the operator allows, and
no link a sandbox planted, is ever mounted; removing a volume in use is refused."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox_rt
from sandbox_rt import (
    ConfigError,
    Manager,
    Settings,
    StateConflict,
    VolumeMount,
    VolumeNotAllowed,
    VolumeNotFound,
)
from tests.integration.provision_helpers import destroy_labelled

from .conftest import SESSION_LABEL, Factory, _factory


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sandbox-rt-volumes-"))
    os.chmod(path, 0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def allowed(scratch: Path, settings: Settings) -> Path:
    """A host directory the operator allows, with a file, a subdirectory and a link out."""
    root = scratch / "allowed"
    (root / "project").mkdir(parents=True)
    (root / "project" / "README").write_text("from the host\n")
    os.chown(root / "project", settings.idmap_base + 1000, settings.idmap_base + 1000)
    (root / "escape").symlink_to("/etc")
    (scratch / "secret").mkdir()
    (scratch / "secret" / "key").write_text("not for sandboxes\n")
    return root


@pytest.fixture(scope="module")
def vmanager(settings: Settings, scratch: Path, allowed: Path) -> Iterator[Manager]:
    mgr = Manager(
        dataclasses.replace(settings, volume_dir=scratch / "volumes", volume_host_dirs=[str(allowed)])
    )
    yield mgr
    destroy_labelled(mgr, SESSION_LABEL)


@pytest.fixture
def make_v(vmanager: Manager) -> Iterator[Factory]:
    yield from _factory(vmanager)


def run(sb: sandbox_rt.Sandbox, cmd: str, **kwargs: object) -> sandbox_rt.ExecResult:
    return sb.exec(cmd, timeout=60, **kwargs)  # type: ignore[arg-type]


def test_named_volume_outlives_its_sandbox_and_is_shared_as_each_ones_user(
    vmanager: Manager, make_v: Factory, settings: Settings
) -> None:
    info = vmanager.volumes.create("shared-work")
    try:
        writer = make_v(memory_mb=256, volumes=[VolumeMount("/data", volume="shared-work")])
        r = run(writer, "echo made-by-a > /data/a.txt && stat -c '%U %a' /data /data/a.txt")
        assert r.exit_code == 0, r.stderr
        assert r.stdout.decode().split("\n")[:2] == ["sandbox 755", "sandbox 644"]
        reader = make_v(memory_mb=256, volumes=[VolumeMount("/mnt/in", volume="shared-work")])
        r = run(reader, "cat /mnt/in/a.txt && stat -c %U /mnt/in/a.txt && echo b > /mnt/in/b.txt")
        assert r.exit_code == 0, r.stderr
        assert r.stdout.decode().split() == ["made-by-a", "sandbox"]
        assert vmanager.volumes.get("shared-work").used_by == tuple(sorted((writer.id, reader.id)))
        # stored with the template range's ids: neither sandbox's own range, never host root
        st = os.stat(Path(info.path) / "a.txt")
        assert (st.st_uid, st.st_gid) == (settings.idmap_base + 1000,) * 2
        writer.destroy()
        reader.destroy()
        assert sorted(os.listdir(info.path)) == ["a.txt", "b.txt"]  # the destroy left the files
        later = make_v(memory_mb=256, volumes=[VolumeMount("/data", volume="shared-work", read_only=True)])
        assert run(later, "cat /data/a.txt /data/b.txt").stdout == b"made-by-a\nb\n"
    finally:
        for record in vmanager.list(labels=SESSION_LABEL):
            vmanager.destroy(record.id)
        vmanager.volumes.remove("shared-work")
    assert not Path(info.path).exists()


def test_read_only_refuses_writes_even_by_root_and_no_setuid_reaches_the_host(
    vmanager: Manager, make_v: Factory, settings: Settings
) -> None:
    info = vmanager.volumes.create("ro-check")
    try:
        (Path(info.path) / "keep").write_text("original\n")
        rw = make_v(memory_mb=256, root=True, volumes=[VolumeMount("/rw", volume="ro-check", sub_path="bin")])
        r = run(rw, "cp /bin/true /rw/suid && chmod 4755 /rw/suid && stat -c %a /rw/suid", user="root")
        assert r.exit_code == 0, r.stderr
        assert r.stdout.strip() == b"4755"
        st = os.stat(Path(info.path) / "bin" / "suid")
        assert st.st_uid == settings.idmap_base  # the sandbox's root, stored unprivileged
        assert st.st_uid != 0
        ro = make_v(memory_mb=256, root=True, volumes=[VolumeMount("/ro", volume="ro-check", read_only=True)])
        for user in ("sandbox", "root"):
            r = run(ro, "echo changed > /ro/keep", user=user)
            assert r.exit_code != 0 and b"Read-only file system" in r.stderr, (user, r)
        r = run(ro, "mount -o remount,rw,bind /ro", user="root")
        assert r.exit_code != 0
        assert run(ro, "echo changed > /ro/keep", user="root").exit_code != 0
        assert (Path(info.path) / "keep").read_text() == "original\n"
        r = run(ro, "grep ' /ro ' /proc/self/mountinfo")
        assert {"ro", "nosuid", "nodev"} <= set(r.stdout.decode().split()[5].split(","))
    finally:
        for record in vmanager.list(labels=SESSION_LABEL):
            vmanager.destroy(record.id)
        vmanager.volumes.remove("ro-check")


def test_a_link_a_sandbox_planted_in_a_volume_is_never_followed(vmanager: Manager, make_v: Factory) -> None:
    vmanager.volumes.create("planted")
    try:
        sb = make_v(memory_mb=256, volumes=[VolumeMount("/data", volume="planted")])
        assert run(sb, "ln -s /etc /data/evil && ln -s / /data/top").exit_code == 0
        before = {r.id for r in vmanager.list()}
        for sub in ("evil", "top", "top/etc"):
            with pytest.raises(ConfigError, match="symbolic link"):
                vmanager.create(
                    labels=SESSION_LABEL, volumes=[VolumeMount("/x", volume="planted", sub_path=sub)]
                )
        assert {r.id for r in vmanager.list()} == before  # nothing half-made was left
    finally:
        for record in vmanager.list(labels=SESSION_LABEL):
            vmanager.destroy(record.id)
        vmanager.volumes.remove("planted")


def test_host_paths_only_under_allowed_dirs_and_never_through_a_link(
    vmanager: Manager, make_v: Factory, allowed: Path, scratch: Path
) -> None:
    sb = make_v(memory_mb=256, volumes=[VolumeMount("/work", host_path=str(allowed), sub_path="project")])
    r = run(sb, "cat /work/README && echo new > /work/out && stat -c %U /work/out")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.decode().split() == ["from", "the", "host", "sandbox"]
    assert (allowed / "project" / "out").read_text() == "new\n"
    before = {r.id for r in vmanager.list()}
    refused = [
        (VolumeMount("/x", host_path=str(scratch / "secret")), "not under a directory this host allows"),
        (VolumeMount("/x", host_path=f"{allowed}/../secret"), r"'\.\.' is not allowed"),
        (VolumeMount("/x", host_path=str(allowed / "escape")), "symbolic link"),
        (VolumeMount("/x", host_path=str(allowed), sub_path="escape"), "symbolic link"),
        (VolumeMount("/x", host_path=str(allowed / "missing")), "not a directory there"),
        (VolumeMount("/etc/ssh", host_path=str(allowed)), "system directory"),
        (VolumeMount("/", host_path=str(allowed)), "system directory"),
    ]
    for mount, message in refused:
        with pytest.raises((ConfigError, VolumeNotFound), match=message):
            vmanager.create(labels=SESSION_LABEL, volumes=[mount])
    assert {r.id for r in vmanager.list()} == before


def test_a_volume_in_use_cannot_be_removed_and_a_missing_one_is_named(
    vmanager: Manager, make_v: Factory
) -> None:
    with pytest.raises(VolumeNotFound):
        vmanager.create(labels=SESSION_LABEL, volumes=[VolumeMount("/data", volume="never-made")])
    vmanager.volumes.create("busy")
    with pytest.raises(StateConflict):
        vmanager.volumes.create("busy")
    sb = make_v(memory_mb=256, volumes=[VolumeMount("/data", volume="busy")])
    with pytest.raises(StateConflict, match=sb.id):
        vmanager.volumes.remove("busy")
    sb.destroy()
    vmanager.volumes.remove("busy")
    assert [v.name for v in vmanager.volumes.list()] == []
    with pytest.raises(VolumeNotFound):
        vmanager.volumes.remove("busy")


def test_a_mount_left_by_a_crashed_start_is_detached_before_the_dir_is_deleted(settings: Settings) -> None:
    from sandbox_rt.backends.lxc.idmap import idmapped_bind

    # the volumes on the same device as the container dir (no btrfs subvolume per sandbox): LXC's
    # and our deletes skip other devices, so only there does a forgotten mount cost the files
    volumes = settings.lxc_path / f".test-volumes-{os.getpid()}"
    vmanager = Manager(dataclasses.replace(settings, volume_dir=volumes, disk_limits=False))
    info = vmanager.volumes.create("crash-safe")
    try:
        (Path(info.path) / "precious").write_text("keep me\n")
        sb = vmanager.create(
            labels=SESSION_LABEL, memory_mb=256, volumes=[VolumeMount("/data", volume="crash-safe")]
        )
        point = settings.lxc_path / sb.id / "volumes" / "0"
        assert not point.exists()  # the host's copy went after the start
        point.mkdir(parents=True)  # what a start killed before its cleanup leaves: the volume mounted
        idmapped_bind(Path(info.path), point, inner=0, outer=0)
        assert (point / "precious").exists()
        sb.destroy()
        assert not (settings.lxc_path / sb.id).exists()
        assert (Path(info.path) / "precious").read_text() == "keep me\n"
    finally:
        for record in vmanager.list(labels=SESSION_LABEL):
            vmanager.destroy(record.id)
        vmanager.volumes.remove("crash-safe")
        shutil.rmtree(volumes)


def test_the_proxmox_backend_refuses_volumes_before_making_anything(pve_manager: Manager) -> None:
    before = {r.id for r in pve_manager.list()}
    with pytest.raises(ConfigError, match="no volumes"):
        pve_manager.create(labels=SESSION_LABEL, volumes=[VolumeMount("/data", volume="anything")])
    with pytest.raises(ConfigError, match="root@pam"):
        pve_manager.volumes.list()
    assert {r.id for r in pve_manager.list()} == before


def test_a_mount_path_that_is_a_link_in_a_forked_snapshot_never_reaches_the_host(
    vmanager: Manager, make_v: Factory, settings: Settings
) -> None:
    """A sandbox's root makes its future mount path a link to /etc and snapshots itself: the fork
    that mounts a volume there refuses to start (LXC opens mount targets without following links),
    and nothing is left."""
    vmanager.volumes.create("aimed")
    snapshot = f"linked{os.getpid()}"
    try:
        sb = make_v(memory_mb=256, root=True)
        assert run(sb, "ln -s /etc /workspace", user="root").exit_code == 0
        vmanager.snapshot(sb.id, snapshot)
        before = {r.id for r in vmanager.list()}
        etc_before = sorted(os.listdir("/etc"))
        with pytest.raises(sandbox_rt.BackendError, match="did not start") as err:
            vmanager.create(
                labels=SESSION_LABEL,
                from_snapshot=snapshot,
                volumes=[VolumeMount("/workspace", volume="aimed")],
            )
        assert "symbolic links" in (err.value.detail or "")
        assert {r.id for r in vmanager.list()} == before
        assert sorted(os.listdir("/etc")) == etc_before
        assert not [d for d in os.listdir(settings.lxc_path) if d.startswith("sbx-") and d not in before]
    finally:
        with contextlib.suppress(sandbox_rt.SandboxError):
            vmanager.delete_snapshot(snapshot)
        for record in vmanager.list(labels=SESSION_LABEL):
            vmanager.destroy(record.id)
        vmanager.volumes.remove("aimed")


def test_a_mount_inside_a_volume_gets_its_mount_point_and_no_link_is_followed(
    vmanager: Manager, make_v: Factory, settings: Settings
) -> None:
    base, out = vmanager.volumes.create("nest-base"), vmanager.volumes.create("nest-out")
    try:
        mounts = [
            VolumeMount("/data/out", volume="nest-out"),  # listed first: mounted after its parent
            VolumeMount("/data", volume="nest-base"),
        ]
        sb = make_v(memory_mb=256, volumes=mounts)
        r = run(sb, "echo result > /data/out/r.txt && cat /data/out/r.txt")
        assert r.stdout == b"result\n", r
        assert (Path(out.path) / "r.txt").read_text() == "result\n"
        point = os.stat(Path(base.path) / "out")  # its mount point, made on the host
        assert (point.st_uid, point.st_gid) == (settings.idmap_base + 1000,) * 2
        sb.destroy()
        (Path(base.path) / "out").rmdir()
        (Path(base.path) / "out").symlink_to("/etc")  # what a sandbox with it mounted rw could do
        before = {r.id for r in vmanager.list()}
        with pytest.raises(VolumeNotAllowed, match="/data/out"):
            vmanager.create(labels=SESSION_LABEL, volumes=mounts)
        assert {r.id for r in vmanager.list()} == before
        assert not Path("/etc/r.txt").exists()
    finally:
        for record in vmanager.list(labels=SESSION_LABEL):
            vmanager.destroy(record.id)
        vmanager.volumes.remove("nest-base")
        vmanager.volumes.remove("nest-out")
