"""Node engine: every PVE CT is a real, unprivileged LXC container *inside* an emulated PVE node
(``tests/pve_node``: a privileged Debian 12 system container with systemd, LXC and the node's own
vmbr1, dnsmasq and nftables). What PVE itself does on a node, this engine does there:

* storage ``local`` is the node's ``/var/lib/vz`` (uploads land in ``template/cache/``);
* create from ``ostemplate``: the vztmpl tarball is unpacked inside the node into
  ``/var/lib/lxc/<vmid>/rootfs``, shifted into the CT's id range (container root = node uid
  100000, as PVE's unprivileged CTs), root's ``authorized_keys`` from ``ssh-public-keys``;
* the LXC container is named by its VMID (``pct`` and PVE's own tools find it so); its config is
  what pve-container generates for an unprivileged CT: ``common.conf`` + ``userns.conf``, the id
  map, ``veth<vmid>i0`` on the ``net0`` bridge (no address: LXC sets none on PVE), cgroup limits;
  then the CT's raw ``lxc.*`` entries, appended last (they win); init is the template's
  ``/sbin/init`` unless a raw ``lxc.init.cmd`` names another;
* at start, as pve-container's Debian setup does: ``/etc/network/interfaces`` of the CT from
  ``net0`` (static address and gateway, or dhcp), which nothing applies unless the CT does;
* ``/etc/pve/lxc/<vmid>.conf`` (pmxcfs): every CT's config file is written into the node from the
  server's state after each change; root's hand edits of the raw ``lxc.*`` lines there are read back
  before the next API call, whitelisted as pve-container does (``pct_conf``), copied by a clone;
* a linked clone of a template is ``lxc-copy -s -B overlayfs`` of the template's container (the
  template's rootfs is the lower layer, as PVE's linked clones share the base volume);
* pve-firewall: the datacenter, CT options and rules are compiled into one nftables table in the
  node (``pvefw.py``), reloaded atomically whenever any of them changes;
* the host-key hookscript (pre-start) is emulated as in the LXC engine; its post-start (the caps
  PVE's config has no option for: pids.max, the rootfs disk's IO limits) is the real
  ``sandbox-rt-hookscript.pl`` the proxmox_hookscript role installed in the node, run there with
  stand-ins for the PVE modules it loads (``node_hook``).

Commands run in the node through ``lxc-attach`` (about 9 ms each, measured); files are read and
written through the node's root filesystem on this machine (the node is privileged, its ids are
the host's). The engine's own paths (``lxc_path``, overlay dirs) are host paths into that rootfs;
:meth:`_run` turns them into node paths.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import node_hook, pct_conf
from .ctconfig import env_lines, parse_kv
from .engine import CTConfig, EngineError
from .engine_lxc import LxcEngine, cgroup_lines
from .hookcaps import REFUSED_PREFIX, Published, applied_of, published_line

NODE_LXC_PATH = "/var/lib/lxc"  # inside the node, as on PVE
NODE_STORAGE = {"local": "/var/lib/vz"}  # PVE's default directory storage
IDMAP_BASE = 100000
IDMAP_SIZE = 65536
NFT_TABLE = "pve-firewall-emu"
_NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MANAGED_MARK = "# managed by the PVE test server"
RAW_MARK = "# the CT's raw lxc.* entries (/etc/pve/lxc/<vmid>.conf), appended last as pve-container does"
WWW_DATA_GID = 33  # /etc/pve belongs to root:www-data
CFS_PERIOD = 100_000


def pve_net_lines(vmid: int, config: CTConfig) -> list[str]:
    """``net0`` -> the ``lxc.net.0.*`` keys pve-container writes: no address (the CT's own network
    configuration, written at start, holds it). pve-container plugs the veth into the bridge with its
    ``lxcnetaddbr`` up-script; here LXC's own ``link`` does that."""
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
    return lines


