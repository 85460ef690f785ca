"""Node engine: every PVE CT is a real, unprivileged LXC container *inside* an emulated PVE node
(``tests/pve_node``: a privileged Debian 12 system container with systemd, LXC and the node's own
vmbr1, dnsmasq and nftables). What PVE itself does on a node, this engine does there:

* storage ``local`` is the node's ``/var/lib/vz`` (uploads land in ``template/cache/``);
* create from ``ostemplate``: the vztmpl tarball is unpacked inside the node into
  ``/var/lib/lxc/<vmid>/rootfs``, shifted into the CT's id range (container root = node uid
  100000, as PVE's unprivileged CTs), root's ``authorized_keys`` from ``ssh-public-keys``;
* the LXC container is named by its VMID (``pct`` and PVE's own tools find it so); its config is
  what pve-container generates for an unprivileged CT: ``common.conf`` + ``userns.conf``, the id
  map, ``veth<vmid>i0`` on the ``net0`` bridge (static IPv4 set by LXC), cgroup limits; init is the
  template's ``/sbin/init``;
* a linked clone of a template is ``lxc-copy -s -B overlayfs`` of the template's container (the
  template's rootfs is the lower layer, as PVE's linked clones share the base volume);
* pve-firewall: the datacenter, CT options and rules are compiled into one nftables table in the
  node (``pvefw.py``), reloaded atomically whenever any of them changes;
* the host-key hookscript (pre-start) is emulated as in the LXC engine.

Commands run in the node through ``lxc-attach`` (about 9 ms each, measured); files are read and
written through the node's root filesystem on this machine (the node is privileged, its ids are
the host's). The engine's own paths (``lxc_path``, overlay dirs) are host paths into that rootfs;
:meth:`_run` turns them into node paths.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .ctconfig import parse_kv
from .engine import CTConfig, EngineError
from .engine_lxc import LxcEngine, cgroup_lines, net_lines

NODE_LXC_PATH = "/var/lib/lxc"  # inside the node, as on PVE
NODE_STORAGE = {"local": "/var/lib/vz"}  # PVE's default directory storage
IDMAP_BASE = 100000
IDMAP_SIZE = 65536
NFT_TABLE = "pve-firewall-emu"
_NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class NodeEngine(LxcEngine):
    name = "node"

    def __init__(self, node_lxc_path: Path, node_name: str, timeout: float = 120.0) -> None:
        self.node_lxc_path = node_lxc_path
        self.node_name = node_name
        self.node_root = self._read_node_rootfs()
        super().__init__(self.host_path(NODE_LXC_PATH), template="", prefix="", timeout=timeout)
        self.firewall_text = ""  # what was loaded last (tests read it)
        self._firewall_boot = ""

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
        path = self._config_path(vmid)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise EngineError(f"cannot read {path}: {exc}") from None
        managed_keys = ("lxc.uts.name", "lxc.net.0.", "lxc.cgroup", "# managed by")
        kept = [ln for ln in lines if not ln.strip().startswith(managed_keys)]
        if config.get("net0"):
            kept += ["lxc.net.0.type = veth", "lxc.net.0.flags = up", "lxc.net.0.mtu = 1500"]
        hostname = str(config.get("hostname") or f"CT{vmid}")
        managed = [f"lxc.uts.name = {hostname}", *net_lines(vmid, config)]
        managed += cgroup_lines(config, self._cgroup, self._memsw)
        path.write_text(
            "\n".join([*kept, "# managed by the PVE test server", *managed]) + "\n", encoding="utf-8"
        )

    def start(self, vmid: int, config: CTConfig) -> str:
        """pve-container's pre-start: config, resolv.conf, then the hookscript's host key; start."""
        self.apply_config(vmid, config)
        self._write_resolv(vmid, config)
        public = self._prepare_rootfs(vmid, config)
        self._lxc("lxc-start", vmid)
        self._lxc("lxc-wait", vmid, "-s", "RUNNING", "-t", "20", timeout=30)
        return public

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
