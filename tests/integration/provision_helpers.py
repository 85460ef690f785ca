"""Helpers for the provisioning tests: run site.yml, parse its recap, make throwaway LXC clones.

Network safety: everything here talks only to loopback, the sandbox bridge the roles made and
network namespaces the tests make themselves; nothing is routed off the machine.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import shlex
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import paramiko

from sandbox_rt.backends.lxc.netstate import NetState, SandboxNet
from sandbox_rt.config import Settings
from sandbox_rt.errors import SandboxError
from sandbox_rt.ipam import mac_for_ip
from sandbox_rt.manager import Manager

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
INVENTORY = REPO / "inventories" / "local"
HOST_JSON = Path("/etc/sandbox_rt/host.json")
NFT_FILE = Path("/etc/sandbox_rt/nftables.nft")
DNSMASQ_LEASES = Path("/var/lib/sandbox_rt/dnsmasq/leases")

RECAP_LINE = re.compile(r"^(?P<host>\S+)\s*:\s*(?P<counts>(?:\w+=\d+\s*)+)$")


@dataclass
class PlaybookRun:
    args: list[str]
    returncode: int
    output: str
    recap: dict[str, dict[str, int]]
    seconds: float

    def total(self, key: str) -> int:
        return sum(counts.get(key, 0) for counts in self.recap.values())

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def parse_recap(output: str) -> dict[str, dict[str, int]]:
    """The PLAY RECAP block as {host: {"ok": n, "changed": n, "failed": n, ...}}."""
    recap: dict[str, dict[str, int]] = {}
    in_recap = False
    for line in output.splitlines():
        if line.startswith("PLAY RECAP"):
            in_recap = True
            continue
        if in_recap:
            match = RECAP_LINE.match(line.strip())
            if match:
                recap[match["host"]] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match["counts"])}
            elif line.strip() and recap:
                break
    return recap


def run_playbook(
    *extra: str, timeout: float = 1800, inventory: Path = INVENTORY, env: Mapping[str, str] | None = None
) -> PlaybookRun:
    """`ansible-playbook -i INVENTORY site.yml EXTRA...` from the repository root (inventories/local
    unless told), with ``env`` added to this process's environment."""
    args = [str(ANSIBLE_PLAYBOOK), "-i", str(inventory), "site.yml", *extra]
    environ = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", **(env or {}))
    start = time.monotonic()
    proc = subprocess.run(
        args, cwd=REPO, env=environ, capture_output=True, text=True, timeout=timeout, check=False
    )
    output = proc.stdout + proc.stderr
    return PlaybookRun(args, proc.returncode, output, parse_recap(proc.stdout), time.monotonic() - start)


def ensure_provisioned() -> dict[str, object]:
    """The host settings; provisions the host first if the runner has not done it yet."""
    settings = _settings()
    template = Path(str(settings.get("lxc_path", ""))) / str(settings.get("template", "")) / "config"
    if not HOST_JSON.exists() or not template.exists():
        run = run_playbook()
        assert run.returncode == 0, f"site.yml failed:\n{run.tail()}"
        settings = _settings()
    return settings


def _settings() -> dict[str, object]:
    return json.loads(HOST_JSON.read_text()) if HOST_JSON.exists() else {}


