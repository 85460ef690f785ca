"""Volume mounts of an LXC sandbox (see sandbox_rt/volumes for what a mount may name).

At each start, every mount's source directory is opened without following links
(``openat2``, see volumes/beneath.py), cloned as a detached mount (``open_tree`` of the fd),
made ``nosuid,nodev`` (and read-only if asked), idmapped from the template's id range to the
sandbox's own (isolated id maps), and moved to ``<container dir>/volumes/<i>``. The clone's
config binds that into the sandbox (``lxc.mount.entry``). After ``lxc-start`` the host's copies
are detached: the sandbox's mount namespace holds its own, with the flags locked.

Files in a volume are therefore stored with the template range's ids (``idmap_base + uid``): a
file a sandbox's root makes setuid is owned by an unprivileged host uid, never by host root.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Sequence
from pathlib import Path

from ...errors import BackendError, VolumeNotAllowed
from ...models import VolumeMount
from ...volumes.beneath import mkdirs_beneath, open_beneath
from ...volumes.store import VolumeStore, open_host_source
from .idmap import bind_beneath, unmount

__all__ = ["MOUNTS_DIR", "attach_volumes", "detach_volumes", "mount_entries"]

MOUNTS_DIR = "volumes"  # <container dir>/volumes/<i>: where each source waits for lxc-start


def mount_entries(cdir: Path, mounts: Sequence[VolumeMount]) -> list[str]:
    """The clone's ``lxc.mount.entry`` lines (paths were checked: no blanks, no '..')."""
    lines = []
    for i, mount in enumerate(mounts):
        options = "bind,create=dir,nosuid,nodev" + (",ro" if mount.read_only else "")
        source = cdir / MOUNTS_DIR / str(i)
        lines.append(f"lxc.mount.entry = {source} {mount.mount_path[1:]} none {options} 0 0")
    return lines


def attach_volumes(
    cdir: Path,
    mounts: Sequence[VolumeMount],
    *,
    store: VolumeStore,
    host_dirs: Sequence[str],
    idmap: tuple[int, int] | None,
    root_uid: int,
) -> None:
    """Mount each source at ``<cdir>/volumes/<i>`` for ``lxc-start`` (detach_volumes undoes it).

    ``mounts`` come sorted (check_mounts): a mount inside another one's path gets its mount point
    made in that source here, on the host, never through a link, owned like the volume's files
    (in a host directory: like the directory it is made in, so a sandbox gets no directory there
    it could not have made itself). Nothing is ever made in a read-only source: check_mounts
    refuses a mount inside a read-only one; a record stored before that rule mounts only onto a
    mount point that is already there. A source that is gone, not allowed or reached through a link
    raises VolumeNotFound / VolumeNotAllowed. ``root_uid`` (the sandbox's root on the host, which
    makes LXC's mounts) owns the mount points' dir."""
    if not mounts:
        return
    (cdir / MOUNTS_DIR).mkdir(mode=0o700, exist_ok=True)
    os.chown(cdir / MOUNTS_DIR, root_uid, root_uid)
    fds: list[int] = []
    try:
        for i, mount in enumerate(mounts):
            fds.append(
                store.open_source(mount) if mount.volume is not None else open_host_source(mount, host_dirs)
            )
            parent = _parent(mounts, i)
            if parent is not None:
                _mount_point(mounts, parent, i, fds[parent], owner=store.owner)
            dst = cdir / MOUNTS_DIR / str(i)
            dst.mkdir(mode=0o700, exist_ok=True)
            try:
                bind_beneath(fds[i], dst, idmap=idmap, read_only=mount.read_only)
            except OSError as exc:
                what = f"cannot mount the volume for {mount.mount_path}: {exc}"
                raise BackendError(what, step="volumes") from exc
    finally:
        for fd in fds:
            os.close(fd)


def _mount_point(mounts: Sequence[VolumeMount], parent: int, i: int, parent_fd: int, *, owner: int) -> None:
    """Make mount ``i``'s mount point in the source of mount ``parent`` (open as ``parent_fd``),
    never through a link; in a read-only source it must be there already (nothing is made)."""
    outer = mounts[parent]
    rel = mounts[i].mount_path[len(outer.mount_path) + 1 :]
    try:
        if outer.read_only:
            os.close(open_beneath(parent_fd, rel))
        else:
            mkdirs_beneath(parent_fd, rel, owner=owner if outer.volume is not None else None)
    except OSError as exc:
        what = "find" if outer.read_only else "make"
        raise VolumeNotAllowed(
            f"cannot {what} the mount point {mounts[i].mount_path} in the "
            f"{'read-only ' if outer.read_only else ''}volume at {outer.mount_path}: {exc.strerror or exc}"
        ) from exc


def _parent(mounts: Sequence[VolumeMount], i: int) -> int | None:
    """The index of the innermost earlier mount whose path holds mount ``i``'s, if any."""
    path = mounts[i].mount_path
    inside = [j for j in range(i) if path.startswith(mounts[j].mount_path + "/")]
    return max(inside, key=lambda j: len(mounts[j].mount_path)) if inside else None


def detach_volumes(cdir: Path) -> None:
    """Detach the host's copies and remove their mount points. Before anything deletes the
    container dir: a mount left there would have the volume's files deleted with it. Raises
    BackendError if one cannot go (nothing may delete the dir then)."""
    mounts = cdir / MOUNTS_DIR
    if not mounts.is_dir() or mounts.is_symlink():
        return
    for point in sorted(mounts.iterdir()):
        try:
            while unmount(point):  # stacked mounts too
                pass
            point.rmdir()
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                continue
            raise BackendError(
                f"cannot detach the volume mount {point}: {exc.strerror or exc}", step="volumes"
            ) from exc
    with contextlib.suppress(OSError):
        mounts.rmdir()
