"""An emulated Proxmox VE node: a privileged Debian 12 system container (systemd as PID 1) that
nests unprivileged LXC sandboxes, plus the PVE API test server standing in for pveproxy/pvedaemon.

``start`` makes what is missing and boots it (a second ``start`` of a running node does nothing);
``reboot`` stops and starts the container, keeping its disk (what ``site.yml`` made must come back
by itself); ``stop`` removes everything: API server, container, host wiring, keys (the cached
tarball stays, it is a cache).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import paramiko

from . import hostnet, rootfs
from .spec import NodeSpec

REPO = Path(__file__).resolve().parents[2]
BOOT_TIMEOUT_S = 120.0


def _port_free(port: int) -> bool:
    """Whether the API server could bind ``port`` now (it reuses addresses: TIME_WAIT is fine)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _mac(ip: str) -> str:
    return "02:00:" + ":".join(f"{int(octet):02x}" for octet in ip.split("."))


def lxc_config(spec: NodeSpec) -> str:
    """The node container: privileged (PVE runs on the host), systemd as init, nesting allowed,
    cgroups writable (the nested CTs get their own), two veths (management, uplink)."""
    return "\n".join(
        [
            "# Emulated PVE node (tests/pve_node): a privileged system container that nests LXC.",
            f"lxc.uts.name = {spec.name}",
            "lxc.arch = linux64",
            f"lxc.rootfs.path = dir:{spec.rootfs}",
            "lxc.include = /usr/share/lxc/config/common.conf",
            "lxc.include = /usr/share/lxc/config/nesting.conf",
            # nesting.conf names an AppArmor profile; the build machines have no AppArmor.
            "lxc.apparmor.profile = unconfined",
            "lxc.init.cmd = /sbin/init",
            "lxc.signal.halt = SIGRTMIN+3",
            "lxc.mount.auto = proc:mixed sys:mixed cgroup:rw:force",
            # A PVE host's /proc/sys is writable; here /proc/sys/user is (proc:mixed keeps the rest
            # read-only, so nothing in the node changes this machine's global sysctls). The sandboxes'
            # CT setup hook writes user.max_user_namespaces there, which the kernel applies to the
            # writer's own user namespace: the CT's, never the node's (template_build's
            # sandbox-rt-pve-ct-setup, SBX-ESC-14).
            "lxc.mount.entry = /proc/sys/user proc/sys/user none bind,rw 0 0",
            # The runtime (its package and the .venv it is installed in: the node is Debian 12 like
            # this machine) at the same paths, read-only: the runtime's services run from them in
            # the node (tests/integration/test_services.py), as from an installed package on a real
            # host. Only these two: the rest of the repository's path stays the node's own (Ansible
            # makes its remote tmp there in the molecule scenarios).
            *(
                f"lxc.mount.entry = {REPO / sub} {str(REPO / sub).lstrip('/')} none bind,ro,create=dir 0 0"
                for sub in (".venv", "sandbox_rt")
            ),
            "lxc.autodev = 1",
            "lxc.tty.max = 1",
            "lxc.pty.max = 64",
            "lxc.start.auto = 0",
            "lxc.net.0.type = veth",
            f"lxc.net.0.veth.pair = {spec.mgmt_if}",
            "lxc.net.0.name = eth0",
            f"lxc.net.0.hwaddr = {_mac(spec.mgmt_node_ip)}",
            "lxc.net.0.flags = up",
            "lxc.net.1.type = veth",
            f"lxc.net.1.veth.pair = {spec.wan_if}",
            "lxc.net.1.name = eth1",
            f"lxc.net.1.hwaddr = {_mac(spec.wan_node_ip)}",
            "lxc.net.1.flags = up",
            "",
        ]
    )


