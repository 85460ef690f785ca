"""Fault switches: make the test server misbehave the ways real PVE does, on demand.

* ``lock``: the next ``count`` config writes (``PUT .../config``, ``resize``, ``template``,
  firewall writes) to a CT (optionally only ``vmid``) fail with ``500 CT is locked (<lock>)``,
  as PVE answers while another task holds the lock (LXC locks: ``disk`` on a clone source,
  ``create`` on a CT being created or cloned, ``backup``, ``snapshot``...).
* ``nextid_repeat``: the next ``count`` calls of ``GET /cluster/nextid`` return the same ID (the
  first one computed), even after it was taken - two callers racing for one ID; the loser's clone
  then fails with ``CT <id> already exists on node '<node>'``.
* ``task_delay``: tasks (optionally of some types: ``vzclone``, ``vzstart``...) stay ``running``
  ``seconds`` longer (optionally only the next ``count`` ones); ``release`` ends all current
  delays at once (tests arm a long delay, look at the running task, then release it).
* ``task_fail``: the next ``count`` tasks (optionally of some types) end with ``exitstatus`` =
  ``message`` (what was made is rolled back, as PVE does).
* ``node_offline``: requests proxied to that node answer ``595 Errors during connection
  establishment, proxy handler: No route to host``; it shows ``offline`` in ``/nodes``.
* ``http_error``: the next ``count`` API requests (optionally only of one HTTP ``method`` and whose
  path below ``/api2/json`` matches the regular expression ``path``) answer ``status`` with
  ``message`` before anything is done, as pveproxy does when pvedaemon is down or overloaded
  (``503 Service Unavailable``) or a handler dies (``500``).
* ``task_half_fail``: the next ``count`` tasks (optionally of some types) fail after doing their
  work, and PVE's own cleanup fails as well (``Failed to remove target CT config``): a clone
  leaves its new CT behind (in its pool), unlocked or, with ``keep_lock``, still locked ``create``;
  other task types just fail.

A running task can be stopped (``DELETE /nodes/{node}/tasks/{upid}``, as PVE's ``stop_task``):
a delayed task stops waiting, and its first fault point ends it with ``received interrupt``
after the task's own cleanup (a stopped clone removes its new CT, as PVE's worker does on SIGTERM).

Python API: the methods below; HTTP: ``GET|POST|DELETE /_test/faults`` (JSON, root token).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Armed:
    count: int | None  # None = forever
    types: frozenset[str] | None = None
    vmid: int | None = None
    value: Any = None

    def matches(self, kind: str | None = None, vmid: int | None = None) -> bool:
        if self.count is not None and self.count <= 0:
            return False
        if self.types is not None and kind not in self.types:
            return False
        return self.vmid is None or vmid is None or self.vmid == vmid

    def consume(self) -> None:
        if self.count is not None:
            self.count -= 1


@dataclass
class Faults:
    """Thread-safe fault switches (see module docstring)."""

    _mutex: threading.Lock = field(default_factory=threading.Lock)
    _locks: list[_Armed] = field(default_factory=list)
    _delays: list[_Armed] = field(default_factory=list)
    _failures: list[_Armed] = field(default_factory=list)
    _nextid: _Armed | None = None
    _offline: set[str] = field(default_factory=set)
    _release: threading.Event = field(default_factory=threading.Event)
    _http: list[_Armed] = field(default_factory=list)
    _half: list[_Armed] = field(default_factory=list)

    # --- arming -----------------------------------------------------------------------------
    def inject_lock(self, count: int = 1, lock: str = "disk", vmid: int | None = None) -> None:
        with self._mutex:
            self._locks.append(_Armed(count, vmid=vmid, value=lock))

    def repeat_nextid(self, count: int = 2) -> None:
        with self._mutex:
            self._nextid = _Armed(count)

    def slow_tasks(self, seconds: float, types: list[str] | None = None, count: int | None = None) -> None:
        with self._mutex:
            self._delays.append(_Armed(count, frozenset(types) if types else None, value=float(seconds)))

    def fail_tasks(self, message: str, types: list[str] | None = None, count: int | None = 1) -> None:
        with self._mutex:
            self._failures.append(_Armed(count, frozenset(types) if types else None, value=message))

    def release_tasks(self) -> None:
        """End every delay a task is serving now (later delays are not affected)."""
        with self._mutex:
            event, self._release = self._release, threading.Event()
        event.set()

    def set_node_offline(self, node: str, offline: bool = True) -> None:
        with self._mutex:
            if offline:
                self._offline.add(node)
            else:
                self._offline.discard(node)

    def http_error(
        self,
        status: int,
        message: str,
        method: str | None = None,
        path: str | None = None,
        count: int | None = 1,
    ) -> None:
        """The next ``count`` requests (``None``: all) matching ``method`` and the ``path`` regex answer
        ``status message`` without being handled."""
        matcher = (method.upper() if method else None, re.compile(path) if path else None)
        with self._mutex:
            self._http.append(_Armed(count, vmid=None, value=(int(status), str(message), matcher)))

    def half_fail_tasks(
        self, message: str, types: list[str] | None = None, count: int | None = 1, keep_lock: bool = False
    ) -> None:
        with self._mutex:
            self._half.append(_Armed(count, frozenset(types) if types else None, value=(message, keep_lock)))

    def clear(self) -> None:
        with self._mutex:
            self._locks.clear()
            self._delays.clear()
            self._failures.clear()
            self._nextid = None
            self._offline.clear()
            self._http.clear()
            self._half.clear()
        self.release_tasks()

    def configure(self, spec: dict[str, Any]) -> None:
        """Arm from the JSON of ``POST /_test/faults`` (keys as in the module docstring)."""
        if "lock" in spec:
            s = spec["lock"]
            self.inject_lock(int(s.get("count", 1)), str(s.get("lock", "disk")), _opt_int(s.get("vmid")))
        if "nextid_repeat" in spec:
            self.repeat_nextid(int(spec["nextid_repeat"].get("count", 2)))
        if "task_delay" in spec:
            s = spec["task_delay"]
            self.slow_tasks(float(s["seconds"]), s.get("types"), _opt_int(s.get("count")))
        if "task_fail" in spec:
            s = spec["task_fail"]
            self.fail_tasks(str(s["message"]), s.get("types"), _opt_int(s.get("count", 1)))
        if spec.get("release"):
            self.release_tasks()
        if "node_offline" in spec:
            s = spec["node_offline"]
            self.set_node_offline(str(s["node"]), bool(s.get("offline", True)))
        if "http_error" in spec:
            s = spec["http_error"]
            self.http_error(
                int(s["status"]),
                str(s["message"]),
                s.get("method"),
                s.get("path"),
                _opt_int(s.get("count", 1)),
            )
        if "task_half_fail" in spec:
            s = spec["task_half_fail"]
            self.half_fail_tasks(
                str(s["message"]), s.get("types"), _opt_int(s.get("count", 1)), bool(s.get("keep_lock"))
            )

    def describe(self) -> dict[str, Any]:
        with self._mutex:
            return {
                "lock": [
                    {"count": a.count, "lock": a.value, "vmid": a.vmid} for a in self._locks if a.matches()
                ],
                "nextid_repeat": None
                if self._nextid is None or not self._nextid.matches()
                else {"count": self._nextid.count, "value": self._nextid.value},
                "task_delay": [
                    {"seconds": a.value, "types": sorted(a.types or []), "count": a.count}
                    for a in self._delays
                    if a.matches()
                ],
                "task_fail": [
                    {"message": a.value, "types": sorted(a.types or []), "count": a.count}
                    for a in self._failures
                    if a.matches()
                ],
                "node_offline": sorted(self._offline),
                "http_error": [
                    {
                        "status": a.value[0],
                        "message": a.value[1],
                        "method": a.value[2][0],
                        "path": a.value[2][1].pattern if a.value[2][1] else None,
                        "count": a.count,
                    }
                    for a in self._http
                    if a.matches()
                ],
                "task_half_fail": [
                    {
                        "message": a.value[0],
                        "types": sorted(a.types or []),
                        "count": a.count,
                        "keep_lock": a.value[1],
                    }
                    for a in self._half
                    if a.matches()
                ],
            }

    # --- consulted by the server ------------------------------------------------------------
    def take_lock(self, vmid: int) -> str | None:
        """The injected lock name for this config write of ``vmid`` (consumed), or None."""
        with self._mutex:
            for armed in self._locks:
                if armed.matches(vmid=vmid):
                    armed.consume()
                    return str(armed.value)
        return None

    def nextid(self, compute: Callable[[], int]) -> int:
        with self._mutex:
            armed = self._nextid
            if armed is None or not armed.matches():
                return compute()
            if armed.value is None:
                armed.value = compute()
            armed.consume()
            return int(armed.value)

    def task_delay(self, dtype: str) -> float:
        with self._mutex:
            total = 0.0
            for armed in self._delays:
                if armed.matches(dtype):
                    armed.consume()
                    total += float(armed.value)
            return total

    def serve_delay(self, dtype: str, stop: threading.Event | None = None) -> None:
        """Block a starting task for its armed delay (or until :meth:`release_tasks`, or until the
        task is stopped: ``stop`` is set)."""
        seconds = self.task_delay(dtype)
        if seconds > 0:
            with self._mutex:
                event = self._release
            if stop is None:
                event.wait(seconds)
                return
            deadline = time.monotonic() + seconds
            while not stop.is_set() and not event.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    break

    def http_failure(self, method: str, path: str) -> tuple[int, str] | None:
        """(status, message) this request answers (consumed), or None to handle it."""
        with self._mutex:
            for armed in self._http:
                verb, pattern = armed.value[2]
                if armed.matches() and verb in (None, method) and (pattern is None or pattern.search(path)):
                    armed.consume()
                    return int(armed.value[0]), str(armed.value[1])
        return None

    def task_half_failure(self, dtype: str) -> tuple[str, bool] | None:
        """(message, keep_lock) of the armed ``task_half_fail`` fault for this task type, or None."""
        with self._mutex:
            for armed in self._half:
                if armed.matches(dtype):
                    armed.consume()
                    return str(armed.value[0]), bool(armed.value[1])
        return None

    def task_failure(self, dtype: str) -> str | None:
        with self._mutex:
            for armed in self._failures:
                if armed.matches(dtype):
                    armed.consume()
                    return str(armed.value)
        return None

    def is_offline(self, node: str) -> bool:
        with self._mutex:
            return node in self._offline


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)
