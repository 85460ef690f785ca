"""The embedded default's engine: sandboxes as ``lxc-copy`` overlay clones of a template.

Layout under ``settings.lxc_path`` (see docs/host-contract.md):
- ``sandbox-template`` the default template (never started), ``sandbox-template-<name>`` each named
  template: a link to the generation new creates clone (``<slot>.<tag>/``, generations.py), or on a
  host provisioned before generations the container dir itself;
- ``sbx-<hex>/`` one dir per sandbox with the LXC ``config``, the overlay ``delta`` and
  ``sandbox_rt.json`` (the record: labels, expiry, owner, pinned host key, template and the template
  generation it was cloned from; container.py).
  With ``disk_limits`` the dir is a btrfs subvolume whose qgroup limit is ``disk_gb`` (see btrfs.py).
- ``.runtime/creating/<id>.json`` marks a create in progress (the creator's pid): ``gc`` removes
  what a caller killed mid-create left, whatever step it died at.
- ``snap-<name>/`` one dir per snapshot (snapshots.py).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import ipaddress
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...config import Settings
from ...errors import BackendError, SandboxNotFound, StateConflict
from ...ipam import IpPool, mac_for_ip
from ...models import DEFAULT_TEMPLATE, ResourceUsage, SandboxRecord, SandboxSpec, SnapshotInfo
from ...validation import SANDBOX_ID
from ...volumes import VolumeStore
from ..base import GcCandidate
from ..intents import CreateMarkers
from ..owner import owner_alive, process_start_time
from ..records import ROOT_ENV, new_record, updated_record
from .background import Background
from .btrfs import create_subvolume, set_size_limit
from .cgroups import CGROUP_MOUNT, CGROUP_ROOT, Cgroups
from .container import (
    ISOLATION_KEYS,
    LIMIT_KEYS,
    RECORD_FILE,
    RUNTIME_KEYS,
    config_lines,
    config_value,
    id_base,
    read_record,
    replace_config,
    rootfs_dirs,
    write_record,
)
from .fstree import tree_bytes
from .hostcaps import (
    HostLoad,
    allowed_cpus,
    check_pids_budget,
    cpu_list,
    host_load,
    pick_cpus,
    read_pid_max,
    storage_device,
)
from .identity import Overlay, seed_identity, set_hostname
from .idmap import ID_RANGE, idmapped_bind, isolated_base, own_ids, unmount
from .netstate import NetState, SandboxNet
from .snapshots import SnapshotStore, fill_clone
from .template_slots import TemplateSlots
from .userinit import SandboxUser, init_lines, read_limits, read_user
from .volumes import attach_volumes, detach_volumes, mount_entries

__all__ = ["LxcBackend"]

# states of a container that has processes: running, paused (frozen) or on its way there
_LIVE = ("running", "frozen", "freezing")
# how long counting a volume's bytes may take (``volume ls``/``show``), like a sandbox's disk usage
VOLUME_SIZE_BUDGET_S = 1.0
LOWER_MOUNT = "lower"  # <container dir>/lower: the template's root, idmapped, while the clone starts


class LxcBackend:
    """Sandboxes as unprivileged LXC containers on this host."""

    name = "lxc"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.path = settings.lxc_path
        self.runtime_dir = self.path / ".runtime"
        self.intents = self.runtime_dir / "creating"
        self.markers = CreateMarkers(self.intents)
        net = settings.network
        self.pool = IpPool(
            settings.ip_pool_start,
            settings.ip_pool_end,
            str(net),
            self.runtime_dir / "ipam.lock",
            reserved={settings.gateway, settings.dns_server},
        )
        self.prefixlen = net.prefixlen
        self.netstate = NetState(settings)
        self.snapshots = SnapshotStore(self.path, self.runtime_dir / "snapshots.lock", self.name)
        # the disk the sandboxes write to (their disk caps), read once; None: no block device
        self.disk_device = storage_device(self.path)
        self.cgroups = Cgroups(self.disk_device)
        self.templates = TemplateSlots(settings, self.path)

    # -- helpers ---------------------------------------------------------------------------------
    def _lxc(
        self, tool: str, *args: str, step: str, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Every ``lxc-*`` call: this backend's LXC path, typed errors (a missing tool, a timeout,
        and with ``check`` a non-zero exit, with its output as the detail)."""
        cmd = [tool, "-P", str(self.path), *args]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError as exc:
            raise BackendError(f"{tool} is not installed (run site.yml)", step=step) from exc
        except subprocess.TimeoutExpired as exc:
            raise BackendError(f"{' '.join(cmd)} did not finish in {timeout:g} s", step=step) from exc
        if check and proc.returncode != 0:
            raise BackendError(
                f"{' '.join(cmd)} exited {proc.returncode}", step=step, detail=proc.stderr + proc.stdout
            )
        return proc

    def _dir(self, sandbox_id: str) -> Path:
        return self.path / sandbox_id

    def template_is_current(self, record: SandboxRecord) -> bool:
        """Whether ``record``'s sandbox was cloned from the generation its template's creates get now
        (the warm pool hands out no sandbox of a template swapped since it was made)."""
        made_from = self._read_record(record.id)[1].get("template_container")
        template = record.spec.template
        return self.templates.made_from(template, made_from) == self.templates.current(template)

    def prune_templates(self, *, dry_run: bool = False) -> builtins.list[str]:
        """The template generations nothing uses any more, removed (:meth:`TemplateSlots.prune`)."""
        return self.templates.prune(dry_run=dry_run)

    def _addresses_in_use(self) -> set[str]:
        return host_load(self.path).addresses

    def _placement(self, sandbox_id: str, spec: SandboxSpec, load: HostLoad) -> str:
        """Check the host's pids budget for ``spec`` and pick its CPUs (a cpu list)."""
        check_pids_budget(spec.pids_max, load.pids, read_pid_max())
        return cpu_list(pick_cpus(spec.cpus, allowed_cpus(CGROUP_ROOT, self.cgroups.v1), load.cpu_load))

    def _limit_lines(self, spec: SandboxSpec, cpuset: str) -> builtins.list[str]:
        return self.cgroups.limit_lines(spec, cpuset)

    # -- create steps ----------------------------------------------------------------------------
    def begin(self, sandbox_id: str) -> None:
        self.markers.write(sandbox_id)

    def end(self, sandbox_id: str) -> None:
        self.markers.remove(sandbox_id)

    def clone(
        self, sandbox_id: str, spec: SandboxSpec, *, delta: Path | None = None, container: str | None = None
    ) -> SandboxRecord:
        """Clone the template's current generation (or ``container``, a snapshot's); with ``delta``
        (that snapshot's) the clone starts with those files."""
        try:
            return self._clone(sandbox_id, spec, delta, container)
        except OSError as exc:  # disk full, permissions, ...: a typed error naming the step
            raise BackendError(f"{exc.strerror or exc} ({exc.filename or self.path})", step="clone") from exc

    def _clone(
        self, sandbox_id: str, spec: SandboxSpec, delta: Path | None = None, container: str | None = None
    ) -> SandboxRecord:
        # the generation is read once: a switch during this create changes nothing of it
        made_from = container or self.templates.current(spec.template)
        template = self.path / made_from
        if not (template / "config").is_file():
            raise BackendError(
                f"template {spec.template!r} ({made_from}) not found in {self.path} (run site.yml)",
                step="clone",
            )
        cdir = self._dir(sandbox_id)
        if self.settings.disk_limits:  # the delta lives in the container dir: make it a subvolume
            create_subvolume(cdir)
        self._lxc("lxc-copy", "-n", template.name, "-N", sandbox_id, "-s", "-B", "overlayfs", step="clone")
        self._limit_disk(sandbox_id, spec)
        if delta is not None:
            fill_clone(delta, rootfs_dirs(cdir)[1])
        hostname = spec.hostname or sandbox_id
        isolated = self.settings.idmap_isolated
        ours = (*RUNTIME_KEYS, *ISOLATION_KEYS) if isolated else RUNTIME_KEYS
        lines = [ln for ln in config_lines(cdir) if not ln.strip().startswith(ours)]
        upper = rootfs_dirs(cdir)[1]
        seen: list[HostLoad] = []
        default_root = self.templates.rootfs(DEFAULT_TEMPLATE)
        user = read_user(default_root, self.settings.ssh_user)
        login_limits = read_limits(default_root)

        def in_use() -> set[str]:  # under the pool's lock, like commit
            seen.append(host_load(self.path, skip=sandbox_id))
            return seen[-1].addresses

        def commit(ip: str) -> None:
            limits = self._limit_lines(spec, self._placement(sandbox_id, spec, seen[-1]))
            own: list[str] = []
            if isolated:
                base = isolated_base(ip, self.settings.ip_pool_start, self.settings.idmap_base)
                own = [
                    f"lxc.idmap = u 0 {base} {ID_RANGE}",
                    f"lxc.idmap = g 0 {base} {ID_RANGE}",
                    f"lxc.rootfs.path = overlay:{cdir / LOWER_MOUNT}:{upper}",
                ]
            extra = [
                *own,
                f"lxc.uts.name = {hostname}",
                f"lxc.net.0.link = {self.settings.bridge}",
                f"lxc.net.0.ipv4.address = {ip}/{self.prefixlen}",
                f"lxc.net.0.ipv4.gateway = {self.settings.gateway}",
                f"lxc.net.0.hwaddr = {mac_for_ip(ip)}",
                f"lxc.net.0.veth.pair = sbx{sandbox_id[4:]}",
                *limits,
                CGROUP_MOUNT,
                # root on request; otherwise PID 1 starts as the sandbox user (userinit.py)
                *([f"lxc.environment = {ROOT_ENV}"] if spec.root else init_lines(user, login_limits)),
                *mount_entries(cdir, spec.volumes),
            ]
            replace_config(cdir, [*lines, *extra])

        ip = self.pool.allocate(in_use, commit)
        if isolated:
            own_ids(cdir, upper, cdir / LOWER_MOUNT, template_base=self.settings.idmap_base)
        host_pub = self._seed_rootfs(cdir, hostname, ip, made_from, None if spec.root else user)
        record = new_record(sandbox_id, spec, ip=ip, host_key=host_pub, backend=self.name)
        write_record(cdir, record, process_start_time(record.owner_pid), template_container=made_from)
        # its port may send only as itself, within its bandwidth, from its first frame on
        self.netstate.apply(self._port_state(sandbox_id, ip, spec))
        return record

    def _port_state(self, sandbox_id: str, ip: str, spec: SandboxSpec) -> SandboxNet:
        old = self.netstate.read(sandbox_id) or SandboxNet(sandbox_id, ip)
        return dataclasses.replace(
            old, ip=ip, port=f"sbx{sandbox_id[4:]}", mac=mac_for_ip(ip), net_mbps=spec.net_mbps
        )

    def _seed_rootfs(
        self, cdir: Path, hostname: str, ip: str, container: str, user: SandboxUser | None
    ) -> str:
        """The clone's own host key, machine-id, names and resolver (see identity.py); the host key
        belongs to ``user`` when sshd runs as that user (a sandbox without root), else to root."""
        fs = Overlay(
            lower=self.templates.container_rootfs(container),
            upper=rootfs_dirs(cdir)[1],
            template_base=self.settings.idmap_base,
            shift=id_base(cdir, self.settings.idmap_base) - self.settings.idmap_base,
        )
        key_owner = None if user is None else (user.uid, user.gid)
        return seed_identity(
            fs, hostname=hostname, ip=ip, dns_server=self.settings.dns_server, key_owner=key_owner
        )

    # -- isolated id maps (see idmap.py) ----------------------------------------------------------
    def _write_record(self, record: SandboxRecord, owner_start: int | None) -> None:
        write_record(self._dir(record.id), record, owner_start)

    def _read_record(self, sandbox_id: str) -> tuple[SandboxRecord, dict[str, Any]]:
        return read_record(self._dir(sandbox_id))

    def start(self, sandbox_id: str) -> SandboxRecord:
        cdir = self._dir(sandbox_id)
        log = cdir / "start.log"
        lower = cdir / LOWER_MOUNT
        isolated = rootfs_dirs(cdir)[0] == lower
        stored, extra = self._read_record(sandbox_id)
        spec = stored.spec
        base = id_base(cdir, self.settings.idmap_base)
        try:
            if isolated:  # the template's root, seen with this sandbox's ids, while LXC mounts the overlay
                try:
                    made_from = self.templates.made_from(spec.template, extra.get("template_container"))
                    rootfs = self.templates.container_rootfs(made_from)
                    idmapped_bind(rootfs, lower, inner=self.settings.idmap_base, outer=base)
                except OSError as exc:
                    raise BackendError(f"cannot map the template's ids: {exc}", step="start") from exc
            attach_volumes(
                cdir,
                spec.volumes,
                store=self.volume_store(),
                host_dirs=self.settings.volume_host_dirs,
                idmap=(self.settings.idmap_base, base) if base != self.settings.idmap_base else None,
                root_uid=base,
            )
            self._lxc("lxc-start", "-n", sandbox_id, f"--logfile={log}", "--logpriority=ERROR", step="start")
        except BackendError as exc:
            with contextlib.suppress(OSError):
                raise BackendError(
                    "the container did not start", step="start", detail=log.read_text()
                ) from exc
            raise
        finally:
            if isolated:  # the overlay holds its own clone of the layer: the host's mount can go
                with contextlib.suppress(OSError):
                    unmount(lower)
            detach_volumes(cdir)  # the sandbox's namespace holds its own copies
        return self.get(sandbox_id)  # the host key was pinned before start (written by clone)

    # -- volumes (sandbox_rt/volumes; mounted at start by volumes.py) ------------------------------
    def volume_store(self) -> VolumeStore:
        """The host's named volumes; their files start owned by the template range's sandbox user."""
        return VolumeStore(
            self.settings.volume_dir,
            owner=self.settings.idmap_base + self.templates.sandbox_uid(),
            users=self._volume_users,
            measure=lambda path: tree_bytes(path, budget_s=VOLUME_SIZE_BUDGET_S),
        )

    def _volume_users(self) -> dict[str, tuple[str, ...]]:
        users: dict[str, list[str]] = {}
        for record in self.list():
            for mount in record.spec.volumes:
                if mount.volume is not None:
                    users.setdefault(mount.volume, []).append(record.id)
        return {name: tuple(dict.fromkeys(ids)) for name, ids in users.items()}

    def stop(self, sandbox_id: str) -> None:
        if self.state(sandbox_id) in _LIVE:  # lxc-stop thaws a paused one as it kills it
            self._lxc("lxc-stop", "-n", sandbox_id, "-k", step="stop")

    def update(self, record: SandboxRecord, spec: SandboxSpec) -> SandboxRecord:
        """Apply a new spec to a running sandbox: limits (live cgroup writes), hostname, labels, TTL.

        Used by the warm pool on hand-out; ``internet`` and egress are the caller's business.
        """
        sid = record.id
        pid = self._init_pid(sid)
        if pid is None:
            raise BackendError(f"{sid} is not running", step="update")
        cdir = self._dir(sid)
        hostname = spec.hostname or record.hostname
        with self.pool.locked():  # the pids budget and CPU placement read every config
            cpuset = self._placement(sid, spec, host_load(self.path, skip=sid))
            self.cgroups.apply_live(sid, spec, cpuset)
            lines = [ln for ln in config_lines(cdir) if not ln.strip().startswith(LIMIT_KEYS)]
            lines += self._limit_lines(spec, cpuset)
            if hostname != record.hostname:
                lines = [ln for ln in lines if not ln.strip().startswith("lxc.uts.name")]
                lines.append(f"lxc.uts.name = {hostname}")
            replace_config(cdir, lines)
        self._limit_disk(sid, spec)
        if hostname != record.hostname:
            set_hostname(pid, record.ip, hostname)
        port = self._port_state(sid, record.ip, spec)
        if not port.same_port(self.netstate.read(sid)):
            self.netstate.apply(port)
        new = updated_record(record, spec)
        self._write_record(new, owner_start=process_start_time(new.owner_pid))
        return new

    def _limit_disk(self, sandbox_id: str, spec: SandboxSpec) -> None:
        """Bound what the sandbox may write to ``disk_gb`` (its dir's qgroup limit; live)."""
        if not self.settings.disk_limits:
            return
        try:
            set_size_limit(self._dir(sandbox_id), spec.disk_gb << 30)
        except OSError as exc:
            raise BackendError(
                f"cannot limit {sandbox_id}'s disk to {spec.disk_gb} GiB: {exc.strerror or exc}", step="disk"
            ) from exc

    def destroy(self, sandbox_id: str) -> bool:
        cdir = self._dir(sandbox_id)
        existed = cdir.exists()
        ip: str | None = None
        if (cdir / "config").exists():
            addr = config_value(config_lines(cdir), "lxc.net.0.ipv4.address")
            ip = str(ipaddress.IPv4Interface(addr).ip) if addr else None
        # the network state goes while the container stops (an nft removal waits for the kernel's
        # RCU grace period, ~10 ms); both are done before lxc-destroy frees the address
        with Background(lambda: self._forget_network(sandbox_id, ip)) as network_gone:
            if existed:
                with contextlib.suppress(OSError):  # a start that died half-way may leave it mounted
                    unmount(cdir / LOWER_MOUNT)
                detach_volumes(cdir)  # never delete the dir with a volume still mounted in it
                if self.state(sandbox_id) != "stopped":
                    proc = self._lxc("lxc-stop", "-n", sandbox_id, "-k", step="destroy", check=False)
                    if proc.returncode != 0 and self.state(sandbox_id) in _LIVE:
                        raise BackendError(f"cannot stop {sandbox_id}", step="destroy", detail=proc.stderr)
        network_gone.result()
        if existed:
            if (cdir / "config").exists():
                proc = self._lxc("lxc-destroy", "-n", sandbox_id, step="destroy", check=False)
                if proc.returncode != 0 and cdir.exists():
                    # a half-made clone lxc-destroy does not understand: nothing is mounted, remove it
                    shutil.rmtree(cdir)
            if cdir.exists():
                shutil.rmtree(cdir)
        self.end(sandbox_id)
        return existed

    def _forget_network(self, sandbox_id: str, ip: str | None) -> None:
        with contextlib.suppress(BackendError):  # the table may be gone; the address goes with the CT
            if self.netstate.remove(sandbox_id, ip) and ip is not None:
                self._forget_connections(ip)

    # -- queries ---------------------------------------------------------------------------------
    def get(self, sandbox_id: str) -> SandboxRecord:
        return self._read_record(sandbox_id)[0]

    def list(self) -> builtins.list[SandboxRecord]:
        out: builtins.list[SandboxRecord] = []
        if not self.path.is_dir():
            return out
        for entry in sorted(self.path.iterdir()):
            if SANDBOX_ID.match(entry.name) and (entry / RECORD_FILE).exists():
                with contextlib.suppress(SandboxNotFound, BackendError):
                    out.append(self.get(entry.name))
        return out

    def state(self, sandbox_id: str) -> str:
        if not (self._dir(sandbox_id) / "config").exists():
            return "absent"
        proc = self._lxc("lxc-info", "-n", sandbox_id, "-s", "-H", step="status", timeout=30, check=False)
        state = proc.stdout.strip().lower() or "unknown"
        if state == "running":  # lxc-info knows only of freezes made through LXC itself
            freezer = self.cgroups.freezer_state(sandbox_id)
            return "running" if freezer == "thawed" else freezer
        return state

    def _init_pid(self, sandbox_id: str) -> int | None:
        proc = self._lxc("lxc-info", "-n", sandbox_id, "-p", "-H", step="status", timeout=30, check=False)
        text = proc.stdout.strip()
        return int(text) if text.isdigit() else None

    def uptime_s(self, sandbox_id: str) -> float | None:
        pid = self._init_pid(sandbox_id)
        started = process_start_time(pid) if pid else None
        if started is None:
            return None
        boot_uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, boot_uptime - started / os.sysconf("SC_CLK_TCK"))

    def usage(self, sandbox_id: str) -> ResourceUsage:
        return self.cgroups.usage(sandbox_id, self._disk_bytes(sandbox_id))

    # -- pause -----------------------------------------------------------------------------------
    def pause(self, sandbox_id: str) -> None:
        """Freeze every process of the sandbox where it stands (the cgroup freezer, as ``lxc-freeze``
        does, without its 1 s polling); its memory, files and connections stay. Idempotent."""
        if self._pausable(sandbox_id, "pause") != "frozen":
            self.cgroups.freeze(sandbox_id, step="pause")

    def resume(self, sandbox_id: str) -> None:
        """Thaw a paused sandbox (also one whose freeze was left half-way). Idempotent."""
        if self._pausable(sandbox_id, "resume") != "running":
            try:
                self.cgroups.set_frozen(sandbox_id, False)
            except OSError as exc:
                raise BackendError(f"cannot thaw {sandbox_id}: {exc.strerror or exc}", step="resume") from exc

    def _pausable(self, sandbox_id: str, what: str) -> str:
        self._read_record(sandbox_id)  # SandboxNotFound without one
        state = self.state(sandbox_id)
        if state not in _LIVE:
            raise StateConflict(f"sandbox {sandbox_id} is {state}: only a running sandbox can {what}")
        return state

    # -- network ---------------------------------------------------------------------------------
    def set_internet(self, record: SandboxRecord, enabled: bool) -> None:
        self.netstate.set_internet(record.id, record.ip, enabled)
        if not enabled:
            self._forget_connections(record.ip)

    def set_egress(self, record: SandboxRecord, egress: tuple[str, ...]) -> None:
        old = self.netstate.read(record.id) or SandboxNet(record.id, record.ip)
        self.netstate.apply(dataclasses.replace(old, ip=record.ip, egress=egress))
        if set(old.egress) - set(egress):
            self._forget_connections(record.ip)  # connections to what is no longer allowed end now
        stored, extra = self._read_record(record.id)
        spec = dataclasses.replace(stored.spec, egress=egress)
        self._write_record(dataclasses.replace(stored, spec=spec), owner_start=extra["owner_start_time"])

    @staticmethod
    def _forget_connections(ip: str) -> None:
        """Established connections die with the permission (conntrack is installed by the role)."""
        with contextlib.suppress(FileNotFoundError, subprocess.TimeoutExpired):
            subprocess.run(["conntrack", "-D", "-s", ip], capture_output=True, timeout=10)

    def internet_enabled(self, record: SandboxRecord) -> bool:
        return self.netstate.internet_enabled(record.ip)

    # -- garbage collection ----------------------------------------------------------------------
    def gc_candidates(self, *, now: float, dead_owners: bool) -> builtins.list[GcCandidate]:
        live_intents, found = self.markers.sweep()
        if self.path.is_dir():
            for entry in self.path.iterdir():
                sid = entry.name
                if not SANDBOX_ID.match(sid) or sid in found or sid in live_intents:
                    continue
                try:
                    record, extra = self._read_record(sid)
                except (SandboxNotFound, BackendError, TypeError, KeyError):
                    found[sid] = "no record (half-made)"
                    continue
                if record.expires_at is not None and record.expires_at <= now:
                    found[sid] = "expired"
                elif dead_owners and not owner_alive(
                    record.owner_pid, extra["owner_start_time"], record.owner_host
                ):
                    found[sid] = "owner process died"
        # network state (and egress resolver) left by a destroy that failed half-way: destroy again
        for sid in self.netstate.orphans(live_intents):
            found.setdefault(sid, "network state without a sandbox")
        return [GcCandidate(sid, reason) for sid, reason in sorted(found.items())]

    # -- snapshots -------------------------------------------------------------------------------
    def _disk_bytes(self, sandbox_id: str) -> int | None:
        """What the sandbox wrote: its overlay delta's allocated bytes (bounded walk, see fstree)."""
        try:
            upper = rootfs_dirs(self._dir(sandbox_id))[1]
        except (OSError, BackendError):
            return None
        return tree_bytes(upper)

    @contextlib.contextmanager
    def _still(self, sandbox_id: str) -> Iterator[None]:
        """A running sandbox frozen for the block (its files consistent); a stopped one as it is."""
        running = self.state(sandbox_id) == "running"
        if running:
            self.cgroups.freeze(sandbox_id)
        try:
            yield
        finally:
            if running:
                self.cgroups.set_frozen(sandbox_id, False)

    def snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo:
        source, extra = self._read_record(sandbox_id)  # SandboxNotFound without one
        upper = rootfs_dirs(self._dir(sandbox_id))[1]
        template, hold = source.spec.template, self._still(sandbox_id)
        made_from = self.templates.made_from(template, extra.get("template_container"))
        return self.snapshots.take(
            name, source_id=sandbox_id, template=template, upper=upper, hold=hold,
            template_container=made_from,
        )  # fmt: skip

    def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        return self.snapshots.list()

    def delete_snapshot(self, name: str) -> bool:
        return self.snapshots.delete(name)

    def clone_from_snapshot(self, sandbox_id: str, spec: SandboxSpec, name: str) -> SandboxRecord:
        with self.snapshots.opened(name) as (info, delta, taken_on):
            # the delta is a layer over its source's template generation: the fork is cloned from that
            made_from = self.templates.made_from(info.template, taken_on)
            fork = dataclasses.replace(spec, template=info.template)
            return self.clone(sandbox_id, fork, delta=delta, container=made_from)
