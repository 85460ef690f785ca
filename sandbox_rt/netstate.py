"""Each sandbox's network state on the host: its internet toggle and its egress allow-list.

The state survives any reload of the sandbox firewall. For every sandbox with internet or an egress
list, ``settings.net_state_dir`` holds:

- ``<id>.json``: what the runtime decided (address, internet on/off, egress entries);
- ``<id>.nft``: the nft commands that (re)create it; the role's nft file ends with
  ``include "<net_state_dir>/*.nft"``, so every load of the tables (site.yml, the boot unit,
  ``nft -f`` by hand) restores all sandboxes in the same atomic transaction.

Egress allow-list (internet off, only some destinations): per sandbox a chain ``egress_<hex>`` with
two sets, ``egress_<hex>_net`` (the IPv4 addresses and networks given) and ``egress_<hex>_dns`` (what
the domain names resolve to), and an element ``<ip> : jump egress_<hex>`` in the role's verdict map
``egress_sources``. Domain names are resolved by the host's dnsmasq, which adds each answer to the
sets named for that domain: the runtime writes ``<dnsmasq_conf_dir>/sandbox_rt-egress.conf`` with
one ``nftset=`` line per domain listing every sandbox's set (dnsmasq uses only the first line it has
for a name) and restarts dnsmasq when that file changes. Sandboxes with domain entries may query
the host's DNS (set ``dns_clients``); DNS stays closed to the others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import subprocess
import time
from pathlib import Path

from .config import Settings
from .errors import BackendError
from .filelock import file_lock
from .network import run_nft
from .validation import split_egress

__all__ = ["DNS_CLIENTS_SET", "EGRESS_MAP", "NetState", "SandboxNet"]

EGRESS_MAP = "egress_sources"  # ipv4_addr : verdict, defined by the role's nft file
DNS_CLIENTS_SET = "dns_clients"  # sandboxes that may query the host's DNS without internet
DNSMASQ_FILE = "sandbox_rt-egress.conf"
DNSMASQ_UNIT = "sandbox-dnsmasq.service"  # the role's unit name (hosts with systemd)
_DNSMASQ_READY_S = 10.0


@dataclasses.dataclass(frozen=True)
class SandboxNet:
    """The network decisions for one sandbox, as stored in ``<id>.json``."""

    sandbox_id: str
    ip: str
    internet: bool = False
    egress: tuple[str, ...] = ()

    @property
    def chain(self) -> str:
        return "egress_" + self.sandbox_id.removeprefix("sbx-")

    @property
    def empty(self) -> bool:
        return not self.internet and not self.egress


class NetState:
    """Writes, applies and removes the per-sandbox state files; keeps dnsmasq's egress file."""

    def __init__(self, settings: Settings) -> None:
        self.dir = settings.net_state_dir
        self.family = settings.nft_family
        self.table = settings.nft_table
        self.internet_set = settings.nft_internet_set
        self.dnsmasq_dir = settings.dnsmasq_conf_dir
        self.dnsmasq_conf = settings.dnsmasq_conf
        self.dnsmasq_pidfile = settings.dnsmasq_pidfile
        self.dns_server = settings.dns_server

    # -- nft -------------------------------------------------------------------------------------
    def _nft(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_nft(*args, table=f"{self.family} {self.table}", step="network", check=check, timeout=15)

    def fragment(self, net: SandboxNet) -> str:
        """The nft commands that (re)create ``net`` in a freshly loaded table (idempotent)."""
        t = f"{self.family} {self.table}"
        ip = str(ipaddress.IPv4Address(net.ip))
        lines = [f"# sandbox_rt: network state of {net.sandbox_id} (written by the runtime)"]
        if net.internet:
            lines.append(f"add element {t} {self.internet_set} {{ {ip} }}")
        if net.egress:
            nets, names = split_egress(net.egress)
            c = net.chain
            lines += [
                f"add set {t} {c}_net {{ type ipv4_addr; flags interval; }}",
                f"add set {t} {c}_dns {{ type ipv4_addr; }}",
                f"add chain {t} {c}",
                f"flush chain {t} {c}",
                f"add rule {t} {c} ip daddr @{c}_net accept",
                f"add rule {t} {c} ip daddr @{c}_dns accept",
                f"add element {t} {EGRESS_MAP} {{ {ip} : jump {c} }}",
            ]
            if nets:
                lines.append(f"add element {t} {c}_net {{ {', '.join(nets)} }}")
            if names:
                lines.append(f"add element {t} {DNS_CLIENTS_SET} {{ {ip} }}")
        return "\n".join(lines) + "\n"

    # -- files -----------------------------------------------------------------------------------
    def _paths(self, sandbox_id: str) -> tuple[Path, Path]:
        return self.dir / f"{sandbox_id}.json", self.dir / f"{sandbox_id}.nft"

    def read(self, sandbox_id: str) -> SandboxNet | None:
        path = self._paths(sandbox_id)[0]
        try:
            data = json.loads(path.read_text())
            return SandboxNet(
                sandbox_id=str(data["sandbox_id"]),
                ip=str(data["ip"]),
                internet=bool(data.get("internet", False)),
                egress=tuple(str(e) for e in data.get("egress", [])),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BackendError(f"network state {path} is unreadable: {exc}", step="network") from exc

    def all(self) -> list[SandboxNet]:
        out: list[SandboxNet] = []
        if self.dir.is_dir():
            for path in sorted(self.dir.glob("sbx-*.json")):
                with contextlib.suppress(BackendError):
                    net = self.read(path.stem)
                    if net is not None:
                        out.append(net)
        return out

    def _write(self, net: SandboxNet) -> None:
        """Write ``<id>.json`` and ``<id>.nft`` (atomically each); an empty state removes them."""
        meta, frag = self._paths(net.sandbox_id)
        if net.empty:
            frag.unlink(missing_ok=True)
            meta.unlink(missing_ok=True)
            return
        self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        for path, text in ((meta, json.dumps(dataclasses.asdict(net), indent=1)), (frag, self.fragment(net))):
            tmp = path.with_name("." + path.name + ".tmp")  # the nft include glob skips dot files
            tmp.write_text(text)
            tmp.replace(path)

    # -- operations ------------------------------------------------------------------------------
    def apply(self, net: SandboxNet) -> None:
        """Record ``net`` and make it live (a new sandbox, or egress set on a running one)."""
        old = self.read(net.sandbox_id)
        if old is not None and old.egress and old.egress != net.egress:
            self._remove_egress(old)
        if not net.internet and old is not None and old.internet:
            self._drop_element(self.internet_set, net.ip)  # revoke, then record
        self._write(net)
        if not net.empty:
            try:
                self._nft("-f", str(self._paths(net.sandbox_id)[1]))
            except BackendError:
                self._write(dataclasses.replace(net, internet=False, egress=()))
                raise
        if (old is not None and split_egress(old.egress)[1]) or split_egress(net.egress)[1]:
            self.sync_dnsmasq()

    def set_internet(self, sandbox_id: str, ip: str, enabled: bool) -> None:
        """Toggle internet. On: record, then grant. Off: revoke, then record. So a crash or a
        reload in between never leaves a permission without its state file."""
        old = self.read(sandbox_id) or SandboxNet(sandbox_id, ip)
        net = dataclasses.replace(old, ip=ip, internet=enabled)
        if enabled:
            self._write(net)
            addr = f"{{ {ipaddress.IPv4Address(ip)} }}"
            self._nft("add", "element", self.family, self.table, self.internet_set, addr)
        else:
            self._drop_element(self.internet_set, ip)
            self._write(net)

    def remove(self, sandbox_id: str, ip: str | None) -> bool:
        """Forget the sandbox's state and remove its live elements, chain and sets (idempotent).

        True if it had any (its connections should then be forgotten too). A sandbox without a
        state file has nothing live: every change records before it grants and revokes before it
        forgets (see :meth:`set_internet`), so destroy of a plain sandbox runs no ``nft`` at all.
        """
        old = self.read(sandbox_id)
        if old is None:
            return False
        self._drop_element(self.internet_set, ip or old.ip)
        if old.egress:
            self._remove_egress(old)
        for path in self._paths(sandbox_id):
            path.unlink(missing_ok=True)
        if split_egress(old.egress)[1]:
            self.sync_dnsmasq()
        return True

    def _drop_element(self, set_name: str, ip: str) -> None:
        """Make sure ``ip`` is not in ``set_name``: one nft transaction that adds then deletes it,
        so an absent element is no error. Raises only if the element is still there."""
        addr = str(ipaddress.IPv4Address(ip))
        where = f"{self.family} {self.table} {set_name} {{ {addr} }}"
        proc = self._nft_script(f"add element {where}\ndelete element {where}\n")
        if proc.returncode == 0:
            return
        listed = self._nft("list", "set", self.family, self.table, set_name, check=False)
        if listed.returncode == 0 and addr in listed.stdout.split("elements", 1)[-1]:
            raise BackendError(f"cannot remove {addr} from {set_name}", step="network", detail=proc.stderr)

    def _nft_script(self, script: str) -> subprocess.CompletedProcess[str]:
        return run_nft(
            "-f",
            "-",
            table=f"{self.family} {self.table}",
            step="network",
            check=False,
            script=script,
            timeout=15,
        )

    def _remove_egress(self, net: SandboxNet) -> None:
        t = (self.family, self.table)
        ip = str(ipaddress.IPv4Address(net.ip))
        # map element first (it jumps to the chain), then the chain (its rules use the sets)
        self._nft("delete", "element", *t, EGRESS_MAP, f"{{ {ip} }}", check=False)
        self._nft("delete", "element", *t, DNS_CLIENTS_SET, f"{{ {ip} }}", check=False)
        self._nft("delete", "chain", *t, net.chain, check=False)
        for suffix in ("_net", "_dns"):
            self._nft("delete", "set", *t, net.chain + suffix, check=False)
        if self._nft("list", "chain", *t, net.chain, check=False).returncode == 0:
            raise BackendError(f"cannot remove the egress chain of {net.sandbox_id}", step="network")

    # -- dnsmasq ---------------------------------------------------------------------------------
    def dnsmasq_config(self, nets: list[SandboxNet]) -> str:
        """One ``nftset=/<domain>/...`` line per domain naming the set of every sandbox allowing it."""
        by_domain: dict[str, list[str]] = {}
        for net in nets:
            for name in split_egress(net.egress)[1]:
                by_domain.setdefault(name, []).append(f"4#{self.family}#{self.table}#{net.chain}_dns")
        lines = ["# sandbox_rt: egress allow-lists by domain (written by the runtime; do not edit)"]
        lines += [f"nftset=/{name}/{','.join(sets)}" for name, sets in sorted(by_domain.items())]
        return "\n".join(lines) + "\n"

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        return file_lock(self.dir / ".lock")

    def sync_dnsmasq(self) -> bool:
        """Rewrite dnsmasq's egress file from all sandboxes' state; restart dnsmasq if it changed.

        The restart also empties dnsmasq's cache, so the next answer for each name is added to the
        sets (a cached answer would not be). True if dnsmasq was restarted.
        """
        with self._locked():
            text = self.dnsmasq_config(self.all())
            path = self.dnsmasq_dir / DNSMASQ_FILE
            with contextlib.suppress(FileNotFoundError):
                if path.read_text() == text:
                    return False
            if not self.dnsmasq_dir.is_dir():
                raise BackendError(
                    f"{self.dnsmasq_dir} is missing: dnsmasq cannot resolve egress names (run site.yml)",
                    step="network",
                )
            tmp = path.with_name("." + path.name + ".tmp")
            tmp.write_text(text)
            tmp.replace(path)
            self._restart_dnsmasq()
            return True

    def _restart_dnsmasq(self) -> None:
        """Restart the sandbox dnsmasq as the role does: its systemd unit, or by pidfile without systemd."""
        if Path("/run/systemd/system").is_dir():
            cmds = [["systemctl", "restart", DNSMASQ_UNIT]]
        else:
            pid = ["--pidfile", str(self.dnsmasq_pidfile), "--exec", "/usr/sbin/dnsmasq"]
            cmds = [
                ["start-stop-daemon", "--stop", "--quiet", "--oknodo", "--retry", "TERM/5/KILL/2", *pid],
                ["start-stop-daemon", "--start", "--quiet", *pid, "--", f"--conf-file={self.dnsmasq_conf}"],
            ]
        for cmd in cmds:
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
                raise BackendError(f"cannot restart the sandbox dnsmasq: {exc}", step="network") from exc
            if proc.returncode != 0:
                raise BackendError(
                    f"cannot restart the sandbox dnsmasq ({' '.join(cmd[:2])} exited {proc.returncode})",
                    step="network",
                    detail=proc.stderr,
                )
        deadline = time.monotonic() + _DNSMASQ_READY_S
        while not dns_port_bound(self.dns_server):
            if time.monotonic() > deadline:
                raise BackendError(
                    f"dnsmasq did not listen on {self.dns_server}:53 within {_DNSMASQ_READY_S:g} s",
                    step="network",
                )
            time.sleep(0.01)  # polling a condition: is the UDP socket bound yet


def dns_port_bound(address: str) -> bool:
    """Is a UDP socket bound to ``address``:53 on this host (read from /proc/net/udp)?"""
    want = "%08X:0035" % int.from_bytes(ipaddress.IPv4Address(address).packed, "little")  # noqa: UP031
    try:
        lines = Path("/proc/net/udp").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(line.split()[1] == want for line in lines if len(line.split()) > 1)
