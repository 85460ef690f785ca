"""Snapshots on Proxmox VE: a PVE snapshot of the sandbox's CT (``POST .../snapshot``,
VM.Snapshot) belongs to that CT and goes when the CT is destroyed (destroy, TTL, gc). A fork is a
full clone of it (``POST .../clone`` with ``snapname``), independent of the source and the snapshot;
its description names the source's template (forks are of that template)."""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from ...errors import BackendError, ConfigError, PermissionDenied, SnapshotNotFound, StateConflict
from ...filelock import file_lock
from ...models import SandboxRecord, SandboxSpec, SnapshotInfo
from .core import PveCore
from .description import TEMPLATE_NOTE, sandbox_id_tag, snapshot_template, tags_of

__all__ = ["PveSnapshots"]


class PveSnapshots(PveCore):
    """The snapshot half of the backend; a fork is made by the backend's clone step."""

    def _clone_from(
        self, sandbox_id: str, spec: SandboxSpec, source: tuple[str, int, str | None]
    ) -> SandboxRecord:
        raise NotImplementedError  # backend.py: the create step both a clone and a fork use

    def _snapshot_lock(self) -> contextlib.AbstractContextManager[None]:
        """Snapshot names are unique across the sandboxes: one naming at a time from this host."""
        return file_lock(self.state_dir / "snapshots.lock")

    def _snapshots(self) -> Iterator[tuple[str, int, str, dict[str, Any]]]:
        """(node, vmid, sandbox id, PVE's snapshot entry) of every snapshot of our CTs."""
        seen: set[int] = set()
        for r in self._ours():
            sid = sandbox_id_tag(tags_of(r.get("tags")))
            node, vmid = str(r["node"]), int(r["vmid"])
            if sid is None or vmid in seen:
                continue
            seen.add(vmid)
            try:
                entries = self._call("snapshot", lambda n=node, v=vmid: self._ct(n, v).snapshot.get())  # type: ignore[misc]
            except PermissionDenied:
                raise
            except BackendError:
                continue  # destroyed while we list
            for entry in entries:
                if entry.get("name") and entry["name"] != "current":  # "current" is the CT itself
                    yield node, vmid, sid, entry

    def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        return sorted(
            (
                SnapshotInfo(
                    str(e["name"]), sid, float(e.get("snaptime") or 0), self.name,
                    template=snapshot_template(str(e.get("description", ""))),
                )
                for _node, _vmid, sid, e in self._snapshots()
            ),
            key=lambda info: info.name,
        )  # fmt: skip

    def _find_snapshot(self, name: str) -> tuple[str, int, str]:
        """(node, vmid, the source's template) of snapshot ``name``; SnapshotNotFound if none."""
        for node, vmid, _sid, entry in self._snapshots():
            if entry["name"] == name:
                return node, vmid, snapshot_template(str(entry.get("description", "")))
        raise SnapshotNotFound(name)

    def snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo:
        node, vmid = self._find(sandbox_id)
        template = self._record_at(node, vmid).spec.template
        note = f"sandbox-rt snapshot of {sandbox_id}{TEMPLATE_NOTE}{template}"
        with self._snapshot_lock():
            if any(e["name"] == name for *_where, e in self._snapshots()):
                raise StateConflict(f"a snapshot named {name!r} exists already (delete it first)")
            ct = self._ct(node, vmid)
            upid = self._retrying(
                "snapshot",
                lambda: ct.snapshot.post(snapname=name, description=note),
            )
            self._wait(str(upid), "snapshot")
        return SnapshotInfo(
            name=name, source_id=sandbox_id, created_at=time.time(), backend=self.name, template=template
        )

    def delete_snapshot(self, name: str) -> bool:
        try:
            node, vmid, _template = self._find_snapshot(name)
        except SnapshotNotFound:
            return False
        ct = self._ct(node, vmid)
        upid = self._retrying("snapshot", lambda: ct.snapshot(name).delete())
        self._wait(str(upid), "snapshot")
        return True

    def clone_from_snapshot(self, sandbox_id: str, spec: SandboxSpec, name: str) -> SandboxRecord:
        node, vmid, template = self._find_snapshot(name)  # SnapshotNotFound before anything is made
        if not spec.root and self._record_at(node, vmid).spec.root:
            # what the source's root left in its files would run as root in the fork (init and sshd
            # still start as root on Proxmox VE): forks of a root sandbox keep root
            raise ConfigError(
                f"snapshot {name!r} is of a sandbox made with root=True: on Proxmox VE its forks are made "
                "with root=True only (docs/proxmox.md, 'Root-tainted sources')"
            )
        spec = dataclasses.replace(spec, template=template)  # the fork's, for its record
        return self._clone_from(sandbox_id, spec, (node, vmid, name))
