"""/version, /cluster/{nextid,resources,status}, /nodes, /nodes/{node}/status, storage."""

from __future__ import annotations

import os
import re
import shutil
import time
from typing import Any

from .core import Call, route
from .ctconfig import parse_kv, rootfs_info
from .engine import StorageBacked
from .errors import fail, param_error
from .tasks import TaskContext

_GIB = 1024**3


def ct_stats(call: Call, vmid: int, ct: dict[str, Any]) -> dict[str, Any]:
    """The numbers PVE reports for a guest (list, status/current, resources)."""
    conf = ct["config"]
    engine = call.core.engine_for(str(ct.get("node", "")))
    running = engine.is_running(vmid)
    _sid, _vol, size = rootfs_info(conf)
    started = ct.get("started") or time.time()
    entry: dict[str, Any] = {
        "vmid": vmid,
        "name": conf.get("hostname", f"CT{vmid}"),
        "status": "running" if running else "stopped",
        "type": "lxc",
        "cpus": int(conf.get("cores") or os.cpu_count() or 1),
        "maxmem": int(conf.get("memory", 512)) * 1024 * 1024,
        "maxswap": int(conf.get("swap", 512)) * 1024 * 1024,
        "maxdisk": size,
        "cpu": 0,
        "mem": engine.memory_used(vmid) if running else 0,
        "disk": 0,
        "netin": 0,
        "netout": 0,
        "diskread": 0,
        "diskwrite": 0,
        "uptime": int(time.time() - started) if running else 0,
    }
    if conf.get("template"):
        entry["template"] = 1
    for key in ("tags", "lock"):
        if conf.get(key):
            entry[key] = conf[key]
    return entry


@route("GET", "/version")
def version(call: Call) -> dict[str, Any]:
    return {
        "version": call.core.version,
        "release": call.core.release,
        "repoid": "5e7e5d1a",
        "console": "xtermjs",
    }


def _next_free(call: Call) -> int:
    used = {int(k) for k in call.state.cts}
    vmid = call.core.first_vmid
    while vmid in used:
        vmid += 1
    return vmid


@route("GET", "/cluster/nextid")
def nextid(call: Call) -> str:
    """PVE answers the ID as a JSON string ("100"; the schema says integer, Perl sends a string)."""
    with call.state.lock:
        if "vmid" in call.params:
            vmid = int(call.params["vmid"])
            if call.state.ct(vmid) is not None:
                raise param_error({"vmid": f"VM {vmid} already exists"})
            return str(vmid)
        return str(call.faults.nextid(lambda: _next_free(call)))


@route("GET", "/cluster/resources")
def resources(call: Call) -> list[dict[str, Any]]:
    kind = call.params.get("type")
    out: list[dict[str, Any]] = []
    with call.state.lock:
        acl, who = call.acl, call.authid
        if kind in (None, "pool"):
            for pool, data in sorted(call.state.pools.items()):
                if acl.check(who, f"/pool/{pool}", ["Pool.Audit"], noerr=True):
                    entry: dict[str, Any] = {"id": f"/pool/{pool}", "pool": pool, "type": "pool"}
                    if data.get("comment"):
                        entry["comment"] = data["comment"]
                    out.append(entry)
        if kind in (None, "vm"):
            for key, ct in sorted(call.state.cts.items(), key=lambda kv: int(kv[0])):
                vmid = int(key)
                if not acl.check(who, f"/vms/{vmid}", ["VM.Audit"], noerr=True):
                    continue
                entry = {"id": f"lxc/{vmid}", "node": ct["node"], **ct_stats(call, vmid, ct)}
                if call.faults.is_offline(str(ct["node"])):  # PVE: no status from a node it cannot reach
                    entry.update(status="unknown", mem=0, uptime=0)
                entry["maxcpu"] = entry.pop("cpus")
                entry.pop("maxswap")
                entry["template"] = int(bool(ct["config"].get("template")))
                vm_pool = call.state.pool_of(vmid)
                if vm_pool and acl.check(who, f"/pool/{vm_pool}", ["Pool.Audit"], noerr=True):
                    entry["pool"] = vm_pool
                out.append(entry)
        if kind in (None, "node"):
            for node in call.state.nodes:
                out.append(
                    _node_entry(call, node, acl.check(who, f"/nodes/{node}", ["Sys.Audit"], noerr=True))
                )
        if kind in (None, "storage"):
            for sid, scfg in sorted(call.state.storages.items()):
                if not acl.check(who, f"/storage/{sid}", ["Datastore.Audit"], noerr=True):
                    continue
                for node in call.state.nodes:
                    out.append(
                        {
                            "id": f"storage/{node}/{sid}",
                            "storage": sid,
                            "node": node,
                            "type": "storage",
                            "plugintype": scfg["type"],
                            "content": ",".join(scfg["content"]),
                            "shared": int(bool(scfg.get("shared"))),
                            "status": "unknown" if call.faults.is_offline(node) else "available",
                            "maxdisk": scfg["total"],
                            "disk": scfg["used"],
                        }
                    )
    return out


