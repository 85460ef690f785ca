"""A warm pool: N started, SSH-connected sandboxes waiting to be handed out in milliseconds.

``Manager(pool_size=N)`` keeps N ready sandboxes of a base spec; ``create()`` takes one, applies the
request's live settings (limits by cgroup writes, hostname, labels, TTL, internet) and hands it out;
a background thread refills. A sandbox leaves the queue exactly once (``queue.Queue.get``), so it is
never handed out twice. Pool sandboxes carry the label ``sandbox-rt.pool`` and a TTL, so ``gc``
(with ``dead_owners=True``, or after expiry) reclaims them if the process dies.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable

from . import logs
from .errors import SandboxError
from .sandbox import Sandbox

__all__ = ["POOL_LABEL", "WarmPool"]

POOL_LABEL = "sandbox-rt.pool"
log = logging.getLogger(__name__)


class WarmPool:
    """Keeps ``size`` sandboxes made by ``make()`` ready; thread-safe."""

    def __init__(self, size: int, make: Callable[[], Sandbox]) -> None:
        if size < 1:
            raise ValueError("pool size must be >= 1")
        self.size = size
        self._make = make
        self._ready: queue.Queue[Sandbox] = queue.Queue()
        self._wanted = threading.Event()
        self._closed = threading.Event()
        self._failures = 0
        self._thread = threading.Thread(target=self._refill_loop, name="sandbox-rt-pool", daemon=True)
        self._wanted.set()
        self._thread.start()

    @property
    def ready(self) -> int:
        return self._ready.qsize()

    def take(self) -> Sandbox | None:
        """A ready sandbox, or None when the pool is empty right now (the caller creates cold)."""
        try:
            sb = self._ready.get_nowait()
        except queue.Empty:
            sb = None
        self._wanted.set()
        return sb

    def wait_ready(self, count: int | None = None, timeout: float = 60.0) -> bool:
        """Block until ``count`` (default: all) sandboxes are ready; False on timeout or close."""
        want = self.size if count is None else count
        deadline = time.monotonic() + timeout
        while self._ready.qsize() < want:
            if self._closed.is_set() or time.monotonic() >= deadline:
                return False
            self._closed.wait(0.02)  # poll the queue; the refiller signals nothing finer
        return True

    def _refill_loop(self) -> None:
        while not self._closed.is_set():
            self._wanted.wait(timeout=1.0)
            if self._closed.is_set():
                break
            if self._ready.qsize() >= self.size:
                self._wanted.clear()
                continue
            try:
                sb = self._make()
            except SandboxError as exc:
                self._failures += 1
                log.warning("warm pool: could not make a sandbox (%s)", exc)
                logs.event(
                    "pool_fill_failed", level=logging.WARNING, error=type(exc).__name__, count=self._failures
                )
                self._closed.wait(min(30.0, 0.5 * 2 ** min(self._failures, 6)))  # back off
                continue
            self._failures = 0
            if self._closed.is_set():
                with contextlib.suppress(SandboxError):
                    sb.destroy()
                break
            self._ready.put(sb)
            logs.event("pool_ready", sb.id, count=self._ready.qsize())

    def close(self) -> None:
        """Stop refilling and destroy the sandboxes nobody took."""
        self._closed.set()
        self._wanted.set()
        self._thread.join(timeout=120)
        while True:
            try:
                sb = self._ready.get_nowait()
            except queue.Empty:
                break
            with contextlib.suppress(SandboxError):
                sb.destroy()