def pve_cgroup_lines(config: CTConfig, version: int, memsw: bool) -> list[str]:
    """The cgroup keys pve-container writes: ``memory``/``swap`` as the LXC engine's, and the CPU
    quota from ``cpulimit`` (``cores`` pins CPUs on PVE, a cpuset not emulated here; no quota)."""
    lines = cgroup_lines({k: v for k, v in config.items() if k != "cores"}, version, memsw)
    limit = float(config.get("cpulimit") or 0)
    if limit > 0:
        quota = int(limit * CFS_PERIOD)
        if version == 2:
            lines.append(f"lxc.cgroup2.cpu.max = {quota} {CFS_PERIOD}")
        else:
            lines += [f"lxc.cgroup.cpu.cfs_period_us = {CFS_PERIOD}"]
            lines += [f"lxc.cgroup.cpu.cfs_quota_us = {quota}"]
    return lines


def debian_interfaces(config: CTConfig) -> str:
    """What pve-container's Debian setup writes into the CT's /etc/network/interfaces for net0."""
    net = parse_kv(str(config.get("net0") or ""))
    name = net.get("name", "eth0")
    ip = net.get("ip", "")
    lines = ["auto lo", "iface lo inet loopback", "", f"auto {name}"]
    if "/" in ip:
        lines += [f"iface {name} inet static", f"\taddress {ip}"]
        if net.get("gw"):
            lines.append(f"\tgateway {net['gw']}")
    else:
        lines.append(f"iface {name} inet {'dhcp' if ip == 'dhcp' else 'manual'}")
    return "\n".join(lines) + "\n"


