"""The raw engine and the raw tools: what a sandbox costs without the runtime.

- :class:`RawLxc`: ``lxc-copy -s -B overlayfs`` of the same template + static IP + ``lxc-start``, then
  the first TCP connect to :22; ``lxc-stop -k`` + ``lxc-destroy``. Containers are named
  ``rawbench-<pid>-<n>`` (the product only ever makes ``sbx-<10 hex>``, so its gc never sees them)
  and take addresses 10.99.0.10-99 of the sandbox network: outside the runtime's pool
  (10.99.1.0-) and below dnsmasq's DHCP range (.100-.250).
- :class:`OpenSSH`: the system ``ssh``/``sftp``/``scp`` with the runtime's key, the sandbox user and
  the pinned host key (a temporary known_hosts file, ``StrictHostKeyChecking=yes``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from sandbox_rt import Settings
from sandbox_rt.ipam import mac_for_ip

__all__ = ["PVE_PREFIX", "RAW_PREFIX", "OpenSSH", "RawLxc", "wait_port"]

RAW_PREFIX = "rawbench-"
PVE_PREFIX = "pvebench-"  # the containers of the benchmark's own PVE test server (benchmarks.pve)
_RAW_HOSTS = range(10, 100)  # host numbers in the sandbox network (see the module docstring)
PORT_POLL_S = 0.002  # the same interval the runtime polls a booting sandbox's sshd with


def wait_port(ip: str, port: int = 22, timeout: float = 20.0, interval: float = PORT_POLL_S) -> None:
    """Return once ``ip:port`` accepts a TCP connection."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((ip, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(interval)  # polling a booting container's port


def _run(cmd: list[str], timeout: float = 60) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")


class RawLxc:
    """Raw LXC containers, cloned from the runtime's template; thread-safe."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.path = settings.lxc_path
        self.prefixlen = settings.network.prefixlen
        self._lock = threading.Lock()
        self._taken: set[str] = set()
        self._seq = 0
        net = settings.network
        pool = (ipaddress.IPv4Address(settings.ip_pool_start), ipaddress.IPv4Address(settings.ip_pool_end))
        reserved = {settings.gateway, settings.dns_server}
        self._candidates = [
            str(a)
            for a in (net.network_address + n for n in _RAW_HOSTS)
            if a in net and not pool[0] <= a <= pool[1] and str(a) not in reserved
        ]

    # -- names and addresses ---------------------------------------------------------------------
    def new_name(self) -> str:
        with self._lock:
            self._seq += 1
            return f"{RAW_PREFIX}{os.getpid()}-{self._seq}"

    def _addresses_in_configs(self) -> set[str]:
        used: set[str] = set()
        for cfg in self.path.glob("*/config"):
            with contextlib.suppress(OSError):
                for line in cfg.read_text().splitlines():
                    key, sep, value = line.partition("=")
                    if sep and key.strip() == "lxc.net.0.ipv4.address":
                        used.add(value.strip().split("/")[0])
        return used

    @contextlib.contextmanager
    def address(self) -> Iterator[str]:
        """A free raw address for the duration of the block."""
        with self._lock:
            used = self._addresses_in_configs() | self._taken
            free = [a for a in self._candidates if a not in used]
            if not free:
                raise RuntimeError("no free raw benchmark address (10.99.0.10-99)")
            ip = free[0]
            self._taken.add(ip)
        try:
            yield ip
        finally:
            with self._lock:
                self._taken.discard(ip)

    # -- the engine ------------------------------------------------------------------------------
    def clone_start(self, name: str, ip: str) -> None:
        """lxc-copy + static address + lxc-start (returns when lxc-start does)."""
        p = str(self.path)
        _run(["lxc-copy", "-P", p, "-n", self.s.template, "-N", name, "-s", "-B", "overlayfs"])
        with (self.path / name / "config").open("a") as fh:
            fh.write(
                f"lxc.net.0.ipv4.address = {ip}/{self.prefixlen}\n"
                f"lxc.net.0.ipv4.gateway = {self.s.gateway}\nlxc.net.0.hwaddr = {mac_for_ip(ip)}\n"
            )
        _run(["lxc-start", "-P", p, "-n", name])

    def create(self, name: str, ip: str) -> None:
        """The raw baseline of create: clone, start, first TCP connect to :22."""
        self.clone_start(name, ip)
        wait_port(ip)

    def destroy(self, name: str) -> None:
        """The raw baseline of destroy: lxc-stop -k + lxc-destroy."""
        p = str(self.path)
        _run(["lxc-stop", "-P", p, "-n", name, "-k"])
        _run(["lxc-destroy", "-P", p, "-n", name])

    def remove(self, name: str) -> None:
        """Best-effort removal (cleanup paths): whatever state the container is in."""
        if not name.startswith((RAW_PREFIX, PVE_PREFIX)) or not (self.path / name).exists():
            return
        p = str(self.path)
        subprocess.run(["lxc-stop", "-P", p, "-n", name, "-k"], capture_output=True, timeout=60)
        subprocess.run(["lxc-destroy", "-P", p, "-n", name], capture_output=True, timeout=60)

    def host_key(self, name: str) -> str:
        """The public host key the container's init wrote (read from the host, a trusted channel)."""
        upper = None
        for line in (self.path / name / "config").read_text().splitlines():
            key, _, value = (x.strip() for x in line.partition("="))
            if key == "lxc.rootfs.path":
                upper = Path(value.rsplit(":", 1)[1])
        if upper is None:
            raise RuntimeError(f"{name} has no overlay rootfs")
        return (upper / "etc/ssh/ssh_host_ed25519_key.pub").read_text().strip()

    def mine(self) -> list[str]:
        return sorted(d.name for d in self.path.glob(f"{RAW_PREFIX}{os.getpid()}-*"))

    def sweep(self, *, stale_pve: bool = False) -> list[str]:
        """Remove this process's raw containers and those of benchmark runs that died (with
        ``stale_pve``, also containers a killed run's PVE test server left)."""
        removed = []
        prefixes = (RAW_PREFIX, PVE_PREFIX) if stale_pve else (RAW_PREFIX,)
        for d in sorted(p for prefix in prefixes for p in self.path.glob(f"{prefix}*")):
            pid = d.name.split("-")[1]
            mine = d.name.startswith(RAW_PREFIX) and pid == str(os.getpid())
            if pid.isdigit() and (mine or not Path(f"/proc/{pid}").exists()):
                self.remove(d.name)
                removed.append(d.name)
        return removed


