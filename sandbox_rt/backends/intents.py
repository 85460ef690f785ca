"""Create markers: a file per create in progress, naming the creating process.

Both backends write one before the first engine call and remove it when create returns or fails;
a marker whose process is gone is how ``gc`` finds what a caller killed mid-create left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from .owner import owner_alive, process_start_time

__all__ = ["CreateMarkers"]


class CreateMarkers:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def write(self, sandbox_id: str, **extra: Any) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        marker = {
            "id": sandbox_id,
            "pid": pid,
            "start_time": process_start_time(pid),
            "host": socket.gethostname(),
            "at": time.time(),
            **extra,
        }
        (self.directory / f"{sandbox_id}.json").write_text(json.dumps(marker))

    def remove(self, sandbox_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.directory / f"{sandbox_id}.json").unlink()

    def read(self, sandbox_id: str) -> dict[str, Any] | None:
        try:
            data = json.loads((self.directory / f"{sandbox_id}.json").read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def sweep(self) -> tuple[set[str], dict[str, str]]:
        """(ids whose creator still runs, {id: reason} of those to collect)."""
        live: set[str] = set()
        dead: dict[str, str] = {}
        if not self.directory.is_dir():
            return live, dead
        for f in self.directory.glob("*.json"):
            try:
                marker = json.loads(f.read_text())
            except (OSError, ValueError):
                dead[f.stem] = "unreadable create marker"
                continue
            sid = str(marker.get("id", f.stem))
            if owner_alive(int(marker.get("pid", 0)), marker.get("start_time"), str(marker.get("host"))):
                live.add(sid)
            else:
                dead[sid] = "creator died during create"
        return live, dead