class NodeEngine(LxcEngine):
    name = "node"

    def __init__(self, node_lxc_path: Path, node_name: str, timeout: float = 120.0) -> None:
        self.node_lxc_path = node_lxc_path
        self.node_name = node_name
        self.node_root = self._read_node_rootfs()
        super().__init__(self.host_path(NODE_LXC_PATH), template="", prefix="", timeout=timeout)
        self.firewall_text = ""  # what was loaded last (tests read it)
        self._firewall_boot = ""
        self._file_signatures: dict[str, tuple[int, int, int]] = {}  # config file -> as last seen
        self.refused_keys: dict[int, list[str]] = {}  # vmid -> raw keys pve-container would refuse

    # --- where things are ------------------------------------------------------------------------
    def _read_node_rootfs(self) -> Path:
        config = self.node_lxc_path / self.node_name / "config"
        try:
            for line in config.read_text(encoding="utf-8").splitlines():
                key, _, value = (p.strip() for p in line.partition("="))
                if key == "lxc.rootfs.path":
                    return Path(value.split(":", 1)[1] if value.startswith("dir:") else value)
        except OSError:
            pass
        return self.node_lxc_path / self.node_name / "rootfs"

    def host_path(self, node_path: str | Path) -> Path:
        """The node's ``node_path`` as seen from this machine."""
        return self.node_root / str(node_path).lstrip("/")

    def node_path(self, host_path: str | Path) -> str:
        text = str(host_path)
        root = str(self.node_root)
        return "/" + text[len(root) :].lstrip("/") if text.startswith(root) else text

    def ct_name(self, vmid: int) -> str:
        return str(vmid)

    def storage_dir(self, storage: str) -> Path | None:
        """Host path of a directory storage the node backs (uploads are written there)."""
        inside = NODE_STORAGE.get(storage)
        return self.host_path(inside) if inside else None

    # --- running commands in the node --------------------------------------------------------------
    def node_argv(self, cmd: Sequence[str]) -> list[str]:
        return [
            "lxc-attach",
            "-P",
            str(self.node_lxc_path),
            "-n",
            self.node_name,
            "--clear-env",
            "--set-var",
            f"PATH={_NODE_PATH}",
            "--",
            *(self.node_path(arg) for arg in cmd),
        ]

    def _run(self, cmd: Sequence[str], timeout: float | None = None, check: bool = True) -> str:
        return super()._run(self.node_argv(cmd), timeout, check)

    def _run_input(self, cmd: Sequence[str], data: str, timeout: float = 60) -> None:
        argv = self.node_argv(cmd)
        proc = subprocess.run(argv, input=data, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise EngineError(
                f"command '{shlex.join(cmd)}' failed in the node: {proc.stderr.strip()[-1500:]}"
            )

    # --- Engine protocol ---------------------------------------------------------------------------
    def unavailable_reason(self) -> str | None:
        if os.geteuid() != 0:
            return "the node engine needs root"
        proc = subprocess.run(
            ["lxc-info", "-P", str(self.node_lxc_path), "-n", self.node_name, "-s", "-H"],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.stdout.strip() != "RUNNING":
            return f"the emulated PVE node {self.node_name} is not running (python -m tests.pve_node start)"
        return None

    def lxc_config(self, vmid: int, rootfs: str) -> str:
        """What pve-container writes for an unprivileged CT (before the managed keys)."""
        return "\n".join(
            [
                "# PVE CT (emulated node): generated by the PVE API test server's node engine",
                "lxc.arch = amd64",
                "lxc.include = /usr/share/lxc/config/common.conf",
                "lxc.include = /usr/share/lxc/config/userns.conf",
                # PVE: 'generated' (lxc-container-default-cgns + nesting rules); no AppArmor here.
                "lxc.apparmor.profile = unconfined",
                "lxc.mount.auto = sys:mixed",
                "lxc.monitor.unshare = 1",
                # Not pve-container's: the emulated node runs under this machine's LXC seccomp filter,
                # and LXC loads no filter of a nested container's own in an already filtered process
                # ("Already seccomp-confined") unless told to stack it. A PVE host runs unfiltered, so
                # there each CT's filter is its only one; here it is stacked on the node's.
                "lxc.seccomp.allow_nesting = 1",
                f"lxc.idmap = u 0 {IDMAP_BASE} {IDMAP_SIZE}",
                f"lxc.idmap = g 0 {IDMAP_BASE} {IDMAP_SIZE}",
                f"lxc.rootfs.path = {rootfs}",
                "",
            ]
        )

    def create(self, vmid: int, config: CTConfig, ostemplate: str = "", ssh_public_keys: str = "") -> None:
        """``POST /nodes/{node}/lxc``: unpack ``ostemplate`` (a volid on a storage of the node)."""
        storage, _, volname = ostemplate.partition(":")
        base = NODE_STORAGE.get(storage)
        m = re.fullmatch(r"vztmpl/([^/]+\.tar(?:\.(?:gz|xz|zst|bz2))?)", volname)
        if base is None or m is None:
            raise EngineError(f"the node engine cannot create from '{ostemplate}'")
        archive = f"{base}/template/cache/{m.group(1)}"
        if not self.host_path(archive).is_file():
            raise EngineError(f"volume '{ostemplate}' does not exist")
        directory = f"{NODE_LXC_PATH}/{vmid}"
        if self.host_path(directory).exists():
            raise EngineError(f"CT {vmid}: {directory} exists already")
        rootfs = f"{directory}/rootfs"
        try:
            self._run(["mkdir", "-p", "-m", "0755", rootfs])
            self._run(["chown", f"{IDMAP_BASE}:{IDMAP_BASE}", rootfs])
            # unpacked inside the CT's user namespace: every file gets the mapped owner
            self._run(
                [
                    "lxc-usernsexec",
                    "-m",
                    f"b:0:{IDMAP_BASE}:{IDMAP_SIZE}",
                    "--",
                    "tar",
                    "--numeric-owner",
                    "-xpf",
                    archive,
                    "-C",
                    rootfs,
                    "--exclude=./dev/*",
                ],
                timeout=600,
            )
            self.host_path(f"{directory}/config").write_text(self.lxc_config(vmid, f"dir:{rootfs}"))
            if ssh_public_keys.strip():
                self._write_in_ct(
                    vmid, "root/.ssh/authorized_keys", ssh_public_keys.strip() + "\n", 0o600, 0o700
                )
            self.apply_config(vmid, config)
        except BaseException:
            self._run(["rm", "-rf", "--one-file-system", directory], check=False)
            raise

    def clone(self, source_vmid: int, vmid: int, config: CTConfig) -> None:
        """Linked clone of a template (overlay snapshot of its container); a full clone copies."""
        if self.host_path(f"{NODE_LXC_PATH}/{vmid}").exists():
            raise EngineError(f"LXC container {vmid} already exists")
        linked = (
            ["-s", "-B", "overlayfs"]
            if "base-" in str(config.get("rootfs", "")) or config.get("_linked")
            else []
        )
        self._run(
            ["lxc-copy", "-P", NODE_LXC_PATH, "-n", str(source_vmid), "-N", str(vmid), *linked], timeout=600
        )
        self.apply_config(vmid, config)

    def apply_config(self, vmid: int, config: CTConfig) -> None:
        """The CT's LXC config, written whole as pve-container does at every start: the keys it
        generates (the rootfs is the one the container has: ``lxc-copy`` set it), then the CT's raw
        ``lxc`` entries (whitelisted), last."""
        path = self._config_path(vmid)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise EngineError(f"cannot read {path}: {exc}") from None
        rootfs = ""
        for line in lines:
            key, _, value = (p.strip() for p in line.partition("="))
            if key == "lxc.rootfs.path":
                rootfs = value  # the last one counts (lxc-copy appends its own)
        if not rootfs:
            raise EngineError(f"CT {vmid}: {path} has no lxc.rootfs.path")
        hostname = str(config.get("hostname") or f"CT{vmid}")
        managed = [f"lxc.uts.name = {hostname}"]
        if config.get("net0"):
            managed += ["lxc.net.0.type = veth", "lxc.net.0.flags = up", "lxc.net.0.mtu = 1500"]
            managed += pve_net_lines(vmid, config)
        managed += pve_cgroup_lines(config, self._cgroup, self._memsw)
        managed += env_lines(config)
        raw = [f"{key} = {value}" for key, value in pct_conf.raw_entries(config)]
        base = self.lxc_config(vmid, rootfs).rstrip("\n")
        text = "\n".join([base, MANAGED_MARK, *managed, *([RAW_MARK, *raw] if raw else [])])
        path.write_text(text + "\n", encoding="utf-8")

    def start(self, vmid: int, config: CTConfig) -> str:
        """pve-container's pre-start: config, resolv.conf, network configuration, then the
        hookscript's host key; start."""
        self.apply_config(vmid, config)
        self._write_resolv(vmid, config)
        self._write_in_ct(vmid, "etc/network/interfaces", debian_interfaces(config), 0o644)
        public = self._prepare_rootfs(vmid, config)
        self._lxc("lxc-start", vmid)
        self._lxc("lxc-wait", vmid, "-s", "RUNNING", "-t", "20", timeout=30)
        return public

    def post_start(self, vmid: int, config: CTConfig) -> Published:
        """The node's hookscript, post-start phase, for real in the node (``node_hook``): it writes
        the CT's pids.max and its rootfs disk's IO limits into the nested CT's cgroup and publishes
        what holds. Nothing applied when it fails or the node has no hookscript (PVE: a warning),
        with the reason it published when the node refused the caps (its pids budget)."""
        if not self.host_path(node_hook.SCRIPT).is_file():
            print(f"vm {vmid} - no hookscript {node_hook.SCRIPT} in the node", file=sys.stderr, flush=True)
            return Published()
        for rel, text in node_hook.SHIMS.items():
            shim = self.host_path(f"{node_hook.PERL_DIR}/{rel}")
            if not shim.is_file() or shim.read_text(encoding="utf-8") != text:
                shim.parent.mkdir(parents=True, exist_ok=True)
                shim.write_text(text, encoding="utf-8")
        conf_file = self.host_path(f"{node_hook.CONF_DIR}/{vmid}.json")
        conf_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        conf_file.write_text(
            json.dumps({k: v for k, v in config.items() if isinstance(v, (str, int, float))})
        )
        try:
            argv = self.node_argv(
                ["perl", "-I", node_hook.PERL_DIR, node_hook.SCRIPT, str(vmid), "post-start"]
            )
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
            description = str(json.loads(conf_file.read_text()).get("description", ""))
            if proc.returncode != 0:
                print(
                    f"vm {vmid} - hookscript post-start: {proc.stderr.strip()[-1500:]}",
                    file=sys.stderr,
                    flush=True,
                )
                return Published(refused=published_line(description, REFUSED_PREFIX))
            return Published(applied_of(description))
        finally:
            conf_file.unlink(missing_ok=True)

    def memory_used(self, vmid: int) -> int:
        group = Path("/sys/fs/cgroup/memory") / f"lxc.payload.{self.node_name}" / f"lxc.payload.{vmid}"
        for path in (group / "memory.usage_in_bytes",):
            try:
                return int(path.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
        return 0

    def clone_snapshot(self, source_vmid: int, snapname: str, vmid: int, config: CTConfig) -> None:
        delta = self._snapshots_dir(source_vmid) / snapname / "delta"
        if not delta.is_dir():
            raise EngineError(f"no snapshot {snapname!r} of CT {source_vmid}")
        lower = self._overlay_dirs(source_vmid)[0]
        template = lower.parent.name  # the template whose rootfs is the source's lower layer
        self.clone(int(template), vmid, {**config, "_linked": 1})
        upper = self._overlay_dirs(vmid)[1]
        self._run(["cp", "-a", "--no-target-directory", "--", str(delta), str(upper)])
        ssh = upper / "etc" / "ssh"
        if ssh.is_dir() and not ssh.is_symlink():
            for key in ssh.glob("ssh_host_*"):
                key.unlink()
        machine_id = upper / "etc" / "machine-id"
        if machine_id.is_file() and not machine_id.is_symlink():
            machine_id.write_text("\n")

    # --- files inside a CT ---------------------------------------------------------------------------
    def _overlay_dirs(self, vmid: int) -> tuple[Path, Path, int]:
        """(lower, upper, host uid of CT root) as host paths; a plain ``dir:`` rootfs is both."""
        rootfs = ""
        for line in self._config_path(vmid).read_text(encoding="utf-8").splitlines():
            key, _, value = (p.strip() for p in line.partition("="))
            if key == "lxc.rootfs.path":
                rootfs = value
        m = re.match(r"^(?:overlay|overlayfs):(.+):([^:]+)$", rootfs)
        if m:
            return self.host_path(m.group(1)), self.host_path(m.group(2)), IDMAP_BASE
        if rootfs.startswith("dir:") or rootfs.startswith("/"):
            path = self.host_path(rootfs.removeprefix("dir:"))
            return path, path, IDMAP_BASE
        raise EngineError(f"CT {vmid} has no usable lxc.rootfs.path ({rootfs!r})")

    def _write_in_ct(self, vmid: int, rel: str, text: str, mode: int, dir_mode: int = 0o755) -> None:
        """Write a file into the CT's writable layer, owned by the CT's root (never through a
        symlink the CT could have planted: each component is checked)."""
        upper = self._overlay_dirs(vmid)[1]
        current = upper
        for part in Path(rel).parent.parts:
            current = current / part
            if current.is_symlink():
                raise EngineError(f"CT {vmid}: /{rel} lies under a symlink")
            if not current.exists():
                current.mkdir(mode=dir_mode)
                os.chown(current, IDMAP_BASE, IDMAP_BASE)
        target = upper / rel
        tmp = target.with_name(target.name + ".pve-tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chown(tmp, IDMAP_BASE, IDMAP_BASE)
        os.chmod(tmp, mode)
        tmp.replace(target)

    def _write_resolv(self, vmid: int, config: CTConfig) -> None:
        """PVE writes the CT's resolv.conf from ``nameserver``/``searchdomain`` at start."""
        servers = str(config.get("nameserver") or "").split()
        if not servers:
            return
        lines = [f"nameserver {s}" for s in servers]
        if config.get("searchdomain"):
            lines.insert(0, f"search {config['searchdomain']}")
        upper = self._overlay_dirs(vmid)[1]
        if (upper / "etc" / "resolv.conf").is_symlink():
            (upper / "etc" / "resolv.conf").unlink()
        self._write_in_ct(vmid, "etc/resolv.conf", "\n".join(lines) + "\n", 0o644)

    # --- pve-firewall ----------------------------------------------------------------------------------
    def _node_boot(self) -> str:
        """The node container's init pid: it changes when the node reboots (its tables are gone)."""
        proc = subprocess.run(
            ["lxc-info", "-P", str(self.node_lxc_path), "-n", self.node_name, "-p", "-H"],
            capture_output=True,
            text=True,
            check=False,
        )
        return proc.stdout.strip()

    def apply_firewall(self, text: str) -> None:
        """Load the compiled firewall (``pvefw.render``) into the node in one transaction: when it
        changed, or when the node rebooted since the last load (pve-firewall compiles at boot)."""
        boot = self._node_boot()
        if text == self.firewall_text and boot == self._firewall_boot:
            return
        if not boot:
            return  # the node is down: nothing runs there to filter; loaded at its next change
        self._run_input(["nft", "-f", "-"], text)
        self.firewall_text, self._firewall_boot = text, boot

    def bridge_of(self, config: Mapping[str, Any]) -> str:
        return parse_kv(str(config.get("net0", ""))).get("bridge", "")

    # --- /etc/pve/lxc/<vmid>.conf (pmxcfs) --------------------------------------------------------------
    def config_file(self, node: str, vmid: int | str) -> Path:
        """Host path of the CT's config file in the node (``/etc/pve/lxc`` links to it, as on PVE)."""
        return self.host_path(f"/etc/pve/nodes/{node}/lxc/{vmid}.conf")

    def _ensure_pve_dirs(self, node: str) -> Path:
        folder = self.config_file(node, 0).parent
        if not folder.is_dir():
            folder.mkdir(parents=True, mode=0o755)
        link = self.host_path("/etc/pve/lxc")
        if not link.is_symlink() and not link.exists():
            link.symlink_to(f"nodes/{node}/lxc")
        return folder

    @staticmethod
    def _signature(path: Path) -> tuple[int, int, int] | None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def sync_config_files(self, cts: dict[str, dict[str, Any]], node: str) -> bool:
        """Read back the raw ``lxc.*`` lines of every CT file root changed since it was written (the
        whitelist applied, refused keys logged and dropped, as pve-container's parser does), then
        write every CT's file from ``cts``. True if a CT's raw entries changed. Root's edits of other
        options in the file are not read (only the API changes those here)."""
        if not (self.node_root / "etc").is_dir():
            return False  # no node (yet): nothing holds the files
        folder = self._ensure_pve_dirs(node)
        ours = {key: ct for key, ct in cts.items() if ct.get("node") == node}
        changed = False
        for key, ct in ours.items():
            path = folder / f"{key}.conf"
            signature = self._signature(path)
            if signature is None or signature == self._file_signatures.get(path.name):
                continue
            entries, warnings = pct_conf.parse_raw(path.read_text(encoding="utf-8", errors="replace"))
            self.refused_keys[int(key)] = [w.split(":", 1)[0] for w in warnings]
            for warning in warnings:
                print(f"vm {key} - {warning}", file=sys.stderr, flush=True)
            conf = ct["config"]
            if entries != list(conf.get("lxc") or []):
                if entries:
                    conf["lxc"] = entries
                else:
                    conf.pop("lxc", None)
                changed = True
            self._file_signatures[path.name] = signature
        for key, ct in ours.items():
            path = folder / f"{key}.conf"
            text = pct_conf.render(ct["config"], ct.get("snapshots"))
            signature = self._signature(path)
            if signature is not None and signature != self._file_signatures.get(path.name):
                continue  # root wrote it just now: read at the next sync, never overwritten unread
            if signature is None or path.read_text(encoding="utf-8", errors="replace") != text:
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_text(text, encoding="utf-8")
                os.chown(tmp, 0, WWW_DATA_GID)
                tmp.chmod(0o640)
                tmp.replace(path)
            self._file_signatures[path.name] = self._signature(path) or (0, 0, 0)
        for path in folder.glob("*.conf"):
            if path.stem.isdigit() and path.stem not in ours:
                path.unlink(missing_ok=True)
                self._file_signatures.pop(path.name, None)
        return changed
