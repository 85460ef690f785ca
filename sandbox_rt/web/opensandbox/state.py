"""What the OpenSandbox lifecycle and execd routers agree on about a sandbox (the contract between
:mod:`.lifecycle` and :mod:`.execd`):

- where a sandbox's execd (port 44772) and egress API (port 18080) are served: on the dialect's own
  server, under :func:`execd_base_path` / :func:`egress_base_path`; ``GET
  /v1/sandboxes/{id}/endpoints/{port}`` answers ``<host>:<port>`` followed by that path;
- the default environment of its commands (the create request's ``env``): :func:`default_env`;
- what else the create request asked that the runtime's record does not keep (the entrypoint and the
  pid it runs as, the template or snapshot named): a :class:`SandboxNotes`, kept by the host, never by
  the sandbox (which could alter it), in one JSON file per sandbox (mode 0600) under the runtime's
  state directory (``<state_dir>/opensandbox/<id>.json``), so that it survives a restart of the server
  and every server of the host sees the same; in memory for a runtime without one (the unit tests'
  fakes). :func:`bind` chooses (the lifecycle router calls it with its manager).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ...errors import BackendError
from ...validation import SANDBOX_ID, check_env, check_sandbox_id

__all__ = [
    "EGRESS_PORT",
    "EXECD_PORT",
    "SandboxNotes",
    "bind",
    "default_env",
    "drop_notes",
    "egress_base_path",
    "execd_base_path",
    "notes",
    "put_notes",
    "sweep_notes",
]

log = logging.getLogger(__name__)

EXECD_PORT = 44772  # the SDK's DEFAULT_EXECD_PORT
EGRESS_PORT = 18080  # the SDK's DEFAULT_EGRESS_PORT
_NOTES_DIR = "opensandbox"
_MAX_NOTES_BYTES = 1 << 20  # what one sandbox's notes may take (the create body's bound is smaller)
_SWEEP_GRACE_S = 300.0  # notes younger than this are never swept (their create may still run)


def _proxy_path(sandbox_id: str, port: int) -> str:
    return f"/sandboxes/{check_sandbox_id(sandbox_id)}/proxy/{port}"


def execd_base_path(sandbox_id: str) -> str:
    """The path under which the dialect's server serves the execd API of ``sandbox_id``
    (``/sandboxes/sbx-0123456789/proxy/44772``): its ``/ping``, ``/command``, ``/files``... follow it.
    ConfigError for a malformed id."""
    return _proxy_path(sandbox_id, EXECD_PORT)


def egress_base_path(sandbox_id: str) -> str:
    """The path under which the dialect's server serves the egress API of ``sandbox_id``
    (``/sandboxes/sbx-0123456789/proxy/18080``): the SDK resolves it at every create and connect."""
    return _proxy_path(sandbox_id, EGRESS_PORT)


@dataclasses.dataclass(frozen=True)
class SandboxNotes:
    """What the dialect's create asked of a sandbox beyond the runtime's own record."""

    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    entrypoint: tuple[str, ...] = ()
    entrypoint_pid: int | None = None  # the background process it runs as; None: not started
    image: str | None = None  # the template ``image.uri`` named
    snapshot_id: str | None = None  # the snapshot it was forked from

    def to_json(self) -> dict[str, Any]:
        return {
            "env": dict(self.env),
            "entrypoint": list(self.entrypoint),
            "entrypoint_pid": self.entrypoint_pid,
            "image": self.image,
            "snapshot_id": self.snapshot_id,
        }

    @classmethod
    def from_json(cls, data: Any) -> SandboxNotes:
        """The notes in ``data``; ValueError if anything in it is not what :meth:`to_json` writes."""
        if not isinstance(data, dict) or set(data) != {
            "env",
            "entrypoint",
            "entrypoint_pid",
            "image",
            "snapshot_id",
        }:
            raise ValueError("not a notes object")
        env, argv, pid = data["env"], data["entrypoint"], data["entrypoint_pid"]
        if not isinstance(env, dict):
            raise ValueError("env is not an object")
        if not isinstance(argv, list) or not all(isinstance(w, str) for w in argv):
            raise ValueError("entrypoint is not an array of strings")
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid < 1):
            raise ValueError("entrypoint_pid is not a pid")
        for key in ("image", "snapshot_id"):
            if data[key] is not None and not isinstance(data[key], str):
                raise ValueError(f"{key} is not a string")
        return cls(check_env(env), tuple(argv), pid, data["image"], data["snapshot_id"])


class _Store:
    """The notes of every sandbox: files under ``root``, or a dict when ``root`` is None."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self._memory: dict[str, SandboxNotes] = {}
        self._lock = threading.Lock()

    def _path(self, sandbox_id: str) -> Path:
        assert self.root is not None
        return self.root / f"{check_sandbox_id(sandbox_id)}.json"

    def put(self, sandbox_id: str, value: SandboxNotes) -> None:
        if self.root is None:
            with self._lock:
                self._memory[check_sandbox_id(sandbox_id)] = value
            return
        path = self._path(sandbox_id)
        tmp = path.with_suffix(".tmp")
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(value.to_json(), f)
            tmp.replace(path)
        except OSError as exc:
            raise BackendError(
                f"cannot keep the OpenSandbox notes of {sandbox_id} in {self.root}: {exc.strerror or exc}",
                step="opensandbox",
            ) from exc

    def get(self, sandbox_id: str) -> SandboxNotes | None:
        if self.root is None:
            with self._lock:
                return self._memory.get(check_sandbox_id(sandbox_id))
        path = self._path(sandbox_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise BackendError(
                f"cannot read the OpenSandbox notes of {sandbox_id}: {exc.strerror or exc}",
                step="opensandbox",
            ) from exc
        try:
            with os.fdopen(fd, "rb") as f:
                raw = f.read(_MAX_NOTES_BYTES + 1)
            if len(raw) > _MAX_NOTES_BYTES:
                raise ValueError(f"larger than {_MAX_NOTES_BYTES} bytes")
            return SandboxNotes.from_json(json.loads(raw))
        except (OSError, ValueError) as exc:  # ConfigError (a bad env name) is a ValueError too
            raise BackendError(
                f"the OpenSandbox notes of {sandbox_id} ({path}) are unreadable: {exc}", step="opensandbox"
            ) from exc

    def drop(self, sandbox_id: str) -> None:
        if self.root is None:
            with self._lock:
                self._memory.pop(check_sandbox_id(sandbox_id), None)
            return
        with contextlib.suppress(FileNotFoundError):
            self._path(sandbox_id).unlink()

    def sweep(self, live: Iterable[str]) -> int:
        """Forget the notes of sandboxes not in ``live`` (destroyed by another API, or by the reaper
        when their TTL ran out); notes younger than a few minutes stay (their create may still run)."""
        keep = set(live)
        if self.root is None:
            with self._lock:
                gone = [sid for sid in self._memory if sid not in keep]
                for sid in gone:
                    del self._memory[sid]
            return len(gone)
        removed = 0
        try:
            entries = list(self.root.iterdir())
        except FileNotFoundError:
            return 0
        now = time.time()
        for entry in entries:
            sid = entry.name.removesuffix(".json")
            if entry.suffix != ".json" or not SANDBOX_ID.match(sid) or sid in keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                if now - entry.lstat().st_mtime > _SWEEP_GRACE_S:
                    entry.unlink()
                    removed += 1
        return removed


_store = _Store(None)
_bound: object | None = None
_bind_lock = threading.Lock()


def bind(manager: object) -> None:
    """Keep the notes where ``manager``'s runtime keeps its state (``settings.state_dir``), or in
    memory if it has none. Cheap when called again with the same manager."""
    global _store, _bound
    if _bound is manager:
        return
    with _bind_lock:
        if _bound is manager:
            return
        state_dir = getattr(getattr(manager, "settings", None), "state_dir", None)
        root = Path(state_dir) / _NOTES_DIR if isinstance(state_dir, str | Path) else None
        if root != _store.root:
            _store = _Store(root)
        _bound = manager


def put_notes(sandbox_id: str, value: SandboxNotes) -> None:
    _store.put(sandbox_id, value)


def notes(sandbox_id: str) -> SandboxNotes | None:
    """The notes of a sandbox the dialect created; None for one it did not (made by the native API,
    the CLI, the Python library)."""
    return _store.get(sandbox_id)


def drop_notes(sandbox_id: str) -> None:
    _store.drop(sandbox_id)


def sweep_notes(live: Iterable[str]) -> int:
    return _store.sweep(live)


def default_env(sandbox_id: str) -> dict[str, str]:
    """The environment every command of ``sandbox_id`` starts with: the create request's ``env``
    ({} for a sandbox the dialect did not create). A command's own ``envs`` override it key by key:
    ``{**default_env(sid), **request_envs}``. BackendError if the host's notes are unreadable."""
    found = _store.get(sandbox_id)
    return dict(found.env) if found is not None else {}
