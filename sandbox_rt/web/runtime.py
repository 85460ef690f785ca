"""The cache of attached sandboxes the HTTP routes share: one attached :class:`~sandbox_rt.Sandbox`
per id, so consecutive execs reuse its SSH transport. What the routes need of the runtime is
:mod:`sandbox_rt.protocols` (one declaration for every door).
"""

from __future__ import annotations

import builtins
import logging
import threading

from ..protocols import ManagerLike, SandboxLike

__all__ = ["SandboxCache", "quiet_close"]

log = logging.getLogger(__name__)


# -- the attached-sandbox cache ----------------------------------------------------------------------
class SandboxCache:
    """One attached sandbox per id, shared by all requests (one SSH transport, channels per exec)."""

    def __init__(self, manager: ManagerLike) -> None:
        self._manager = manager
        self._lock = threading.Lock()
        self._items: dict[str, SandboxLike] = {}
        self._attaching: dict[str, threading.Lock] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def put(self, sb: SandboxLike) -> None:
        with self._lock:
            old = self._items.get(sb.id)
            self._items[sb.id] = sb
        if old is not None and old is not sb:
            quiet_close(old)

    def get(self, sandbox_id: str) -> SandboxLike:
        with self._lock:
            sb = self._items.get(sandbox_id)
            if sb is not None and sb.is_connected():
                return sb
            gate = self._attaching.setdefault(sandbox_id, threading.Lock())
        with gate:  # one attach per id at a time; the others wait and share its result
            with self._lock:
                sb = self._items.get(sandbox_id)
                if sb is not None and sb.is_connected():
                    return sb
                stale = self._items.pop(sandbox_id, None)
            if stale is not None:
                quiet_close(stale)
            try:
                sb = self._manager.attach(sandbox_id)
            finally:
                with self._lock:
                    self._attaching.pop(sandbox_id, None)
            self.put(sb)
            return sb

    def drop(self, sandbox_id: str) -> None:
        """Forget (and disconnect from) a sandbox; it keeps running."""
        with self._lock:
            sb = self._items.pop(sandbox_id, None)
        if sb is not None:
            quiet_close(sb)

    def close_all(self) -> None:
        with self._lock:
            items = builtins.list(self._items.values())
            self._items.clear()
        for sb in items:
            quiet_close(sb)


def quiet_close(sb: SandboxLike) -> None:
    try:
        sb.close()
    except Exception:  # closing a dead connection must not fail a request
        log.debug("closing the connection to %s failed", sb.id, exc_info=True)