def node_memory(call: Call, node: str) -> tuple[int, int]:
    """(used, total) bytes of ``node``'s memory: its base use (``Core.node_memory``, default 2 of
    16 GiB) plus what its running CTs use now, so placing a CT there lowers its free memory."""
    base, total = call.core.node_memory.get(node, (2 * _GIB, 16 * _GIB))
    engine = call.core.engine_for(node)
    with call.state.lock:
        vmids = [int(k) for k, ct in call.state.cts.items() if ct.get("node") == node]
    return base + sum(engine.memory_used(vmid) for vmid in vmids), total


def _node_entry(call: Call, node: str, audit: bool) -> dict[str, Any]:
    online = not call.faults.is_offline(node)
    entry: dict[str, Any] = {
        "id": f"node/{node}",
        "node": node,
        "type": "node",
        "status": "online" if online else "offline",
    }
    if audit and online:
        entry.update(
            {
                "cpu": 0.01,
                "maxcpu": os.cpu_count() or 1,
                "mem": node_memory(call, node)[0],
                "maxmem": node_memory(call, node)[1],
                "disk": 10 * _GIB,
                "maxdisk": 100 * _GIB,
                "uptime": int(time.time() - call.core.started),
                "level": "",
                "cgroup-mode": 2 if os.path.exists("/sys/fs/cgroup/cgroup.controllers") else 1,
            }
        )
    return entry


@route("GET", "/cluster/status")
def cluster_status(call: Call) -> list[dict[str, Any]]:
    nodes = call.state.nodes
    out: list[dict[str, Any]] = []
    if len(nodes) > 1:
        out.append(
            {
                "type": "cluster",
                "id": "cluster",
                "name": "sandbox-test",
                "nodes": len(nodes),
                "quorate": 1,
                "version": 1,
            }
        )
    for i, node in enumerate(nodes):
        out.append(
            {
                "type": "node",
                "id": f"node/{node}",
                "name": node,
                "nodeid": i + 1,
                "ip": "127.0.0.1",
                "local": int(node == call.core.local_node),
                "online": int(not call.faults.is_offline(node)),
                "level": "",
            }
        )
    return out


@route("GET", "/nodes")
def nodes(call: Call) -> list[dict[str, Any]]:
    with call.state.lock:
        return [
            _node_entry(call, node, call.acl.check(call.authid, f"/nodes/{node}", ["Sys.Audit"], noerr=True))
            for node in call.state.nodes
        ]


@route("GET", "/nodes/{node}/status")
def node_status(call: Call) -> dict[str, Any]:
    cpus = os.cpu_count() or 1
    used, total = node_memory(call, call.node)
    return {
        "uptime": int(time.time() - call.core.started),
        "cpu": 0.01,
        "wait": 0,
        "loadavg": ["0.10", "0.05", "0.01"],
        "kversion": f"Linux {os.uname().release}",
        "pveversion": f"pve-manager/{call.core.version}/5e7e5d1a",
        "cpuinfo": {
            "cpus": cpus,
            "cores": cpus,
            "sockets": 1,
            "model": "PVE test server",
            "mhz": "2000",
            "hvm": "1",
        },
        "memory": {"total": total, "used": used, "free": total - used, "available": total - used},
        "swap": {"total": 0, "used": 0, "free": 0},
        "rootfs": {"total": 100 * _GIB, "used": 10 * _GIB, "free": 90 * _GIB, "avail": 90 * _GIB},
        "boot-info": {"mode": "legacy-bios"},
        "current-kernel": {"sysname": "Linux", "release": os.uname().release, "machine": os.uname().machine},
    }


def _storage_or_fail(call: Call, sid: str) -> dict[str, Any]:
    scfg: dict[str, Any] | None = call.state.storages.get(sid)
    if scfg is None:
        raise fail(f"storage '{sid}' does not exist")
    return scfg


def _storage_entry(sid: str, scfg: dict[str, Any]) -> dict[str, Any]:
    total, used = int(scfg["total"]), int(scfg["used"])
    return {
        "storage": sid,
        "type": scfg["type"],
        "content": ",".join(scfg["content"]),
        "active": 1,
        "enabled": 1,
        "shared": int(bool(scfg.get("shared"))),
        "total": total,
        "used": used,
        "avail": total - used,
        "used_fraction": used / total if total else 0,
    }


