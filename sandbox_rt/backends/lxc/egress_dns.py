"""The DNS of a sandbox whose egress allow-list has domain names: its own small resolver.

One dnsmasq shared by every sandbox cannot answer per client, so each such sandbox gets its own
instance (``netstate.py`` decides when; this module only writes, starts and stops them):

- it listens on the bridge address (``settings.dns_server``) on one port of
  ``egress_dns_port_min..max``; the role's nat chain DNATs that sandbox's DNS (udp and tcp 53 to the
  bridge address) to the port through the map ``dns_resolvers`` (sandbox address -> port), and its
  input chain accepts only DNS that was DNATed so, so no sandbox reaches another one's resolver;
- ``no-resolv`` and one ``server=/<name>/<bridge address>#53`` line per allowed name: only those
  names (and their subdomains) are forwarded, to the host's shared dnsmasq and from there upstream;
  every other name is answered REFUSED at once and never leaves the host;
- ``cache-size=0`` and one ``nftset=/<name>/...#egress_<hex>_dns`` line per name, so every answer
  for a listed name lands in that sandbox's own set (and in no other sandbox's).

Its configuration lives beside the sandbox's nft state (``<net_state_dir>/<id>.dnsmasq.conf``), so
whatever restores the nft state (site.yml, the boot unit) can start the resolvers again: the role's
``egress_dns.yml`` does, and on systemd hosts each instance is an enabled
``sandbox-egress-dns@<id>.service``. Changing one sandbox's list restarts only its own resolver.
"""

from __future__ import annotations

import contextlib
import ipaddress
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from ...config import Settings
from ...errors import BackendError

__all__ = ["EgressResolvers", "PortBusy", "bound_ports"]

DNSMASQ = "/usr/sbin/dnsmasq"
UNIT = "sandbox-egress-dns@{}.service"  # the role's template unit (hosts with systemd)
CONF_SUFFIX = ".dnsmasq.conf"
_READY_S = 10.0
_STOP = ["--retry", "TERM/5/KILL/2"]


class PortBusy(BackendError):
    """The resolver's port was taken by another socket between the check and the bind."""


