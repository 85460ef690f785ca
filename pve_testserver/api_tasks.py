"""/nodes/{node}/tasks (pve-manager's API2/Tasks.pm semantics)."""

from __future__ import annotations

from typing import Any

from .auth import split_tokenid
from .core import Call, route
from .errors import param_error
from .tasks import UPID_RE, Task


def _may_see(call: Call, task: Task) -> bool:
    """Owner (a user sees its tokens' tasks, a token only its own) or Sys.Audit on the node."""
    if call.authid == task.user:
        return True
    tok = split_tokenid(task.user)
    if tok and call.authid == tok[0]:
        return True
    return call.acl.check(call.authid, f"/nodes/{task.node}", ["Sys.Audit"], noerr=True)


def _find_task(call: Call) -> Task:
    """The task the ``upid`` parameter names, on this node (no permission check)."""
    upid = str(call.params["upid"])
    if not UPID_RE.match(upid):
        raise param_error({"upid": "unable to parse worker upid"})
    task = call.tasks.get(upid)
    if task is None or task.node != call.node:
        raise param_error({"upid": "no such task"})
    return task


def _task(call: Call) -> Task:
    task = _find_task(call)
    if not _may_see(call, task):
        with call.state.lock:
            call.acl.check(call.authid, f"/nodes/{call.node}", ["Sys.Audit"])
    return task


@route("GET", "/nodes/{node}/tasks")
def node_tasks(call: Call) -> list[dict[str, Any]]:
    p = call.params
    out = []
    with call.state.lock:
        tasks = [t for t in call.tasks.all() if t.node == call.node and _may_see(call, t)]
    source = p.get("source", "archive")
    for task in sorted(tasks, key=lambda t: t.starttime, reverse=True):
        if source == "active" and task.status != "running":
            continue
        if source == "archive" and task.status == "running":
            continue
        if "vmid" in p and task.id != str(p["vmid"]):
            continue
        if p.get("typefilter") and task.type != p["typefilter"]:
            continue
        if p.get("userfilter") and p["userfilter"] not in task.user:
            continue
        if p.get("errors") and task.exitstatus in (None, "OK"):
            continue
        entry = task.status_dict()
        if task.status == "stopped":
            entry["status"] = task.exitstatus
            entry["endtime"] = task.endtime
        else:
            entry.pop("status")
        out.append(entry)
    start, limit = int(p.get("start", 0)), int(p.get("limit", 50))
    call.total = len(out)
    return out[start : start + limit]


@route("GET", "/nodes/{node}/tasks/{upid}")
def upid_index(call: Call) -> list[dict[str, str]]:
    _task(call)
    return [{"name": "log"}, {"name": "status"}]


@route("GET", "/nodes/{node}/tasks/{upid}/status")
def read_task_status(call: Call) -> dict[str, Any]:
    return _task(call).status_dict()


@route("GET", "/nodes/{node}/tasks/{upid}/log")
def read_task_log(call: Call) -> list[dict[str, Any]]:
    task = _task(call)
    lines = list(task.lines)
    start, limit = int(call.params.get("start", 0)), int(call.params.get("limit", 50))
    call.total = len(lines)
    return [{"n": i + 1, "t": line} for i, line in enumerate(lines) if start <= i < start + limit]


@route("DELETE", "/nodes/{node}/tasks/{upid}")
def stop_task(call: Call) -> None:
    """PVE's stop_task: the task's owner, or Sys.Modify on the node. The task ends at its next
    fault point with ``received interrupt`` (after its own cleanup); a finished task is left."""
    task = _find_task(call)
    if call.authid != task.user:
        with call.state.lock:
            call.acl.check(call.authid, f"/nodes/{call.node}", ["Sys.Modify"])
    call.tasks.stop(task.upid)
