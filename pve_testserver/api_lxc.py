"""/nodes/{node}/lxc: containers (pve-container's API2/LXC*.pm semantics).

Locks as PVE takes them: a clone locks its source ``disk`` and the new CT ``create`` for the whole
task, a create locks the new CT ``create``; config writes, resize, template and destroy of a locked
CT answer ``500 CT is locked (<lock>)``, start/stop/shutdown of a locked CT start a task that fails
with that message.
"""

from __future__ import annotations

import copy
import re
import time
from typing import Any

from .api_lxc_status import do_start
from .core import Call, route
from .ctchecks import (
    DISK_RE,
    NET_RE,
    check_config_write,
    check_digest,
    check_lock,
    check_modify_perm,
    ct_list_entry,
    load_ct,
    start_task,
    stored,
)
from .ctconfig import (
    api_config,
    normalize_net,
    normalize_tags,
    parse_kv,
    print_kv,
    rootfs_info,
)
from .errors import PVEError, fail, param_error, perm_error
from .formats import parse_size, split_list
from .hostkey import without_hostkey
from .tasks import TaskContext, TaskError

_NOT_STORED = frozenset(
    {
        "node",
        "vmid",
        "ostemplate",
        "storage",
        "pool",
        "force",
        "restore",
        "unique",
        "start",
        "bwlimit",
        "ignore-unpack-errors",
        "ha-managed",
        "password",
        "ssh-public-keys",
        "unprivileged",
    }
)


# --- index, create, read, destroy -------------------------------------------------------------


@route("GET", "/nodes/{node}/lxc")
def vmlist(call: Call) -> list[dict[str, Any]]:
    out = []
    with call.state.lock:
        for key, ct in sorted(call.state.cts.items(), key=lambda kv: int(kv[0])):
            vmid = int(key)
            if ct["node"] == call.node and call.acl.check(
                call.authid, f"/vms/{vmid}", ["VM.Audit"], noerr=True
            ):
                out.append(ct_list_entry(call, vmid, ct))
    return out


@route("POST", "/nodes/{node}/lxc")
def create_vm(call: Call) -> str:
    p = call.params
    vmid = int(p["vmid"])
    who = call.authid
    with call.mutate() as st:
        unprivileged = bool(p.get("unprivileged", True))
        if not unprivileged:
            call.acl.check(who, "/", ["Sys.Modify"])
        existing = st.ct(vmid)
        if existing is not None:
            raise fail(f"CT {vmid} already exists on node '{existing['node']}'")
        pool = p.get("pool")
        if pool is not None and pool not in st.pools:
            raise perm_error(f"pool '{pool}' does not exist")
        if not (
            call.acl.check(who, f"/vms/{vmid}", ["VM.Allocate"], noerr=True)
            or (pool and call.acl.check(who, f"/pool/{pool}", ["VM.Allocate"], noerr=True))
        ):
            raise perm_error()
        new = {k: v for k, v in p.items() if k not in _NOT_STORED}
        check_modify_perm(call, vmid, pool, None, new, [], storage=p.get("storage"))
        template = str(p["ostemplate"])
        tsid = template.split(":", 1)[0]
        if template not in [v["volid"] for v in st.volumes.get(tsid, [])]:
            raise fail(f"volume '{template}' does not exist")
        if not call.acl.check(who, f"/storage/{tsid}", ["Datastore.Allocate"], noerr=True):
            call.acl.check_any(who, f"/storage/{tsid}", ["Datastore.AllocateSpace", "Datastore.Audit"])
        storage = str(p.get("storage", "local"))
        rootfs = parse_kv(str(p.get("rootfs", f"{storage}:4")), "volume")
        vol = rootfs.get("volume", "")
        if re.fullmatch(r"\d+(\.\d+)?", vol):
            vol = f"{storage}:{vol}"
        m = re.fullmatch(r"([^:]+):(\d+(?:\.\d+)?)", vol)
        if not m:
            raise fail(f"unable to use volume {vol} as rootfs of a new CT (use STORAGE:SIZE_IN_GiB)")
        sid, size = m.group(1), m.group(2)
        scfg = st.storages.get(sid)
        if scfg is None:
            raise fail(f"storage '{sid}' does not exist")
        if "rootdir" not in scfg["content"]:
            raise param_error({"storage": f"storage '{sid}' does not support container directories"})
        call.acl.check(who, f"/storage/{sid}", ["Datastore.AllocateSpace"])
        # PVE's create: hostname defaults to "CT<vmid>" and is stored (pve-container's create_vm)
        conf: dict[str, Any] = {
            "arch": "amd64",
            "ostype": "debian",
            "memory": 512,
            "swap": 512,
            "hostname": f"CT{vmid}",
        }
        for key, value in new.items():
            if NET_RE.match(key):
                conf[key] = normalize_net(str(value))
            elif key == "tags":
                conf[key] = normalize_tags(str(value))
            elif key != "rootfs":
                conf[key] = stored(value)
        rootfs.update(volume=f"{sid}:vm-{vmid}-disk-0", size=f"{int(float(size))}G")
        conf["rootfs"] = print_kv(rootfs, default_key="volume")
        if unprivileged:
            conf["unprivileged"] = 1
        conf["lock"] = "create"
        st.cts[str(vmid)] = {"vmid": vmid, "node": call.node, "config": conf, "ctime": int(time.time())}
        snapshot_conf = dict(conf)

    def body(ctx: TaskContext) -> None:
        ctx.log(f"extracting archive '{template}'")
        try:
            call.engine.create(vmid, snapshot_conf, template, str(p.get("ssh-public-keys") or ""))
            ctx.fault_point()
        except Exception:
            _drop_ct(call, vmid)
            raise
        with call.mutate() as st2:
            ct2 = st2.ct(vmid)
            if ct2 is not None:
                ct2["config"].pop("lock", None)
            if pool and pool in st2.pools and vmid not in st2.pools[pool]["vms"]:
                st2.pools[pool]["vms"].append(vmid)
        if p.get("start"):
            do_start(call, ctx, vmid, skiplock=False)

    return start_task(call, "vzcreate", vmid, body)


