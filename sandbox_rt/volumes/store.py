"""Named volumes on this host, and the host directories sandboxes may mount.

Layout under ``settings.volume_dir`` (root only, 0711)::

    <name>/            0700 root: nobody on the host but root reaches a volume's files
    <name>/volume.json when it was made
    <name>/data/       what a sandbox sees at its mount path, owned by the template range's
                       sandbox user (``idmap_base + uid``), which each sandbox sees as its own user

A volume outlives the sandboxes that mount it; ``remove`` refuses one that a sandbox still
mounts. Host directories come from the operator's ``volume_host_dirs`` only: a host path is
allowed if it lies under one as written (normalised, never resolved), and the allowed directory is
opened from ``/`` without following a link at any component (one may lie inside another that
sandboxes write, and a sandbox may have replaced it, or a directory on its way, with a link).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import ConfigError, SandboxError, StateConflict, VolumeNotAllowed, VolumeNotFound
from ..models import VolumeInfo, VolumeMount
from .beneath import mkdirs_beneath, open_beneath, open_dir, open_no_links
from .checks import VOLUME_NAME, check_volume_name

__all__ = ["DATA", "VolumeStore", "host_dir_for", "open_host_source"]

DATA = "data"
_META = "volume.json"


class VolumeStore:
    """The named volumes under ``root``; ``owner`` is the host uid (and gid) their files start with."""

    def __init__(
        self,
        root: Path,
        *,
        owner: int,
        users: Callable[[], dict[str, tuple[str, ...]]],
        measure: Callable[[Path], int | None] = lambda _path: None,
    ) -> None:
        self.root = root
        self.owner = owner
        # volume name -> ids of the sandboxes that mount it (read from the sandboxes' records)
        self._users = users
        # the bytes a directory tree holds, or None if it cannot be counted quickly
        self._measure = measure

    def _dir(self, name: str) -> Path:
        return self.root / check_volume_name(name)

    def _info(self, name: str, used: dict[str, tuple[str, ...]], *, size: bool) -> VolumeInfo:
        vdir = self._dir(name)
        try:
            meta = json.loads((vdir / _META).read_text())
            created = float(meta["created_at"])
        except FileNotFoundError:
            raise VolumeNotFound(name) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"volume {name!r} has an unreadable {_META}: {exc}") from exc
        return VolumeInfo(
            name=name,
            path=str(vdir / DATA),
            created_at=created,
            used_by=used.get(name, ()),
            size_bytes=self._measure(vdir / DATA) if size else None,
        )

    def create(self, name: str) -> VolumeInfo:
        """A new, empty volume; StateConflict if one has that name."""
        vdir = self._dir(name)
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        try:
            vdir.mkdir(mode=0o700)
        except FileExistsError:
            raise StateConflict(f"volume {name!r} already exists") from None
        try:
            (vdir / DATA).mkdir(mode=0o755)
            os.chown(vdir / DATA, self.owner, self.owner)
            tmp = vdir / f".{_META}.tmp"
            tmp.write_text(json.dumps({"created_at": time.time()}))
            tmp.replace(vdir / _META)  # last: a volume without it is one being made
        except BaseException:
            shutil.rmtree(vdir, ignore_errors=True)
            raise
        return self._info(name, {}, size=False)

    def ensure(self, name: str) -> None:
        """Make volume ``name`` unless it exists (OpenSandbox's ``createIfNotExists``)."""
        with contextlib.suppress(StateConflict):
            self.create(name)

    def get(self, name: str, *, size: bool = True) -> VolumeInfo:
        return self._info(name, self._users(), size=size)

    def exists(self, name: str) -> bool:
        return (self._dir(name) / _META).is_file()

    def list(self, *, size: bool = False) -> list[VolumeInfo]:
        if not self.root.is_dir():
            return []
        used = self._users()
        out = []
        for entry in sorted(self.root.iterdir()):
            if VOLUME_NAME.fullmatch(entry.name) and (entry / _META).is_file():
                with contextlib.suppress(VolumeNotFound):
                    out.append(self._info(entry.name, used, size=size))
        return out

    def remove(self, name: str) -> None:
        """Delete volume ``name`` and its files; StateConflict while a sandbox mounts it."""
        vdir = self._dir(name)
        if not (vdir / _META).is_file():
            raise VolumeNotFound(name)
        users = self._users().get(name, ())
        if users:
            raise StateConflict(f"volume {name!r} is mounted by {', '.join(users)}: destroy them first")
        # out of the way first (a create mounting it from now on fails cleanly), then deleted;
        # rmtree does not follow the links a sandbox left in it
        doomed = self.root / f".removing-{name}-{secrets.token_hex(4)}"
        vdir.rename(doomed)
        shutil.rmtree(doomed)

    def open_source(self, mount: VolumeMount) -> int:
        """An ``O_PATH`` fd of the directory a named-volume mount shows (its ``sub_path`` made if
        missing), found without following any link; VolumeNotFound, VolumeNotAllowed."""
        assert mount.volume is not None
        if not self.exists(mount.volume):
            raise VolumeNotFound(mount.volume)
        root = open_dir(str(self._dir(mount.volume) / DATA))
        try:
            if mount.sub_path:
                try:
                    mkdirs_beneath(root, mount.sub_path, owner=self.owner)
                except OSError as exc:
                    raise _path_error(f"volume {mount.volume!r}", mount.sub_path, exc) from exc
            try:
                return open_beneath(root, mount.sub_path)
            except OSError as exc:
                raise _path_error(f"volume {mount.volume!r}", mount.sub_path or ".", exc) from exc
        finally:
            os.close(root)


def host_dir_for(host_path: str, allowed: Iterable[str]) -> tuple[str, str]:
    """(the allowed directory, the rest of ``host_path`` below it) or VolumeNotAllowed: the path must
    lie under one of the operator's ``volume_host_dirs``, compared as written (normalised: no empty
    components), never resolved: a link's target is not allowed because a link points there. The
    innermost allowed directory that holds it."""
    bases = ["/" + "/".join(p for p in base.split("/") if p) for base in allowed]
    holding = [b for b in bases if b != "/" and (host_path == b or host_path.startswith(b + "/"))]
    if holding:
        base = max(holding, key=len)
        return base, host_path[len(base) :].lstrip("/")
    listed = ", ".join(allowed) or "none (sandbox-rt serve --allow-host-path DIR, or volume_host_dirs)"
    raise VolumeNotAllowed(f"host path {host_path!r} is not under a directory this host allows: {listed}")


def open_host_source(mount: VolumeMount, allowed: Iterable[str]) -> int:
    """An ``O_PATH`` fd of the host directory a mount shows (``host_path``/``sub_path``): its allowed
    directory opened from ``/`` and the rest beneath that, without following a link at any
    component; VolumeNotFound, VolumeNotAllowed."""
    assert mount.host_path is not None
    base, rest = host_dir_for(mount.host_path, allowed)
    rel = "/".join(p for p in (rest, mount.sub_path or "") if p)
    try:
        root = open_no_links(base)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise VolumeNotAllowed(
                f"allowed host directory {base!r} cannot be mounted: a component of it is a symbolic "
                "link (links are never followed; the operator allows the directory's real path)"
            ) from exc
        what = f"allowed host directory {base!r} cannot be opened: {exc.strerror}"
        raise VolumeNotFound(base, what) from exc
    try:
        return open_beneath(root, rel)
    except OSError as exc:
        raise _path_error(f"host directory {base!r}", rel or ".", exc) from exc
    finally:
        os.close(root)


def _path_error(where: str, rel: str, exc: OSError) -> SandboxError:
    """VolumeNotFound for what is not there, VolumeNotAllowed for a link or a way out."""
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return VolumeNotFound(rel, f"{rel!r} in {where} cannot be mounted: it is not a directory there")
    reason = {
        errno.ELOOP: "a component is a symbolic link (links are never followed)",
        errno.EXDEV: "it leads out of it",
    }.get(exc.errno or 0, exc.strerror or str(exc))
    return VolumeNotAllowed(f"{rel!r} in {where} cannot be mounted: {reason}")
