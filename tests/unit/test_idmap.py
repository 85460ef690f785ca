"""Isolated id maps: which range a sandbox gets, whether the host delegates it, moving a tree's owners."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_rt.backends.lxc.idmap import ID_RANGE, idmap_base_for, shift_owners, subid_ranges_cover
from sandbox_rt.errors import BackendError


def test_each_address_gets_its_own_range_after_the_templates() -> None:
    first = idmap_base_for("10.99.1.0", "10.99.1.0", 100000)
    assert first == 100000 + ID_RANGE
    assert idmap_base_for("10.99.1.1", "10.99.1.0", 100000) == first + ID_RANGE
    last = idmap_base_for("10.99.255.254", "10.99.1.0", 100000)  # the default pool's last address
    assert last + ID_RANGE <= (1 << 32) - 1


def test_an_address_without_a_range_below_2_32_is_refused() -> None:
    with pytest.raises(BackendError, match="below 2"):
        idmap_base_for("10.255.255.255", "10.0.0.0", 100000)
    with pytest.raises(BackendError, match="below the address pool"):
        idmap_base_for("10.99.0.5", "10.99.1.0", 100000)


def test_subid_delegation_must_cover_the_whole_range(tmp_path: Path) -> None:
    uid, gid = tmp_path / "subuid", tmp_path / "subgid"
    uid.write_text("alice:100000:65536\nroot:100000:655360\n")
    gid.write_text("root:100000:655360\n")
    files = (uid, gid)
    assert subid_ranges_cover("root", 100000 + 65536, 65536, files)
    assert not subid_ranges_cover("root", 100000 + 10 * 65536, 65536, files)  # one past the end
    assert not subid_ranges_cover("alice", 165536, 65536, files)
    gid.write_text("root:100000:65536\n")
    assert not subid_ranges_cover("root", 165536, 65536, files)  # gids must be delegated too


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")  # CI runs as root: never skipped there
def test_shift_owners_keeps_each_ids_place_and_special_bits(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    f = tmp_path / "d" / "suid"
    f.write_text("x")
    src = 100000 + 2 * ID_RANGE  # another sandbox's range
    os.chown(f, src + 1000, src + 1000)
    os.chmod(f, 0o4755)
    (tmp_path / "link").symlink_to("/etc/shadow")  # a link is re-owned, never followed
    os.lchown(tmp_path / "link", src, src)
    (tmp_path / "dirlink").symlink_to(tmp_path / "d")
    os.chown(tmp_path, 0, 0)  # an id from outside any range
    n = shift_owners(tmp_path, template_base=100000, to_base=300000)
    assert n == 5
    # src + 1000 is place 1000 of its range: it moves to place 1000 of the new one
    assert (f.stat().st_uid, f.stat().st_gid) == (301000, 301000)
    assert f.stat().st_mode & 0o7777 == 0o4755
    assert os.lstat(tmp_path / "link").st_uid == 300000 and Path("/etc/shadow").stat().st_uid == 0
    assert os.lstat(tmp_path).st_uid == 300000 + ID_RANGE - 2  # nobody
