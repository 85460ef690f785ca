"""The registry of templates built from code: ``<state_dir>/templates.json``.

One JSON object, written whole under a lock (a reader sees the old file or the new one)::

    {"version": 1,
     "templates": {"<name>": {"container": "sandbox-template-<name>-<key[:12]>", "key": "<sha256>",
                              "base": "default", "backend": "lxc", "built_at": 1764070000.0,
                              "steps": ["apt_install(jq)", ...], "vmid": null}}}

On Proxmox VE (``"backend": "proxmox"``) ``vmid`` is the VMID of the CT template the build made
(``container`` is then its hostname); files written before it had the field read it as null.

:class:`~sandbox_rt.config.Settings` merges it with host.json's ``templates`` (the inventory-built
ones; those win a name they share, and the builder refuses such a name), so ``create(template=...)``,
the HTTP API, MCP and the OpenSandbox dialect see built templates with no change of their own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .filelock import file_lock

__all__ = ["REGISTRY_FILE", "BuiltTemplate", "TemplateRegistry", "built_containers", "built_vmids"]

REGISTRY_FILE = "templates.json"
_VERSION = 1
_CONTAINER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_KEY = re.compile(r"[0-9a-f]{64}")


@dataclasses.dataclass(frozen=True)
class BuiltTemplate:
    """One built template: its name, the container that holds it, its cache key and provenance;
    on Proxmox VE the VMID of its CT template."""

    name: str
    container: str
    key: str
    base: str
    backend: str
    built_at: float
    steps: tuple[str, ...] = ()
    vmid: int | None = None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        del data["name"]
        data["steps"] = list(self.steps)
        return data

    @classmethod
    def from_json(cls, name: str, data: Any) -> BuiltTemplate:
        if not isinstance(data, dict):
            raise ValueError(f"{name}: not an object")
        entry = cls(
            name=name,
            container=str(data["container"]),
            key=str(data["key"]),
            base=str(data["base"]),
            backend=str(data.get("backend", "lxc")),
            built_at=float(data["built_at"]),
            steps=tuple(str(s) for s in data.get("steps", ())),
            vmid=None if data.get("vmid") is None else int(data["vmid"]),
        )
        if not _CONTAINER.fullmatch(entry.container) or not _KEY.fullmatch(entry.key):
            raise ValueError(f"{name}: bad container or key")
        if entry.vmid is not None and entry.vmid < 100:
            raise ValueError(f"{name}: bad vmid {entry.vmid}")
        if entry.backend == "proxmox" and entry.vmid is None:
            raise ValueError(f"{name}: a proxmox template without a vmid")
        return entry


class TemplateRegistry:
    """The built templates of one runtime state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / REGISTRY_FILE
        self._lock_path = self.state_dir / ".templates.lock"

    def read(self) -> dict[str, BuiltTemplate]:
        """Name -> entry; no file: none. A malformed file is a ConfigError naming it."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ConfigError(f"cannot read the template registry {self.path}: {exc}") from exc
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("version") != _VERSION:
                raise ValueError(f"not a version {_VERSION} registry")
            templates = data.get("templates")
            if not isinstance(templates, dict):
                raise ValueError("no 'templates' object")
            return {str(n): BuiltTemplate.from_json(str(n), v) for n, v in templates.items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"template registry {self.path} is malformed: {exc}") from exc

    def get(self, name: str) -> BuiltTemplate | None:
        return self.read().get(name)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with file_lock(self._lock_path):
            yield

    @contextlib.contextmanager
    def building(self, name: str) -> Iterator[None]:
        """Held while ``name`` is built or removed: one build of a name at a time on this host."""
        with file_lock(self.state_dir / f".template-build-{name}.lock"):
            yield

    def _write(self, entries: dict[str, BuiltTemplate]) -> None:
        data = {"version": _VERSION, "templates": {n: e.to_json() for n, e in sorted(entries.items())}}
        tmp = self.path.with_name(f".{REGISTRY_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.chmod(tmp, 0o644)
        tmp.replace(self.path)

    def put(self, entry: BuiltTemplate) -> BuiltTemplate | None:
        """Record ``entry``; returns the entry it replaced, if any."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with self._locked():
            entries = self.read()
            old = entries.get(entry.name)
            entries[entry.name] = entry
            self._write(entries)
        return old

    def remove(self, name: str) -> BuiltTemplate | None:
        """Forget ``name``; returns its entry (None: there was none)."""
        with self._locked():
            entries = self.read()
            old = entries.pop(name, None)
            if old is not None:
                self._write(entries)
        return old


def built_containers(state_dir: Path, backend: str) -> dict[str, str]:
    """Name -> container of the templates built for ``backend`` (what Settings merges)."""
    return {n: e.container for n, e in TemplateRegistry(state_dir).read().items() if e.backend == backend}


def built_vmids(state_dir: Path) -> dict[str, int]:
    """Name -> VMID of the CT templates built on Proxmox VE (what Settings merges)."""
    return {
        n: e.vmid
        for n, e in TemplateRegistry(state_dir).read().items()
        if e.backend == "proxmox" and e.vmid is not None
    }
