"""The embedded default: plain LXC on this host (``lxc-copy`` overlay snapshots of the template).

Layout under ``settings.lxc_path`` (see docs/host-contract.md):
- ``sandbox-template/`` the template (never started), ``sbx-<hex>/`` one dir per sandbox with the
  LXC ``config``, the overlay ``delta`` and ``sandbox_rt.json`` (the record: labels, expiry, owner,
  pinned host key). The record lives outside the container's root, so the sandbox cannot alter it.
- ``.runtime/creating/<id>.json`` marks a create in progress (the creator's pid): ``gc`` removes
  what a caller killed mid-create left, whatever step it died at.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import ipaddress
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..config import Settings
from ..errors import BackendError, SandboxNotFound
from ..ipam import IpPool, mac_for_ip
from ..models import ResourceUsage, SandboxRecord, SandboxSpec
from ..network import NftInternetSet
from ..validation import SANDBOX_ID
from .base import GcCandidate
from .intents import CreateMarkers
from .owner import owner_alive, process_start_time

__all__ = ["LxcBackend", "cgroup_limit_lines", "cgroup_limits"]

RECORD_FILE = "sandbox_rt.json"
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
)
_LIMIT_KEYS = tuple(k for k in _OURS if k.startswith("lxc.cgroup"))  # the limit keys among them
CPU_PERIOD_US = 100_000
_CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_v1() -> bool:
    return (_CGROUP_ROOT / "memory" / "memory.limit_in_bytes").exists()


def cgroup_limits(spec: SandboxSpec, *, v1: bool, memsw: bool) -> builtins.list[tuple[str, str]]:
    """(cgroup file, value) pairs that apply ``spec``'s limits on a v1 or v2 host (swap always 0).

    The same pairs go into the config before start (``lxc.cgroup[2].<file> = <value>``) and into the
    live cgroup files when a running sandbox changes (warm pool).
    """
    mem = str(spec.memory_mb * 1024 * 1024)
    quota = max(1000, int(spec.cpus * CPU_PERIOD_US))
    if v1:
        pairs = [("memory.limit_in_bytes", mem)]
        if memsw:
            pairs.append(("memory.memsw.limit_in_bytes", mem))
        return [
            *pairs,
            ("pids.max", str(spec.pids_max)),
            ("cpu.cfs_period_us", str(CPU_PERIOD_US)),
            ("cpu.cfs_quota_us", str(quota)),
        ]
    return [
        ("memory.max", mem),
        ("memory.swap.max", "0"),
        ("pids.max", str(spec.pids_max)),
        ("cpu.max", f"{quota} {CPU_PERIOD_US}"),
    ]


def cgroup_limit_lines(spec: SandboxSpec, *, v1: bool, memsw: bool) -> builtins.list[str]:
    """LXC config lines for ``spec``'s limits (see :func:`cgroup_limits`)."""
    prefix = "lxc.cgroup." if v1 else "lxc.cgroup2."
    return [f"{prefix}{key} = {value}" for key, value in cgroup_limits(spec, v1=v1, memsw=memsw)]


def _spec_to_json(spec: SandboxSpec) -> dict[str, Any]:
    return dataclasses.asdict(spec)


