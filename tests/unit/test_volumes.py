"""Volume checks and the volume store on a real file system (no sandbox needed)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from sandbox_rt import ConfigError, StateConflict, VolumeMount, VolumeNotAllowed, VolumeNotFound
from sandbox_rt.backends.lxc.fstree import tree_bytes
from sandbox_rt.backends.lxc.volumes import mount_entries
from sandbox_rt.backends.records import spec_from_json, spec_to_json
from sandbox_rt.volumes import VolumeStore, check_mounts, check_volume_name
from sandbox_rt.volumes.beneath import mkdirs_beneath, open_beneath, open_dir, open_no_links
from sandbox_rt.volumes.checks import MAX_MOUNTS, check_mount_path, check_sub_path
from sandbox_rt.volumes.store import host_dir_for, open_host_source

OWNER = os.getuid()


@pytest.mark.parametrize("name", ["a", "data", "my-vol-2", "x" * 63])
def test_volume_names_are_dns_labels(name: str) -> None:
    assert check_volume_name(name) == name


@pytest.mark.parametrize("name", ["", "-a", "a-", "A", "a_b", "a.b", "x" * 64, "a\n", None, 3])
def test_other_volume_names_are_refused(name: object) -> None:
    with pytest.raises(ConfigError, match="DNS label"):
        check_volume_name(name)


@pytest.mark.parametrize(
    ("path", "normal"),
    [
        ("/data", "/data"),
        ("/workspace/", "/workspace"),
        ("//mnt//x", "/mnt/x"),
        ("/home/sandbox/w", "/home/sandbox/w"),
    ],
)
def test_mount_paths_are_normalised(path: str, normal: str) -> None:
    assert check_mount_path(path) == normal


@pytest.mark.parametrize(
    "path",
    ["/", "/etc", "/etc/ssh", "/proc/x", "/usr/local", "/var", "/var/run/x", "/run", "/dev/shm", "/lib64"],
)
def test_system_directories_are_never_mount_paths(path: str) -> None:
    with pytest.raises(ConfigError, match="system directory"):
        check_mount_path(path)


@pytest.mark.parametrize(
    "path", ["data", "/a/../etc", "/a/./b", "/a b", "/a,b", "/a#b", "/a\nb", "/x" * 600, 5]
)
def test_malformed_mount_paths_are_refused(path: object) -> None:
    with pytest.raises(ConfigError):
        check_mount_path(path)


def test_sub_paths_are_relative_and_never_climb() -> None:
    assert check_sub_path("a//b/") == "a/b"
    assert check_sub_path(None) is None
    for bad in ("/abs", "../up", "a/../../b", "a/./b", "", "/", 3):
        with pytest.raises(ConfigError):
            check_sub_path(bad)


def test_mounts_need_one_source_and_distinct_paths() -> None:
    with pytest.raises(ConfigError, match="one of volume= and host_path="):
        check_mounts([VolumeMount("/data")])
    with pytest.raises(ConfigError, match="one of volume= and host_path="):
        check_mounts([VolumeMount("/data", volume="v", host_path="/srv")])
    with pytest.raises(ConfigError, match="two volumes are mounted at '/data'"):
        check_mounts([VolumeMount("/data/", volume="a"), VolumeMount("/data", volume="b")])
    nested = check_mounts([VolumeMount("/data/x", volume="b"), VolumeMount("/data", volume="a")])
    assert [m.mount_path for m in nested] == ["/data", "/data/x"]  # parents first
    with pytest.raises(ConfigError, match="at most"):
        check_mounts([VolumeMount(f"/m{i}", volume="a") for i in range(MAX_MOUNTS + 1)])
    with pytest.raises(ConfigError, match="True or False"):
        check_mounts([VolumeMount("/data", volume="a", read_only="yes")])  # type: ignore[arg-type]
    assert check_mounts([VolumeMount("/data/", volume="a", sub_path="x/")]) == (
        VolumeMount("/data", volume="a", sub_path="x"),
    )


def test_mounts_survive_the_stored_record() -> None:
    from sandbox_rt.validation import make_spec

    spec = make_spec(
        volumes=[VolumeMount("/data", volume="a", read_only=True), VolumeMount("/w", host_path="/srv")]
    )
    assert spec_from_json(spec_to_json(spec)) == spec


def test_mount_entries_bind_each_prepared_source_without_suid_or_devices(tmp_path: Path) -> None:
    lines = mount_entries(tmp_path, check_mounts([VolumeMount("/data", volume="a", read_only=True)]))
    assert lines == [f"lxc.mount.entry = {tmp_path}/volumes/0 data none bind,create=dir,nosuid,nodev,ro 0 0"]


def _store(tmp_path: Path, users: dict[str, tuple[str, ...]] | None = None) -> VolumeStore:
    return VolumeStore(tmp_path / "volumes", owner=OWNER, users=lambda: users or {}, measure=tree_bytes)


def test_store_creates_lists_and_removes(tmp_path: Path) -> None:
    store = _store(tmp_path)
    info = store.create("alpha")
    assert Path(info.path) == tmp_path / "volumes" / "alpha" / "data"
    assert (os.stat(tmp_path / "volumes" / "alpha").st_mode & 0o777) == 0o700
    (Path(info.path) / "f").write_bytes(b"x" * 10_000)
    with pytest.raises(StateConflict):
        store.create("alpha")
    store.ensure("alpha")  # exists: nothing happens
    store.ensure("beta")
    assert [v.name for v in store.list()] == ["alpha", "beta"]
    got = store.get("alpha")
    assert got.size_bytes is not None and got.size_bytes >= 10_000
    store.remove("alpha")
    assert [v.name for v in store.list()] == ["beta"]
    assert sorted(os.listdir(tmp_path / "volumes")) == ["beta"]
    for call in (store.get, store.remove):
        with pytest.raises(VolumeNotFound):
            call("alpha")


def test_store_refuses_to_remove_a_mounted_volume(tmp_path: Path) -> None:
    store = _store(tmp_path, {"busy": ("sbx-0123456789",)})
    store.create("busy")
    with pytest.raises(StateConflict, match="sbx-0123456789"):
        store.remove("busy")
    assert store.exists("busy")


def test_removing_a_volume_does_not_follow_links_in_it(tmp_path: Path) -> None:
    store = _store(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    info = store.create("linked")
    (Path(info.path) / "out").symlink_to(outside)
    store.remove("linked")
    assert (outside / "keep").read_text() == "keep"


def test_open_source_makes_the_sub_path_and_never_follows_a_planted_link(tmp_path: Path) -> None:
    store = _store(tmp_path)
    data = Path(store.create("v").path)
    fd = store.open_source(VolumeMount("/m", volume="v", sub_path="a/b"))
    try:
        assert os.readlink(f"/proc/self/fd/{fd}") == str(data / "a" / "b")
    finally:
        os.close(fd)
    (data / "evil").symlink_to("/etc")
    (data / "a" / "up").symlink_to("..")
    for sub in ("evil", "evil/ssh", "a/up", "a/up/evil"):
        with pytest.raises(VolumeNotAllowed, match="symbolic link"):
            store.open_source(VolumeMount("/m", volume="v", sub_path=sub))
    assert not (Path("/etc") / "ssh" / "evil").exists()
    with pytest.raises(VolumeNotFound):
        store.open_source(VolumeMount("/m", volume="nope"))


def test_beneath_refuses_escapes_and_links(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "d")
    root = open_dir(str(tmp_path))
    try:
        os.close(open_beneath(root, "d"))
        for rel, code in (("link", "ELOOP"), ("../", "EXDEV"), ("missing", "ENOENT")):
            with pytest.raises(OSError) as err:
                open_beneath(root, rel)
            assert err.value.errno == getattr(__import__("errno"), code)
        with pytest.raises(OSError):
            mkdirs_beneath(root, "link/new", owner=OWNER)
        assert not (tmp_path / "d" / "new").exists()
    finally:
        os.close(root)


def test_host_paths_must_lie_under_an_allowed_dir(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    (allowed / "p").mkdir(parents=True)
    (allowed / "out").symlink_to(tmp_path)
    alias = tmp_path / "alias"
    alias.symlink_to(allowed)
    assert host_dir_for(f"{allowed}/p", [str(allowed)]) == (str(allowed), "p")
    assert host_dir_for(f"{allowed}/p", [f"/{allowed}//"]) == (str(allowed), "p")  # normalised
    assert host_dir_for(str(allowed), [str(allowed)]) == (str(allowed), "")
    # compared as written, never resolved: a link's target is not allowed because a link points there
    with pytest.raises(VolumeNotAllowed, match="not under"):
        host_dir_for(f"{allowed}/p", [str(alias)])
    with pytest.raises(VolumeNotAllowed, match="not under"):
        host_dir_for(str(tmp_path), [f"{allowed}/out"])
    # the innermost allowed directory that holds it
    assert host_dir_for(f"{allowed}/p/q", [str(allowed), f"{allowed}/p"]) == (f"{allowed}/p", "q")
    with pytest.raises(VolumeNotAllowed, match="not under"):
        host_dir_for(f"{allowed}x/p", [str(allowed)])
    with pytest.raises(VolumeNotAllowed, match="none"):
        host_dir_for(f"{allowed}/p", [])
    os.close(open_host_source(VolumeMount("/m", host_path=f"{allowed}/p"), [str(allowed)]))
    with pytest.raises(VolumeNotAllowed, match="symbolic link"):
        open_host_source(VolumeMount("/m", host_path=f"{allowed}/out"), [str(allowed)])
    with pytest.raises(VolumeNotFound, match="not a directory there"):
        open_host_source(VolumeMount("/m", host_path=f"{allowed}/missing"), [str(allowed)])


def test_a_mount_inside_a_read_only_mount_is_refused_before_anything_is_made() -> None:
    for outer in (
        VolumeMount("/h", host_path="/srv", read_only=True),
        VolumeMount("/h", volume="a", read_only=True),
    ):
        for inner in (VolumeMount("/h/made/by/api", volume="b"), VolumeMount("/h/x", host_path="/srv/o")):
            with pytest.raises(ConfigError, match=r"'/h/.*' lies inside the read-only mount at '/h'"):
                check_mounts([inner, outer])
    for inner_ro in (True, False):  # deeper too, read-only or not
        deeper = [
            VolumeMount("/a", volume="a", read_only=True),
            VolumeMount("/a/b/c", volume="c", read_only=inner_ro),
        ]
        with pytest.raises(ConfigError, match="'/a/b/c' lies inside the read-only mount at '/a'"):
            check_mounts(deeper)
    beside = [VolumeMount("/h", host_path="/srv", read_only=True), VolumeMount("/hx", volume="b")]
    assert [m.mount_path for m in check_mounts(beside)] == ["/h", "/hx"]
    inside_rw = [VolumeMount("/h", host_path="/srv"), VolumeMount("/h/x", volume="b", read_only=True)]
    assert [m.mount_path for m in check_mounts(inside_rw)] == ["/h", "/h/x"]


def test_allowed_dirs_are_opened_without_following_a_link_at_any_component(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    (allowed / "inner").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(allowed)
    (tmp_path / "via").symlink_to(tmp_path)  # a link on the way to a real directory
    secret = tmp_path / "secret"
    secret.mkdir()
    os.close(open_no_links(str(allowed / "inner")))
    for path in (tmp_path / "alias", tmp_path / "via" / "allowed"):
        with pytest.raises(OSError) as err:
            open_no_links(str(path))
        assert err.value.errno == errno.ELOOP
        with pytest.raises(VolumeNotAllowed, match="a component of it is a symbolic link"):
            open_host_source(VolumeMount("/m", host_path=f"{path}/inner"), [str(path)])
    # an allowed directory inside another, replaced with a link by a sandbox that writes the outer
    nested = [str(allowed / "inner"), str(allowed)]
    os.close(open_host_source(VolumeMount("/m", host_path=str(allowed / "inner")), nested))
    (allowed / "inner").rmdir()
    (allowed / "inner").symlink_to(secret)
    with pytest.raises(VolumeNotAllowed, match="symbolic link"):
        open_host_source(VolumeMount("/m", host_path=str(allowed / "inner")), nested)
    with pytest.raises(VolumeNotAllowed, match="not under"):
        open_host_source(VolumeMount("/m", host_path=str(secret)), nested)


def test_mount_points_made_without_an_owner_take_their_directory_owner(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    os.chown(tmp_path / "d", 4321, 4322)
    root = open_dir(str(tmp_path))
    try:
        mkdirs_beneath(root, "d/a/b", owner=None)
        mkdirs_beneath(root, "mine", owner=1234)
    finally:
        os.close(root)
    for rel, ids in (("d/a", (4321, 4322)), ("d/a/b", (4321, 4322)), ("mine", (1234, 1234))):
        st = os.stat(tmp_path / rel)
        assert (st.st_uid, st.st_gid) == ids, rel


def test_a_stored_mount_inside_a_read_only_one_gets_no_mount_point_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record stored before check_mounts refused it: it mounts onto a mount point that is there
    and makes none in the read-only source."""
    from sandbox_rt.backends.lxc import volumes as lxc_volumes

    bound: list[tuple[str, bool]] = []
    monkeypatch.setattr(
        lxc_volumes,
        "bind_beneath",
        lambda fd, dst, *, idmap, read_only: bound.append((os.readlink(f"/proc/self/fd/{fd}"), read_only)),
    )
    host = tmp_path / "host"
    host.mkdir()
    store = _store(tmp_path)
    store.create("v")
    cdir = tmp_path / "ct"
    cdir.mkdir()
    mounts = (VolumeMount("/h", host_path=str(host), read_only=True), VolumeMount("/h/sub", volume="v"))

    def attach() -> None:
        lxc_volumes.attach_volumes(
            cdir, mounts, store=store, host_dirs=[str(host)], idmap=None, root_uid=OWNER
        )

    with pytest.raises(VolumeNotAllowed, match="cannot find the mount point /h/sub in the read-only"):
        attach()
    assert os.listdir(host) == [] and bound == [(str(host), True)]
    (host / "sub").mkdir()
    bound.clear()
    attach()
    assert bound == [(str(host), True), (store.get("v").path, False)]
    assert os.listdir(host) == ["sub"]