def _drop_ct(call: Call, vmid: int) -> None:
    """Remove a CT and what it made (failed create/clone, destroy)."""
    try:
        call.engine.destroy(vmid)
    finally:
        with call.mutate() as st:
            st.cts.pop(str(vmid), None)
            st.firewall.pop(str(vmid), None)


@route("GET", "/nodes/{node}/lxc/{vmid}")
def vmdiridx(call: Call) -> list[dict[str, str]]:
    with call.state.lock:
        load_ct(call, call.params["vmid"])
    subdirs = [
        "config",
        "pending",
        "status",
        "vncproxy",
        "termproxy",
        "vncwebsocket",
        "spiceproxy",
        "migrate",
    ]
    subdirs += ["clone", "rrd", "rrddata", "firewall", "snapshot", "resize", "interfaces"]
    return [{"subdir": s} for s in subdirs]


def _linked_clones_of(state: Any, vmid: int, conf: dict[str, Any]) -> str:
    """The template's base volume if a linked clone (a CT whose rootfs, or a snapshot's, is
    ``<storage>:base-<vmid>-disk-N/...``) still uses it, else ""."""
    if not conf.get("template"):
        return ""
    base = parse_kv(str(conf.get("rootfs", "")), "volume").get("volume", "")
    if not base or "/" in base:
        return ""
    for key, ct in state.cts.items():
        if key == str(vmid):
            continue
        confs = [ct["config"], *[snap.get("config", {}) for snap in (ct.get("snapshots") or {}).values()]]
        for other in confs:
            if parse_kv(str(other.get("rootfs", "")), "volume").get("volume", "").startswith(base + "/"):
                return base
    return ""


