"""LXC engine: every PVE CT is a real overlay clone of the host's template container.

* create / clone: ``lxc-copy -P <lxc_path> -n <template> -N pve-<vmid> -s -B overlayfs`` (a CT
  made by create, or a named template, only contributes its config: the bits come from the host
  template, see docs/host-contract.md); a clone of a CT that is itself a clone (a build CT converted
  to a template, issue 27) also gets a copy of that CT's upper dir: its own files.
* config -> LXC config keys (rewritten on every change, other lines kept): ``lxc.uts.name``
  (hostname), ``net0`` -> ``lxc.net.0.{link,name,hwaddr,ipv4.address,ipv4.gateway,veth.pair}``,
  ``memory``/``swap``/``cores`` -> cgroup v1 (``lxc.cgroup.memory.limit_in_bytes``,
  ``memory.memsw.limit_in_bytes`` when the kernel accounts swap, ``cpu.cfs_quota_us`` +
  ``cpu.cfs_period_us``) or v2 (``lxc.cgroup2.memory.max``, ``memory.swap.max``, ``cpu.max``) keys.
* start: the "pre-start hook" writes, into the clone's overlay upper dir (owned by the mapped
  root), one ed25519 SSH host key (first start only), ``/etc/machine-id``, ``/etc/hostname`` and
  ``/etc/hosts``; then ``lxc-start`` and ``lxc-wait -s RUNNING``. The host key's public half is
  returned (published in the CT description, see ``hostkey``).
* stop ``lxc-stop -k``; shutdown ``lxc-stop -t``; destroy ``lxc-destroy`` (after a kill);
  interfaces: ``nsenter -t <pid> --net ip -j addr`` as PVE does.
* snapshot: ``lxc-freeze`` (when running), ``cp -a`` of the overlay upper dir into
  ``<lxc_path>/.pve-snapshots/<vmid>/<snapname>/delta``, ``lxc-unfreeze``; a clone of a snapshot
  is a template clone whose upper dir is first filled from that copy, minus the host keys (the
  hookscript writes new ones at first start) and with ``/etc/machine-id`` emptied (PVE's
  ``post_clone_hook``); destroy removes the CT's snapshots. ``disk``: the upper dir's bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .ctconfig import env_lines, parse_kv
from .engine import CTConfig, EngineError
from .hookcaps import Published, bookkept
from .hostkey import generate_ed25519, public_line_of

DEFAULT_LXC_PATH = Path("/var/lib/sandbox_rt/lxc")
DEFAULT_TEMPLATE = "sandbox-template"
_MANAGED_PREFIXES = (
    "lxc.uts.name",
    "lxc.net.0.link",
    "lxc.net.0.name",
    "lxc.net.0.hwaddr",
    "lxc.net.0.ipv4.address",
    "lxc.net.0.ipv4.gateway",
    "lxc.net.0.veth.pair",
    "lxc.cgroup.memory.limit_in_bytes",
    "lxc.cgroup.memory.memsw.limit_in_bytes",
    "lxc.cgroup.cpu.cfs_quota_us",
    "lxc.cgroup.cpu.cfs_period_us",
    "lxc.cgroup2.memory.max",
    "lxc.cgroup2.memory.swap.max",
    "lxc.cgroup2.cpu.max",
    "lxc.environment",
)
_CFS_PERIOD = 100_000
_CREATED_MARK = "pve-engine-created"  # in the container dir of a CT made by create (not a clone)
_MIB = 1024 * 1024


def cgroup_version(root: Path = Path("/sys/fs/cgroup")) -> int:
    """2 on a pure cgroup v2 host, 1 on v1 or hybrid (v1 controllers, empty unified tree)."""
    return 2 if (root / "cgroup.controllers").exists() else 1


def cgroup_lines(config: CTConfig, version: int, memsw: bool) -> list[str]:
    """The LXC cgroup keys for ``memory``/``swap`` (MiB) and ``cores`` of a PVE config."""
    memory = int(config.get("memory", 512))
    swap = int(config.get("swap", 512))
    cores = config.get("cores")
    lines: list[str] = []
    if version == 2:
        lines += [f"lxc.cgroup2.memory.max = {memory * _MIB}", f"lxc.cgroup2.memory.swap.max = {swap * _MIB}"]
        if cores:
            lines.append(f"lxc.cgroup2.cpu.max = {int(cores) * _CFS_PERIOD} {_CFS_PERIOD}")
    else:
        lines.append(f"lxc.cgroup.memory.limit_in_bytes = {memory * _MIB}")
        if memsw:
            lines.append(f"lxc.cgroup.memory.memsw.limit_in_bytes = {(memory + swap) * _MIB}")
        if cores:
            lines += [
                f"lxc.cgroup.cpu.cfs_period_us = {_CFS_PERIOD}",
                f"lxc.cgroup.cpu.cfs_quota_us = {int(cores) * _CFS_PERIOD}",
            ]
    return lines


def net_lines(vmid: int, config: CTConfig) -> list[str]:
    """``net0`` -> ``lxc.net.0.*`` keys (static IPv4 only: nothing in the CT runs DHCP)."""
    raw = config.get("net0")
    if not raw:
        return []
    net = parse_kv(str(raw))
    lines = [f"lxc.net.0.veth.pair = veth{vmid}i0"]
    if net.get("bridge"):
        lines.append(f"lxc.net.0.link = {net['bridge']}")
    if net.get("name"):
        lines.append(f"lxc.net.0.name = {net['name']}")
    if net.get("hwaddr"):
        lines.append(f"lxc.net.0.hwaddr = {net['hwaddr'].lower()}")
    ip = net.get("ip", "")
    if "/" in ip:
        lines.append(f"lxc.net.0.ipv4.address = {ip}")
        if net.get("gw"):
            lines.append(f"lxc.net.0.ipv4.gateway = {net['gw']}")
    return lines


class LxcEngine:
    name = "lxc"

    def __init__(
        self,
        lxc_path: Path = DEFAULT_LXC_PATH,
        template: str = DEFAULT_TEMPLATE,
        prefix: str = "pve-",
        timeout: float = 60.0,
        templates: dict[int, str] | None = None,
    ) -> None:
        self.lxc_path = lxc_path
        self.template = template
        # clones of these CT templates (VMID -> LXC template) copy that LXC template, not ``template``:
        # named templates (issue 17), each a CT template of its own as on a real PVE
        self.templates = dict(templates or {})
        self.prefix = prefix
        self.timeout = timeout
        self._cgroup = cgroup_version()
        self._memsw = Path("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes").exists()

    # --- helpers ----------------------------------------------------------------------------
    def ct_name(self, vmid: int) -> str:
        return f"{self.prefix}{vmid}"

    def _config_path(self, vmid: int) -> Path:
        return self.lxc_path / self.ct_name(vmid) / "config"

    def _run(self, cmd: Sequence[str], timeout: float | None = None, check: bool = True) -> str:
        try:
            proc = subprocess.run(
                list(cmd), capture_output=True, text=True, timeout=timeout or self.timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise EngineError(f"command '{' '.join(cmd)}' timed out after {exc.timeout}s") from None
        if check and proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise EngineError(
                f"command '{' '.join(cmd)}' failed: exit code {proc.returncode}: {' | '.join(tail)}"
            )
        return proc.stdout

    def _lxc(self, tool: str, vmid: int, *args: str, timeout: float | None = None, check: bool = True) -> str:
        return self._run([tool, "-P", str(self.lxc_path), "-n", self.ct_name(vmid), *args], timeout, check)

    # --- Engine protocol --------------------------------------------------------------------
    def unavailable_reason(self) -> str | None:
        for tool in ("lxc-copy", "lxc-start", "lxc-stop", "lxc-destroy", "lxc-info", "nsenter"):
            if shutil.which(tool) is None:
                return f"{tool} is not installed"
        if os.geteuid() != 0:
            return "the LXC engine needs root"
        if not (self.lxc_path / self.template / "config").is_file():
            template = self.lxc_path / self.template
            return f"LXC template {template} does not exist (the template_build role builds it)"
        return None

    def restore(self, vmid: int, config: CTConfig, running: bool) -> None:
        return None

    def create(self, vmid: int, config: CTConfig, ostemplate: str = "", ssh_public_keys: str = "") -> None:
        self._copy(self.template, vmid, config)
        # made from the OS template (the host's LXC template): nothing of its own to clone
        (self._config_path(vmid).parent / _CREATED_MARK).touch()

    def _copy(self, template: str, vmid: int, config: CTConfig) -> None:
        if self._config_path(vmid).exists():
            raise EngineError(f"LXC container {self.ct_name(vmid)} already exists")
        self._run(
            [
                "lxc-copy",
                "-P",
                str(self.lxc_path),
                "-n",
                template,
                "-N",
                self.ct_name(vmid),
                "-s",
                "-B",
                "overlayfs",
            ]
        )
        self.apply_config(vmid, config)

    def clone(self, source_vmid: int, vmid: int, config: CTConfig) -> None:
        """A clone of a named template copies its LXC template; of a CT made by ``create``, the
        host's template; of any other CT (a clone itself, e.g. a build CT converted to a template),
        that CT's own files: its lower layer's template plus a copy of its upper dir."""
        if source_vmid in self.templates:
            self._copy(self.templates[source_vmid], vmid, config)
            return
        source_dir = self._config_path(source_vmid).parent
        if not (source_dir / "config").is_file() or (source_dir / _CREATED_MARK).exists():
            self._copy(self.template, vmid, config)
            return
        lower, upper, _uid = self._overlay_dirs(source_vmid)
        self._copy(lower.parent.name if lower.parent.parent == self.lxc_path else self.template, vmid, config)
        try:
            new_upper = self._overlay_dirs(vmid)[1]
            self._run(["cp", "-a", "--no-target-directory", "--", str(upper), str(new_upper)])
        except BaseException:
            self.destroy(vmid)
            raise

    def apply_config(self, vmid: int, config: CTConfig) -> None:
        path = self._config_path(vmid)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise EngineError(f"cannot read {path}: {exc}") from None
        kept = [ln for ln in lines if not ln.strip().startswith(_MANAGED_PREFIXES)]
        hostname = str(config.get("hostname") or f"CT{vmid}")
        managed = [f"lxc.uts.name = {hostname}", *net_lines(vmid, config)]
        managed += cgroup_lines(config, self._cgroup, self._memsw)
        managed += env_lines(config)
        path.write_text(
            "\n".join([*kept, "# managed by the PVE test server", *managed]) + "\n", encoding="utf-8"
        )

    def start(self, vmid: int, config: CTConfig) -> str:
        self.apply_config(vmid, config)
        public = self._prepare_rootfs(vmid, config)
        self._lxc("lxc-start", vmid)
        self._lxc("lxc-wait", vmid, "-s", "RUNNING", "-t", "20", timeout=30)
        return public

    def post_start(self, vmid: int, config: CTConfig) -> Published:
        """The caps are bookkeeping on this engine (hookcaps.bookkept): it enforces none of them; the
        node engine runs the real hookscript."""
        return Published(bookkept(str(config.get("description") or "")))

    def stop(self, vmid: int) -> None:
        if self.is_running(vmid):
            self._lxc("lxc-stop", vmid, "-k")

    def shutdown(self, vmid: int, timeout: float) -> None:
        if self.is_running(vmid):
            self._lxc("lxc-stop", vmid, "-t", str(int(timeout)), timeout=timeout + 30)

    def destroy(self, vmid: int) -> None:
        shutil.rmtree(self._snapshots_dir(vmid), ignore_errors=True)
        self._prune(vmid)
        if not self._config_path(vmid).parent.exists():
            return
        self.stop(vmid)
        self._lxc("lxc-destroy", vmid)

    def is_running(self, vmid: int) -> bool:
        if not self._config_path(vmid).exists():
            return False
        return self._lxc("lxc-info", vmid, "-s", "-H", check=False).strip() == "RUNNING"

    def memory_used(self, vmid: int) -> int:
        group = f"lxc.payload.{self.ct_name(vmid)}"
        for path in (
            Path("/sys/fs/cgroup/memory") / group / "memory.usage_in_bytes",  # cgroup v1
            Path("/sys/fs/cgroup") / group / "memory.current",  # cgroup v2
        ):
            try:
                return int(path.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
        return 0

    # --- snapshots and disk usage -----------------------------------------------------------
    def _snapshots_dir(self, vmid: int) -> Path:
        return self.lxc_path / f".{self.prefix}snapshots" / str(vmid)

    def disk_used(self, vmid: int) -> int:
        """Allocated bytes of the CT's overlay upper dir (what it wrote), symlinks not followed."""
        try:
            upper = self._overlay_dirs(vmid)[1]
        except (OSError, EngineError):
            return 0
        total, seen, stack = 0, set(), [str(upper)]
        while stack:
            with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
                for entry in entries:
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
                    elif st.st_nlink > 1:
                        if (st.st_dev, st.st_ino) in seen:
                            continue
                        seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
        return total

    def snapshot(self, vmid: int, snapname: str) -> None:
        upper = self._overlay_dirs(vmid)[1]
        target = self._snapshots_dir(vmid) / snapname
        if target.exists():
            raise EngineError(f"snapshot {snapname!r} of CT {vmid} exists already")
        for _ in range(3):  # a concurrent _prune may remove an empty parent in between
            with contextlib.suppress(FileNotFoundError):
                target.mkdir(parents=True, mode=0o700)
                break
        running = self.is_running(vmid)
        try:
            if running:
                self._freeze(vmid)
            try:
                self._run(["cp", "-a", "--no-target-directory", "--", str(upper), str(target / "delta")])
            finally:
                if running:
                    self._lxc("lxc-unfreeze", vmid)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise

    def _freeze(self, vmid: int, attempts: int = 5) -> None:
        """``lxc-freeze``, bounded: the v1 freezer can stall in FREEZING (a task caught in vfork
        whose child it froze); thaw and try again."""
        for attempt in range(attempts):
            try:
                self._lxc("lxc-freeze", vmid, timeout=3)
                return
            except EngineError:
                self._lxc("lxc-unfreeze", vmid, check=False)
                if attempt == attempts - 1:
                    raise

    def delete_snapshot(self, vmid: int, snapname: str) -> None:
        shutil.rmtree(self._snapshots_dir(vmid) / snapname, ignore_errors=True)
        self._prune(vmid)

    def _prune(self, vmid: int) -> None:
        """Remove the CT's snapshot dir and the common parent once they are empty."""
        for empty in (self._snapshots_dir(vmid), self._snapshots_dir(vmid).parent):
            with contextlib.suppress(OSError):
                empty.rmdir()

    def clone_snapshot(self, source_vmid: int, snapname: str, vmid: int, config: CTConfig) -> None:
        delta = self._snapshots_dir(source_vmid) / snapname / "delta"
        if not delta.is_dir():
            raise EngineError(f"no snapshot {snapname!r} of CT {source_vmid}")
        # a full clone copies the source's whole disk: here its delta over the source's own template
        lower = self._overlay_dirs(source_vmid)[0]
        self._copy(lower.parent.name if lower.parent.parent == self.lxc_path else self.template, vmid, config)
        upper = self._overlay_dirs(vmid)[1]
        self._run(["cp", "-a", "--no-target-directory", "--", str(delta), str(upper)])
        ssh = upper / "etc" / "ssh"
        if ssh.is_dir() and not ssh.is_symlink():
            for key in ssh.glob("ssh_host_*"):
                key.unlink()  # the hookscript's job at first start: a fresh key for the clone
        machine_id = upper / "etc" / "machine-id"
        if machine_id.is_file() and not machine_id.is_symlink():
            machine_id.write_text("\n")  # post_clone_hook; the pre-start emulation writes a new one

    def interfaces(self, vmid: int, config: CTConfig) -> list[dict[str, Any]] | None:
        if not self.is_running(vmid):
            return None
        pid = self._lxc("lxc-info", vmid, "-p", "-H", check=False).strip()
        if not pid.isdigit():
            return None
        out = self._run(["nsenter", "-t", pid, "--net", "--", "ip", "--json", "a"], timeout=10)
        result: list[dict[str, Any]] = []
        for iface in json.loads(out or "[]"):
            addrs = [
                {"ip-address-type": a["family"], "ip-address": a["local"], "prefix": a["prefixlen"]}
                for a in iface.get("addr_info", [])
            ]
            entry: dict[str, Any] = {
                "name": iface.get("ifname"),
                "hwaddr": iface.get("address"),
                "hardware-address": iface.get("address"),
                "ip-addresses": addrs,
            }
            for a in iface.get("addr_info", []):
                entry[a["family"]] = f"{a['local']}/{a['prefixlen']}"
            result.append(entry)
        return result

    # --- the pre-start hook -----------------------------------------------------------------
    def _overlay_dirs(self, vmid: int) -> tuple[Path, Path, int]:
        """(lower rootfs, upper dir, host uid of container root) from the clone's LXC config."""
        lower = upper = None
        uid = 0
        for line in self._config_path(vmid).read_text(encoding="utf-8").splitlines():
            key, _, value = (p.strip() for p in line.partition("="))
            if key == "lxc.rootfs.path":
                m = re.match(r"^(?:overlay|overlayfs):(.+):([^:]+)$", value)
                if not m:
                    raise EngineError(f"{self.ct_name(vmid)} is not an overlay clone: {value}")
                lower, upper = Path(m.group(1)), Path(m.group(2))
            elif key == "lxc.idmap":
                parts = value.split()
                if len(parts) == 4 and parts[0] in ("u", "b") and parts[1] == "0":
                    uid = int(parts[2])
        if lower is None or upper is None:
            raise EngineError(f"{self.ct_name(vmid)} has no lxc.rootfs.path")
        return lower, upper, uid

    def _prepare_rootfs(self, vmid: int, config: CTConfig) -> str:
        lower, upper, uid = self._overlay_dirs(vmid)
        hostname = str(config.get("hostname") or f"CT{vmid}")

        def ensure_dir(rel: str) -> None:
            # Each level owned and moded like the template's (else the CT sees nobody:nogroup).
            cur = Path()
            for part in Path(rel).parts:
                cur = cur / part
                target, ref = upper / cur, lower / cur
                if target.is_dir():
                    continue
                st = ref.stat() if ref.is_dir() else None
                target.mkdir()
                os.chown(target, st.st_uid if st else uid, st.st_gid if st else uid)
                target.chmod(st.st_mode & 0o7777 if st else 0o755)

        def write(rel: str, data: bytes, mode: int) -> None:
            ensure_dir(str(Path(rel).parent))
            target = upper / rel
            tmp = target.with_name(target.name + ".pve-tmp")
            tmp.write_bytes(data)
            os.chown(tmp, uid, uid)
            tmp.chmod(mode)
            tmp.replace(target)

        key_rel = "etc/ssh/ssh_host_ed25519_key"
        comment = f"root@{hostname}"
        if (upper / key_rel).is_file():
            public = public_line_of((upper / key_rel).read_bytes(), comment)
        else:
            private, public = generate_ed25519(comment)
            write(key_rel, private, 0o600)
            write(key_rel + ".pub", (public + "\n").encode(), 0o644)
        if not (upper / "etc/machine-id").is_file() or not (upper / "etc/machine-id").read_text().strip():
            write("etc/machine-id", (secrets.token_hex(16) + "\n").encode(), 0o444)
        write("etc/hostname", f"{hostname}\n".encode(), 0o644)
        ip = parse_kv(str(config.get("net0", ""))).get("ip", "")
        own = ip.split("/")[0] if "/" in ip else "127.0.1.1"
        hosts = f"127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n{own} {hostname}\n"
        write("etc/hosts", hosts.encode(), 0o644)
        return public