class PVENode:
    """One emulated node (see the module docstring). All methods need root."""

    def __init__(self, spec: NodeSpec | None = None) -> None:
        self.spec = spec or NodeSpec()

    # --- container ----------------------------------------------------------------------------
    def _lxc(
        self, tool: str, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return hostnet.run(
            tool, "-P", str(self.spec.lxc_path), "-n", self.spec.name, *args, check=check, timeout=timeout
        )

    def exists(self) -> bool:
        return (self.spec.lxc_path / self.spec.name / "config").is_file()

    def running(self) -> bool:
        return self.exists() and self._lxc("lxc-info", "-s", "-H", check=False).stdout.strip() == "RUNNING"

    def attach(self, *cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a command as root in the node (lxc-attach; for what the node's own root would do)."""
        return self._lxc("lxc-attach", "--clear-env", "--", *cmd, check=check, timeout=timeout)

    def create(self) -> None:
        """Extract and customise the rootfs, write the container config (once per node)."""
        spec = self.spec
        tarball = rootfs.build_tarball(spec)
        container = spec.lxc_path / spec.name
        shutil.rmtree(container, ignore_errors=True)  # a half-made earlier attempt
        container.mkdir(parents=True, mode=0o700)
        rootfs.extract(tarball, spec.rootfs)
        public = rootfs.customize(spec)
        ip = spec.mgmt_node_ip
        spec.known_hosts.write_text(f"{ip} {' '.join(public.split()[:2])}\n")
        spec.known_hosts.chmod(0o600)
        home_ssh = spec.ansible_home / ".ssh"
        home_ssh.mkdir(parents=True, exist_ok=True, mode=0o700)
        shutil.copyfile(spec.known_hosts, home_ssh / "known_hosts")
        (container / "config").write_text(lxc_config(spec))

    def start(self) -> None:
        """Create if needed, boot, wire the host side, wait until systemd finished booting and SSH
        answers with the pinned key. Idempotent."""
        if not self.exists():
            self.create()
        if not self.running():
            self._lxc("lxc-start")
            self._lxc("lxc-wait", "-s", "RUNNING", "-t", "30", timeout=40)
        hostnet.wire(self.spec)
        self.wait_booted()
        self.write_info()

    def wait_booted(self, timeout: float = BOOT_TIMEOUT_S) -> str:
        """Wait for systemd's boot to end; returns its state. ``degraded`` (a failed unit) is an error."""
        deadline = time.monotonic() + timeout
        state = ""
        # Right after lxc-start systemd may not answer on its socket yet (empty output): poll.
        while state not in ("running", "degraded", "maintenance", "stopping", "offline"):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
            state = self.attach("systemctl", "is-system-running", check=False).stdout.strip()
        if state != "running":
            failed = self.attach("systemctl", "--failed", "--no-legend", "--plain", check=False).stdout
            raise RuntimeError(f"node {self.spec.name} booted {state or 'nowhere'}; failed units:\n{failed}")
        deadline = time.monotonic() + 30
        while True:
            try:
                self.ssh("true")
                return state
            except (OSError, paramiko.SSHException) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"node {self.spec.name}: SSH to {self.spec.mgmt_node_ip} failed: {exc}"
                    ) from exc
                time.sleep(0.2)

    def reboot(self) -> None:
        """Clean shutdown (systemd's halt signal), then start: the disk stays, the veths are new."""
        if self.running():
            self._lxc("lxc-stop", "-t", "60", timeout=90)
        self.start()

    def stop(self) -> list[str]:
        """Remove the node and everything of it (API server, container, wiring, keys). Returns the
        objects that had to be removed, for a report."""
        removed: list[str] = []
        if self.api_stop():
            removed.append("api server")
        if self.exists():
            if self.running():
                self._lxc("lxc-stop", "-k", check=False)
            self._lxc("lxc-destroy", "-f", check=False, timeout=300)
            removed.append(f"container {self.spec.name}")
        removed += hostnet.remove(self.spec)
        if self.spec.home.exists():
            shutil.rmtree(self.spec.home)
            removed.append(str(self.spec.home))
        with contextlib.suppress(OSError):  # the nodes' common directory, once no node is left
            self.spec.state_root.rmdir()
        return removed

    def leftovers(self) -> list[str]:
        """What of the node exists on this machine now (empty after :meth:`stop`)."""
        out = hostnet.leftovers(self.spec)
        if self.spec.home.exists():
            out.append(str(self.spec.home))
        return out

    # --- SSH (pinned host key, never AutoAdd) ------------------------------------------------------
    def client(self) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        client.load_host_keys(str(self.spec.known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(
            self.spec.mgmt_node_ip,
            username="root",
            key_filename=str(self.spec.ssh_key),
            look_for_keys=False,
            allow_agent=False,
            timeout=5,
            banner_timeout=5,
            auth_timeout=5,
        )
        return client

    def ssh(self, command: str, timeout: float = 60) -> str:
        """Run ``command`` as root on the node over SSH; its stdout, or RuntimeError with the tail."""
        with contextlib.closing(self.client()) as client:
            _in, out, err = client.exec_command(command, timeout=timeout)
            stdout, stderr = out.read().decode(), err.read().decode()
            code = out.channel.recv_exit_status()
        if code != 0:
            raise RuntimeError(f"node {self.spec.name}: {command!r} -> {code}: {stderr.strip()[-2000:]}")
        return stdout

    # --- the PVE API (test server) -------------------------------------------------------------------
    @property
    def api_pidfile(self) -> Path:
        return self.spec.api_dir / "server.pid"

    def api_running(self) -> bool:
        try:
            pid = int(self.api_pidfile.read_text())
        except (OSError, ValueError):
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return Path(f"/proc/{pid}/cmdline").read_bytes().find(b"pve_testserver") >= 0

    def api_start(self, timeout: float = 60, extra_nodes: Sequence[str] = ()) -> dict[str, Any]:
        """Start the PVE API test server for this node (node engine) in the background, unless it
        runs; returns its info (url, ca_file, token_id ...). Its state survives restarts.

        ``extra_nodes``: more PVE node names the server serves, all backed by this one node container
        (a cluster whose nodes share one machine: each node's CTs are its own, by name and VMID)."""
        api = self.spec.api_dir
        info_file = api / "info.json"
        if self.api_running():
            return dict(json.loads(info_file.read_text()))
        api.mkdir(parents=True, exist_ok=True, mode=0o700)
        # A restarted server keeps its port when it is free: the host contract site.yml wrote names it.
        port = 0
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            port = int(json.loads(info_file.read_text())["port"])
        if port and not _port_free(port):
            port = 0
        info_file.unlink(missing_ok=True)
        log = open(api / "server.log", "ab")  # noqa: SIM115 (the child keeps it)
        cmd = [
            sys.executable,
            "-m",
            "pve_testserver",
            "--engine",
            "node",
            "--nodes",
            ",".join([self.spec.name, *extra_nodes]),
            "--node-lxc-path",
            str(self.spec.lxc_path),
            "--state",
            str(api / "state.json"),
            "--tls-dir",
            str(api / "tls"),
            "--bootstrap-token-file",
            str(api / "root.token"),
            "--info-file",
            str(info_file),
            "--port",
            str(port),
        ]
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=log, start_new_session=True)
        log.close()
        self.api_pidfile.write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + timeout
        while not info_file.is_file():
            if proc.poll() is not None:
                tail = (api / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the PVE API test server exited ({proc.returncode}):\n{tail}")
            if time.monotonic() > deadline:
                proc.terminate()
                raise RuntimeError("the PVE API test server did not start in time")
            time.sleep(0.05)
        return dict(json.loads(info_file.read_text()))

    def api_stop(self) -> bool:
        """Stop the API server this helper started (by its pid file); True if one ran."""
        if not self.api_running():
            self.api_pidfile.unlink(missing_ok=True)
            return False
        pid = int(self.api_pidfile.read_text())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.05)
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)
        self.api_pidfile.unlink(missing_ok=True)
        return True

    # --- facts for other processes ---------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "name": spec.name,
            "running": self.running(),
            "address": spec.mgmt_node_ip,
            "controller_address": spec.mgmt_host_ip,
            "ssh_key": str(spec.ssh_key),
            "known_hosts": str(spec.known_hosts),
            "ansible_home": str(spec.ansible_home),
            "sandbox_cidr": spec.sandbox_cidr,
            "sandbox_gateway": spec.sandbox_gateway,
            "sandbox_dhcp_range": list(spec.sandbox_dhcp_range),
            "sandbox_pool": list(spec.sandbox_pool),
            "wan_netns": spec.wan_netns,
            "wan_gateway": spec.wan_gateway_ip,
            "uplink": "eth1",
            "api_dir": str(spec.api_dir),
            "lxc_path": str(spec.lxc_path),
        }

    def write_info(self) -> None:
        path = self.spec.home / "node.json"
        path.write_text(json.dumps(self.info(), indent=1) + "\n")