@route("DELETE", "/nodes/{node}/lxc/{vmid}")
def destroy_vm(call: Call) -> str:
    vmid = int(call.params["vmid"])
    force = bool(call.params.get("force"))
    with call.state.lock:
        conf = load_ct(call, vmid)["config"]
        check_lock(conf)
        if conf.get("protection"):
            raise fail(f"can't remove CT {vmid} - protection mode enabled")
        if not force and call.engine.is_running(vmid):
            raise fail(f"unable to destroy CT {vmid} - container is running")

    def body(ctx: TaskContext) -> None:
        with call.state.lock:
            conf2 = load_ct(call, vmid)["config"]
            check_lock(conf2)
        if call.engine.is_running(vmid):
            if not force:
                raise TaskError(f"unable to destroy CT {vmid} - container is running")
            ctx.log(f"forced to stop CT {vmid} before destroying!")
        ctx.fault_point()
        with call.state.lock:
            in_use = _linked_clones_of(call.state, vmid, load_ct(call, vmid)["config"])
        if in_use:
            # PVE::Storage::vdisk_free refuses to free a base volume that backs a linked clone
            raise TaskError(f"base volume '{in_use}' is still in use by linked cloned")
        _drop_ct(call, vmid)
        with call.mutate() as st:
            for path in [p for p in st.acl if p == f"/vms/{vmid}" or p.startswith(f"/vms/{vmid}/")]:
                del st.acl[path]
            for data in st.pools.values():
                if vmid in data.get("vms", []):
                    data["vms"].remove(vmid)

    return start_task(call, "vzdestroy", vmid, body)


# --- config -----------------------------------------------------------------------------------


@route("GET", "/nodes/{node}/lxc/{vmid}/config")
def vm_config(call: Call) -> dict[str, Any]:
    with call.state.lock:
        ct = load_ct(call, call.params["vmid"])
        conf = ct["config"]
        if call.params.get("snapshot"):
            snap = (ct.get("snapshots") or {}).get(call.params["snapshot"])
            if snap is None:
                raise fail(f"snapshot '{call.params['snapshot']}' does not exist")
            conf = snap["config"]
        return api_config(conf)


@route("PUT", "/nodes/{node}/lxc/{vmid}/config")
def update_vm(call: Call) -> None:
    p = dict(call.params)
    vmid = int(p.pop("vmid"))
    p.pop("node")
    digest = p.pop("digest", None)
    if not p:
        raise fail("no options specified")
    delete = split_list(p.pop("delete", ""))
    revert = split_list(p.pop("revert", ""))
    known = set(call.method.properties) - {"node", "vmid", "delete", "revert", "digest"}
    with call.mutate():
        conf = load_ct(call, vmid)["config"]
        check_config_write(call, vmid, conf)
        check_digest(conf, digest)
        check_modify_perm(call, vmid, None, conf, {}, delete + revert)
        for opt in revert:
            if opt not in known:
                raise param_error({"revert": f"unknown option '{opt}'"})
        for opt in delete:
            if opt not in known:
                raise param_error({"delete": f"unknown option '{opt}'"})
            if opt in p:
                raise param_error({"delete": f"you can't use '-{opt}' and -delete {opt}' at the same time"})
        check_modify_perm(call, vmid, None, conf, p, [])
        for opt in delete:
            if opt not in conf:
                continue
            if opt in ("memory", "rootfs", "ostype"):
                raise fail(f"unable to delete required option '{opt}'")
            if opt == "unprivileged":
                raise fail(f"unable to delete read-only option: '{opt}'")
            del conf[opt]
        for opt, value in sorted(p.items()):
            if opt == "unprivileged":
                raise fail(f"unable to modify read-only option: '{opt}'")
            if opt == "tags":
                conf[opt] = normalize_tags(str(value))
            elif NET_RE.match(opt):
                conf[opt] = normalize_net(str(value))
            else:
                conf[opt] = stored(value)
        snapshot_conf = dict(conf)
    call.engine.apply_config(vmid, snapshot_conf)


# --- clone, template, resize, interfaces ------------------------------------------------------


