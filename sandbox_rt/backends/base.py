"""The Protocol every container engine implements, and what it hands back."""

from __future__ import annotations

import builtins
from typing import Protocol, runtime_checkable

from ..errors import ConfigError
from ..models import ResourceUsage, SandboxRecord, SandboxSpec, SnapshotInfo

__all__ = [
    "Backend",
    "GcCandidate",
    "PauseBackend",
    "PlacementBackend",
    "SnapshotBackend",
    "TemplateGenerations",
    "pause_backend",
    "placement_backend",
    "snapshot_backend",
]


class GcCandidate:
    """A sandbox (or the remains of one) that ``gc`` should remove, and why."""

    __slots__ = ("reason", "sandbox_id")

    def __init__(self, sandbox_id: str, reason: str) -> None:
        self.sandbox_id = sandbox_id
        self.reason = reason

    def __repr__(self) -> str:
        return f"GcCandidate({self.sandbox_id!r}, {self.reason!r})"


@runtime_checkable
class Backend(Protocol):
    """A container engine: makes, starts, describes and removes sandboxes.

    Create is split in steps so the manager can clean up after any of them:
    ``begin`` (record the intent) → ``clone`` (copy the template, apply limits, address; returns
    the record) → ``start`` (returns the record with the pinned host key) → [SSH by the manager]
    → ``end`` (forget the intent).
    ``destroy`` is idempotent and removes everything ``clone``/``start`` made.
    ``clone`` never grants what the spec's ``internet`` and ``egress`` ask for: the manager does,
    once, with ``set_internet``/``set_egress`` after ``start`` (a sandbox is offline until then).
    """

    name: str

    def begin(self, sandbox_id: str) -> None: ...

    def end(self, sandbox_id: str) -> None: ...

    def clone(self, sandbox_id: str, spec: SandboxSpec) -> SandboxRecord: ...

    def start(self, sandbox_id: str) -> SandboxRecord:
        """Start the sandbox; returns its record with the SSH host key pinned for it."""
        ...

    def stop(self, sandbox_id: str) -> None: ...

    def update(self, record: SandboxRecord, spec: SandboxSpec) -> SandboxRecord:
        """Apply limits, hostname, labels and TTL of ``spec`` to a running sandbox (warm pool)."""
        ...

    def destroy(self, sandbox_id: str) -> bool:
        """Remove the sandbox and all it holds; True if anything existed."""
        ...

    def get(self, sandbox_id: str) -> SandboxRecord:
        """The record of a sandbox; raises SandboxNotFound."""
        ...

    def list(self) -> builtins.list[SandboxRecord]: ...

    def state(self, sandbox_id: str) -> str: ...

    def uptime_s(self, sandbox_id: str) -> float | None: ...

    def usage(self, sandbox_id: str) -> ResourceUsage: ...

    def set_internet(self, record: SandboxRecord, enabled: bool) -> None: ...

    def internet_enabled(self, record: SandboxRecord) -> bool: ...

    def set_egress(self, record: SandboxRecord, egress: tuple[str, ...]) -> None:
        """Allow only these destinations (validated, normalised) while internet is off."""
        ...

    def gc_candidates(self, *, now: float, dead_owners: bool) -> builtins.list[GcCandidate]: ...


@runtime_checkable
class SnapshotBackend(Protocol):
    """What a backend adds to support snapshots (an optional capability of :class:`Backend`).

    ``snapshot`` saves a sandbox's filesystem under a name (validated by the caller); names are
    unique per backend. ``clone_from_snapshot`` is ``clone`` with the snapshot's files instead of
    the bare template, then the same per-clone identity (host key, machine-id, name, address);
    it raises SnapshotNotFound before making anything when the name is unknown.
    """

    def snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo: ...

    def list_snapshots(self) -> builtins.list[SnapshotInfo]: ...

    def delete_snapshot(self, name: str) -> bool:
        """Remove the snapshot; True if it existed."""
        ...

    def clone_from_snapshot(self, sandbox_id: str, spec: SandboxSpec, name: str) -> SandboxRecord: ...


def snapshot_backend(backend: object) -> SnapshotBackend:
    """``backend`` as a :class:`SnapshotBackend`, or ConfigError if it has no snapshots."""
    if not isinstance(backend, SnapshotBackend):
        raise ConfigError(f"the {getattr(backend, 'name', type(backend).__name__)} backend has no snapshots")
    return backend


@runtime_checkable
class TemplateGenerations(Protocol):
    """What a backend adds whose templates are swapped in generations while sandboxes run (an
    optional capability of :class:`Backend`; LXC: generations.py).

    ``template_is_current`` says whether a sandbox was cloned from the generation its template's
    creates get now (the warm pool hands out none that is not); ``prune_templates`` removes the
    generations creates no longer get and nothing uses, and returns them.
    """

    def template_is_current(self, record: SandboxRecord) -> bool: ...

    def prune_templates(self, *, dry_run: bool = False) -> builtins.list[str]: ...


@runtime_checkable
class PauseBackend(Protocol):
    """What a backend adds to pause sandboxes (an optional capability of :class:`Backend`, like
    :class:`SnapshotBackend`: a test's fake engine need not have it).

    ``pause`` freezes every process of a running sandbox where it stands (its memory, files and
    network state stay; nothing runs until ``resume``); ``state`` then says ``frozen``. Both are
    idempotent: pausing a paused sandbox or resuming a running one changes nothing. A stopped
    sandbox is a StateConflict; an unknown one SandboxNotFound.
    """

    def pause(self, sandbox_id: str) -> None: ...

    def resume(self, sandbox_id: str) -> None: ...


def pause_backend(backend: object) -> PauseBackend:
    """``backend`` as a :class:`PauseBackend`, or ConfigError if it cannot pause sandboxes."""
    if not isinstance(backend, PauseBackend):
        raise ConfigError(
            f"the {getattr(backend, 'name', type(backend).__name__)} backend cannot pause sandboxes"
        )
    return backend


@runtime_checkable
class PlacementBackend(Protocol):
    """A backend over several nodes (an optional capability of :class:`Backend`): ``clone_on`` is
    ``clone`` on the named node only (``create(node=...)``); ConfigError for an unknown node or one
    without the template, BackendError for one that is offline."""

    def clone_on(self, sandbox_id: str, spec: SandboxSpec, node: str) -> SandboxRecord: ...


def placement_backend(backend: object) -> PlacementBackend:
    """``backend`` as a :class:`PlacementBackend`, or ConfigError if it has one host only."""
    if not isinstance(backend, PlacementBackend):
        raise ConfigError(
            f"the {getattr(backend, 'name', type(backend).__name__)} backend runs on one host: "
            "node= does not apply"
        )
    return backend