class OpenSSH:
    """OpenSSH's client tools against one container, host key pinned from a trusted channel."""

    def __init__(self, ip: str, host_key: str, key: Path, user: str, tmp: Path) -> None:
        self.ip = ip
        self.target = f"{user}@{ip}"
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.known_hosts = tmp / "known_hosts"
        self.known_hosts.write_text(f"{ip} {host_key}\n")
        self.control = tmp / "ctl"
        self.opts = [
            "-i",
            str(key),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-F",
            "/dev/null",
        ]
        self.mux = ["-o", f"ControlPath={self.control}"]

    def ssh(self, *command: str, mux: bool = False) -> list[str]:
        return ["ssh", *self.opts, *(self.mux if mux else []), self.target, *command]

    @contextlib.contextmanager
    def master(self) -> Iterator[None]:
        """A ControlMaster connection for the block (commands with ``mux=True`` reuse it)."""
        persist = ["-o", "ControlMaster=yes", "-o", "ControlPersist=120", "-fN"]
        _run(["ssh", *self.opts, *self.mux, *persist, self.target])
        try:
            yield
        finally:
            subprocess.run(["ssh", *self.opts, *self.mux, "-O", "exit", self.target], capture_output=True)

    def sftp_batch(self, lines: list[str], mux: bool = True) -> list[str]:
        batch = self.tmp / f"batch-{abs(hash(tuple(lines)))}"
        batch.write_text("".join(f"{line}\n" for line in lines))
        return ["sftp", "-q", "-b", str(batch), *self.opts, *(self.mux if mux else []), self.target]

    def scp(self, src: str, dst: str, mux: bool = True) -> list[str]:
        return ["scp", "-q", *self.opts, *(self.mux if mux else []), src, dst]

    def remote(self, path: str) -> str:
        return f"{self.target}:{path}"