@route("POST", "/nodes/{node}/lxc/{vmid}/clone")
def clone_vm(call: Call) -> str:
    p = call.params
    vmid, newid = int(p["vmid"]), int(p["newid"])
    who = call.authid
    pool, storage, target = p.get("pool"), p.get("storage"), p.get("target")
    with call.mutate() as st:
        if pool is not None and pool not in st.pools:
            raise perm_error(f"pool '{pool}' does not exist")
        if target in (call.node, "localhost"):
            target = None
        if target and target not in st.nodes:
            raise fail(f"no such cluster node '{target}'")
        if storage and storage not in st.storages:
            raise fail(f"storage '{storage}' does not exist")
        live = src = load_ct(call, vmid)["config"]
        check_lock(live)  # set_lock($vmid, 'disk')
        existing = st.ct(newid)
        if existing is not None:
            raise fail(f"CT {newid} already exists on node '{existing['node']}'")
        full = p.get("full")
        if full is None:
            full = not src.get("template")
        if storage and not full:
            raise fail("parameter 'storage' not allowed for linked clones")
        if not full and not src.get("template") and not p.get("snapname"):
            # PVE::Storage::volume_has_feature('clone', ...): only a template's base volume (or
            # a snapshot, on lvmthin) can back a linked clone
            volid = parse_kv(str(src.get("rootfs", "")), "volume").get("volume", "")
            raise fail(f"Linked clone feature for '{volid}' is not available")
        snapname = p.get("snapname")
        if snapname:  # clone what the snapshot holds (api_snapshot), not the CT as it is now
            snap = (load_ct(call, vmid).get("snapshots") or {}).get(snapname)
            if snap is None:
                raise fail(f"snapshot '{snapname}' does not exist")
            src = snap["config"]
        newconf: dict[str, Any] = {}
        for opt, value in sorted(src.items()):
            if opt.startswith("unused") or opt in ("lock", "template", "parent", "snaptime", "snapstate"):
                continue
            if opt == "rootfs" or DISK_RE.match(opt):
                sid = parse_kv(str(value), "volume").get("volume", "").split(":")[0]
                call.acl.check(who, f"/storage/{storage or sid}", ["Datastore.AllocateSpace"])
                if full and not snapname and call.engine.is_running(vmid):
                    raise fail("Full clone of a running container is only possible from a snapshot")
                newconf[opt] = value
            elif NET_RE.match(opt):
                newconf[opt] = normalize_net(str(value), new_mac=True)
                bridge = parse_kv(newconf[opt]).get("bridge")
                if bridge:
                    call.acl.check_sdn_bridge(who, bridge, parse_kv(newconf[opt]).get("tag"))
            else:
                newconf[opt] = value
        if p.get("hostname"):
            newconf["hostname"] = p["hostname"]
        # The source's published host key is not the clone's: drop it (a new one comes at start).
        desc = p.get("description") or without_hostkey(src.get("description"))
        newconf.pop("description", None)
        if desc:
            newconf["description"] = desc
        newconf["lock"] = "create"
        live["lock"] = "disk"
        st.cts[str(newid)] = {"vmid": newid, "node": call.node, "config": newconf, "ctime": int(time.time())}
        fw = st.firewall
        if str(vmid) in fw:
            fw[str(newid)] = copy.deepcopy(fw[str(vmid)])
        engine_conf = dict(newconf)
        engine_conf["_linked"] = int(not full)  # for engines with real storage (not a PVE option)

    def unlock(key: int, lock: str) -> None:
        with call.mutate() as st2:
            ct = st2.ct(key)
            if ct is not None and ct["config"].get("lock") == lock:
                del ct["config"]["lock"]

    def body(ctx: TaskContext) -> None:
        ctx.log(f"creating a clone of container {vmid} with ID {newid}")
        try:
            if snapname:
                call.engine.clone_snapshot(vmid, snapname, newid, engine_conf)
            else:  # a clone to another node (shared storage) is that node's container
                call.core.engine_for(target or call.node).clone(vmid, newid, engine_conf)
            ctx.fault_point()
            with call.mutate() as st2:
                ct = st2.ct(newid)
                if ct is None:
                    raise TaskError("Lost 'create' config lock, aborting.")
                conf = ct["config"]
                root = parse_kv(str(conf.get("rootfs", "")), "volume")
                sid = root.get("volume", "").split(":")[0]
                base = f"base-{vmid}-disk-0/" if not full else ""
                root["volume"] = f"{storage or sid}:{base}vm-{newid}-disk-0"
                conf["rootfs"] = print_kv(root, default_key="volume")
                if pool and pool in st2.pools and newid not in st2.pools[pool]["vms"]:
                    st2.pools[pool]["vms"].append(newid)
        except Exception as exc:
            unlock(vmid, "disk")
            if ctx.leave_partial is not None:
                # task_half_fail fault: the clone failed late (PVE: in post_clone_hook, after
                # add_vm_to_pool) and PVE's cleanup failed as well: the new CT stays, in the pool
                with call.mutate() as st2:
                    if pool and pool in st2.pools and newid not in st2.pools[pool]["vms"]:
                        st2.pools[pool]["vms"].append(newid)
                ctx.log(f"Failed to remove target CT config - cannot remove CT {newid} (injected fault)")
                if not ctx.leave_partial:
                    unlock(newid, "create")
                raise TaskError(f"clone failed: {exc}") from None
            try:
                _drop_ct(call, newid)
            except Exception as cleanup:  # keep the original error, log the cleanup one
                ctx.log(f"Failed to remove target CT config - {cleanup}")
            raise TaskError(f"clone failed: {exc}") from None
        unlock(vmid, "disk")
        unlock(newid, "create")
        if target:
            with call.mutate() as st2:
                st2.cts[str(newid)]["node"] = target

    return start_task(call, "vzclone", vmid, body)


