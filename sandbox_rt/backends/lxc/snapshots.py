"""Snapshots on the embedded default: ``snap-<name>/`` in the LXC path (root, 0700) holds
``delta/``, a copy of a sandbox's overlay delta taken while it was frozen, and ``snapshot.json``.
Not a container (no config, no address): never matches ``sbx-<hex>``, so ``list``/``gc`` never see
it. A fork is a normal clone of the snapshot's template whose fresh delta is first filled from
``delta/`` (then the per-clone identity is written over it). ``.snap-tmp-<pid>-*`` /
``.snap-del-<pid>-*`` are a snapshot or delete in progress (swept once their process is gone)."""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import errno
import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from ...errors import BackendError, SnapshotNotFound, StateConflict
from ...filelock import file_lock
from ...models import SnapshotInfo
from .fstree import copy_tree, sweep_stale, tree_bytes

__all__ = ["SNAPSHOT_PREFIX", "SnapshotStore", "fill_clone"]

SNAPSHOT_PREFIX = "snap-"  # snapshot dirs: never a sandbox id (sbx-<10 hex>)
SNAPSHOT_FILE = "snapshot.json"
_TMP = ".snap-tmp-"  # + <pid>-<random>: a snapshot being written
_DEL = ".snap-del-"  # + <pid>-<random>: a snapshot being deleted


class SnapshotStore:
    """The snapshots of one LXC path."""

    def __init__(self, path: Path, lock_file: Path, backend: str) -> None:
        self.path = path
        self._lock_file = lock_file
        self._backend = backend

    def _dir(self, name: str) -> Path:
        return self.path / f"{SNAPSHOT_PREFIX}{name}"

    def _lock(self, *, exclusive: bool) -> contextlib.AbstractContextManager[None]:
        """Forks read a snapshot under a shared lock, a delete takes it exclusively."""
        return file_lock(self._lock_file, exclusive=exclusive)

    def take(
        self,
        name: str,
        *,
        source_id: str,
        template: str,
        upper: Path,
        hold: contextlib.AbstractContextManager[None],
        template_container: str | None = None,
    ) -> SnapshotInfo:
        """Copy ``upper`` (the source's overlay delta) into ``snap-<name>/`` while ``hold`` keeps the
        source still (frozen); the runtime's record and network state are not part of it.
        ``template_container``: the template generation the delta lies on (forks are cloned from it)."""
        final = self._dir(name)
        if final.exists():
            raise StateConflict(f"a snapshot named {name!r} exists already (delete it first)")
        sweep_stale(self.path, _TMP)
        tmp = self.path / f"{_TMP}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            tmp.mkdir(mode=0o700)
            with hold:
                copy_tree(upper, tmp / "delta", step="snapshot")
            info = SnapshotInfo(
                name=name,
                source_id=source_id,
                created_at=time.time(),
                backend=self._backend,
                size_bytes=tree_bytes(tmp / "delta"),
                template=template,
            )
            data = {**dataclasses.asdict(info), "template_container": template_container}
            (tmp / SNAPSHOT_FILE).write_text(json.dumps(data, sort_keys=True))
            try:
                os.rename(tmp, final)  # atomic; refuses an existing (non-empty) snapshot dir
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    taken = f"a snapshot named {name!r} exists already (delete it first)"
                    raise StateConflict(taken) from exc
                raise
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            where = exc.filename or self.path
            raise BackendError(f"{exc.strerror or exc} ({where})", step="snapshot") from exc
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return info

    @staticmethod
    def _read(sdir: Path) -> SnapshotInfo | None:
        try:
            data = json.loads((sdir / SNAPSHOT_FILE).read_text())
            known = {f.name for f in dataclasses.fields(SnapshotInfo)}
            return SnapshotInfo(**{k: v for k, v in data.items() if k in known})
        except (OSError, ValueError, TypeError, AttributeError):
            return None

    def list(self) -> builtins.list[SnapshotInfo]:
        out: builtins.list[SnapshotInfo] = []
        if self.path.is_dir():
            for entry in sorted(self.path.glob(f"{SNAPSHOT_PREFIX}*")):
                info = self._read(entry)
                if info is not None:
                    out.append(info)
        return out

    def delete(self, name: str) -> bool:
        final = self._dir(name)
        sweep_stale(self.path, _DEL)
        trash = self.path / f"{_DEL}{os.getpid()}-{secrets.token_hex(4)}"
        with self._lock(exclusive=True):  # waits for forks that are reading it
            try:
                os.rename(final, trash)
            except FileNotFoundError:
                return False
        shutil.rmtree(trash, ignore_errors=True)
        return True

    @contextlib.contextmanager
    def opened(self, name: str) -> Iterator[tuple[SnapshotInfo, Path, str | None]]:
        """(its info, its delta dir, the template generation it was taken on: None in a snapshot taken
        before generations) for a fork, under the shared lock; SnapshotNotFound if none."""
        sdir = self._dir(name)
        with self._lock(exclusive=False):
            info = self._read(sdir)
            if info is None:
                raise SnapshotNotFound(name)
            taken_on: str | None = None
            with contextlib.suppress(OSError, ValueError, AttributeError):
                value = json.loads((sdir / SNAPSHOT_FILE).read_text()).get("template_container")
                taken_on = value if isinstance(value, str) else None
            yield info, sdir / "delta", taken_on


def fill_clone(delta: Path, upper: Path) -> None:
    """Copy a snapshot's delta into a fresh clone's upper dir; host keys of any type go (the clone
    gets its own, and a new machine-id and names: identity.py)."""
    copy_tree(delta, upper, step="clone")
    ssh_dir = upper / "etc" / "ssh"
    if ssh_dir.is_dir() and not ssh_dir.is_symlink():
        for key in ssh_dir.glob("ssh_host_*"):
            if key.is_symlink() or not key.is_dir():
                key.unlink()