def _spec_from_json(data: dict[str, Any]) -> SandboxSpec:
    known = {f.name for f in dataclasses.fields(SandboxSpec)}
    return SandboxSpec(**{k: v for k, v in data.items() if k in known})


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
        self._v1 = cgroup_v1()
        self._memsw = (_CGROUP_ROOT / "memory" / "memory.memsw.limit_in_bytes").exists()

    # -- helpers ---------------------------------------------------------------------------------
    def _lxc(self, tool: str, *args: str, step: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = [tool, "-P", str(self.path), *args]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError as exc:
            raise BackendError(f"{tool} is not installed (run site.yml)", step=step) from exc
        except subprocess.TimeoutExpired as exc:
            raise BackendError(f"{' '.join(cmd)} did not finish in {timeout:g} s", step=step) from exc
        if proc.returncode != 0:
            raise BackendError(
                f"{' '.join(cmd)} exited {proc.returncode}", step=step, detail=proc.stderr + proc.stdout
            )
        return proc

    def _dir(self, sandbox_id: str) -> Path:
        return self.path / sandbox_id

    def _template_dir(self) -> Path:
        return self.path / self.settings.template

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

    def _addresses_in_use(self) -> set[str]:
        used: set[str] = set()
        if not self.path.is_dir():
            return used
        for cfg in self.path.glob("*/config"):
            try:
                lines = cfg.read_text().splitlines()
            except OSError:
                continue
            value = self._config_value(lines, "lxc.net.0.ipv4.address")
            if value:
                with contextlib.suppress(ValueError):
                    used.add(str(ipaddress.IPv4Interface(value).ip))
        return used

    # -- create steps ----------------------------------------------------------------------------
    def begin(self, sandbox_id: str) -> None:
        self.markers.write(sandbox_id)

    def end(self, sandbox_id: str) -> None:
        self.markers.remove(sandbox_id)

    def clone(self, sandbox_id: str, spec: SandboxSpec) -> SandboxRecord:
        try:
            return self._clone(sandbox_id, spec)
        except OSError as exc:  # disk full, permissions, ...: a typed error naming the step
            raise BackendError(f"{exc.strerror or exc} ({exc.filename or self.path})", step="clone") from exc

    def _clone(self, sandbox_id: str, spec: SandboxSpec) -> SandboxRecord:
        template = self._template_dir()
        if not (template / "config").is_file():
            raise BackendError(
                f"template {self.settings.template!r} not found in {self.path} (run site.yml)", step="clone"
            )
        self._lxc(
            "lxc-copy", "-n", self.settings.template, "-N", sandbox_id, "-s", "-B", "overlayfs", step="clone"
        )
        cdir = self._dir(sandbox_id)
        hostname = spec.hostname or sandbox_id
        lines = [ln for ln in self._config_lines(cdir) if not ln.strip().startswith(_OURS)]
        limits = cgroup_limit_lines(spec, v1=self._v1, memsw=self._memsw)

        def commit(ip: str) -> None:
            extra = [
                f"lxc.uts.name = {hostname}",
                f"lxc.net.0.link = {self.settings.bridge}",
                f"lxc.net.0.ipv4.address = {ip}/{self.prefixlen}",
                f"lxc.net.0.ipv4.gateway = {self.settings.gateway}",
                f"lxc.net.0.hwaddr = {mac_for_ip(ip)}",
                f"lxc.net.0.veth.pair = sbx{sandbox_id[4:]}",
                *limits,
            ]
            tmp = cdir / "config.new"
            tmp.write_text("\n".join([*lines, *extra]) + "\n")
            tmp.replace(cdir / "config")

        ip = self.pool.allocate(self._addresses_in_use, commit)
        host_pub = self._seed_rootfs(cdir, hostname, ip)
        now = time.time()
        pid = 0 if spec.detached else os.getpid()
        record = SandboxRecord(
            id=sandbox_id,
            hostname=hostname,
            ip=ip,
            host_key=host_pub,
            spec=spec,
            created_at=now,
            expires_at=now + spec.ttl_s if spec.ttl_s else None,
            owner_pid=pid,
            owner_host=socket.gethostname(),
            backend=self.name,
        )
        self._write_record(record, owner_start=process_start_time(pid))
        return record

    def _seed_rootfs(self, cdir: Path, hostname: str, ip: str) -> str:
        """Write per-clone identity into the overlay delta: host key, machine-id, names, resolver."""
        lower, upper = self._rootfs_dirs(cdir)
        # the upper dir's root is the container's "/": give it the lower root's owner and mode
        # (lxc-copy creates it under the caller's umask, e.g. 0700, which would lock out the user)
        st = lower.stat()
        os.chown(upper, st.st_uid, st.st_gid)
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
            self._write_into_upper(lower, upper, rel, data, mode)
        return public.decode()

    def _write_into_upper(self, lower: Path, upper: Path, rel: str, data: bytes, mode: int) -> None:
        """Create ``rel`` in the overlay's upper dir, owned by container root, parents like the lower's."""
        base = self.settings.idmap_base
        parts = Path(rel).parts
        for i in range(1, len(parts)):
            sub = Path(*parts[:i])
            target = upper / sub
            if not target.exists():
                src = lower / sub
                st = src.stat() if src.is_dir() else None
                target.mkdir(mode=0o755)
                os.chown(target, st.st_uid if st else base, st.st_gid if st else base)
                os.chmod(target, (st.st_mode & 0o7777) if st else 0o755)
        path = upper / rel
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, data)
            os.fchown(fd, base, base)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    def _write_record(self, record: SandboxRecord, owner_start: int | None) -> None:
        data = dataclasses.asdict(record)
        data["spec"] = _spec_to_json(record.spec)
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
        data["spec"] = _spec_from_json(data["spec"])
        return SandboxRecord(**data), extra

    def start(self, sandbox_id: str) -> SandboxRecord:
        log = self._dir(sandbox_id) / "start.log"
        try:
            self._lxc("lxc-start", "-n", sandbox_id, f"--logfile={log}", "--logpriority=ERROR", step="start")
        except BackendError as exc:
            with contextlib.suppress(OSError):
                raise BackendError(
                    "the container did not start", step="start", detail=log.read_text()
                ) from exc
            raise
        return self.get(sandbox_id)  # the host key was pinned before start (written by clone)

    def stop(self, sandbox_id: str) -> None:
        if self.state(sandbox_id) == "running":
            self._lxc("lxc-stop", "-n", sandbox_id, "-k", step="stop")

    def update(self, record: SandboxRecord, spec: SandboxSpec) -> SandboxRecord:
        """Apply a new spec to a running sandbox: limits (live cgroup writes), hostname, labels, TTL.

        Used by the warm pool on hand-out; ``disk_gb`` and ``internet`` are the caller's business.
        """
        sid = record.id
        pid = self._init_pid(sid)
        if pid is None:
            raise BackendError(f"{sid} is not running", step="update")
        self._apply_live_limits(sid, spec)
        cdir = self._dir(sid)
        lines = [ln for ln in self._config_lines(cdir) if not ln.strip().startswith(_LIMIT_KEYS)]
        lines += cgroup_limit_lines(spec, v1=self._v1, memsw=self._memsw)
        hostname = spec.hostname or record.hostname
        if hostname != record.hostname:
            self._set_hostname(pid, record.ip, hostname)
            lines = [ln for ln in lines if not ln.strip().startswith("lxc.uts.name")]
            lines.append(f"lxc.uts.name = {hostname}")
        tmp = cdir / "config.new"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(cdir / "config")
        now = time.time()
        new = dataclasses.replace(
            record,
            hostname=hostname,
            spec=dataclasses.replace(spec, hostname=hostname),
            expires_at=now + spec.ttl_s if spec.ttl_s else None,
        )
        self._write_record(new, owner_start=process_start_time(new.owner_pid))
        return new

    def _cgroup_dir(self, sandbox_id: str, key: str) -> Path:
        group = f"lxc.payload.{sandbox_id}"
        if not self._v1:
            return _CGROUP_ROOT / group
        controller = key.split(".", 1)[0]
        return _CGROUP_ROOT / controller / group

    def _apply_live_limits(self, sandbox_id: str, spec: SandboxSpec) -> None:
        pairs = cgroup_limits(spec, v1=self._v1, memsw=self._memsw)
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
        root = Path(f"/proc/{pid}/root")
        (root / "etc/hostname").write_text(f"{hostname}\n")
        (root / "etc/hosts").write_text(
            f"127.0.0.1\tlocalhost\n{ip}\t{hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        )

    def destroy(self, sandbox_id: str) -> bool:
        cdir = self._dir(sandbox_id)
        existed = cdir.exists()
        ip: str | None = None
        if (cdir / "config").exists():
            addr = self._config_value(self._config_lines(cdir), "lxc.net.0.ipv4.address")
            ip = str(ipaddress.IPv4Interface(addr).ip) if addr else None
        if ip is not None:
            with contextlib.suppress(BackendError):  # the table may be gone; the address goes with the CT
                if self.internet.remove(ip):
                    self._forget_connections(ip)
        if existed:
            if self.state(sandbox_id) != "stopped":
                proc = subprocess.run(
                    ["lxc-stop", "-P", str(self.path), "-n", sandbox_id, "-k"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                if proc.returncode != 0 and self.state(sandbox_id) == "running":
                    raise BackendError(f"cannot stop {sandbox_id}", step="destroy", detail=proc.stderr)
            if (cdir / "config").exists():
                proc = subprocess.run(
                    ["lxc-destroy", "-P", str(self.path), "-n", sandbox_id],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                if proc.returncode != 0 and cdir.exists():
                    # a half-made clone lxc-destroy does not understand: nothing is mounted, remove it
                    shutil.rmtree(cdir)
            if cdir.exists():
                shutil.rmtree(cdir)
        self.end(sandbox_id)
        return existed

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
        proc = subprocess.run(
            ["lxc-info", "-P", str(self.path), "-n", sandbox_id, "-s", "-H"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return proc.stdout.strip().lower() or "unknown"

    def _init_pid(self, sandbox_id: str) -> int | None:
        proc = subprocess.run(
            ["lxc-info", "-P", str(self.path), "-n", sandbox_id, "-p", "-H"],
            capture_output=True,
            text=True,
            timeout=30,
        )
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
        )

    # -- network ---------------------------------------------------------------------------------
    def set_internet(self, record: SandboxRecord, enabled: bool) -> None:
        if enabled:
            self.internet.add(record.ip)
        else:
            self.internet.remove(record.ip)
            self._forget_connections(record.ip)

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
        return [GcCandidate(sid, reason) for sid, reason in sorted(found.items())]