class EgressResolvers:
    """Configuration files and processes of the per-sandbox resolvers (see the module doc)."""

    def __init__(self, settings: Settings) -> None:
        self.dir = settings.net_state_dir
        self.run_dir = settings.dnsmasq_pidfile.parent
        self.address = str(ipaddress.IPv4Address(settings.dns_server))
        self.ports = range(settings.egress_dns_port_min, settings.egress_dns_port_max + 1)
        self.family = settings.nft_family
        self.table = settings.nft_table

    # -- files -----------------------------------------------------------------------------------
    def conf_path(self, sandbox_id: str) -> Path:
        return self.dir / f"{sandbox_id}{CONF_SUFFIX}"

    def pid_path(self, sandbox_id: str) -> Path:
        return self.run_dir / f"egress-{sandbox_id}.pid"

    def config(self, sandbox_id: str, port: int, dns_set: str, names: Iterable[str]) -> str:
        """The resolver's dnsmasq configuration (``names`` are validated egress names)."""
        lines = [
            f"# sandbox_rt: DNS of {sandbox_id}, only for its egress allow-list (written by the runtime)",
            f"listen-address={self.address}",
            f"port={port}",
            "bind-interfaces",
            f"pid-file={self.pid_path(sandbox_id)}",
            "no-resolv",
            "no-hosts",
            "cache-size=0",
        ]
        for name in sorted(set(names)):
            lines.append(f"server=/{name}/{self.address}#53")
            lines.append(f"nftset=/{name}/4#{self.family}#{self.table}#{dns_set}")
        return "\n".join(lines) + "\n"

    def write(self, sandbox_id: str, text: str | None) -> None:
        """Write (atomically) or, with None, remove the resolver's configuration file."""
        path = self.conf_path(sandbox_id)
        if text is None:
            path.unlink(missing_ok=True)
            return
        self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        tmp = path.with_name("." + path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)

    def read(self, sandbox_id: str) -> str | None:
        try:
            return self.conf_path(sandbox_id).read_text()
        except FileNotFoundError:
            return None

    # -- ports -----------------------------------------------------------------------------------
    def pick_port(self, reserved: Iterable[int]) -> int:
        """The lowest port of the range that no sandbox holds and no socket on this host uses."""
        taken = set(reserved) | bound_ports()
        for port in self.ports:
            if port not in taken:
                return port
        raise BackendError(
            f"no free port for another egress resolver: all of {self.ports.start}-{self.ports.stop - 1} "
            "are in use (egress_dns_port_min/max)",
            step="network",
        )

    # -- processes -------------------------------------------------------------------------------
    def running(self, sandbox_id: str) -> bool:
        """Is the resolver of ``sandbox_id`` running (its pid file names a dnsmasq with its config)?"""
        try:
            pid = int(self.pid_path(sandbox_id).read_text().split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            return False
        return f"--conf-file={self.conf_path(sandbox_id)}".encode() in cmdline

    def start(self, sandbox_id: str, port: int) -> None:
        """Start the resolver (stopping a running one first: dnsmasq rereads server= only at start);
        returns once it listens. A port another socket took is :class:`PortBusy`."""
        if _systemd():
            self._run(["systemctl", "enable", UNIT.format(sandbox_id)], "start")
            self._run(["systemctl", "restart", UNIT.format(sandbox_id)], "start")
        else:
            if self.running(sandbox_id):
                self.stop(sandbox_id)
            self.run_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
            proc = self._run([DNSMASQ, f"--conf-file={self.conf_path(sandbox_id)}"], "start", check=False)
            if proc.returncode != 0:
                msg = f"the egress resolver of {sandbox_id} did not start (dnsmasq exited {proc.returncode})"
                if "Address already in use" in proc.stderr:
                    raise PortBusy(msg, step="network", detail=proc.stderr)
                raise BackendError(msg, step="network", detail=proc.stderr)
        deadline = time.monotonic() + _READY_S
        while port not in bound_ports(self.address, "udp"):
            if time.monotonic() > deadline:
                self.stop(sandbox_id)
                raise BackendError(
                    f"the egress resolver of {sandbox_id} did not listen on {self.address}:{port} "
                    f"within {_READY_S:g} s",
                    step="network",
                )
            time.sleep(0.005)  # polling a condition: is the UDP socket bound yet

    def stop(self, sandbox_id: str) -> None:
        """Stop the resolver if it runs (idempotent); on systemd hosts also disable it."""
        if _systemd():
            self._run(["systemctl", "disable", "--now", UNIT.format(sandbox_id)], "stop", check=False)
        else:
            pid = ["--pidfile", str(self.pid_path(sandbox_id)), "--exec", DNSMASQ]
            self._run(["start-stop-daemon", "--stop", "--quiet", "--oknodo", *_STOP, *pid], "stop")
        if self.running(sandbox_id):
            raise BackendError(f"the egress resolver of {sandbox_id} is still running", step="network")
        self.pid_path(sandbox_id).unlink(missing_ok=True)

    @staticmethod
    def _run(cmd: list[str], what: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
            raise BackendError(f"cannot {what} an egress resolver: {exc}", step="network") from exc
        if check and proc.returncode != 0:
            raise BackendError(
                f"cannot {what} an egress resolver ({' '.join(cmd[:2])} exited {proc.returncode})",
                step="network",
                detail=proc.stderr,
            )
        return proc

    def leftovers(self, known: Iterable[str]) -> list[str]:
        """Sandbox ids with a resolver pid file or configuration but not in ``known``."""
        found = {p.name.removesuffix(CONF_SUFFIX) for p in self.dir.glob(f"sbx-*{CONF_SUFFIX}")}
        if self.run_dir.is_dir():
            found |= {p.stem.removeprefix("egress-") for p in self.run_dir.glob("egress-sbx-*.pid")}
        return sorted(found - set(known))


def _systemd() -> bool:
    return Path("/run/systemd/system").is_dir()


def bound_ports(address: str | None = None, proto: str | None = None) -> set[int]:
    """Local ports of this host's sockets (/proc/net/{udp,tcp}{,6}); with ``address`` only those
    bound to it (or to every address), with ``proto`` only ``udp`` or ``tcp``."""
    want: set[str] | None = None
    if address is not None:
        hexaddr = "%08X" % int.from_bytes(ipaddress.IPv4Address(address).packed, "little")  # noqa: UP031
        want = {hexaddr, "00000000"}
    out: set[int] = set()
    for name in ("udp", "tcp", "udp6", "tcp6"):
        if proto is not None and not name.startswith(proto):
            continue
        if want is not None and name.endswith("6"):
            continue
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) < 2 or ":" not in fields[1]:
                    continue
                addr, _, port = fields[1].partition(":")
                if want is None or addr in want:
                    out.add(int(port, 16))
    return out
