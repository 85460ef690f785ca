"""/nodes/{node}/lxc/{vmid}/status: start, stop, shutdown and the current status of a CT
(pve-container's API2/LXC/Status.pm); a start runs the hookscript's post-start (the caps, hookcaps)
and publishes the CT's host key (hostkey). Locks as in ``api_lxc``: a locked CT's start, stop or
shutdown starts a task that fails with ``CT is locked (<lock>)``.
"""

from __future__ import annotations

import time
from typing import Any

from .auth import ROOT
from .core import Call, route
from .ctchecks import check_lock, ct_list_entry, load_ct, start_task
from .errors import fail, param_error
from .hookcaps import REFUSED_PREFIX, applied_of, published_line, with_applied
from .hostkey import hostkey_of, with_hostkey
from .tasks import TaskContext, TaskError


@route("GET", "/nodes/{node}/lxc/{vmid}/status")
def vmcmdidx(call: Call) -> list[dict[str, str]]:
    with call.state.lock:
        load_ct(call, call.params["vmid"])
    return [{"subdir": s} for s in ("current", "start", "stop", "shutdown", "reboot", "suspend", "resume")]


@route("GET", "/nodes/{node}/lxc/{vmid}/status/current")
def vm_status(call: Call) -> dict[str, Any]:
    vmid = int(call.params["vmid"])
    with call.state.lock:
        ct = load_ct(call, vmid)
        entry = ct_list_entry(call, vmid, ct)
    entry["ha"] = {"managed": 0}
    if entry["status"] == "running":  # PVE: df of the running CT's root; 0 when stopped
        entry["disk"] = call.engine.disk_used(vmid)
    return entry


def _skiplock(call: Call) -> bool:
    skip = bool(call.params.get("skiplock"))
    if skip and call.authid != ROOT:
        raise param_error({"skiplock": "Only root may use this option."})
    return skip


def do_start(call: Call, ctx: TaskContext, vmid: int, skiplock: bool) -> None:
    with call.state.lock:
        conf = dict(load_ct(call, vmid)["config"])
    if conf.get("template"):
        raise TaskError("you can't start a CT if it's a template")
    if not skiplock:
        check_lock(conf)
    with call.state.lock:  # the CT's firewall is in force before it runs (also after a node reboot)
        call.core.after_change()
    public = call.engine.start(vmid, conf)
    try:
        ctx.fault_point()
    except TaskError:
        call.engine.stop(vmid)
        raise
    # the hookscript's post-start: the caps (hookcaps); PVE only warns when it fails
    published = call.engine.post_start(vmid, conf)
    applied = published.applied
    if applied is None:
        ctx.log(f"hookscript error for {vmid} on post-start: the caps were not applied")
    with call.mutate() as st:
        ct = st.ct(vmid)
        if ct is not None:
            ct["status"] = "running"
            ct["started"] = time.time()
            if hostkey_of(ct["config"].get("description")) != public:
                ct["config"]["description"] = with_hostkey(ct["config"].get("description"), public)
            if applied_of(ct["config"].get("description")) != applied:
                ct["config"]["description"] = with_applied(ct["config"].get("description"), applied)
            # as on PVE, where the script writes the config itself: its refusal stays, a former one goes
            if published_line(ct["config"].get("description"), REFUSED_PREFIX) != published.refused:
                ct["config"]["description"] = with_applied(
                    ct["config"].get("description"), published.refused, REFUSED_PREFIX
                )


@route("POST", "/nodes/{node}/lxc/{vmid}/status/start")
def vm_start(call: Call) -> str:
    vmid = int(call.params["vmid"])
    skiplock = _skiplock(call)
    with call.state.lock:
        load_ct(call, vmid)
        if call.engine.is_running(vmid):
            raise fail(f"CT {vmid} already running")
    return start_task(call, "vzstart", vmid, lambda ctx: do_start(call, ctx, vmid, skiplock))


def _stopper(call: Call, vmid: int, skiplock: bool, timeout: float | None) -> Any:
    def body(ctx: TaskContext) -> None:
        with call.state.lock:
            conf = dict(load_ct(call, vmid)["config"])
        if not skiplock:
            check_lock(conf)
        if timeout is None:
            call.engine.stop(vmid)
        else:
            call.engine.shutdown(vmid, timeout)
        ctx.fault_point()
        with call.mutate() as st:
            ct = st.ct(vmid)
            if ct is not None:
                ct["status"] = "stopped"
                ct.pop("started", None)

    return body


@route("POST", "/nodes/{node}/lxc/{vmid}/status/stop")
def vm_stop(call: Call) -> str:
    vmid = int(call.params["vmid"])
    skiplock = _skiplock(call)
    with call.state.lock:
        load_ct(call, vmid)
        if not call.engine.is_running(vmid):
            raise fail(f"CT {vmid} not running")
    return start_task(call, "vzstop", vmid, _stopper(call, vmid, skiplock, None))


@route("POST", "/nodes/{node}/lxc/{vmid}/status/shutdown")
def vm_shutdown(call: Call) -> str:
    vmid = int(call.params["vmid"])
    with call.state.lock:
        load_ct(call, vmid)
        if not call.engine.is_running(vmid):
            raise fail(f"CT {vmid} not running")
    timeout = float(call.params.get("timeout", 60))
    return start_task(call, "vzshutdown", vmid, _stopper(call, vmid, False, timeout))
