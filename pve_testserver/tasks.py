"""Worker tasks with real-looking UPIDs, as PVE's fork_worker makes them.

``UPID:<node>:<pid 8 hex>:<pstart 8 hex>:<starttime 8 hex>:<type>:<id>:<user or token>:`` - each
task runs in a thread, logs lines, and ends ``stopped`` with ``exitstatus`` ``OK`` or the error
message (the last log line is ``TASK OK`` / ``TASK ERROR: <message>``, as in PVE's task logs).
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import PVEError
from .faults import Faults

UPID_RE = re.compile(
    r"^UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):"
    r"([0-9A-Fa-f]{8}):([^:\s/]+):([^:\s/]*):([^:\s/]+):$"
)


class TaskError(Exception):
    """Raised inside a task body: ends the task with this exit status."""


@dataclass
class Task:
    upid: str
    node: str
    pid: int
    pstart: int
    starttime: int
    type: str
    id: str
    user: str
    lines: list[str] = field(default_factory=list)
    status: str = "running"
    exitstatus: str | None = None
    endtime: int | None = None
    done: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)  # stop_task asked it to end

    def log(self, line: str) -> None:
        self.lines.extend(line.rstrip("\n").split("\n"))

    def status_dict(self) -> dict[str, Any]:
        user, _, token = self.user.partition("!")
        out: dict[str, Any] = {
            "upid": self.upid,
            "node": self.node,
            "pid": self.pid,
            "pstart": self.pstart,
            "starttime": self.starttime,
            "type": self.type,
            "id": self.id,
            "user": user,
            "status": self.status,
        }
        if token:
            out["tokenid"] = token
        if self.status == "stopped":
            out["exitstatus"] = self.exitstatus
        return out


@dataclass
class TaskContext:
    """Handed to a task body: logging and the fault injection point."""

    task: Task
    faults: Faults
    checked: bool = False
    # set by a ``task_half_fail`` fault: the body must not clean up what it made (PVE's cleanup
    # failed too); True = leave the new CT locked
    leave_partial: bool | None = None

    def log(self, line: str) -> None:
        self.task.log(line)

    def fault_point(self) -> None:
        """End the task here if it was stopped (``received interrupt``, as PVE's worker on SIGTERM),
        else raise the armed ``task_fail`` / ``task_half_fail`` fault for this task type, if any
        (once per task: a stop after that point comes too late, the task completes)."""
        if self.checked:
            return
        self.checked = True
        if self.task.stop.is_set():
            raise TaskError("received interrupt")
        message = self.faults.task_failure(self.task.type)
        if message is not None:
            raise TaskError(message)
        half = self.faults.task_half_failure(self.task.type)
        if half is not None:
            self.leave_partial = half[1]
            raise TaskError(half[0])


TaskBody = Callable[[TaskContext], None]


class TaskManager:
    """Starts and tracks tasks; thread-safe."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults
        self._tasks: dict[str, Task] = {}
        self._mutex = threading.Lock()
        self._counter = itertools.count(1)
        self._pid_base = os.getpid() * 16
        self._pstart_base = int(time.monotonic() * 100) & 0x0FFFFFFF

    def start(self, node: str, dtype: str, ident: str, user: str, body: TaskBody) -> Task:
        n = next(self._counter)
        pid = (self._pid_base + n) & 0xFFFFFFFF
        pstart = self._pstart_base + n
        starttime = int(time.time())
        upid = f"UPID:{node}:{pid:08X}:{pstart:08X}:{starttime:08X}:{dtype}:{ident}:{user}:"
        task = Task(upid, node, pid, pstart, starttime, dtype, ident, user)
        with self._mutex:
            self._tasks[upid] = task
        thread = threading.Thread(target=self._run, args=(task, body), name=f"pve-task-{n}", daemon=True)
        thread.start()
        return task

    def _run(self, task: Task, body: TaskBody) -> None:
        ctx = TaskContext(task, self.faults)
        try:
            self.faults.serve_delay(task.type, task.stop)  # the slow-task fault switch
            body(ctx)
            ctx.fault_point()
        except TaskError as exc:
            self._finish(task, str(exc))
        except PVEError as exc:
            self._finish(task, exc.perl_string())
        except Exception as exc:
            self._finish(task, str(exc) or type(exc).__name__)
        else:
            self._finish(task, None)

    @staticmethod
    def _finish(task: Task, error: str | None) -> None:
        if error is None:
            task.lines.append("TASK OK")
            task.exitstatus = "OK"
        else:
            message = error.strip().splitlines()[-1] if error.strip() else "unknown error"
            task.lines.append(f"TASK ERROR: {message}")
            task.exitstatus = message
        task.endtime = int(time.time())
        task.status = "stopped"
        task.done.set()

    def stop(self, upid: str) -> None:
        """Ask a running task to end (it does at its next fault point); a stopped one is left."""
        task = self.get(upid)
        if task is not None and task.status == "running":
            task.log("received interrupt")
            task.stop.set()

    def get(self, upid: str) -> Task | None:
        with self._mutex:
            return self._tasks.get(upid)

    def all(self) -> list[Task]:
        with self._mutex:
            return list(self._tasks.values())

    def wait_all(self, timeout: float) -> bool:
        """Wait until no task runs (used on shutdown); False on timeout."""
        deadline = time.monotonic() + timeout
        return all(task.done.wait(max(0.0, deadline - time.monotonic())) for task in self.all())
