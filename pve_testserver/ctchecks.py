"""What every /nodes/{node}/lxc route checks first (pve-container's PVE::LXC and PVE::AbstractConfig
helpers): the CT on the addressed node, its lock, the config digest, the privileges each option
needs; how a parameter is stored, a CT's list entry, and the task a route starts."""

from __future__ import annotations

import re
from typing import Any

from .api_cluster import ct_stats
from .auth import ROOT
from .core import Call
from .ctconfig import (
    config_digest,
    parse_kv,
)
from .errors import fail, perm_error

NET_RE = re.compile(r"^net\d+$")
DISK_RE = re.compile(r"^(rootfs|mp\d+)$")


def load_ct(call: Call, vmid: int) -> dict[str, Any]:
    """The CT on the addressed node (state lock held), or PVE's missing-config error."""
    ct: dict[str, Any] | None = call.state.ct(vmid)
    if ct is None or ct["node"] != call.node:
        raise fail(f"Configuration file 'nodes/{call.node}/lxc/{vmid}.conf' does not exist")
    return ct


def check_lock(conf: dict[str, Any]) -> None:
    if conf.get("lock"):
        raise fail(f"CT is locked ({conf['lock']})")


def check_config_write(call: Call, vmid: int, conf: dict[str, Any]) -> None:
    """check_lock for config writes, honouring the ``lock`` fault switch."""
    injected = call.faults.take_lock(vmid)
    if injected:
        raise fail(f"CT is locked ({injected})")
    check_lock(conf)


def check_digest(conf: dict[str, Any], digest: str | None) -> None:
    if digest and digest != config_digest(conf):
        raise fail("detected modified configuration - file changed by other user? Try again.")


def stored(value: Any) -> Any:
    """A validated parameter as the config file stores it."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else str(value)
    return value


def start_task(call: Call, dtype: str, vmid: int, body: Any) -> str:
    return call.tasks.start(call.node, dtype, str(vmid), call.authid, body).upid


def check_modify_perm(
    call: Call,
    vmid: int,
    pool: str | None,
    old: dict[str, Any] | None,
    new: dict[str, Any],
    delete: list[str],
    storage: str | None = None,
) -> None:
    """PVE::LXC::check_ct_modify_config_perm (per option privileges, SDN.Use on bridges)."""
    who = call.authid
    if who == ROOT:
        return
    acl = call.acl

    def one(opt: str, deleting: bool) -> None:
        if opt in ("cores", "cpuunits", "cpulimit"):
            acl.check_vm_perm(who, vmid, pool, ["VM.Config.CPU"])
        elif DISK_RE.match(opt):
            acl.check_vm_perm(who, vmid, pool, ["VM.Config.Disk"])
            if not deleting:
                # PVE's classify_mountpoint: /dev/... is a device, /... a bind mount, anything else a
                # volume - STORAGE:VOLUME, STORAGE:SIZE or a bare SIZE on the create's storage
                volume = parse_kv(str(new[opt]), "volume").get("volume", "")
                if volume.startswith("/"):
                    kind = "device" if volume.startswith("/dev/") else "bind"
                    raise perm_error(f"mount point type {kind} is only allowed for root@pam")
                sid = volume.split(":")[0] if ":" in volume else str(storage or "local")
                acl.check(who, f"/storage/{sid}", ["Datastore.AllocateSpace"])
        elif opt in ("memory", "swap"):
            acl.check_vm_perm(who, vmid, pool, ["VM.Config.Memory"])
        elif NET_RE.match(opt):
            acl.check_vm_perm(who, vmid, pool, ["VM.Config.Network"])
            for value in ((old or {}).get(opt), None if deleting else new.get(opt)):
                if value:
                    net = parse_kv(str(value))
                    if net.get("bridge"):
                        acl.check_sdn_bridge(who, net["bridge"], net.get("tag"))
        elif opt.startswith("dev"):
            raise perm_error("configuring device passthrough is only allowed for root@pam")
        elif opt in ("nameserver", "searchdomain", "hostname"):
            acl.check_vm_perm(who, vmid, pool, ["VM.Config.Network"])
        elif opt == "features":
            raise perm_error("changing feature flags (except nesting) is only allowed for root@pam")
        elif opt == "hookscript":
            raise perm_error("changing the hookscript is only allowed for root@pam")
        elif opt == "tags":
            acl.check_vm_perm(who, vmid, None, ["VM.Config.Options"])
        else:
            acl.check_vm_perm(who, vmid, pool, ["VM.Config.Options"])

    for opt in new:
        one(opt, False)
    for opt in delete:
        one(opt, True)


def ct_list_entry(call: Call, vmid: int, ct: dict[str, Any]) -> dict[str, Any]:
    entry = ct_stats(call, vmid, ct)
    entry["vmid"] = vmid
    return entry
