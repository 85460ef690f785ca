"""The embedded default: plain LXC on this host (``lxc-copy`` overlay snapshots of the template).

Layout under ``settings.lxc_path`` (see docs/host-contract.md):
- ``sandbox-template/`` the template (never started), ``sbx-<hex>/`` one dir per sandbox with the
  LXC ``config``, the overlay ``delta`` and ``sandbox_rt.json`` (the record: labels, expiry, owner,
  pinned host key). The record lives outside the container's root, so the sandbox cannot alter it.
  With ``disk_limits`` the dir is a btrfs subvolume whose qgroup limit is ``disk_gb`` (see btrfs.py).
- ``.runtime/creating/<id>.json`` marks a create in progress (the creator's pid): ``gc`` removes
  what a caller killed mid-create left, whatever step it died at.
- ``snap-<name>/`` one dir per snapshot (root, 0700): ``delta/``, a copy of a sandbox's overlay
  delta taken while it was frozen, and ``snapshot.json``. Not a container (no config, no
  address); never matches ``sbx-<hex>``, so ``list``/``gc`` never see it. A fork is a normal
  template clone whose fresh delta is first filled from ``delta/`` (then the per-clone identity
  is written over it). ``.snap-tmp-<pid>-*``/``.snap-del-<pid>-*`` are a snapshot or delete in
  progress (swept once their process is gone).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import errno
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..config import Settings
from ..errors import BackendError, ConfigError, SandboxNotFound, SnapshotNotFound
from ..filelock import file_lock
from ..ipam import IpPool, mac_for_ip
from ..models import DEFAULT_TEMPLATE, ResourceUsage, SandboxRecord, SandboxSpec, SnapshotInfo
from ..netstate import NetState, SandboxNet
from ..network import NftInternetSet
from ..validation import SANDBOX_ID
from .base import GcCandidate
from .btrfs import create_subvolume, set_size_limit
from .fstree import copy_tree, rewrite_file_beneath, sweep_stale, tree_bytes
from .hostcaps import (
    HostLoad,
    allowed_cpus,
    check_pids_budget,
    cpu_list,
    pick_cpus,
    read_pid_max,
    storage_device,
)
from .idmap import ID_RANGE, idmap_base_for, idmapped_bind, shift_owners, subid_ranges_cover, unmount
from .intents import CreateMarkers
from .owner import owner_alive, process_start_time
from .records import ROOT_ENV, new_record, spec_from_json, spec_to_json, updated_record

__all__ = ["LxcBackend", "cgroup_limit_lines", "cgroup_limits"]

RECORD_FILE = "sandbox_rt.json"
SNAPSHOT_PREFIX = "snap-"  # snapshot dirs: never a sandbox id (sbx-<10 hex>)
SNAPSHOT_FILE = "snapshot.json"
_SNAP_TMP = ".snap-tmp-"  # + <pid>-<random>: a snapshot being written
_SNAP_DEL = ".snap-del-"  # + <pid>-<random>: a snapshot being deleted
# config keys the runtime writes per clone (whatever the template had for them is replaced)
_OURS = (
    "lxc.uts.name",
    "lxc.net.0.link",
    "lxc.net.0.ipv4.",
    "lxc.net.0.hwaddr",
    "lxc.net.0.veth.pair",
    "lxc.cgroup.memory.",
    "lxc.cgroup.pids.",
    "lxc.cgroup.cpu.",
    "lxc.cgroup2.memory.",
    "lxc.cgroup2.pids.",
    "lxc.cgroup2.cpu.",
    "lxc.cgroup.cpuset.",
    "lxc.cgroup2.cpuset.",
    "lxc.cgroup.blkio.",
    "lxc.cgroup2.io.",
)
_LIMIT_KEYS = tuple(k for k in _OURS if k.startswith("lxc.cgroup"))  # the limit keys among them
_ISOLATION_KEYS = ("lxc.idmap", "lxc.rootfs.path")  # replaced per clone with isolated id maps
LOWER_MOUNT = "lower"  # <container dir>/lower: the template's root, idmapped, while the clone starts
CPU_PERIOD_US = 100_000
_CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_v1() -> bool:
    return (_CGROUP_ROOT / "memory" / "memory.limit_in_bytes").exists()


def cgroup_limits(
    spec: SandboxSpec,
    *,
    v1: bool,
    memsw: bool,
    disk_device: str | None = None,
    cpuset: str | None = None,
) -> builtins.list[tuple[str, str]]:
    """(cgroup file, value) pairs that apply ``spec``'s limits on a v1 or v2 host (swap always 0).

    The same pairs go into the config before start (``lxc.cgroup[2].<file> = <value>``) and into the
    live cgroup files when a running sandbox changes (warm pool). ``disk_device`` (``major:minor`` of
    the disk that holds the sandboxes) gets ``disk_mbps``/``disk_iops`` (0: the cap is lifted);
    ``cpuset`` pins the sandbox to those CPUs.
    """
    mem = str(spec.memory_mb * 1024 * 1024)
    quota = max(1000, int(spec.cpus * CPU_PERIOD_US))
    bps, iops = spec.disk_mbps << 20, spec.disk_iops
    if v1:
        pairs = [("memory.limit_in_bytes", mem)]
        if memsw:
            pairs.append(("memory.memsw.limit_in_bytes", mem))
        pairs += [
            ("pids.max", str(spec.pids_max)),
            ("cpu.cfs_period_us", str(CPU_PERIOD_US)),
            ("cpu.cfs_quota_us", str(quota)),
        ]
        if cpuset:
            pairs.append(("cpuset.cpus", cpuset))
        if disk_device:
            pairs += [
                ("blkio.throttle.read_bps_device", f"{disk_device} {bps}"),
                ("blkio.throttle.write_bps_device", f"{disk_device} {bps}"),
                ("blkio.throttle.read_iops_device", f"{disk_device} {iops}"),
                ("blkio.throttle.write_iops_device", f"{disk_device} {iops}"),
            ]
        return pairs
    pairs = [
        ("memory.max", mem),
        ("memory.swap.max", "0"),
        ("pids.max", str(spec.pids_max)),
        ("cpu.max", f"{quota} {CPU_PERIOD_US}"),
    ]
    if cpuset:
        pairs.append(("cpuset.cpus", cpuset))
    if disk_device:
        b, i = (str(bps) if bps else "max"), (str(iops) if iops else "max")
        pairs.append(("io.max", f"{disk_device} rbps={b} wbps={b} riops={i} wiops={i}"))
    return pairs


def cgroup_limit_lines(
    spec: SandboxSpec,
    *,
    v1: bool,
    memsw: bool,
    disk_device: str | None = None,
    cpuset: str | None = None,
) -> builtins.list[str]:
    """LXC config lines for ``spec``'s limits (see :func:`cgroup_limits`)."""
    prefix = "lxc.cgroup." if v1 else "lxc.cgroup2."
    pairs = cgroup_limits(spec, v1=v1, memsw=memsw, disk_device=disk_device, cpuset=cpuset)
    return [f"{prefix}{key} = {value}" for key, value in pairs]


