"""The btrfs helpers refuse clearly where they cannot work (the real limits: test_disk_limits.py)."""

from __future__ import annotations

import errno
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_rt.backends.lxc.btrfs import DiskLimitError, create_subvolume, is_subvolume, set_size_limit


@pytest.fixture
def tmpfs_dir() -> Iterator[Path]:
    """A directory on tmpfs (/dev/shm): surely not btrfs."""
    path = Path(tempfile.mkdtemp(dir="/dev/shm"))
    yield path
    shutil.rmtree(path)


def test_subvolume_outside_btrfs_says_what_is_missing(tmpfs_dir: Path) -> None:
    tmp_path = tmpfs_dir
    with pytest.raises(DiskLimitError, match="not on a btrfs filesystem, so disk_gb cannot be enforced"):
        create_subvolume(tmp_path / "sbx-1")
    assert not (tmp_path / "sbx-1").exists()
    with pytest.raises(DiskLimitError, match="not on a btrfs filesystem"):
        set_size_limit(tmp_path, 1 << 30)
    assert not is_subvolume(tmp_path) and not is_subvolume(tmp_path / "absent")


@pytest.mark.parametrize("limit", [0, -1])
def test_a_limit_must_be_positive(tmp_path: Path, limit: int) -> None:
    with pytest.raises(DiskLimitError) as err:
        set_size_limit(tmp_path, limit)
    assert err.value.errno == errno.EINVAL


def test_names_that_are_not_one_path_component_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DiskLimitError, match="bad subvolume name"):
        create_subvolume(tmp_path / ("x" * 5000))