@route("GET", "/nodes/{node}/storage")
def storage_index(call: Call) -> list[dict[str, Any]]:
    wanted = set(str(call.params.get("content", "")).replace(";", ",").split(",")) - {""}
    out = []
    with call.state.lock:
        for sid, scfg in sorted(call.state.storages.items()):
            if "storage" in call.params and call.params["storage"] != sid:
                continue
            if not call.acl.check_any(
                call.authid, f"/storage/{sid}", ["Datastore.Audit", "Datastore.AllocateSpace"], noerr=True
            ):
                continue
            if wanted and not wanted & set(scfg["content"]):
                continue
            out.append(_storage_entry(sid, scfg))
    return out


@route("GET", "/nodes/{node}/storage/{storage}/status")
def storage_status(call: Call) -> dict[str, Any]:
    with call.state.lock:
        entry = _storage_entry(call.params["storage"], _storage_or_fail(call, call.params["storage"]))
    entry.pop("storage")
    return entry


def storage_volumes(call: Call, sid: str) -> list[dict[str, Any]]:
    """Volumes on ``sid``: seeded templates plus every CT's rootfs there."""
    vols: list[dict[str, Any]] = []
    for vol in call.state.volumes.get(sid, []):
        entry = {
            "volid": vol["volid"],
            "content": vol["content"],
            "size": vol["size"],
            "ctime": int(call.core.started),
        }
        entry["format"] = "tzst" if vol["content"] == "vztmpl" else "raw"
        vols.append(entry)
    for key, ct in sorted(call.state.cts.items(), key=lambda kv: int(kv[0])):
        storage, volname, size = rootfs_info(ct["config"])
        if storage == sid:
            vols.append(
                {
                    "volid": f"{sid}:{volname}",
                    "content": "rootdir",
                    "format": "raw",
                    "size": size,
                    "vmid": int(key),
                    "ctime": int(ct.get("ctime", 0)),
                }
            )
    return vols


@route("GET", "/nodes/{node}/storage/{storage}/content")
def storage_content(call: Call) -> list[dict[str, Any]]:
    sid = call.params["storage"]
    with call.state.lock:
        _storage_or_fail(call, sid)
        vols = storage_volumes(call, sid)
    content, vmid = call.params.get("content"), call.params.get("vmid")
    return [
        v
        for v in vols
        if (content is None or v["content"] == content) and (vmid is None or v.get("vmid") == vmid)
    ]


def bridge_of(net_value: str) -> str | None:
    return parse_kv(net_value).get("bridge")


# PVE's extension check of an uploaded CT template (PVE::Storage's vztmpl volume names).
_VZTMPL_NAME = re.compile(r"^[^/]+\.tar\.(?:gz|xz|zst|bz2)$")


@route("POST", "/nodes/{node}/storage/{storage}/upload")
def upload(call: Call) -> str:
    """PVE's API2::Storage::Status::upload: pveproxy spooled the file (``tmpfilename``); its name
    is normalised, checked against the content type, and an ``imgcopy`` task moves it into the
    storage (the node engine: the node's /var/lib/vz/template/cache). Other engines keep only the
    volume's record."""
    p = call.params
    sid, content = str(p["storage"]), str(p["content"])
    token = str(p.get("tmpfilename") or "")
    spool = call.core.uploads.pop(token, None)
    if spool is None:
        raise param_error({"filename": "no file uploaded (send it as multipart/form-data)"})
    try:
        filename = re.sub(r"[^a-zA-Z0-9_.-]", "_", os.path.basename(str(p["filename"])))
        with call.state.lock:
            scfg = _storage_or_fail(call, sid)
            if content not in scfg["content"]:
                raise param_error({"content": f"storage '{sid}' does not support '{content}' content"})
        if content != "vztmpl":
            raise fail(f"upload of content type '{content}' is not implemented by the PVE test server")
        if not _VZTMPL_NAME.match(filename):
            raise param_error({"filename": "wrong file extension"})
    except BaseException:
        spool.unlink(missing_ok=True)
        raise
    volid = f"{sid}:vztmpl/{filename}"
    size = spool.stat().st_size
    target_dir = call.engine.storage_dir(sid) if isinstance(call.engine, StorageBacked) else None

    def body(ctx: TaskContext) -> None:
        try:
            if target_dir is not None:
                dest = target_dir / "template" / "cache" / filename
                ctx.log(f"target file: {dest}")
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(spool, dest.with_name(dest.name + ".tmp"))
                dest.with_name(dest.name + ".tmp").replace(dest)
            ctx.log(f"file size is: {size}")
        finally:
            spool.unlink(missing_ok=True)
        with call.mutate() as st:
            vols = [v for v in st.volumes.setdefault(sid, []) if v["volid"] != volid]
            vols.append({"volid": volid, "content": "vztmpl", "size": size})
            st.volumes[sid] = vols
        ctx.log(f"stored as {volid}")

    return call.tasks.start(call.node, "imgcopy", "", call.authid, body).upid
