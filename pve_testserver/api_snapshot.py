"""/nodes/{node}/lxc/{vmid}/snapshot: container snapshots (pve-container's API2/LXC/Snapshot.pm and
pve-guest-common's AbstractConfig snapshot_create / snapshot_delete semantics).

A CT's snapshots live beside its config as ``ct["snapshots"][name] = {"config": {...},
"snaptime": <epoch>, "description": ..., "parent": ...}`` (PVE's ``[name]`` sections); the config
copy leaves out what ``__snapshot_copy_config`` leaves out (lock, description, digest, unusedN).
Create: the task takes the ``snapshot`` lock, records the section with ``snapstate: prepare``, lets
the engine save the files (freezing a running CT), then commits (``parent`` = the new snapshot).
Delete: ``snapshot-delete`` lock, engine, section removed, parent links re-pointed. Destroying the
CT removes its snapshots (PVE frees the volumes with their snapshots). ``clone`` with ``snapname``
is in ``api_lxc``.
"""

from __future__ import annotations

import time
from typing import Any

from .core import Call, route
from .ctchecks import check_lock, load_ct, start_task
from .errors import fail
from .tasks import TaskContext, TaskError

_NOT_COPIED = frozenset({"snapshots", "snapstate", "snaptime", "vmstate", "lock", "digest", "description"})


def _snapshots(ct: dict[str, Any]) -> dict[str, Any]:
    snaps: dict[str, Any] = ct.setdefault("snapshots", {})
    return snaps


@route("GET", "/nodes/{node}/lxc/{vmid}/snapshot")
def snapshot_list(call: Call) -> list[dict[str, Any]]:
    vmid = int(call.params["vmid"])
    with call.state.lock:
        ct = load_ct(call, vmid)
        out: list[dict[str, Any]] = []
        for name, snap in sorted(ct.get("snapshots", {}).items()):
            item: dict[str, Any] = {
                "name": name,
                "snaptime": int(snap.get("snaptime") or 0),
                "description": snap.get("description") or "",
            }
            if snap.get("parent"):
                item["parent"] = snap["parent"]
            if snap.get("snapstate"):
                item["snapstate"] = snap["snapstate"]
            out.append(item)
        current: dict[str, Any] = {"name": "current", "description": "You are here!"}
        if ct["config"].get("parent"):
            current["parent"] = ct["config"]["parent"]
    current["running"] = 1 if call.engine.is_running(vmid) else 0
    out.append(current)
    return out


@route("POST", "/nodes/{node}/lxc/{vmid}/snapshot")
def snapshot_create(call: Call) -> str:
    vmid = int(call.params["vmid"])
    snapname = str(call.params["snapname"])
    if snapname in ("current", "vzdump"):
        raise fail(f"unable to use snapshot name '{snapname}' (reserved name)")
    description = call.params.get("description")
    with call.state.lock:
        load_ct(call, vmid)

    def body(ctx: TaskContext) -> None:
        with call.mutate():  # __snapshot_prepare
            ct = load_ct(call, vmid)
            conf = ct["config"]
            if conf.get("template"):
                raise TaskError("you can't take a snapshot if it's a template")
            check_lock(conf)
            snaps = _snapshots(ct)
            if snapname in snaps:
                raise TaskError(f"snapshot name '{snapname}' already used")
            conf["lock"] = "snapshot"
            copy = {k: v for k, v in conf.items() if k not in _NOT_COPIED and not k.startswith("unused")}
            snaps[snapname] = {"config": copy, "snaptime": int(time.time()), "snapstate": "prepare"}
            if conf.get("parent"):
                snaps[snapname]["parent"] = conf["parent"]
            if description:
                snaps[snapname]["description"] = description
        ctx.log(f"snapshotting CT {vmid} as '{snapname}'")
        try:
            call.engine.snapshot(vmid, snapname)
            ctx.fault_point()
        except Exception:
            with call.mutate():  # PVE removes the half-made snapshot again (snapshot_delete force)
                ct = load_ct(call, vmid)
                _snapshots(ct).pop(snapname, None)
                ct["config"].pop("lock", None)
            call.engine.delete_snapshot(vmid, snapname)
            raise
        with call.mutate():  # __snapshot_commit
            ct = load_ct(call, vmid)
            snaps = _snapshots(ct)
            if ct["config"].get("lock") != "snapshot":
                raise TaskError("missing snapshot lock")
            snaps[snapname].pop("snapstate", None)
            del ct["config"]["lock"]
            ct["config"]["parent"] = snapname

    return start_task(call, "vzsnapshot", vmid, body)


@route("GET", "/nodes/{node}/lxc/{vmid}/snapshot/{snapname}")
def snapshot_cmd_idx(call: Call) -> list[dict[str, str]]:
    return [{"cmd": "rollback"}, {"cmd": "config"}]


@route("GET", "/nodes/{node}/lxc/{vmid}/snapshot/{snapname}/config")
def snapshot_config(call: Call) -> dict[str, Any]:
    vmid, snapname = int(call.params["vmid"]), str(call.params["snapname"])
    with call.state.lock:
        snap = load_ct(call, vmid).get("snapshots", {}).get(snapname)
        if snap is None:
            raise fail(f"snapshot '{snapname}' does not exist")
        conf = dict(snap["config"])
        conf["snaptime"] = snap.get("snaptime", 0)
        if snap.get("description"):
            conf["description"] = snap["description"]
        return conf


@route("DELETE", "/nodes/{node}/lxc/{vmid}/snapshot/{snapname}")
def snapshot_delete(call: Call) -> str:
    vmid, snapname = int(call.params["vmid"]), str(call.params["snapname"])
    force = bool(call.params.get("force"))
    with call.state.lock:
        load_ct(call, vmid)

    def body(ctx: TaskContext) -> None:
        with call.mutate():
            ct = load_ct(call, vmid)
            snap = ct.get("snapshots", {}).get(snapname)
            if snap is None:
                raise TaskError(f"snapshot '{snapname}' does not exist")
            if not force:
                check_lock(ct["config"])
            ct["config"]["lock"] = "snapshot-delete"
            snap["snapstate"] = "delete"
        ctx.log(f"deleting snapshot '{snapname}' of CT {vmid}")
        try:
            call.engine.delete_snapshot(vmid, snapname)
            ctx.fault_point()
        except Exception:
            with call.mutate():  # the section stays (snapstate "delete"); unlocked for a retry
                load_ct(call, vmid)["config"].pop("lock", None)
            raise
        with call.mutate():
            ct = load_ct(call, vmid)
            snaps = _snapshots(ct)
            parent = snaps.pop(snapname, {}).get("parent")
            for other in [*snaps.values(), ct["config"]]:
                if other.get("parent") == snapname:
                    if parent:
                        other["parent"] = parent
                    else:
                        other.pop("parent", None)
            if ct["config"].get("lock") == "snapshot-delete":
                del ct["config"]["lock"]

    return start_task(call, "vzdelsnapshot", vmid, body)
