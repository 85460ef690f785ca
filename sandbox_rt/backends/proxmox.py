"""Proxmox VE: sandboxes as linked clones of a CT template, driven through the API with proxmoxer.

Choices (see docs/proxmox.md):
- Identity: the sandbox id (``sbx-<hex>``) is a PVE tag; ``sandbox-rt`` tags every sandbox and
  ``exp-<epoch>`` carries its expiry, so ``gc`` finds them from ``/cluster/resources`` alone. The
  record (labels, owner, spec) is one JSON line of the CT's description, written by the clone call
  itself, so a CT is recognisably ours from its first moment. gc never touches a CT without that.
- Placement: linked clones live on the template's node (set ``pve_node`` to override).
- Addresses: derived from the VMID, counted down from the top of the pool (the local LXC backend
  counts up from the bottom), then probed past any address another sandbox-rt CT uses.
- Host keys: a hookscript on the node writes a fresh ed25519 host key into the CT before its
  first start and publishes the public half in the description (``sandbox-rt-ssh-host-key:``);
  the runtime pins that before its first SSH contact and refuses a CT that has none.
- Internet: the CT's own PVE firewall (``net0 firewall=1``, outbound policy DROP, two outbound
  ACCEPT rules for DNS and HTTP/HTTPS that ``set_internet`` enables or disables); this needs only
  ``VM.Config.Network`` on the CT, no shell on the node. PVE applies CT firewalls only while the
  datacenter firewall is on: create, set_internet and set_egress check that first and fail closed
  (:class:`FirewallDisabled`).
- Every UPID is waited for and its exit status checked; "CT is locked" and VMID races are retried
  with back-off, then a BackendError with PVE's message.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import ipaddress
import json
import math
import random
import re
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException
from proxmoxer.tools import Tasks

from ..config import Settings
from ..errors import (
    BackendError,
    ConfigError,
    FirewallDisabled,
    PermissionDenied,
    SandboxNotFound,
    SnapshotNotFound,
)
from ..filelock import file_lock
from ..ipam import mac_for_ip
from ..models import DEFAULT_TEMPLATE, ResourceUsage, SandboxRecord, SandboxSpec, SnapshotInfo
from ..validation import SANDBOX_ID, TEMPLATE_NAME, split_egress
from . import vmids
from .base import GcCandidate
from .intents import CreateMarkers
from .owner import owner_alive, process_start_time
from .records import ROOT_ENV, new_record, spec_from_json, spec_to_json, updated_record

__all__ = ["ProxmoxBackend"]

TAG = "sandbox-rt"
RECORD_PREFIX = "sandbox-rt-record: "
HOSTKEY_PREFIX = "sandbox-rt-ssh-host-key: "
RULE_COMMENT = "sandbox-rt internet"
EGRESS_COMMENT = "sandbox-rt egress"
T = TypeVar("T")
_LOCKED = re.compile(r"is locked|got timeout|can't lock file", re.I)
_EXISTS = re.compile(r"already exists", re.I)
# a snapshot's description ends with this and its source's template (forks are of that template)
_TEMPLATE_NOTE = "; template "
_CLONE_ATTEMPTS = 12  # VMIDs tried per clone (each lost race spreads the next pick wider)


def _bool(value: bool) -> int:
    """PVE takes 0/1 for booleans at the top level (proxmoxer would send 'True')."""
    return 1 if value else 0


def _sandbox_id_tag(tags: set[str]) -> str | None:
    """The sandbox id among a CT's tags (``sbx-<10 hex>``), if it carries one."""
    return next((t for t in sorted(tags) if SANDBOX_ID.fullmatch(t)), None)


def _cores(spec: SandboxSpec) -> int:
    """PVE's ``cores`` for ``spec.cpus`` (whole CPUs, at least one; ``cpulimit`` holds the fraction)."""
    return max(1, math.ceil(spec.cpus))


def _snapshot_template(description: str) -> str:
    """The template named at the end of a snapshot's description (older snapshots: ``default``)."""
    _, sep, name = description.rstrip().rpartition(_TEMPLATE_NOTE)
    return name if sep and TEMPLATE_NAME.fullmatch(name) else DEFAULT_TEMPLATE


def _tags(raw: Any) -> set[str]:
    return {t for t in re.split(r"[;, ]+", str(raw or "")) if t}


