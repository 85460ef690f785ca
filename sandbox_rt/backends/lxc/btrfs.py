"""Per-sandbox disk limits on btrfs: each container dir is a subvolume with a qgroup size limit.

The ``lxc_host`` role (``lxc_host_storage: btrfs_loop``) mounts the LXC path on a btrfs filesystem
with quotas enabled. A clone's overlay delta lives in its container dir, so a limit on that
subvolume's referenced bytes bounds everything the sandbox writes. Writes beyond it fail inside the
sandbox with EDQUOT, also for container root (qgroups make no exception for root, unlike the VFS
quotas this kernel does not have).

Plain ioctls (no ``btrfs`` process per sandbox): subvolume create and qgroup limit take well
under a millisecond. ``rmdir``/``shutil.rmtree`` and ``lxc-destroy`` delete an empty subvolume;
the kernel drops its qgroup once the subvolume is cleaned up.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from pathlib import Path

__all__ = ["DiskLimitError", "create_subvolume", "is_subvolume", "set_size_limit"]

_BTRFS_IOC_SUBVOL_CREATE = 0x5000940E  # _IOW(0x94, 14, struct btrfs_ioctl_vol_args), 4096 bytes
_BTRFS_IOC_QGROUP_LIMIT = 0x8030942B  # _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args), 48 bytes
_VOL_ARGS_NAME_MAX = 4087
_QGROUP_LIMIT_MAX_RFER = 1
_SUBVOLUME_ROOT_INO = 256  # BTRFS_FIRST_FREE_OBJECTID: the inode number of every subvolume's root


class DiskLimitError(OSError):
    """A disk limit could not be set up; the message says what the host lacks."""


def _open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def create_subvolume(path: Path, mode: int = 0o755) -> None:
    """Create ``path`` as a btrfs subvolume (its parent must exist and be on btrfs)."""
    name = path.name.encode()
    if not name or len(name) > _VOL_ARGS_NAME_MAX or b"/" in name:
        raise DiskLimitError(errno.EINVAL, "bad subvolume name", str(path))
    args = bytearray(struct.pack("q4088s", 0, name))  # mutable: no 1024-byte ioctl copy limit
    parent = _open_dir(path.parent)
    try:
        fcntl.ioctl(parent, _BTRFS_IOC_SUBVOL_CREATE, args, True)
    except OSError as exc:
        if exc.errno in (errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL):
            raise DiskLimitError(
                exc.errno,
                f"{path.parent} is not on a btrfs filesystem, so disk_gb cannot be enforced "
                "(lxc_host_storage: btrfs_loop in site.yml, or disk_limits: false in host.json)",
                str(path),
            ) from exc
        raise
    finally:
        os.close(parent)
    os.chmod(path, mode)


def is_subvolume(path: Path) -> bool:
    try:
        return path.stat().st_ino == _SUBVOLUME_ROOT_INO
    except FileNotFoundError:
        return False


def set_size_limit(path: Path, limit_bytes: int) -> None:
    """Limit what the subvolume at ``path`` may reference to ``limit_bytes`` (live; may be lowered)."""
    if limit_bytes <= 0:
        raise DiskLimitError(errno.EINVAL, f"disk limit must be positive, not {limit_bytes}", str(path))
    args = struct.pack("=Q5Q", 0, _QGROUP_LIMIT_MAX_RFER, limit_bytes, 0, 0, 0)  # qgroupid 0: path's own
    fd = _open_dir(path)
    try:
        fcntl.ioctl(fd, _BTRFS_IOC_QGROUP_LIMIT, args)
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:
            raise DiskLimitError(
                exc.errno,
                f"btrfs quotas are not enabled on the filesystem of {path} "
                "(btrfs quota enable <LXC path>; site.yml does it)",
                str(path),
            ) from exc
        if exc.errno in (errno.ENOTTY, errno.EOPNOTSUPP):
            raise DiskLimitError(exc.errno, f"{path} is not on a btrfs filesystem", str(path)) from exc
        raise
    finally:
        os.close(fd)
