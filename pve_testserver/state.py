"""The server's state (PVE's ``user.cfg``, ``storage.cfg``, guest configs, firewall configs).

Plain JSON-friendly dicts under one re-entrant lock, optionally persisted (atomically, 0600) to a
JSON file after every change, so a server restarted on the same file (or a test following an
Ansible run made against a server in another process) sees the same pools, users, tokens, ACLs
and containers. Token secrets are stored as SHA-256 hashes only.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

STATE_VERSION = 1
DEFAULT_OSTEMPLATE = "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"


def default_storages() -> dict[str, dict[str, Any]]:
    """A fresh PVE node: ``local`` (directory) and ``local-lvm`` (LVM-thin)."""
    gib = 1024**3
    return {
        "local": {
            "type": "dir",
            "content": ["backup", "iso", "snippets", "vztmpl"],
            "shared": False,
            "total": 100 * gib,
            "used": 10 * gib,
        },
        "local-lvm": {
            "type": "lvmthin",
            "content": ["images", "rootdir"],
            "shared": False,
            "total": 400 * gib,
            "used": 0,
        },
    }


def empty_state(nodes: list[str]) -> dict[str, Any]:
    return {
        "version": STATE_VERSION,
        "nodes": list(nodes),
        "users": {"root@pam": {"enable": True, "expire": 0, "comment": "", "tokens": {}}},
        "groups": {},
        "roles": {},
        "acl": {},
        "pools": {},
        "storages": default_storages(),
        "volumes": {"local": [{"volid": DEFAULT_OSTEMPLATE, "content": "vztmpl", "size": 126 * 1024**2}]},
        "cts": {},
        "firewall": {},
        "cluster_firewall": {"options": {}},
    }


class State:
    """All mutable data; hold :attr:`lock` while reading or changing it, call :meth:`save` after."""

    def __init__(self, data: dict[str, Any], path: Path | None = None) -> None:
        self.lock = threading.RLock()
        self.path = path
        self.data = data

    @classmethod
    def open(cls, path: Path | None, nodes: list[str]) -> State:
        """Load ``path`` if it exists (keeping its nodes), else start empty with ``nodes``."""
        if path is not None and path.exists():
            data = json.loads(path.read_text(encoding="utf-8"))
            base = empty_state(data.get("nodes") or nodes)
            base.update(data)
            return cls(base, path)
        state = cls(empty_state(nodes), path)
        state.save()
        return state

    def save(self) -> None:
        if self.path is None:
            return
        with self.lock:
            text = json.dumps(self.data, indent=1, sort_keys=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".pve-state-", dir=self.path.parent)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.data)

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Roll back to a :meth:`snapshot` (a failed change writes nothing, as in PVE).

        Sections are swapped in whole (one ``update``), never cleared first: a reader that does not
        hold the lock (token checks) sees the old or the restored section, not an empty state."""
        with self.lock:
            for name in [name for name in self.data if name not in snapshot]:
                del self.data[name]
            self.data.update(snapshot)

    # Typed views on the top-level sections (all return live dicts).
    @property
    def nodes(self) -> list[str]:
        nodes: list[str] = self.data["nodes"]
        return nodes

    @property
    def users(self) -> dict[str, Any]:
        return self._section("users")

    @property
    def groups(self) -> dict[str, Any]:
        return self._section("groups")

    @property
    def roles(self) -> dict[str, Any]:
        return self._section("roles")

    @property
    def acl(self) -> dict[str, Any]:
        return self._section("acl")

    @property
    def pools(self) -> dict[str, Any]:
        return self._section("pools")

    @property
    def storages(self) -> dict[str, Any]:
        return self._section("storages")

    @property
    def volumes(self) -> dict[str, Any]:
        return self._section("volumes")

    @property
    def cts(self) -> dict[str, Any]:
        return self._section("cts")

    @property
    def firewall(self) -> dict[str, Any]:
        return self._section("firewall")

    def _section(self, name: str) -> dict[str, Any]:
        section: dict[str, Any] = self.data.setdefault(name, {})
        return section

    def ct(self, vmid: int) -> dict[str, Any] | None:
        ct: dict[str, Any] | None = self.cts.get(str(vmid))
        return ct

    def pool_of(self, vmid: int) -> str | None:
        for pool, data in self.pools.items():
            if vmid in data.get("vms", []):
                return str(pool)
        return None
