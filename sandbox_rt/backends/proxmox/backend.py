from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import ipaddress
import math
import re
import threading
from typing import Any

from ...config import Settings
from ...errors import (
    BackendError,
    ConfigError,
    SandboxNotFound,
)
from ...filelock import file_lock
from ...ipam import mac_for_ip
from ...models import DEFAULT_TEMPLATE, ResourceUsage, SandboxRecord, SandboxSpec
from .. import vmids
from ..base import GcCandidate
from ..owner import owner_alive
from ..records import ROOT_ENV, new_record, updated_record
from .contract import TemplateContract
from .core import NodeUnreachable, pve_bool
from .description import (
    CAPS,
    TAG,
    applied_caps_of,
    caps_mismatch,
    refused_caps_of,
    sandbox_id_tag,
    tags_of,
)
from .firewall import PveFirewall
from .placement import NodeView, cluster_view, rank
from .snapshots import PveSnapshots

__all__ = ["ProxmoxBackend"]

_EXISTS = re.compile(r"already exists", re.I)
_STRANDED_ID = re.compile(r"sbx-[0-9a-f]+@\d+")
# a linked clone's root disk: <storage>:base-<template vmid>-disk-N/vm-... (directory storages:
# <storage>:<vmid>/base-<vmid>-disk-N.raw/...)
_LINKED_BASE = re.compile(r"(?:^|[:/])base-(\d+)-disk-\d+[^/,]*/")
_CLONE_ATTEMPTS = 12  # VMIDs tried per clone (each lost race spreads the next pick wider)


def _cores(spec: SandboxSpec) -> int:
    """PVE's ``cores`` for ``spec.cpus`` (whole CPUs, at least one; ``cpulimit`` holds the fraction)."""
    return max(1, math.ceil(spec.cpus))


