"""The sandboxes of each MCP session: the only ones its tool calls may touch, and what goes when the
session (or the server) ends.

A session is what the MCP SDK serves as one connection of the handshake protocol (2025 revisions):
a stdio process, or a streamable-HTTP session (``Mcp-Session-Id``). Its end (stdin closed, the
client's DELETE, the SDK's idle timeout, the server stopping) destroys its sandboxes and, unless
the server keeps them, the snapshots it took, on a worker thread so the SDK's shutdown is never
held up. Calls of the sessionless 2026 protocol share one scope per server; what they make is
destroyed when the server stops. Whatever a crash leaves behind carries a TTL and the owner pid of
the server process: the reaper (``gc --dead-owners``) and the TTL end it.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading

from ..errors import ConfigError, SandboxError, SandboxNotFound
from ..protocols import ManagerLike, SandboxLike
from ..validation import check_sandbox_id

__all__ = ["SERVER_LABEL", "SESSION_LABEL", "SessionSandboxes"]

log = logging.getLogger(__name__)

SESSION_LABEL = "mcp-session"  # the session a sandbox was made in (sandbox-rt ls --label mcp-session=...)
SERVER_LABEL = "mcp-server"  # the MCP server process that made it


@dataclasses.dataclass
class _Session:
    sandboxes: dict[str, SandboxLike] = dataclasses.field(default_factory=dict)
    snapshots: set[str] = dataclasses.field(default_factory=set)
    pending: int = 0  # creates under way
    ended: bool = False


class SessionSandboxes:
    """Which session holds which sandbox (one connected handle each) and snapshot; thread-safe."""

    def __init__(self, manager: ManagerLike, *, max_per_session: int, keep_snapshots: bool) -> None:
        self._manager = manager
        self._max = max_per_session
        self._keep_snapshots = keep_snapshots
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._workers: list[threading.Thread] = []
        self._closed = False

    def _open(self, key: str) -> _Session:
        """The session ``key`` (made on first use); SandboxError if it or the server has ended."""
        session = self._sessions.setdefault(key, _Session())
        if session.ended or self._closed:
            raise SandboxError("this MCP session has ended; its sandboxes were destroyed")
        return session

    # -- sandboxes -------------------------------------------------------------------------------
    def reserve(self, key: str) -> None:
        """Count a create under way against the session's limit (undo with :meth:`release`)."""
        with self._lock:
            session = self._open(key)
            if len(session.sandboxes) + session.pending >= self._max:
                raise ConfigError(
                    f"this session has {self._max} sandboxes, the server's limit per session "
                    "(--max-sandboxes): destroy one first"
                )
            session.pending += 1

    def release(self, key: str) -> None:
        with self._lock:
            self._sessions[key].pending -= 1

    def admit(self, key: str, sandbox: SandboxLike) -> None:
        """Hand a made sandbox (reserved before) to the session; if the session ended meanwhile, the
        sandbox is destroyed and SandboxError raised: nothing outlives its session."""
        with self._lock:
            session = self._sessions[key]
            session.pending -= 1
            late = session.ended or self._closed
            if not late:
                session.sandboxes[sandbox.id] = sandbox
        if late:
            _destroy(sandbox)
            raise SandboxError("this MCP session ended while the sandbox was made; it was destroyed")

    def get(self, key: str, sandbox_id: str) -> SandboxLike:
        """The session's sandbox ``sandbox_id``; SandboxNotFound for any other (another session's
        sandboxes are not told apart from missing ones)."""
        check_sandbox_id(sandbox_id)
        with self._lock:
            sandbox = self._open(key).sandboxes.get(sandbox_id)
        if sandbox is None:
            raise SandboxNotFound(sandbox_id)
        return sandbox

    def forget(self, key: str, sandbox_id: str) -> SandboxLike:
        """Take ``sandbox_id`` out of the session (to destroy it); SandboxNotFound as :meth:`get`."""
        check_sandbox_id(sandbox_id)
        with self._lock:
            sandbox = self._open(key).sandboxes.pop(sandbox_id, None)
        if sandbox is None:
            raise SandboxNotFound(sandbox_id)
        return sandbox

    def listing(self, key: str) -> builtins.list[SandboxLike]:
        with self._lock:
            return builtins.list(self._open(key).sandboxes.values())

    # -- snapshots -------------------------------------------------------------------------------
    def add_snapshot(self, key: str, name: str) -> None:
        with self._lock:
            self._open(key).snapshots.add(name)

    def has_snapshot(self, key: str, name: str) -> bool:
        with self._lock:
            return name in self._open(key).snapshots

    # -- endings ---------------------------------------------------------------------------------
    def end(self, key: str) -> None:
        """The session ended: destroy its sandboxes (and snapshots) on a worker thread. Returns at
        once (the SDK calls it while tearing the connection down, with a short deadline)."""
        with self._lock:
            session = self._sessions.setdefault(key, _Session())
            if session.ended:
                return
            session.ended = True
            sandboxes = builtins.list(session.sandboxes.values())
            snapshots = set() if self._keep_snapshots else set(session.snapshots)
            session.sandboxes.clear()
            session.snapshots.clear()
            if not sandboxes and not snapshots:
                return
            worker = threading.Thread(
                target=self._clean, args=(key, sandboxes, snapshots), name=f"mcp-end-{key[:12]}"
            )
            self._workers = [w for w in self._workers if w.is_alive()]
            self._workers.append(worker)
        worker.start()

    def _clean(self, key: str, sandboxes: builtins.list[SandboxLike], snapshots: set[str]) -> None:
        # at once, not one by one: a stdio client gives a closing server a few seconds, then kills it
        if sandboxes:
            with concurrent.futures.ThreadPoolExecutor(min(8, len(sandboxes)), "mcp-destroy") as pool:
                list(pool.map(_destroy, sandboxes))
        for name in sorted(snapshots):
            with contextlib.suppress(SandboxError):  # gone already (on PVE: with its sandbox)
                self._manager.delete_snapshot(name)
        log.info("MCP session %s ended: %d sandbox(es) destroyed", key, len(sandboxes))

    def close(self, timeout: float | None = None) -> None:
        """The server stops: end every session and wait for the cleanup (``timeout`` seconds at most)."""
        with self._lock:
            self._closed = True
            keys = builtins.list(self._sessions)
        for key in keys:
            self.end(key)
        with self._lock:
            workers = builtins.list(self._workers)
        for worker in workers:
            worker.join(timeout)

    def ended(self) -> builtins.list[str]:
        """Keys of the sessions that have ended (for tests and logs)."""
        with self._lock:
            return [k for k, s in self._sessions.items() if s.ended]


def _destroy(sandbox: SandboxLike) -> None:
    try:
        sandbox.destroy()
    except SandboxError as exc:  # the TTL and the reaper are the backstop
        log.warning("destroying %s failed: %s", sandbox.id, exc)