def sh(*cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{shlex.join(cmd)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def tcp_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def used_addresses(lxc_path: Path) -> set[str]:
    used = set()
    for config in lxc_path.glob("*/config"):
        for line in config.read_text(errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "lxc.net.0.ipv4.address":
                used.add(value.strip().split("/")[0])
    return used


@dataclass
class Clone:
    """A throwaway overlay clone of the template, started with a static address."""

    name: str
    address: str
    port: str
    lxc_path: Path
    settings: dict[str, object]

    @property
    def delta(self) -> Path:
        return self.lxc_path / self.name / "overlay" / "delta"

    def host_key(self) -> paramiko.PKey:
        """The clone's ed25519 host key, read from its overlay (a channel we trust, not the network)."""
        pub = self.delta / "etc" / "ssh" / "ssh_host_ed25519_key.pub"
        wait_for(lambda: pub.exists() and pub.stat().st_size > 0, 10, f"{pub}")
        key_type, key_b64 = pub.read_text().split()[:2]
        assert key_type == "ssh-ed25519", key_type
        return paramiko.Ed25519Key(data=base64.b64decode(key_b64))

    def client(
        self, user: str | None = None, key_file: str | None = None, **kwargs: object
    ) -> paramiko.SSHClient:
        """A paramiko client with the host key pinned and RejectPolicy (never AutoAddPolicy)."""
        client = paramiko.SSHClient()
        client.get_host_keys().add(self.address, "ssh-ed25519", self.host_key())
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        connect_args: dict[str, object] = {
            "username": user or str(self.settings["ssh_user"]),
            "key_filename": key_file or str(self.settings["ssh_key"]),
            "look_for_keys": False,
            "allow_agent": False,
            "timeout": 10,
            "banner_timeout": 10,
            "auth_timeout": 10,
        }
        connect_args.update(kwargs)
        client.connect(self.address, **connect_args)  # type: ignore[arg-type]
        return client

    def run(self, client: paramiko.SSHClient, command: str, timeout: float = 30) -> tuple[int, str, str]:
        _, stdout, stderr = client.exec_command(command, timeout=timeout)
        out = stdout.read().decode()
        err = stderr.read().decode()
        return stdout.channel.recv_exit_status(), out, err


def _diagnose(clone: Clone) -> str:
    """What the host and the clone see, for a clone whose sshd never answered."""
    probes = [
        ["lxc-info", "-P", str(clone.lxc_path), "-n", clone.name],
        ["ip", "neigh", "show", clone.address],
        ["ip", "-br", "link", "show", clone.port],
        ["lxc-attach", "-P", str(clone.lxc_path), "-n", clone.name, "--", "sh", "-c", "ip -br addr; ps -e"],
    ]
    out = []
    for argv in probes:
        proc = sh(*argv, check=False, timeout=10)
        out.append(f"$ {shlex.join(argv)}\n{proc.stdout}{proc.stderr}")
    return "\n".join(out)


@contextlib.contextmanager
def template_clone(
    settings: dict[str, object], address: str | None = None, static: bool = True
) -> Iterator[Clone]:
    """Clone the template (lxc-copy -s -B overlayfs), start it, and ALWAYS stop and destroy it."""
    lxc_path = Path(str(settings["lxc_path"]))
    suffix = secrets.token_hex(4)
    name = f"sbxtest-{suffix}"
    port = f"sbxt{suffix}"  # the host side of the veth: "sbx*" like every sandbox port
    if address is None and static:
        used = used_addresses(lxc_path)
        candidates = [f"10.99.250.{n}" for n in range(2, 255) if f"10.99.250.{n}" not in used]
        address = secrets.choice(candidates)
    prefix = str(settings["network_cidr"]).split("/")[1]
    clone = Clone(name, address or "", port, lxc_path, settings)
    # Like the runtime, bind the port to its MAC and address first (the bridge table passes nothing
    # else from an sbx* port, ARP included); the binding goes again at the end.
    netstate = NetState(Settings.load())
    binding = f"sbx-{suffix}00"  # a sandbox-like id of its own (no sandbox of the runtime has it)
    try:
        if static:
            netstate.apply(SandboxNet(binding, str(address), port=port, mac=mac_for_ip(str(address))))
        sh(
            "lxc-copy",
            "-P",
            str(lxc_path),
            "-n",
            str(settings["template"]),
            "-N",
            name,
            "-s",
            "-B",
            "overlayfs",
        )
        lines = [f"lxc.net.0.veth.pair = {port}"]
        if static:
            lines += [
                f"lxc.net.0.ipv4.address = {address}/{prefix}",
                f"lxc.net.0.ipv4.gateway = {settings['gateway']}",
                # the runtime's MAC for this address: a reused address never meets a stale ARP entry
                f"lxc.net.0.hwaddr = {mac_for_ip(str(address))}",
            ]
        with open(lxc_path / name / "config", "a") as config:
            config.write("\n".join(lines) + "\n")
        sh("lxc-start", "-P", str(lxc_path), "-n", name)
        # Like the runtime, give the sandbox its own name in /etc/hosts (it has no DNS without internet).
        sh(
            "lxc-attach",
            "-P",
            str(lxc_path),
            "-n",
            name,
            "--",
            "sh",
            "-c",
            f"echo '127.0.1.1 {name}' >> /etc/hosts",
        )
        if static:
            try:
                wait_for(lambda: tcp_open(clone.address, 22), 15, f"sshd on {clone.address}:22")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{_diagnose(clone)}") from None
        yield clone
    finally:
        sh("lxc-stop", "-P", str(lxc_path), "-n", name, "-k", check=False)
        sh("lxc-destroy", "-P", str(lxc_path), "-n", name, check=False)
        netstate.remove(binding, address)
        if (lxc_path / name).exists():
            raise AssertionError(f"{lxc_path / name} survived lxc-destroy")


def destroy_labelled(mgr: Manager, *label_sets: Mapping[str, str]) -> None:
    """Destroy every sandbox of ``mgr`` that carries all of one of ``label_sets``:
    what a failed test left behind. One that fails to go is left to the next sweep."""
    for labels in label_sets:
        for record in mgr.list(labels=dict(labels)):
            with contextlib.suppress(SandboxError):
                mgr.destroy(record.id)