class ProxmoxBackend(PveFirewall, PveSnapshots):
    """Sandboxes on a Proxmox VE host or cluster (the API calls: core.py; the CT firewall:
    firewall.py; snapshots: snapshots.py; where a new one goes: placement.py)."""

    def __init__(self, settings: Settings, api: Any = None) -> None:
        super().__init__(settings, api)
        self._placing_lock = threading.Lock()
        self._placing: dict[str, tuple[str, int]] = {}  # sandbox id -> (node, MiB) while created
        self._template_nodes: dict[int, str] = {}  # the node of a template that has one copy
        # the template VMIDs follow host.json (a template update switches them: contract.py)
        self._contract = TemplateContract(settings)
        # sandbox id -> (spec, pinned node or None, nodes tried) while created (start's retry)
        self._creating: dict[str, tuple[SandboxSpec, str | None, frozenset[str]]] = {}

    # -- templates and placement -----------------------------------------------------------------
    def _template_vmid(self, template: str) -> int:
        """The VMID of the named template (``default``: the host contract's ``pve_template_vmid``),
        as host.json names it now (contract.py)."""
        settings = self._contract.current()
        settings.check_template(template)
        if template == DEFAULT_TEMPLATE:
            return settings.pve_template_vmid
        return settings.pve_template_vmids()[template]

    def _template_vmids(self, template: str) -> builtins.list[int]:
        """Every copy of the named template: the host contract's VMID, then each node's own copy
        (``pve_node_templates``); where each one is, /cluster/resources says."""
        first = self._template_vmid(template)
        nodes = self._contract.current().pve_node_templates
        copies = [c[template] for _n, c in sorted(nodes.items()) if template in c]
        return [first, *copies]

    # -- template updates (base.TemplateGenerations) ---------------------------------------------
    def template_is_current(self, record: SandboxRecord) -> bool:
        """Whether the sandbox is a linked clone of a template copy host.json names now: the warm
        pool hands out none made before a template update (contract.py). A CT whose root disk names
        no template (a fork: a full clone) counts as current."""
        node, vmid = self._find(record.id)
        conf = self._call("attach", lambda: self._ct(node, vmid).config.get())
        match = _LINKED_BASE.search(str(conf.get("rootfs", "")))
        return match is None or int(match[1]) in self._template_vmids(record.spec.template)

    def prune_templates(self, *, dry_run: bool = False) -> builtins.list[str]:
        """Nothing: the runtime's token may only clone the templates. site.yml removes the older
        generations once no linked clone uses them (roles/template_build, tasks/proxmox/retire.yml)."""
        return []

    def _placing_mb(self) -> dict[str, int]:
        """MiB of the creates in flight in this process, per node (not yet in the node's ``mem``)."""
        out: dict[str, int] = {}
        with self._placing_lock:
            for node, mb in self._placing.values():
                out[node] = out.get(node, 0) + mb
        return out

    def _place(self, sandbox_id: str, spec: SandboxSpec, node: str | None) -> builtins.list[NodeView]:
        """The nodes that may take this sandbox, best first (placement.py). A template with one copy
        and no node asked for has one place: its node, looked up once (no call per create)."""
        vmids = self._template_vmids(spec.template)
        want = node or self.settings.pve_node or None
        if len(vmids) == 1 and want is None and vmids[0] in self._template_nodes:
            return [NodeView(self._template_nodes[vmids[0]], True, None, 0, vmids[0])]
        rows = self._call("clone", lambda: self.api.cluster.resources.get())
        views = cluster_view(rows, vmids, TAG)
        if all(v.template_vmid is None for v in views):
            raise BackendError(
                f"template CT {', '.join(map(str, vmids))} not found (or the token may not audit it)",
                step="clone",
            )
        ranked = rank(views, template=spec.template, node=want, placing_mb=self._placing_mb())
        if len(vmids) == 1:
            self._template_nodes[vmids[0]] = next(v.name for v in views if v.template_vmid is not None)
        return ranked

    def _clone_placed(
        self, sandbox_id: str, spec: SandboxSpec, node: str | None, tried: frozenset[str] = frozenset()
    ) -> SandboxRecord:
        """Clone on the best node; one that answers 595 is left (what was made there is stranded
        for gc) and the next one tried, within this call. ``node`` pins it (no other is tried)."""
        order = [v for v in self._place(sandbox_id, spec, node) if v.name not in tried]
        failures: builtins.list[str] = []
        for view in order:
            assert view.template_vmid is not None  # rank() returns nodes holding the template
            with self._placing_lock:
                self._placing[sandbox_id] = (view.name, spec.memory_mb)
            tried = tried | {view.name}
            self._creating[sandbox_id] = (spec, node, tried)
            try:
                return self._clone_from(sandbox_id, spec, (view.name, view.template_vmid, None))
            except NodeUnreachable as exc:
                failures.append(f"{view.name}: {exc}")
                self._leave_node(sandbox_id, view.name)
                if node:
                    raise
        raise BackendError(
            "no node could take the sandbox: " + "; ".join(failures or ["no node left to try"]),
            step="clone",
        )

    def _leave_node(self, sandbox_id: str, node: str) -> None:
        """A create moves away from ``node`` (unreachable): remove what it made there if PVE still
        can, else strand it (gc removes it once the node is back), and forget its VMID."""
        vmid = (self.markers.read(sandbox_id) or {}).get("vmid")
        if vmid:
            try:
                upid = self._call("destroy", lambda: self._ct(node, int(vmid)).delete(force=1, purge=1))
                self._wait(str(upid), "destroy")
            except BackendError:
                self._strand(sandbox_id, node, int(vmid))
        self.markers.write(sandbox_id, vmid=None)

    def clone_on(self, sandbox_id: str, spec: SandboxSpec, node: str) -> SandboxRecord:
        """``clone`` on the named node only (``create(node=...)``)."""
        return self._clone_placed(sandbox_id, spec, node)

    # -- addresses -------------------------------------------------------------------------------
    def _addresses_in_use(self) -> set[str]:
        used: set[str] = set()
        for r in self._ours():
            for tag in tags_of(r.get("tags")):
                if tag.startswith("ip-"):
                    used.add(tag[3:])
        return used

    def _address_lock(self) -> contextlib.AbstractContextManager[None]:
        return file_lock(self.state_dir / "ipam.lock")

    def _pick_address(self, vmid: int, used: set[str]) -> str:
        start = int(ipaddress.IPv4Address(self.settings.ip_pool_start))
        end = int(ipaddress.IPv4Address(self.settings.ip_pool_end))
        span = end - start + 1
        reserved = {
            self.settings.gateway,
            self.settings.dns_server,
            str(self.net.network_address),
            str(self.net.broadcast_address),
        }
        for probe in range(span):
            ip = str(ipaddress.IPv4Address(end - ((vmid + probe) % span)))
            if ip not in used and ip not in reserved:
                return ip
        raise BackendError("no free address left in the sandbox pool", step="address")

    # -- create steps ----------------------------------------------------------------------------
    def begin(self, sandbox_id: str) -> None:
        self.markers.write(sandbox_id, vmid=None)

    def end(self, sandbox_id: str) -> None:
        with self._placing_lock:
            self._placing.pop(sandbox_id, None)
        self._creating.pop(sandbox_id, None)
        if not (self.markers.read(sandbox_id) or {}).get("abandoned"):  # that one waits for gc
            self.markers.remove(sandbox_id)

    def clone(self, sandbox_id: str, spec: SandboxSpec) -> SandboxRecord:
        return self._clone_placed(sandbox_id, spec, None)

    def _check_root_side(self, spec: SandboxSpec) -> None:
        """On Proxmox VE a sandbox's init and sshd still run as root (the embedded default starts a
        sandbox made without root as its user, SBX-ESC-28): a template built from code, whose steps
        ran as root and may have planted what root runs (PAM, NSS, ld.so, sshd, ...), gives only
        sandboxes with root. The default template and the inventory's (Ansible's) are trusted."""
        if spec.root or spec.template == DEFAULT_TEMPLATE or spec.template in self.settings.pve_templates:
            return
        raise ConfigError(
            f"template {spec.template!r} was built from code: on Proxmox VE its sandboxes are made with "
            "root=True only (a build step may have planted code that root runs there; docs/proxmox.md, "
            "'Root-tainted sources')"
        )

    def _clone_from(
        self, sandbox_id: str, spec: SandboxSpec, source: tuple[str, int, str | None]
    ) -> SandboxRecord:
        """A linked clone of the template CT ``source`` (node, vmid, None), or with a snapshot name
        (node, vmid, name) a full clone of that CT's snapshot (PVE clones a CT that is not a
        template only in full)."""
        self._check_egress(spec.egress)  # before anything is made
        self._check_root_side(spec)
        self._check_firewall_gate()
        node, template_vmid, snapname = source
        snapshot = (node, template_vmid, snapname) if snapname else None
        template = self._ct(node, template_vmid)
        draft = new_record(sandbox_id, spec, ip="", host_key="", backend=self.name)
        hostname = draft.hostname

        def request_clone(collisions: int) -> tuple[int, Any]:
            # this process's callers take turns from nextid to the accepted request; a locked
            # template is waited for outside the turn (_retrying's back-off)
            with vmids.allocating(self.settings.pve_url):
                vmid = vmids.candidate(int(self.api.cluster.nextid.get()), collisions)
                self.markers.write(sandbox_id, vmid=vmid)
                return vmid, template.clone.post(
                    newid=vmid,
                    hostname=hostname,
                    pool=self.settings.pve_pool or None,
                    full=pve_bool(snapshot is not None),
                    snapname=snapshot[2] if snapshot else None,
                    description=self._spec_description(draft),
                )

        vmid = 0
        collisions = 0
        for _attempt in range(_CLONE_ATTEMPTS):
            try:
                vmid, upid = self._retrying(
                    "clone", functools.partial(request_clone, collisions), vmid=template_vmid
                )
            except BackendError as exc:
                if _EXISTS.search(str(exc)):
                    collisions += 1
                    continue  # another process took this VMID between nextid and clone
                raise
            # the CT is invisible to the token until its clone task puts it in the pool:
            # a gc after our death waits for this task before looking for the CT
            self.markers.write(sandbox_id, vmid=vmid, upid=str(upid))
            self._wait(str(upid), "clone")
            break
        else:
            raise BackendError(
                f"no free VMID after {_CLONE_ATTEMPTS} attempts (nextid keeps colliding with other "
                "callers' clones)",
                step="clone",
            )

        with self._address_lock():
            ip = self._pick_address(vmid, self._addresses_in_use())
            record = dataclasses.replace(draft, ip=ip)
            tags = [TAG, sandbox_id, f"ip-{ip}"]
            if record.expires_at:
                tags.append(f"exp-{int(record.expires_at)}")
            net0 = self._net0(ip, spec)
            config = {
                "cores": _cores(spec),
                "cpulimit": f"{spec.cpus:g}",
                "memory": spec.memory_mb,
                "swap": 0,
                "net0": net0,
                "tags": ";".join(tags),
                "description": self._spec_description(record),
                "nameserver": self.settings.dns_server,
            }
            ct = self._ct(node, vmid)
            if spec.root:  # PID 1's marker (backends/records.py)
                config["env"] = ROOT_ENV
            elif snapshot is not None and "env" in self._call("clone", lambda: ct.config.get()):
                config["delete"] = "env"  # a full clone of a root sandbox's snapshot copied it
            self._retrying("configure", lambda: ct.config.put(**config), vmid=vmid)
        self._resize(node, vmid, spec.disk_gb)
        if snapshot is not None:
            self._drop_cloned_rules(node, vmid)  # PVE copied the source's firewall with the disk
        self._setup_firewall(node, vmid)  # internet: the manager's set_internet after start (base.py)
        return record

    def _net0(self, ip: str, spec: SandboxSpec) -> str:
        """The CT's NIC: its static address and MAC (bound to its port by the firewall's ipfilter and
        macfilter) and its bandwidth: ``rate`` in MB/s as PVE counts them (2^20 bytes), from
        ``net_mbps`` (10^6 bits); PVE's tc shapes everything through the NIC, SSH included."""
        net0 = (
            f"name=eth0,bridge={self.settings.bridge},ip={ip}/{self.net.prefixlen},"
            f"gw={self.settings.gateway},hwaddr={mac_for_ip(ip).upper()},firewall=1"
        )
        if spec.net_mbps > 0:
            net0 += f",rate={max(0.001, round(spec.net_mbps * 1e6 / 8 / (1 << 20), 3)):g}"
        return net0

    def _resize(self, node: str, vmid: int, disk_gb: int) -> None:
        ct = self._ct(node, vmid)
        conf = self._call("resize", lambda: ct.config.get())
        m = re.search(r"size=(\d+(?:\.\d+)?)([KMGT]?)", str(conf.get("rootfs", "")))
        if m:
            factor = {"": 1 / 1024**3, "K": 1 / 1024**2, "M": 1 / 1024, "G": 1.0, "T": 1024.0}[m.group(2)]
            if float(m.group(1)) * factor >= disk_gb:
                return  # linked clones can only grow; a template disk as large is enough
        upid = self._retrying("resize", lambda: ct.resize.put(disk="rootfs", size=f"{disk_gb}G"), vmid=vmid)
        if upid:
            self._wait(str(upid), "resize")

    def start(self, sandbox_id: str) -> SandboxRecord:
        node, vmid = self._find(sandbox_id)
        ct = self._ct(node, vmid)
        try:
            upid = self._retrying("start", lambda: ct.status.start.post(), vmid=vmid)
            self._wait(str(upid), "start")
        except NodeUnreachable:
            creating = self._creating.get(sandbox_id)
            if creating is None or creating[1]:  # not being made here, or pinned to that node
                raise
            spec, _node, tried = creating  # the node went away between clone and start: next node
            self._leave_node(sandbox_id, node)
            self._clone_placed(sandbox_id, spec, None, tried)
            return self.start(sandbox_id)
        return self._check_caps(node, vmid)

    def _check_caps(self, node: str, vmid: int) -> SandboxRecord:
        """The record of a CT just started, once the caps PVE has no option for hold as asked: the
        node's hookscript applied them at post-start and published what holds
        (``sandbox-rt-caps-applied:``, description.py). PVE only warns when a post-start hookscript
        fails, so without that line, or with caps other than asked, the sandbox is refused:
        BackendError, or ConfigError when the node's ceiling is below what was asked."""
        conf = self._call("start", lambda: self._ct(node, vmid).config.get())
        record = self._record_of(conf, vmid)
        applied = applied_caps_of(str(conf.get("description", "")))
        refused = refused_caps_of(str(conf.get("description", "")))
        if applied is None and refused is not None:
            why = f"CT {vmid} on node {node}: the node refused its caps: {refused}"
            raise BackendError(why, step="start")
        if applied is None:
            raise BackendError(
                f"CT {vmid} on node {node} started without confirming its caps ({', '.join(CAPS)}): "
                "the node's hookscript did not publish a sandbox-rt-caps-applied line (see the start "
                "task's log; is this version of roles/proxmox_hookscript installed on the node?)",
                step="start",
            )
        wrong = caps_mismatch(record.spec, applied)
        lower = [w for w in wrong if w[2] < w[1]]
        if wrong and len(lower) == len(wrong):
            raise ConfigError(
                f"node {node} caps "
                + ", ".join(f"{name} at {got} (asked {asked})" for name, asked, got in lower)
                + ": its ceilings (/etc/sandbox_rt/pve-hookscript.conf, roles/proxmox_hookscript) are "
                "below the request; ask for less or raise them"
            )
        if wrong:
            raise BackendError(
                f"CT {vmid} on node {node}: caps do not hold as asked: "
                + ", ".join(f"{name}={got} (asked {asked})" for name, asked, got in wrong),
                step="start",
            )
        return record

    def stop(self, sandbox_id: str) -> None:
        node, vmid = self._find(sandbox_id)
        ct = self._ct(node, vmid)
        upid = self._retrying("stop", lambda: ct.status.stop.post())
        self._wait(str(upid), "stop")

    def pause(self, sandbox_id: str) -> None:
        """Not supported: PVE's ``status/suspend`` of a CT is an experimental CRIU checkpoint
        (``lxc-checkpoint``: criu on the node, the CT stopped and dumped to disk, no FUSE mounts),
        not a freeze, and ``status/current`` has no state that says a CT is suspended. Raises
        ConfigError (after SandboxNotFound for an unknown sandbox) and changes nothing."""
        self._unpausable(sandbox_id, "pause")

    def resume(self, sandbox_id: str) -> None:
        """Not supported (see :meth:`pause`); nothing on PVE is ever paused by this runtime."""
        self._unpausable(sandbox_id, "resume")

    def _unpausable(self, sandbox_id: str, what: str) -> None:
        self._find(sandbox_id)  # SandboxNotFound first, as the lxc backend
        raise ConfigError(
            f"the proxmox backend cannot {what} sandboxes: PVE's CT suspend is an experimental CRIU "
            "checkpoint that stops the CT (it needs criu on the node), not a freeze; use the lxc backend"
        )

    def update(self, record: SandboxRecord, spec: SandboxSpec) -> SandboxRecord:
        """New limits, name, labels, TTL for a sandbox (a warm one handed out, a TTL extended). The
        caps the node's hookscript applies at start (pids_max, disk_mbps, disk_iops) cannot change
        on a running CT (the runtime has no way into the node's cgroups): a different value is a
        ConfigError, and the manager then makes the sandbox cold instead of taking a warm one."""
        changed = [
            f"{n}={getattr(spec, n)} (running with {getattr(record.spec, n)})"
            for n in CAPS
            if getattr(spec, n) != getattr(record.spec, n)
        ]
        if changed:
            raise ConfigError(
                "a PVE sandbox's caps are applied by the node at its start and cannot change while it "
                "runs: " + ", ".join(changed)
            )
        node, vmid = self._find(record.id)
        new = updated_record(record, spec)
        hostname = new.hostname
        tags = [TAG, record.id, f"ip-{record.ip}"]
        if new.expires_at:
            tags.append(f"exp-{int(new.expires_at)}")
        ct = self._ct(node, vmid)
        conf = self._call("update", lambda: ct.config.get())
        description = self._description(new, conf)
        changes = {
            "cores": _cores(spec),
            "cpulimit": f"{spec.cpus:g}",
            "memory": spec.memory_mb,
            "net0": self._net0(record.ip, spec),  # a warm CT handed out with another net_mbps
            "hostname": hostname,
            "tags": ";".join(tags),
            "description": description,
        }
        self._retrying("update", lambda: ct.config.put(**changes))
        self._resize(node, vmid, spec.disk_gb)  # a warm CT handed out for a larger disk grows live
        return new

    def destroy(self, sandbox_id: str) -> bool:
        """Remove the CT. If that fails, the create marker stays, flagged ``abandoned``: ``end``
        keeps it, so ``gc`` finds the CT later even when it carries no tags yet.
        ``<id>@<vmid>`` (a gc candidate) is a CT a create of ``<id>`` stranded on a node it could
        not reach: that CT goes, never the sandbox's own."""
        if _STRANDED_ID.fullmatch(sandbox_id):
            return self._destroy_stranded(sandbox_id)
        vmid: int | None = None
        try:
            try:
                node, vmid = self._find(sandbox_id)
            except SandboxNotFound:
                upid = (self.markers.read(sandbox_id) or {}).get("upid")
                if upid:  # a clone task of ours may still run (its CT invisible until it ends)
                    with contextlib.suppress(BackendError):  # it failed or hung: PVE removes the CT
                        self._wait(str(upid), "destroy")
                vmid_hint = self._intent_vmid(sandbox_id)
                if vmid_hint is None or not self._is_ours(vmid_hint, sandbox_id):
                    self.markers.remove(sandbox_id)
                    return False
                node, vmid = vmid_hint
            ct = self._ct(node, vmid)
            upid = self._retrying("destroy", lambda: ct.delete(force=1, purge=1), vmid=vmid)
            self._wait(str(upid), "destroy")
        except BackendError:
            old = self.markers.read(sandbox_id) or {}
            self.markers.write(sandbox_id, vmid=vmid or old.get("vmid"), abandoned=True)
            raise
        self.markers.remove(sandbox_id)
        return True

    def _destroy_stranded(self, candidate: str) -> bool:
        sandbox_id, _, vmid_text = candidate.partition("@")
        vmid = int(vmid_text)
        entry = self._stranded().get(vmid)
        if entry is None or entry.get("sandbox_id") != sandbox_id:
            return False
        node = str(entry["node"])
        here = any(int(r["vmid"]) == vmid and str(r["node"]) == node for r in self._resources())
        if here and self._is_ours((node, vmid), sandbox_id):  # a VMID reused by someone else stays
            upid = self._retrying("destroy", lambda: self._ct(node, vmid).delete(force=1, purge=1), vmid=vmid)
            self._wait(str(upid), "destroy")
        self._unstrand(vmid)
        return True

    def _offline_nodes(self) -> set[str]:
        rows = self._call("list", lambda: self.api.cluster.resources.get(type="node"))
        return {str(r.get("node")) for r in rows if r.get("type") == "node" and r.get("status") != "online"}

    def _intent_vmid(self, sandbox_id: str) -> tuple[str, int] | None:
        intent = self.markers.read(sandbox_id)
        if not intent or not intent.get("vmid"):
            return None
        vmid = int(intent["vmid"])
        for r in self._resources():
            if int(r["vmid"]) == vmid:
                return str(r["node"]), vmid
        return None

    # -- records ---------------------------------------------------------------------------------
    def list(self) -> builtins.list[SandboxRecord]:
        out: builtins.list[SandboxRecord] = []
        seen: set[str] = set()
        for r in self._ours():
            sid = sandbox_id_tag(tags_of(r.get("tags")))
            if sid and sid not in seen:  # a fork being made carries its source's id for a moment
                seen.add(sid)
                with contextlib.suppress(SandboxNotFound, BackendError):
                    out.append(self.get(sid))
        return out

    def _current(self, sandbox_id: str) -> dict[str, Any]:
        node, vmid = self._find(sandbox_id)
        return dict(self._call("status", lambda: self._ct(node, vmid).status.current.get()))

    def state(self, sandbox_id: str) -> str:
        try:
            return str(self._current(sandbox_id).get("status", "unknown"))
        except SandboxNotFound:
            return "absent"

    def uptime_s(self, sandbox_id: str) -> float | None:
        up = self._current(sandbox_id).get("uptime")
        return float(up) if up is not None else None

    def usage(self, sandbox_id: str) -> ResourceUsage:
        cur = self._current(sandbox_id)
        mem, disk = cur.get("mem"), cur.get("disk")
        return ResourceUsage(
            memory_bytes=int(mem) if mem is not None else None,
            disk_bytes=int(disk) if disk is not None else None,
        )

    # -- garbage collection ----------------------------------------------------------------------
    def gc_candidates(self, *, now: float, dead_owners: bool) -> builtins.list[GcCandidate]:
        """What gc removes; what sits on a node PVE cannot reach now waits for a later gc (its
        removal would fail with 595 and stop the sweep of the other nodes)."""
        live, found = self.markers.sweep()
        for sid in builtins.list(live):  # a create that returned, but whose cleanup failed
            if (self.markers.read(sid) or {}).get("abandoned"):
                live.discard(sid)
                found[sid] = "removal failed earlier"
        offline = self._offline_nodes()
        resources = self._resources()
        where = {int(r["vmid"]): str(r["node"]) for r in resources}
        for sid in builtins.list(found):
            vmid = (self.markers.read(sid) or {}).get("vmid")
            if vmid and where.get(int(vmid)) in offline:
                del found[sid]
        stranded = self._stranded()
        for vmid, entry in stranded.items():
            if str(entry.get("node")) not in offline:
                why = f"left on node {entry.get('node')} by a create that moved on"
                found[f"{entry.get('sandbox_id')}@{vmid}"] = why
        for r in (r for r in resources if TAG in tags_of(r.get("tags"))):
            tags = tags_of(r.get("tags"))
            tag_id = sandbox_id_tag(tags)
            if tag_id is None or tag_id in found or tag_id in live or str(r["node"]) in offline:
                continue
            if stranded.get(int(r["vmid"]), {}).get("node") == str(r["node"]):
                continue  # its own candidate above
            sid = tag_id
            exp = next((int(t[4:]) for t in tags if re.fullmatch(r"exp-\d+", t)), None)
            if exp is not None and exp <= now:
                found[sid] = "expired"
            elif dead_owners:
                with contextlib.suppress(BackendError, SandboxNotFound):
                    node, vmid = str(r["node"]), int(r["vmid"])
                    conf = self._call("gc", lambda n=node, v=vmid: self._ct(n, v).config.get())  # type: ignore[misc]
                    rec = self._parse_record(str(conf.get("description", ""))) or {}
                    if not owner_alive(
                        int(rec.get("owner_pid", 0)),
                        rec.get("owner_start_time"),
                        str(rec.get("owner_host", "")),
                    ):
                        found[sid] = "owner process died"
        return [GcCandidate(sid, reason) for sid, reason in sorted(found.items())]