class _Background:
    """Run ``work`` in a thread for the ``with`` block; :meth:`result` waits and re-raises its
    error. Leaving the block by an exception still waits for it (and keeps the first error)."""

    def __init__(self, work: Callable[[], None]) -> None:
        self._work = work
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sandbox-rt-background", daemon=True)

    def _run(self) -> None:
        try:
            self._work()
        except BaseException as exc:  # handed to the caller by result()
            self._error = exc

    def __enter__(self) -> _Background:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join()

    def result(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error




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
        self.internet = NftInternetSet(settings.nft_family, settings.nft_table, settings.nft_internet_set)
        self.netstate = NetState(settings)
        self._v1 = cgroup_v1()
        self._memsw = (_CGROUP_ROOT / "memory" / "memory.memsw.limit_in_bytes").exists()
        # the disk the sandboxes write to (their disk caps), read once; None: no block device
        self.disk_device = storage_device(self.path)

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

    def _template_dir(self, template: str) -> Path:
        """The container dir of the named template (``default``: the host contract's ``template``)."""
        if template == DEFAULT_TEMPLATE:
            return self.path / self.settings.template
        try:
            return self.path / self.settings.templates[template]
        except KeyError:
            known = ", ".join(self.settings.template_names())
            raise ConfigError(f"unknown template {template!r}; this host has: {known}") from None

    def _config_lines(self, cdir: Path) -> builtins.list[str]:
        return (cdir / "config").read_text().splitlines()

    @staticmethod
    def _config_value(lines: list[str], key: str) -> str | None:
        for line in lines:
            k, sep, v = line.partition("=")
            if sep and k.strip() == key:
                return v.strip()
        return None

    def _rootfs_dirs(self, cdir: Path) -> tuple[Path, Path]:
        """(lower, upper) of an overlay clone."""
        value = self._config_value(self._config_lines(cdir), "lxc.rootfs.path") or ""
        kind, _, rest = value.partition(":")
        if kind not in ("overlay", "overlayfs") or ":" not in rest:
            raise BackendError(f"{cdir.name} is not an overlay clone (rootfs {value!r})", step="clone")
        lower, _, upper = rest.partition(":")
        return Path(lower), Path(upper)

    def _template_rootfs(self, template: str) -> Path:
        value = self._config_value(self._config_lines(self._template_dir(template)), "lxc.rootfs.path") or ""
        return Path(value.removeprefix("dir:"))

    def _id_base(self, cdir: Path) -> int:
        """The host uid that is root in the container (its ``lxc.idmap = u 0 <base> ...``)."""
        for line in self._config_lines(cdir):
            key, _, value = line.partition("=")
            words = value.split()
            if key.strip() == "lxc.idmap" and len(words) == 4 and words[:2] == ["u", "0"]:
                return int(words[2])
        return self.settings.idmap_base

    def _addresses_in_use(self) -> set[str]:
        return self._host_load().addresses

    def _host_load(self, skip: str = "") -> HostLoad:
        """Addresses, pids limits and pinned CPUs of every container of this LXC path (the
        template has no address; only sandboxes count for pids and CPUs), except ``skip``."""
        load = HostLoad()
        if not self.path.is_dir():
            return load
        for cfg in self.path.glob("*/config"):
            try:
                lines = cfg.read_text().splitlines()
            except OSError:
                continue
            value = self._config_value(lines, "lxc.net.0.ipv4.address")
            if value:
                with contextlib.suppress(ValueError):
                    load.addresses.add(str(ipaddress.IPv4Interface(value).ip))
            name = cfg.parent.name
            if SANDBOX_ID.match(name) and name != skip:
                values: dict[str, str] = {}
                for line in lines:
                    k, sep, v = line.partition("=")
                    if sep:
                        values[k.strip()] = v.strip()
                load.add_sandbox(values)
        return load

    def _placement(self, sandbox_id: str, spec: SandboxSpec, load: HostLoad) -> str:
        """Check the host's pids budget for ``spec`` and pick its CPUs (a cpu list)."""
        check_pids_budget(spec.pids_max, load.pids, read_pid_max())
        return cpu_list(pick_cpus(spec.cpus, allowed_cpus(_CGROUP_ROOT, self._v1), load.cpu_load))

    def _limit_lines(self, spec: SandboxSpec, cpuset: str) -> builtins.list[str]:
        return cgroup_limit_lines(
            spec, v1=self._v1, memsw=self._memsw, disk_device=self.disk_device, cpuset=cpuset or None
        )

    # -- create steps ----------------------------------------------------------------------------
    def begin(self, sandbox_id: str) -> None:
        self.markers.write(sandbox_id)

    def end(self, sandbox_id: str) -> None:
        self.markers.remove(sandbox_id)

    def clone(self, sandbox_id: str, spec: SandboxSpec, *, delta: Path | None = None) -> SandboxRecord:
        """Clone the template; with ``delta`` (a snapshot's) the clone starts with those files."""
        try:
            return self._clone(sandbox_id, spec, delta)
        except OSError as exc:  # disk full, permissions, ...: a typed error naming the step
            raise BackendError(f"{exc.strerror or exc} ({exc.filename or self.path})", step="clone") from exc

    def _clone(self, sandbox_id: str, spec: SandboxSpec, delta: Path | None = None) -> SandboxRecord:
        template = self._template_dir(spec.template)
        if not (template / "config").is_file():
            raise BackendError(
                f"template {spec.template!r} ({template.name}) not found in {self.path} (run site.yml)",
                step="clone",
            )
        cdir = self._dir(sandbox_id)
        if self.settings.disk_limits:  # the delta lives in the container dir: make it a subvolume
            create_subvolume(cdir)
        self._lxc(
            "lxc-copy", "-n", template.name, "-N", sandbox_id, "-s", "-B", "overlayfs", step="clone"
        )
        self._limit_disk(sandbox_id, spec)
        if delta is not None:
            self._fill_from_snapshot(cdir, delta)
        hostname = spec.hostname or sandbox_id
        isolated = self.settings.idmap_isolated
        ours = (*_OURS, *_ISOLATION_KEYS) if isolated else _OURS
        lines = [ln for ln in self._config_lines(cdir) if not ln.strip().startswith(ours)]
        upper = self._rootfs_dirs(cdir)[1]
        seen: list[HostLoad] = []

        def in_use() -> set[str]:  # under the pool's lock, like commit
            seen.append(self._host_load(skip=sandbox_id))
            return seen[-1].addresses

        def commit(ip: str) -> None:
            limits = self._limit_lines(spec, self._placement(sandbox_id, spec, seen[-1]))
            own: list[str] = []
            if isolated:
                base = self._isolated_base(ip)
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
                *([f"lxc.environment = {ROOT_ENV}"] if spec.root else []),
            ]
            tmp = cdir / "config.new"
            tmp.write_text("\n".join([*lines, *extra]) + "\n")
            tmp.replace(cdir / "config")

        ip = self.pool.allocate(in_use, commit)
        if isolated:
            self._own_ids(cdir, upper)
        host_pub = self._seed_rootfs(cdir, hostname, ip, spec.template)
        record = new_record(sandbox_id, spec, ip=ip, host_key=host_pub, backend=self.name)
        self._write_record(record, owner_start=process_start_time(record.owner_pid))
        # its port may send only as itself, within its bandwidth, from its first frame on
        self.netstate.apply(self._port_state(sandbox_id, ip, spec))
        return record

    def _port_state(self, sandbox_id: str, ip: str, spec: SandboxSpec) -> SandboxNet:
        old = self.netstate.read(sandbox_id) or SandboxNet(sandbox_id, ip)
        return dataclasses.replace(
            old, ip=ip, port=f"sbx{sandbox_id[4:]}", mac=mac_for_ip(ip), net_mbps=spec.net_mbps
        )

    def _seed_rootfs(self, cdir: Path, hostname: str, ip: str, template: str) -> str:
        """Write per-clone identity into the overlay delta: host key, machine-id, names, resolver."""
        upper = self._rootfs_dirs(cdir)[1]
        lower = self._template_rootfs(template)
        shift = self._id_base(cdir) - self.settings.idmap_base  # template ids -> this sandbox's
        # the upper dir's root is the container's "/": give it the lower root's owner and mode
        # (lxc-copy creates it under the caller's umask, e.g. 0700, which would lock out the user)
        st = lower.stat()
        os.chown(upper, st.st_uid + shift, st.st_gid + shift)
        os.chmod(upper, st.st_mode & 0o7777)
        key = Ed25519PrivateKey.generate()
        private = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        public = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        pub_line = public.decode() + f" root@{hostname}"
        files: list[tuple[str, bytes, int]] = [
            ("etc/ssh/ssh_host_ed25519_key", private, 0o600),
            ("etc/ssh/ssh_host_ed25519_key.pub", (pub_line + "\n").encode(), 0o644),
            ("etc/machine-id", (secrets.token_hex(16) + "\n").encode(), 0o444),
            ("etc/hostname", f"{hostname}\n".encode(), 0o644),
            (
                "etc/hosts",
                (
                    f"127.0.0.1\tlocalhost\n{ip}\t{hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                ).encode(),
                0o644,
            ),
            ("etc/resolv.conf", f"nameserver {self.settings.dns_server}\n".encode(), 0o644),
        ]
        for rel, data, mode in files:
            self._write_into_upper(lower, upper, rel, data, mode, shift)
        return public.decode()

    def _write_into_upper(
        self, lower: Path, upper: Path, rel: str, data: bytes, mode: int, shift: int
    ) -> None:
        """Create ``rel`` in the overlay's upper dir, owned by container root, parents like the lower's
        (``shift``: what to add to the template's ids to get this sandbox's)."""
        base = self.settings.idmap_base + shift
        parts = Path(rel).parts
        for i in range(1, len(parts)):
            sub = Path(*parts[:i])
            target = upper / sub
            if target.is_symlink() or (target.exists() and not target.is_dir()):
                target.unlink()  # a fork's delta comes from a sandbox: never write through its links
            if not target.exists():
                src = lower / sub
                st = src.stat() if src.is_dir() else None
                target.mkdir(mode=0o755)
                os.chown(target, st.st_uid + shift if st else base, st.st_gid + shift if st else base)
                os.chmod(target, (st.st_mode & 0o7777) if st else 0o755)
        path = upper / rel
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, data)
            os.fchown(fd, base, base)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    # -- isolated id maps (see idmap.py) ----------------------------------------------------------
    def _isolated_base(self, ip: str) -> int:
        base = idmap_base_for(ip, self.settings.ip_pool_start, self.settings.idmap_base)
        if not subid_ranges_cover("root", base, ID_RANGE):
            raise BackendError(
                f"/etc/subuid and /etc/subgid do not give root the ids {base}-{base + ID_RANGE - 1} "
                "for this sandbox's isolated id map (run site.yml: lxc_host delegates them; or set "
                "idmap_isolated=false)",
                step="clone",
            )
        return base

    def _own_ids(self, cdir: Path, upper: Path) -> None:
        """Hand the clone's own dirs to its id range: lxc-copy gave them the template's (and wrote
        etc/hostname into the delta as template root); a fork's delta comes from another sandbox."""
        base = self._id_base(cdir)
        (cdir / LOWER_MOUNT).mkdir(mode=0o755, exist_ok=True)
        for path in (cdir, cdir / "rootfs", upper.parent, *upper.parent.iterdir()):
            if path.exists() and not path.is_symlink():
                os.chown(path, base, base)
        shift_owners(upper, template_base=self.settings.idmap_base, to_base=base)

    def _write_record(self, record: SandboxRecord, owner_start: int | None) -> None:
        data = dataclasses.asdict(record)
        data["spec"] = spec_to_json(record.spec)
        data["owner_start_time"] = owner_start
        path = self._dir(record.id) / RECORD_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)

    def _read_record(self, sandbox_id: str) -> tuple[SandboxRecord, dict[str, Any]]:
        path = self._dir(sandbox_id) / RECORD_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise SandboxNotFound(sandbox_id) from exc
        except (OSError, ValueError) as exc:
            raise BackendError(f"record of {sandbox_id} is unreadable: {exc}", step="attach") from exc
        extra = {"owner_start_time": data.pop("owner_start_time", None)}
        data["spec"] = spec_from_json(data["spec"])
        return SandboxRecord(**data), extra

    def start(self, sandbox_id: str) -> SandboxRecord:
        cdir = self._dir(sandbox_id)
        log = cdir / "start.log"
        lower = cdir / LOWER_MOUNT
        isolated = self._rootfs_dirs(cdir)[0] == lower
        try:
            if isolated:  # the template's root, seen with this sandbox's ids, while LXC mounts the overlay
                try:
                    name = self._read_record(sandbox_id)[0].spec.template
                    template, base = self._template_rootfs(name), self._id_base(cdir)
                    idmapped_bind(template, lower, inner=self.settings.idmap_base, outer=base)
                except OSError as exc:
                    raise BackendError(f"cannot map the template's ids: {exc}", step="start") from exc
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
        return self.get(sandbox_id)  # the host key was pinned before start (written by clone)

    def stop(self, sandbox_id: str) -> None:
        if self.state(sandbox_id) == "running":
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
            cpuset = self._placement(sid, spec, self._host_load(skip=sid))
            self._apply_live_limits(sid, spec, cpuset)
            lines = [ln for ln in self._config_lines(cdir) if not ln.strip().startswith(_LIMIT_KEYS)]
            lines += self._limit_lines(spec, cpuset)
            if hostname != record.hostname:
                lines = [ln for ln in lines if not ln.strip().startswith("lxc.uts.name")]
                lines.append(f"lxc.uts.name = {hostname}")
            tmp = cdir / "config.new"
            tmp.write_text("\n".join(lines) + "\n")
            tmp.replace(cdir / "config")
        self._limit_disk(sid, spec)
        if hostname != record.hostname:
            self._set_hostname(pid, record.ip, hostname)
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

    def _cgroup_dir(self, sandbox_id: str, key: str) -> Path:
        group = f"lxc.payload.{sandbox_id}"
        if not self._v1:
            return _CGROUP_ROOT / group
        controller = key.split(".", 1)[0]
        return _CGROUP_ROOT / controller / group

    def _apply_live_limits(self, sandbox_id: str, spec: SandboxSpec, cpuset: str) -> None:
        pairs = cgroup_limits(
            spec, v1=self._v1, memsw=self._memsw, disk_device=self.disk_device, cpuset=cpuset or None
        )
        pending = list(pairs)
        # v1 refuses memory > memsw and memsw < memory: retry the order that the kernel accepts
        for _round in range(2):
            failed = []
            for key, value in pending:
                try:
                    (self._cgroup_dir(sandbox_id, key) / key).write_text(value)
                except OSError:
                    failed.append((key, value))
            if not failed:
                return
            pending = failed
        raise BackendError(f"cannot apply limits {pending} to {sandbox_id}", step="update")

    def _set_hostname(self, pid: int, ip: str, hostname: str) -> None:
        """Change the UTS name from the host (container root lacks CAP_SYS_ADMIN) and the files."""
        proc = subprocess.run(
            ["nsenter", "-t", str(pid), "-u", "hostname", hostname],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if proc.returncode != 0:
            raise BackendError(f"cannot set hostname {hostname!r}", step="update", detail=proc.stderr)
        hosts = f"127.0.0.1\tlocalhost\n{ip}\t{hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        # the files belong to the sandbox: never write through a link it may have put there
        for rel, text in (("etc/hostname", f"{hostname}\n"), ("etc/hosts", hosts)):
            try:
                rewrite_file_beneath(f"/proc/{pid}/root", rel, text.encode())
            except OSError as exc:
                raise BackendError(
                    f"cannot write /{rel} in the sandbox: {exc.strerror or exc}", step="update"
                ) from exc

    def destroy(self, sandbox_id: str) -> bool:
        cdir = self._dir(sandbox_id)
        existed = cdir.exists()
        ip: str | None = None
        if (cdir / "config").exists():
            addr = self._config_value(self._config_lines(cdir), "lxc.net.0.ipv4.address")
            ip = str(ipaddress.IPv4Interface(addr).ip) if addr else None
        # the network state goes while the container stops (an nft removal waits for the kernel's
        # RCU grace period, ~10 ms); both are done before lxc-destroy frees the address
        with _Background(lambda: self._forget_network(sandbox_id, ip)) as network_gone:
            if existed:
                with contextlib.suppress(OSError):  # a start that died half-way may leave it mounted
                    unmount(cdir / LOWER_MOUNT)
                if self.state(sandbox_id) != "stopped":
                    proc = self._lxc("lxc-stop", "-n", sandbox_id, "-k", step="destroy", check=False)
                    if proc.returncode != 0 and self.state(sandbox_id) == "running":
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
        return proc.stdout.strip().lower() or "unknown"

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
        group = f"lxc.payload.{sandbox_id}"

        def read_int(path: Path) -> int | None:
            try:
                return int(path.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                return None

        if self._v1:
            mem = _CGROUP_ROOT / "memory" / group
            cpu_ns = read_int(_CGROUP_ROOT / "cpuacct" / group / "cpuacct.usage")
            return ResourceUsage(
                memory_bytes=read_int(mem / "memory.usage_in_bytes"),
                memory_peak_bytes=read_int(mem / "memory.max_usage_in_bytes"),
                cpu_time_s=cpu_ns / 1e9 if cpu_ns is not None else None,
                pids=read_int(_CGROUP_ROOT / "pids" / group / "pids.current"),
                disk_bytes=self._disk_bytes(sandbox_id),
            )
        g = _CGROUP_ROOT / group
        cpu_us: int | None = None
        with contextlib.suppress(OSError):
            for line in (g / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec"):
                    cpu_us = int(line.split()[1])
        return ResourceUsage(
            memory_bytes=read_int(g / "memory.current"),
            memory_peak_bytes=read_int(g / "memory.peak"),
            cpu_time_s=cpu_us / 1e6 if cpu_us is not None else None,
            pids=read_int(g / "pids.current"),
            disk_bytes=self._disk_bytes(sandbox_id),
        )

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
        return self.internet.contains(record.ip)

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
            upper = self._rootfs_dirs(self._dir(sandbox_id))[1]
        except (OSError, BackendError):
            return None
        return tree_bytes(upper)

    def _freezer_dir(self, sandbox_id: str) -> Path:
        group = f"lxc.payload.{sandbox_id}"
        return _CGROUP_ROOT / "freezer" / group if self._v1 else _CGROUP_ROOT / group

    def _set_frozen(self, sandbox_id: str, frozen: bool) -> None:
        if self._v1:
            (self._freezer_dir(sandbox_id) / "freezer.state").write_text("FROZEN" if frozen else "THAWED")
        else:
            (self._freezer_dir(sandbox_id) / "cgroup.freeze").write_text("1" if frozen else "0")

    def _is_frozen(self, sandbox_id: str) -> bool:
        if self._v1:
            return (self._freezer_dir(sandbox_id) / "freezer.state").read_text().strip() == "FROZEN"
        return "frozen 1" in (self._freezer_dir(sandbox_id) / "cgroup.events").read_text().splitlines()

    def _freeze(self, sandbox_id: str, attempts: int = 5) -> None:
        """Freeze every process of a running sandbox (the cgroup freezer; what ``lxc-freeze`` does,
        without its 1 s polling and its endless wait). A freeze that does not settle - the v1
        freezer stalls in FREEZING when it catches a task in ``vfork`` whose child it froze - is
        thawed and tried again."""
        for attempt in range(attempts):
            self._set_frozen(sandbox_id, True)
            deadline = time.monotonic() + 0.5 * (attempt + 1)
            while time.monotonic() < deadline:
                if self._is_frozen(sandbox_id):
                    return
                time.sleep(0.002)
            self._set_frozen(sandbox_id, False)
            time.sleep(0.02 * (attempt + 1))
        raise BackendError(
            f"the processes of {sandbox_id} did not freeze (tried {attempts} times)", step="snapshot"
        )

    def _snapshot_dir(self, name: str) -> Path:
        return self.path / f"{SNAPSHOT_PREFIX}{name}"

    def _snapshot_lock(self, *, exclusive: bool) -> contextlib.AbstractContextManager[None]:
        """Forks read a snapshot under a shared lock, a delete takes it exclusively."""
        return file_lock(self.runtime_dir / "snapshots.lock", exclusive=exclusive)

    def snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo:
        """Copy the sandbox's overlay delta (frozen meanwhile, so files are consistent) into
        ``snap-<name>/``; the runtime's record and network state are not part of it."""
        cdir = self._dir(sandbox_id)
        source = self._read_record(sandbox_id)[0]  # SandboxNotFound without one
        final = self._snapshot_dir(name)
        if final.exists():
            raise ConfigError(f"a snapshot named {name!r} exists already (delete it first)")
        upper = self._rootfs_dirs(cdir)[1]
        sweep_stale(self.path, _SNAP_TMP)
        tmp = self.path / f"{_SNAP_TMP}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            tmp.mkdir(mode=0o700)
            frozen = self.state(sandbox_id) == "running"
            if frozen:
                self._freeze(sandbox_id)
            try:
                copy_tree(upper, tmp / "delta", step="snapshot")
            finally:
                if frozen:
                    self._set_frozen(sandbox_id, False)
            info = SnapshotInfo(
                name=name,
                source_id=sandbox_id,
                created_at=time.time(),
                backend=self.name,
                size_bytes=tree_bytes(tmp / "delta"),
                template=source.spec.template,
            )
            (tmp / SNAPSHOT_FILE).write_text(json.dumps(dataclasses.asdict(info), sort_keys=True))
            try:
                os.rename(tmp, final)  # atomic; refuses an existing (non-empty) snapshot dir
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise ConfigError(f"a snapshot named {name!r} exists already (delete it first)") from exc
                raise
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            where = exc.filename or self.path
            raise BackendError(f"{exc.strerror or exc} ({where})", step="snapshot") from exc
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return info

    def _read_snapshot(self, sdir: Path) -> SnapshotInfo | None:
        try:
            data = json.loads((sdir / SNAPSHOT_FILE).read_text())
            known = {f.name for f in dataclasses.fields(SnapshotInfo)}
            return SnapshotInfo(**{k: v for k, v in data.items() if k in known})
        except (OSError, ValueError, TypeError, AttributeError):
            return None

    def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        out: builtins.list[SnapshotInfo] = []
        if self.path.is_dir():
            for entry in sorted(self.path.glob(f"{SNAPSHOT_PREFIX}*")):
                info = self._read_snapshot(entry)
                if info is not None:
                    out.append(info)
        return out

    def delete_snapshot(self, name: str) -> bool:
        final = self._snapshot_dir(name)
        sweep_stale(self.path, _SNAP_DEL)
        trash = self.path / f"{_SNAP_DEL}{os.getpid()}-{secrets.token_hex(4)}"
        with self._snapshot_lock(exclusive=True):  # waits for forks that are reading it
            try:
                os.rename(final, trash)
            except FileNotFoundError:
                return False
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def clone_from_snapshot(self, sandbox_id: str, spec: SandboxSpec, name: str) -> SandboxRecord:
        sdir = self._snapshot_dir(name)
        with self._snapshot_lock(exclusive=False):
            info = self._read_snapshot(sdir)
            if info is None:
                raise SnapshotNotFound(name)
            # the delta is a layer over its source's template: the fork is cloned from that one
            fork = dataclasses.replace(spec, template=info.template)
            return self.clone(sandbox_id, fork, delta=sdir / "delta")

    def _fill_from_snapshot(self, cdir: Path, delta: Path) -> None:
        """Copy a snapshot's delta into a fresh clone's upper dir; host keys of any type go (the
        clone gets its own from ``_seed_rootfs``, which also replaces machine-id and names)."""
        upper = self._rootfs_dirs(cdir)[1]
        copy_tree(delta, upper, step="clone")
        ssh_dir = upper / "etc" / "ssh"
        if ssh_dir.is_dir() and not ssh_dir.is_symlink():
            for key in ssh_dir.glob("ssh_host_*"):
                if key.is_symlink() or not key.is_dir():
                    key.unlink()
