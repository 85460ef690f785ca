"""What execd keeps on the host, in the server's memory (bounded): the commands it started (for
``/command/status`` and interrupt), the bash sessions (their working directory and environment) and
the last CPU sample of each sandbox (for ``/metrics``). One :class:`Registry` per app, made on first
use. Lost when the server restarts: background commands survive it (their ids name their process in
the sandbox), sessions and foreground statuses do not.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Annotated

from fastapi import Depends, Request

from ...errors import ConfigError

__all__ = ["MAX_COMMANDS", "MAX_SESSIONS", "CommandRecord", "Reg", "Registry", "Session"]

MAX_COMMANDS = 4096  # command records kept; the oldest finished ones go first
MAX_SESSIONS = 1024  # bash sessions open at once, over all sandboxes
MAX_SAMPLES = 4096  # sandboxes whose last CPU sample is kept


@dataclasses.dataclass
class CommandRecord:
    """A command execd started: foreground (its status lives here only) or background."""

    id: str
    sandbox_id: str
    content: str
    background: bool
    started_at: float
    user: str | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    error: str | None = None

    @property
    def running(self) -> bool:
        return self.finished_at is None


@dataclasses.dataclass
class Session:
    """A bash session: where its next run starts and with what environment (None until a run has
    reported them: then the sandbox's login environment plus the create-time env)."""

    id: str
    sandbox_id: str
    cwd: str | None
    env: dict[str, str] | None = None
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    running: str | None = None  # the id of the run in progress


class Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._commands: collections.OrderedDict[str, CommandRecord] = collections.OrderedDict()
        self._sessions: dict[str, Session] = {}
        self._samples: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    # -- commands -----------------------------------------------------------------------------------
    def add_command(self, record: CommandRecord) -> None:
        with self._lock:
            self._commands[record.id] = record
            while len(self._commands) > MAX_COMMANDS:
                finished = next((k for k, v in self._commands.items() if not v.running), None)
                self._commands.pop(finished if finished is not None else next(iter(self._commands)))

    def command(self, sandbox_id: str, command_id: str) -> CommandRecord | None:
        with self._lock:
            found = self._commands.get(command_id)
        return found if found is not None and found.sandbox_id == sandbox_id else None

    def finish(self, command_id: str, exit_code: int | None, error: str | None = None) -> None:
        with self._lock:
            found = self._commands.get(command_id)
            if found is not None and found.running:
                found.finished_at = time.time()
                found.exit_code = exit_code
                found.error = error

    # -- sessions -----------------------------------------------------------------------------------
    def add_session(self, session: Session) -> None:
        with self._lock:
            if len(self._sessions) >= MAX_SESSIONS:
                raise ConfigError(f"{MAX_SESSIONS} bash sessions are open on this server: delete some first")
            self._sessions[session.id] = session

    def session(self, sandbox_id: str, session_id: str) -> Session | None:
        with self._lock:
            found = self._sessions.get(session_id)
        return found if found is not None and found.sandbox_id == sandbox_id else None

    def drop_session(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    # -- CPU samples --------------------------------------------------------------------------------
    def swap_sample(self, sandbox_id: str, sample: tuple[float, float]) -> tuple[float, float] | None:
        """Keep ``sample`` (monotonic time, CPU seconds) as the sandbox's last; the one before."""
        with self._lock:
            previous = self._samples.pop(sandbox_id, None)
            self._samples[sandbox_id] = sample
            while len(self._samples) > MAX_SAMPLES:
                self._samples.popitem(last=False)
        return previous


_make_lock = threading.Lock()


def _registry(request: Request) -> Registry:
    app_state = request.app.state
    found = getattr(app_state, "execd_registry", None)
    if isinstance(found, Registry):
        return found
    with _make_lock:
        found = getattr(app_state, "execd_registry", None)
        if not isinstance(found, Registry):
            found = Registry()
            app_state.execd_registry = found
        return found


Reg = Annotated[Registry, Depends(_registry)]