@route("POST", "/nodes/{node}/lxc/{vmid}/template")
def template(call: Call) -> None:
    vmid = int(call.params["vmid"])
    with call.mutate():
        conf = load_ct(call, vmid)["config"]
        check_config_write(call, vmid, conf)
        if conf.get("template"):
            raise fail("you can't convert a template to a template")
        if call.engine.is_running(vmid):
            raise fail("you can't convert a CT to template if the CT is running")
        if load_ct(call, vmid).get("snapshots"):
            raise fail("unable to create template, because CT contains snapshots")
        root = parse_kv(str(conf.get("rootfs", "")), "volume")
        root["volume"] = re.sub(r"vm-(\d+)-disk-(\d+)$", r"base-\1-disk-\2", root.get("volume", ""))
        conf["rootfs"] = print_kv(root, default_key="volume")
        conf["template"] = 1
    # PVE forks a 'vztemplate' worker and returns null; the change is made synchronously here.
    start_task(call, "vztemplate", vmid, lambda ctx: None)


@route("PUT", "/nodes/{node}/lxc/{vmid}/resize")
def resize_vm(call: Call) -> str:
    vmid = int(call.params["vmid"])
    disk = str(call.params["disk"])
    sizestr = str(call.params["size"])
    ext = sizestr.startswith("+")
    request = parse_size(sizestr.lstrip("+"))
    if request is None:
        raise fail("invalid size string")

    def load_and_check() -> int:
        conf = load_ct(call, vmid)["config"]
        check_config_write(call, vmid, conf)
        check_modify_perm(call, vmid, None, conf, {disk: conf.get(disk, "")} if disk in conf else {}, [])
        check_digest(conf, call.params.get("digest"))
        if disk not in conf:
            raise fail(f"unable to parse volume from '{disk}'")
        sid, _vol, size = rootfs_info({"rootfs": conf[disk]})
        call.acl.check(call.authid, f"/storage/{sid}", ["Datastore.AllocateSpace"])
        newsize = size + request if ext else request
        if newsize < size:
            raise fail("unable to shrink disk size")
        if newsize == size:
            raise fail("disk is already at specified size")
        return newsize

    with call.state.lock:
        load_and_check()

    def body(ctx: TaskContext) -> None:
        with call.mutate():
            newsize = load_and_check()
            conf = load_ct(call, vmid)["config"]
            mp = parse_kv(str(conf[disk]), "volume")
            mp["size"] = _format_size(newsize)
            conf[disk] = print_kv(mp, default_key="volume")
            ctx.log(f"update CT {vmid}: resize --disk {disk} --size {sizestr}")
        ctx.fault_point()

    return start_task(call, "resize", vmid, body)


def _format_size(size: int) -> str:
    for unit, factor in (("T", 1024**4), ("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


@route("GET", "/nodes/{node}/lxc/{vmid}/interfaces")
def interfaces(call: Call) -> list[dict[str, Any]] | None:
    vmid = int(call.params["vmid"])
    with call.state.lock:
        conf = dict(load_ct(call, vmid)["config"])
    try:
        return call.engine.interfaces(vmid, conf)
    except PVEError:
        raise
    except Exception as exc:
        raise fail(str(exc)) from None