class ProxmoxBackend:
    """Sandboxes on a Proxmox VE host or cluster."""

    name = "proxmox"

    def __init__(self, settings: Settings, api: ProxmoxAPI | None = None) -> None:
        self.settings = settings
        self.api = api or self._connect(settings)
        self.net = settings.network
        self.state_dir = settings.state_dir / "proxmox"
        self.intents = self.state_dir / "creating"
        self.markers = CreateMarkers(self.intents)
        self.task_timeout_s = settings.pve_task_timeout_s
        self._template_nodes: dict[int, str] = {}  # template VMID -> its node

    # -- connection ------------------------------------------------------------------------------
    @staticmethod
    def _connect(s: Settings) -> ProxmoxAPI:
        url = urlparse(s.pve_url)
        if url.scheme != "https" or not url.hostname:
            raise ConfigError(f"pve_url={s.pve_url!r} must be an https:// URL")
        user, _, token_name = s.pve_token_id.partition("!")
        secret = s.pve_token_secret
        if not secret and s.pve_token_secret_file:
            try:
                secret = Path(s.pve_token_secret_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read pve_token_secret_file: {exc.strerror}") from exc
        verify: bool | str = True
        if s.pve_verify.lower() in ("false", "0", "no"):
            # only when the operator set pve_verify=false explicitly, and never silently
            warnings.warn("TLS verification of the PVE API is off (pve_verify=false)", stacklevel=3)
            verify = False
        elif s.pve_verify.lower() not in ("true", "1", "yes"):
            if not Path(s.pve_verify).is_file():
                raise ConfigError(f"pve_verify={s.pve_verify!r} is neither true/false nor a CA file")
            verify = s.pve_verify
        return ProxmoxAPI(
            url.hostname,
            port=url.port or 8006,
            user=user,
            token_name=token_name,
            token_value=secret,
            verify_ssl=verify,
            timeout=30,
        )

    # -- API helpers -----------------------------------------------------------------------------
    def _call(self, step: str, fn: Callable[[], T]) -> T:
        """One API call; PVE's errors become typed errors naming the step.

        502/503/504 (the proxy did not pass the call on: pvedaemon restarting or overloaded) are
        tried 3 times over ~0.75 s; other answers are final at once.
        """
        for attempt in range(3):
            try:
                return fn()
            except ResourceException as exc:
                # proxmoxer: status_message is the generic HTTP phrase, content PVE's own message
                message = str(exc.content or exc.status_message).strip()
                if exc.errors:
                    message += f" {exc.errors}"
                if exc.status_code == 403:
                    raise PermissionDenied(f"the API token lacks a privilege: {message}", step=step) from exc
                if exc.status_code not in (502, 503, 504):
                    raise BackendError(f"{exc.status_code} {message}", step=step) from exc
                if attempt == 2:
                    raise BackendError(
                        f"{exc.status_code} {message} (3 attempts): the PVE API at {self.settings.pve_url} "
                        "is unavailable; check pveproxy and pvedaemon on the node, then retry",
                        step=step,
                    ) from exc
            except OSError as exc:  # requests' connection errors are OSErrors
                raise BackendError(
                    f"cannot reach the PVE API at {self.settings.pve_url}: {exc}", step=step
                ) from exc
            time.sleep(0.25 * 2**attempt)
        raise AssertionError("unreachable")

    def _retrying(
        self, step: str, fn: Callable[[], T], *, attempts: int | None = None, vmid: int | None = None
    ) -> T:
        """Retry ``fn`` while PVE says the CT is locked (another task holds it), with jittered
        back-off, for at most ``pve_task_timeout_s`` (and ``attempts`` tries, if given): the task
        holding the lock is itself bounded by that time. ``vmid`` names the CT in the error."""
        start = time.monotonic()
        delay = 0.05
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._call(step, fn)
            except BackendError as exc:
                if isinstance(exc, PermissionDenied) or not _LOCKED.search(str(exc)):
                    raise
                elapsed = time.monotonic() - start
                if elapsed + delay > self.task_timeout_s or (attempts is not None and attempt >= attempts):
                    ct = f"CT {vmid}" if vmid is not None else "the CT"
                    raise BackendError(
                        f"{str(exc).removeprefix(step + ': ')} - still locked after {attempt} attempts "
                        f"in {elapsed:.1f} s (pve_task_timeout_s={self.task_timeout_s:g}): another PVE "
                        f"task holds {ct}; let it finish (node's task list), or if none runs any more, "
                        f"unlock it on the node: pct unlock {vmid if vmid is not None else '<vmid>'}",
                        step=step,
                    ) from exc
            time.sleep(delay * random.uniform(0.5, 1.0))  # back-off while another task holds the lock
            delay = min(delay * 2, 1.0)

    def _wait(self, upid: str, step: str) -> None:
        """Wait for a task, at most ``pve_task_timeout_s``; then it is stopped (PVE's worker runs its
        own cleanup, e.g. a stopped clone removes the new CT) and the step fails."""
        status = self._call(
            step,
            lambda: Tasks.blocking_status(self.api, upid, timeout=self.task_timeout_s, polling_interval=0.05),
        )
        if status is None:
            node = Tasks.decode_upid(upid)["node"]
            with contextlib.suppress(BackendError):  # best effort; the error below says what to do
                self._call(step, lambda: self.api.nodes(node).tasks(upid).delete())
                self._call(
                    step,
                    lambda: Tasks.blocking_status(
                        self.api, upid, timeout=min(self.task_timeout_s, 10.0), polling_interval=0.05
                    ),
                )
            raise BackendError(
                f"PVE task {upid} did not finish within pve_task_timeout_s={self.task_timeout_s:g} s "
                f"and was stopped; see its log on node {node} (a hung storage or lock is the usual "
                "cause), or raise pve_task_timeout_s if the node is only slow",
                step=step,
                detail=self._task_log(upid),
            )
        exitstatus = str(status.get("exitstatus", ""))
        if exitstatus != "OK":
            raise BackendError(f"task failed: {exitstatus}", step=step, detail=self._task_log(upid))

    def _task_log(self, upid: str) -> str:
        node = Tasks.decode_upid(upid)["node"]
        with contextlib.suppress(Exception):
            lines = self.api.nodes(node).tasks(upid).log.get(limit=50)
            return "\n".join(str(entry.get("t", "")) for entry in lines)
        return ""

    def _ct(self, node: str, vmid: int) -> Any:
        return self.api.nodes(node).lxc(vmid)

    def _resources(self) -> list[dict[str, Any]]:
        items = self._call("list", lambda: self.api.cluster.resources.get(type="vm"))
        return [r for r in items if r.get("type") == "lxc"]

    def _ours(self) -> list[dict[str, Any]]:
        return [r for r in self._resources() if TAG in _tags(r.get("tags"))]

    def _find(self, sandbox_id: str) -> tuple[str, int]:
        hits = [
            (str(r["node"]), int(r["vmid"])) for r in self._resources() if sandbox_id in _tags(r.get("tags"))
        ]
        if not hits:
            raise SandboxNotFound(sandbox_id)
        if len(hits) > 1:  # a fork being made carries its source's tags until its config write
            for where in hits:
                with contextlib.suppress(BackendError):
                    if self._is_ours(where, sandbox_id):  # the description names the CT's own id
                        return where
        return hits[0]

    def _template_vmid(self, template: str) -> int:
        """The VMID of the named template (``default``: the host contract's ``pve_template_vmid``)."""
        if template == DEFAULT_TEMPLATE:
            return self.settings.pve_template_vmid
        try:
            return self.settings.pve_templates[template]
        except KeyError:
            known = ", ".join(self.settings.template_names())
            raise ConfigError(f"unknown template {template!r}; this host has: {known}") from None

    def _template_location(self, vmid: int) -> str:
        if self.settings.pve_node:
            return self.settings.pve_node
        if vmid not in self._template_nodes:
            for r in self._resources():
                if int(r["vmid"]) == vmid:
                    self._template_nodes[vmid] = str(r["node"])
                    break
            else:
                raise BackendError(
                    f"template CT {vmid} not found (or the token may not audit it)", step="clone"
                )
        return self._template_nodes[vmid]

    # -- addresses -------------------------------------------------------------------------------
    def _addresses_in_use(self) -> set[str]:
        used: set[str] = set()
        for r in self._ours():
            for tag in _tags(r.get("tags")):
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
        if not (self.markers.read(sandbox_id) or {}).get("abandoned"):  # that one waits for gc
            self.markers.remove(sandbox_id)

    def _record_line(self, record: SandboxRecord) -> str:
        data = dataclasses.asdict(record)
        data["spec"] = spec_to_json(record.spec)
        data["host_key"] = ""  # the published key line is the source of truth
        data["owner_start_time"] = process_start_time(record.owner_pid)
        return RECORD_PREFIX + json.dumps(data, sort_keys=True, separators=(",", ":"))

    def _description(self, record: SandboxRecord, conf: dict[str, Any]) -> str:
        """The CT's description for ``record``, keeping the host key line the hookscript published."""
        description = self._record_line(record)
        key = self._host_key_of(str(conf.get("description", "")))
        return description + "\n" + HOSTKEY_PREFIX + key if key else description

    def clone(self, sandbox_id: str, spec: SandboxSpec) -> SandboxRecord:
        return self._clone_from(sandbox_id, spec, None)

    def _clone_from(
        self, sandbox_id: str, spec: SandboxSpec, snapshot: tuple[str, int, str] | None
    ) -> SandboxRecord:
        """A linked clone of the template, or with ``snapshot`` (node, vmid, name) a full clone of
        that CT's snapshot (PVE clones a CT that is not a template only in full)."""
        self._check_egress(spec.egress)  # before anything is made
        self._check_firewall_gate()
        template_vmid = snapshot[1] if snapshot else self._template_vmid(spec.template)
        node = snapshot[0] if snapshot else self._template_location(template_vmid)
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
                    full=_bool(snapshot is not None),
                    snapname=snapshot[2] if snapshot else None,
                    description=self._record_line(draft),
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
                "description": self._record_line(record),
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

    def _setup_firewall(self, node: str, vmid: int) -> None:
        """The CT's firewall: outbound DROP, the address and MAC bound to the port, and the internet
        rules, created off (``set_internet`` turns them on)."""
        fw = self._ct(node, vmid).firewall
        for rule in (
            {"proto": "tcp", "dport": "80,443"},
            {"proto": "udp", "dport": "53", "dest": self.settings.dns_server},
            # DNS over TCP too (answers too large for UDP), as the embedded default allows (SBX-NET-11)
            {"proto": "tcp", "dport": "53", "dest": self.settings.dns_server},
        ):
            self._call(
                "firewall",
                lambda r=rule: fw.rules.post(  # type: ignore[misc]
                    type="out", action="ACCEPT", enable=0, comment=RULE_COMMENT, **r
                ),
            )
        self._call(
            "firewall",
            lambda: fw.options.put(enable=1, policy_out="DROP", policy_in="ACCEPT", ipfilter=1, macfilter=1),
        )

    def start(self, sandbox_id: str) -> SandboxRecord:
        node, vmid = self._find(sandbox_id)
        ct = self._ct(node, vmid)
        upid = self._retrying("start", lambda: ct.status.start.post(), vmid=vmid)
        self._wait(str(upid), "start")
        return self.get(sandbox_id)

    def stop(self, sandbox_id: str) -> None:
        node, vmid = self._find(sandbox_id)
        ct = self._ct(node, vmid)
        upid = self._retrying("stop", lambda: ct.status.stop.post())
        self._wait(str(upid), "stop")

    def update(self, record: SandboxRecord, spec: SandboxSpec) -> SandboxRecord:
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
        keeps it, so ``gc`` finds the CT later even when it carries no tags yet."""
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

    def _intent_vmid(self, sandbox_id: str) -> tuple[str, int] | None:
        intent = self.markers.read(sandbox_id)
        if not intent or not intent.get("vmid"):
            return None
        vmid = int(intent["vmid"])
        for r in self._resources():
            if int(r["vmid"]) == vmid:
                return str(r["node"]), vmid
        return None

    def _is_ours(self, where: tuple[str, int], sandbox_id: str) -> bool:
        """A CT (maybe untagged yet) is ours if its description carries our record for this id."""
        node, vmid = where
        conf = self._call("destroy", lambda: self._ct(node, vmid).config.get())
        rec = self._parse_record(str(conf.get("description", "")))
        return rec is not None and rec.get("id") == sandbox_id

    # -- records ---------------------------------------------------------------------------------
    @staticmethod
    def _parse_record(description: str) -> dict[str, Any] | None:
        for line in description.splitlines():
            if line.startswith(RECORD_PREFIX):
                with contextlib.suppress(ValueError):
                    data = json.loads(line[len(RECORD_PREFIX) :])
                    return data if isinstance(data, dict) else None
        return None

    @staticmethod
    def _host_key_of(description: str) -> str:
        for line in description.splitlines():
            if line.startswith(HOSTKEY_PREFIX):
                return line[len(HOSTKEY_PREFIX) :].strip()
        return ""

    def get(self, sandbox_id: str) -> SandboxRecord:
        node, vmid = self._find(sandbox_id)
        conf = self._call("attach", lambda: self._ct(node, vmid).config.get())
        description = str(conf.get("description", ""))
        data = self._parse_record(description)
        if data is None:
            raise BackendError(f"CT {vmid} carries no sandbox-rt record", step="attach")
        data.pop("owner_start_time", None)
        spec = spec_from_json(data.pop("spec", {}))
        data["host_key"] = self._host_key_of(description)
        return SandboxRecord(spec=spec, **data)

    def list(self) -> builtins.list[SandboxRecord]:
        out: builtins.list[SandboxRecord] = []
        seen: set[str] = set()
        for r in self._ours():
            sid = _sandbox_id_tag(_tags(r.get("tags")))
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

    # -- network ---------------------------------------------------------------------------------
    def _internet_rules(self, record: SandboxRecord) -> tuple[Any, builtins.list[dict[str, Any]]]:
        node, vmid = self._find(record.id)
        fw = self._ct(node, vmid).firewall
        rules = self._call("internet", lambda: fw.rules.get())
        return fw, [r for r in rules if r.get("comment") == RULE_COMMENT]

    def _check_firewall_gate(self) -> None:
        """Fail closed unless the datacenter firewall is on: PVE applies no CT firewall at all while
        it is off, so the CT rules that gate a sandbox's internet would do nothing (every sandbox
        would reach whatever the node's own tables let through). ``GET /cluster/firewall/options``
        needs ``Sys.Audit`` on ``/`` (the proxmox_access role grants it there, not propagated)."""
        opts = self._call("firewall", lambda: self.api.cluster.firewall.options.get())
        if str(opts.get("enable", "0")).strip() not in ("1", "true", "True"):
            raise FirewallDisabled(
                "the PVE datacenter firewall is off, so the CT firewalls that keep sandboxes off the "
                "internet would do nothing; refusing. Turn it on (Datacenter -> Firewall -> Options, or "
                "`pvesh set /cluster/firewall/options --enable 1`; the node play does it with "
                "proxmox_access_datacenter_firewall: true) after checking the datacenter's input policy "
                "keeps your management access (22, 8006)",
                step="firewall",
            )

    def set_internet(self, record: SandboxRecord, enabled: bool) -> None:
        self._check_firewall_gate()
        fw, rules = self._internet_rules(record)
        if not rules:
            raise BackendError(f"sandbox {record.id} has no sandbox-rt firewall rules", step="internet")
        for rule in rules:
            pos = int(rule["pos"])
            self._call("internet", lambda p=pos: fw.rules(p).put(enable=_bool(enabled)))  # type: ignore[misc]

    def internet_enabled(self, record: SandboxRecord) -> bool:
        _fw, rules = self._internet_rules(record)
        return bool(rules) and all(int(r.get("enable", 0)) == 1 for r in rules)

    @staticmethod
    def _check_egress(egress: tuple[str, ...]) -> None:
        names = split_egress(egress)[1]
        if names:
            raise ConfigError(
                f"egress by domain name ({', '.join(names)}) needs the host's dnsmasq (lxc backend); "
                "the PVE firewall matches addresses only: give IPv4 addresses or networks"
            )

    def set_egress(self, record: SandboxRecord, egress: tuple[str, ...]) -> None:
        """One enabled OUT ACCEPT rule per address/network (HTTP/HTTPS ports) in the CT's firewall."""
        self._check_egress(egress)
        self._check_firewall_gate()
        node, vmid = self._find(record.id)
        fw = self._ct(node, vmid).firewall
        rules = self._call("egress", lambda: fw.rules.get())
        # delete from the highest position down, so the positions of the rest stay valid
        for rule in sorted(rules, key=lambda r: -int(r["pos"])):
            if rule.get("comment") == EGRESS_COMMENT:
                pos = int(rule["pos"])
                self._call("egress", lambda p=pos: fw.rules(p).delete())  # type: ignore[misc]
        for dest in egress:
            self._call(
                "egress",
                lambda d=dest: fw.rules.post(  # type: ignore[misc]
                    type="out",
                    action="ACCEPT",
                    enable=1,
                    proto="tcp",
                    dport="80,443",
                    dest=d,
                    comment=EGRESS_COMMENT,
                ),
            )
        stored = self.get(record.id)
        new = dataclasses.replace(stored, spec=dataclasses.replace(stored.spec, egress=egress))
        conf = self._call("egress", lambda: self._ct(node, vmid).config.get())
        description = self._description(new, conf)
        self._call("egress", lambda: self._ct(node, vmid).config.put(description=description))

    # -- garbage collection ----------------------------------------------------------------------
    def gc_candidates(self, *, now: float, dead_owners: bool) -> builtins.list[GcCandidate]:
        live, found = self.markers.sweep()
        for sid in builtins.list(live):  # a create that returned, but whose cleanup failed
            if (self.markers.read(sid) or {}).get("abandoned"):
                live.discard(sid)
                found[sid] = "removal failed earlier"
        for r in self._ours():
            tags = _tags(r.get("tags"))
            tag_id = _sandbox_id_tag(tags)
            if tag_id is None or tag_id in found or tag_id in live:
                continue
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

    # -- snapshots -------------------------------------------------------------------------------
    # A snapshot is a PVE snapshot of the sandbox's CT (``POST .../snapshot``, VM.Snapshot): it
    # belongs to that CT and goes when the CT is destroyed (destroy, TTL, gc). A fork is a full
    # clone of it (``POST .../clone`` with ``snapname``), independent of the source and the snapshot.
    def _snapshot_lock(self) -> contextlib.AbstractContextManager[None]:
        """Snapshot names are unique across the sandboxes: one naming at a time from this host."""
        return file_lock(self.state_dir / "snapshots.lock")

    def _snapshots(self) -> Iterator[tuple[str, int, str, dict[str, Any]]]:
        """(node, vmid, sandbox id, PVE's snapshot entry) of every snapshot of our CTs."""
        seen: set[int] = set()
        for r in self._ours():
            sid = _sandbox_id_tag(_tags(r.get("tags")))
            node, vmid = str(r["node"]), int(r["vmid"])
            if sid is None or vmid in seen:
                continue
            seen.add(vmid)
            try:
                entries = self._call("snapshot", lambda n=node, v=vmid: self._ct(n, v).snapshot.get())  # type: ignore[misc]
            except PermissionDenied:
                raise
            except BackendError:
                continue  # destroyed while we list
            for entry in entries:
                if entry.get("name") and entry["name"] != "current":  # "current" is the CT itself
                    yield node, vmid, sid, entry

    def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        return sorted(
            (
                SnapshotInfo(
                    str(e["name"]), sid, float(e.get("snaptime") or 0), self.name,
                    template=_snapshot_template(str(e.get("description", ""))),
                )
                for _node, _vmid, sid, e in self._snapshots()
            ),
            key=lambda info: info.name,
        )  # fmt: skip

    def _find_snapshot(self, name: str) -> tuple[str, int, str]:
        for node, vmid, sid, entry in self._snapshots():
            if entry["name"] == name:
                return node, vmid, sid
        raise SnapshotNotFound(name)

    def snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo:
        node, vmid = self._find(sandbox_id)
        template = self.get(sandbox_id).spec.template
        note = f"sandbox-rt snapshot of {sandbox_id}{_TEMPLATE_NOTE}{template}"
        with self._snapshot_lock():
            if any(e["name"] == name for *_where, e in self._snapshots()):
                raise ConfigError(f"a snapshot named {name!r} exists already (delete it first)")
            ct = self._ct(node, vmid)
            upid = self._retrying(
                "snapshot",
                lambda: ct.snapshot.post(snapname=name, description=note),
            )
            self._wait(str(upid), "snapshot")
        return SnapshotInfo(
            name=name, source_id=sandbox_id, created_at=time.time(), backend=self.name, template=template
        )

    def delete_snapshot(self, name: str) -> bool:
        try:
            node, vmid, _sid = self._find_snapshot(name)
        except SnapshotNotFound:
            return False
        ct = self._ct(node, vmid)
        upid = self._retrying("snapshot", lambda: ct.snapshot(name).delete())
        self._wait(str(upid), "snapshot")
        return True

    def clone_from_snapshot(self, sandbox_id: str, spec: SandboxSpec, name: str) -> SandboxRecord:
        node, vmid, sid = self._find_snapshot(name)  # SnapshotNotFound before anything is made
        spec = dataclasses.replace(spec, template=self.get(sid).spec.template)  # the fork's, for its record
        return self._clone_from(sandbox_id, spec, (node, vmid, name))

    def _drop_cloned_rules(self, node: str, vmid: int) -> None:
        """Remove the runtime's own firewall rules a full clone copied from its source (internet,
        egress); ``_setup_firewall`` then adds this sandbox's. Rules of the template stay."""
        fw = self._ct(node, vmid).firewall
        rules = self._call("firewall", lambda: fw.rules.get())
        for rule in sorted(rules, key=lambda r: -int(r["pos"])):  # highest first: positions stay valid
            if str(rule.get("comment", "")).startswith(TAG + " "):
                pos = int(rule["pos"])
                self._call("firewall", lambda p=pos: fw.rules(p).delete())  # type: ignore[misc]
