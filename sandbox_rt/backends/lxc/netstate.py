"""Each sandbox's network state on the host: its internet toggle and its egress allow-list.

The state survives any reload of the sandbox firewall. For every sandbox with internet or an egress
list, ``settings.net_state_dir`` holds:

- ``<id>.json``: what the runtime decided (address, internet on/off, egress entries, resolver port);
- ``<id>.nft``: the nft commands that (re)create it; the role's nft file ends with
  ``include "<net_state_dir>/*.nft"``, so every load of the tables (site.yml, the boot unit,
  ``nft -f`` by hand) restores all sandboxes in the same atomic transaction;
- ``<id>.dnsmasq.conf``: the sandbox's own resolver, if its list has domain names (egress_dns.py).

Egress allow-list (internet off, only some destinations): per sandbox a chain ``egress_<hex>`` with
two sets, ``egress_<hex>_net`` (the IPv4 addresses and networks given) and ``egress_<hex>_dns`` (what
the domain names resolve to), and an element ``<ip> : jump egress_<hex>`` in the role's verdict map
``egress_sources``. Domain names are resolved by the sandbox's own resolver (egress_dns.py), which
forwards only the listed names and adds each answer to ``egress_<hex>_dns``; the element
``<ip> : <port>`` in the role's map ``dns_resolvers`` sends the sandbox's DNS to it. Sandboxes without
names in their list get no DNS; those with internet use the host's shared dnsmasq.

Port binding and bandwidth (LXC, issue 26): every sandbox's bridge port (the host side of its veth,
``sbx<hex>``) gets two chains in ``table bridge sandbox``: ``in_<hex>`` passes only frames from the
sandbox's own MAC, IPv4 packets from its own address and ARP that claims only its own pair, then
polices its bandwidth (``net_mbps``, not counting its SSH session with the host); ``out_<hex>``
polices what the host sends it. The role's maps ``port_in``/``port_out`` (port name -> jump) lead
there, and a port without an element sends nothing. They are made with the sandbox, before it
starts, and go with it.

Every change of one sandbox is one nft transaction (``nft -f -``): it either applies in full or
leaves the live table as it was, and the files are put back when it fails. A bad list can neither
leave the sandbox unfiltered nor touch another sandbox's chain, sets or elements.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import re
import subprocess
from pathlib import Path

from ...caps import net_bytes_per_s
from ...config import Settings
from ...errors import BackendError
from ...filelock import file_lock
from ...validation import split_egress
from .egress_dns import EgressResolvers, PortBusy
from .nft import NftInternetSet, run_nft

__all__ = ["DNS_RESOLVER_MAP", "EGRESS_MAP", "PORT_IN_MAP", "PORT_OUT_MAP", "NetState", "SandboxNet"]

EGRESS_MAP = "egress_sources"  # ipv4_addr : verdict, defined by the role's nft file
DNS_RESOLVER_MAP = "dns_resolvers"  # ipv4_addr : inet_service (the sandbox's own resolver), the role's
PORT_IN_MAP = "port_in"  # ifname : verdict in the bridge table: frames from a sandbox port, the role's
PORT_OUT_MAP = "port_out"  # ifname : verdict in the bridge table: frames the host sends to a port
_MAC = re.compile(r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}")
_PORT = re.compile(r"[A-Za-z0-9_-]{1,15}")
_PORT_ATTEMPTS = 5


@dataclasses.dataclass(frozen=True)
class SandboxNet:
    """The network decisions for one sandbox, as stored in ``<id>.json``."""

    sandbox_id: str
    ip: str
    internet: bool = False
    egress: tuple[str, ...] = ()
    dns_port: int | None = None  # its own resolver's port, while the egress list has names
    # its bridge port (the host side of its veth) and MAC, bound to ``ip``; "" = not bound (older state)
    port: str = ""
    mac: str = ""
    net_mbps: int = 0  # bandwidth each way through the port, Mbit/s; 0 = no cap

    @property
    def chain(self) -> str:
        return "egress_" + self.sandbox_id.removeprefix("sbx-")

    @property
    def port_chains(self) -> tuple[str, str]:
        hexid = self.sandbox_id.removeprefix("sbx-")
        return f"in_{hexid}", f"out_{hexid}"

    @property
    def bound(self) -> bool:
        return bool(self.port)

    def same_port(self, other: SandboxNet | None) -> bool:
        """The port objects of ``other`` are those of this state (nothing to change live)."""
        return other is not None and (other.port, other.mac, other.ip, other.net_mbps) == (
            self.port,
            self.mac,
            self.ip,
            self.net_mbps,
        )

    @property
    def names(self) -> list[str]:
        return split_egress(self.egress)[1]

    @property
    def empty(self) -> bool:
        return not self.internet and not self.egress and not self.port

    @property
    def forwards(self) -> bool:
        """It may have flows through the host (internet or an egress list)."""
        return self.internet or bool(self.egress)


class NetState:
    """Writes, applies and removes the per-sandbox state files, nft objects and resolvers: the one
    owner of a sandbox's nft state (its port binding, its element of the internet set, its egress)."""

    def __init__(self, settings: Settings) -> None:
        self.dir = settings.net_state_dir
        self.family = settings.nft_family
        self.table = settings.nft_table
        self.internet_set = settings.nft_internet_set
        self.resolvers = EgressResolvers(settings)
        self.home = settings.lxc_path  # recorded with each state: gc only sweeps its own backend's
        self.host_ip = settings.gateway  # the host's address on the bridge (its SSH sessions)

    # -- nft -------------------------------------------------------------------------------------
    def _nft(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_nft(*args, table=f"{self.family} {self.table}", step="network", check=check, timeout=15)

    def _nft_script(self, script: str) -> subprocess.CompletedProcess[str]:
        table = f"{self.family} {self.table}"
        return run_nft("-f", "-", table=table, step="network", check=False, script=script, timeout=15)

    def _transact(self, script: str, what: str) -> None:
        """Run ``script`` as one nft transaction: all of it or nothing (the live table stays as it was)."""
        proc = self._nft_script(script)
        if proc.returncode != 0:
            raise BackendError(
                f"nft refused {what}; the live rules are unchanged", step="network", detail=proc.stderr
            )

    def fragment(self, net: SandboxNet) -> str:
        """The nft commands that (re)create ``net`` in a freshly loaded table (idempotent)."""
        lines = [f"# sandbox_rt: network state of {net.sandbox_id} (written by the runtime)"]
        return "\n".join(lines + self._port_create(net) + self._create(net)) + "\n"

    def _port_create(self, net: SandboxNet, *, flush: bool = False) -> list[str]:
        """Commands that bind ``net``'s port to its MAC and address and police its bandwidth (its
        chains ``in_<hex>``/``out_<hex>`` and their elements in the role's port maps)."""
        if not net.bound:
            return []
        if not _PORT.fullmatch(net.port) or not _MAC.fullmatch(net.mac):
            raise BackendError(f"bad port {net.port!r} or MAC {net.mac!r}: {net.sandbox_id}", step="network")
        b = f"bridge {self.table}"
        ip = str(ipaddress.IPv4Address(net.ip))
        host = str(ipaddress.IPv4Address(self.host_ip))
        cin, cout = net.port_chains
        # the role's maps (no-ops when loaded; so a runtime newer than the tables still starts sandboxes)
        lines = [f"add map {b} {m} {{ type ifname : verdict; }}" for m in (PORT_IN_MAP, PORT_OUT_MAP)]
        lines += [f"add chain {b} {cin}", f"add chain {b} {cout}"]
        if flush:
            lines += [f"flush chain {b} {cin}", f"flush chain {b} {cout}"]
        lines += [
            f"add rule {b} {cin} ether saddr != {net.mac} counter drop",
            f"add rule {b} {cin} ether type != {{ ip, arp }} counter drop",
            f"add rule {b} {cin} ether type ip ip saddr != {ip} counter drop",
            f"add rule {b} {cin} ether type arp arp saddr ether != {net.mac} counter drop",
            f"add rule {b} {cin} ether type arp arp saddr ip != {ip} counter drop",
        ]
        if net.net_mbps > 0:
            rate = f"{net_bytes_per_s(net.net_mbps)} bytes/second"  # nft's bucket: one second at the rate
            lines += [
                f"add rule {b} {cin} ip daddr {host} tcp sport 22 accept",
                f"add rule {b} {cin} limit rate over {rate} counter drop",
                f"add rule {b} {cout} ip saddr {host} tcp dport 22 accept",
                f"add rule {b} {cout} limit rate over {rate} counter drop",
            ]
        lines += [
            f"add rule {b} {cin} accept",
            f"add rule {b} {cout} accept",
            f'add element {b} {PORT_IN_MAP} {{ "{net.port}" : jump {cin} }}',
            f'add element {b} {PORT_OUT_MAP} {{ "{net.port}" : jump {cout} }}',
        ]
        return lines

    def _port_remove(self, net: SandboxNet) -> list[str]:
        """Commands that remove ``net``'s port objects whether or not they exist."""
        if not net.bound:
            return []
        b = f"bridge {self.table}"
        cin, cout = net.port_chains
        lines: list[str] = []
        for chain, port_map in ((cin, PORT_IN_MAP), (cout, PORT_OUT_MAP)):
            lines += [
                f"add chain {b} {chain}",
                f'add element {b} {port_map} {{ "{net.port}" : jump {chain} }}',
                f'delete element {b} {port_map} {{ "{net.port}" }}',
                f"flush chain {b} {chain}",
                f"delete chain {b} {chain}",
            ]
        return lines

    def _create(self, net: SandboxNet, *, flush_net: bool = False, flush_dns: bool = False) -> list[str]:
        """Commands that add ``net``'s objects; ``flush_*`` empty its sets first (a replaced list)."""
        t = f"{self.family} {self.table}"
        ip = str(ipaddress.IPv4Address(net.ip))
        lines: list[str] = []
        if net.internet:
            lines.append(f"add element {t} {self.internet_set} {{ {ip} }}")
        if not net.egress:
            return lines
        nets, names = split_egress(net.egress)
        c = net.chain
        lines.append(f"add set {t} {c}_net {{ type ipv4_addr; flags interval; }}")
        if flush_net:
            lines.append(f"flush set {t} {c}_net")
        lines.append(f"add set {t} {c}_dns {{ type ipv4_addr; }}")
        if flush_dns:
            lines.append(f"flush set {t} {c}_dns")
        lines += [
            f"add chain {t} {c}",
            f"flush chain {t} {c}",
            f"add rule {t} {c} ip daddr @{c}_net accept",
            f"add rule {t} {c} ip daddr @{c}_dns accept",
            f"add element {t} {EGRESS_MAP} {{ {ip} : jump {c} }}",
        ]
        if nets:
            # nft refuses overlapping intervals in one set (192.0.2.0/24 and 192.0.2.7): merge them
            merged = ipaddress.collapse_addresses(ipaddress.IPv4Network(n) for n in nets)
            elements = [str(m.network_address) if m.prefixlen == 32 else str(m) for m in merged]
            lines.append(f"add element {t} {c}_net {{ {', '.join(elements)} }}")
        if names and net.dns_port is not None:
            lines.append(f"add element {t} {DNS_RESOLVER_MAP} {{ {ip} : {int(net.dns_port)} }}")
        return lines

    def _remove(self, net: SandboxNet, *, internet: bool, egress: bool, dns: bool) -> list[str]:
        """Commands that remove ``net``'s live objects whether or not they exist (each is added,
        then deleted, in the same transaction): the internet element, the egress chain, its sets
        and map element, the resolver element."""
        t = f"{self.family} {self.table}"
        ip = str(ipaddress.IPv4Address(net.ip))
        c = net.chain
        lines: list[str] = []
        if internet:
            lines += [f"add element {t} {self.internet_set} {{ {ip} }}"]
            lines += [f"delete element {t} {self.internet_set} {{ {ip} }}"]
        if dns and net.dns_port is not None:
            lines += [f"add element {t} {DNS_RESOLVER_MAP} {{ {ip} : {int(net.dns_port)} }}"]
            lines += [f"delete element {t} {DNS_RESOLVER_MAP} {{ {ip} }}"]
        if egress:
            # map element first (it jumps to the chain), then the chain (its rules use the sets)
            lines += [
                f"add chain {t} {c}",
                f"add element {t} {EGRESS_MAP} {{ {ip} : jump {c} }}",
                f"delete element {t} {EGRESS_MAP} {{ {ip} }}",
                f"flush chain {t} {c}",
                f"delete chain {t} {c}",
            ]
            for suffix, flags in (("_net", " flags interval;"), ("_dns", "")):
                lines.append(f"add set {t} {c}{suffix} {{ type ipv4_addr;{flags} }}")
                lines.append(f"delete set {t} {c}{suffix}")
        return lines

    def replace_script(self, old: SandboxNet | None, new: SandboxNet) -> str:
        """The one transaction that turns the live objects of ``old`` into those of ``new``."""
        lines = [f"# sandbox_rt: replace the network state of {new.sandbox_id}"]
        if not new.same_port(old):
            if old is not None and old.bound and (not new.bound or old.port != new.port):
                lines += self._port_remove(old)
            lines += self._port_create(new, flush=old is not None and old.port == new.port)
        if old is not None:
            old_dns = bool(old.names) and old.dns_port is not None
            new_dns = bool(new.names) and new.dns_port is not None
            lines += self._remove(
                old,
                internet=old.internet and not new.internet,
                egress=bool(old.egress) and not new.egress,
                dns=old_dns and (not new_dns or old.dns_port != new.dns_port),
            )
        removed_names = bool(set(old.names) - set(new.names)) if old is not None else False
        lines += self._create(new, flush_net=True, flush_dns=removed_names)
        return "\n".join(lines) + "\n"

    # -- files -----------------------------------------------------------------------------------
    def _paths(self, sandbox_id: str) -> tuple[Path, Path]:
        return self.dir / f"{sandbox_id}.json", self.dir / f"{sandbox_id}.nft"

    def read(self, sandbox_id: str) -> SandboxNet | None:
        path = self._paths(sandbox_id)[0]
        try:
            data = json.loads(path.read_text())
            port = data.get("dns_port")
            return SandboxNet(
                sandbox_id=str(data["sandbox_id"]),
                ip=str(data["ip"]),
                internet=bool(data.get("internet", False)),
                egress=tuple(str(e) for e in data.get("egress", [])),
                dns_port=int(port) if port is not None else None,
                port=str(data.get("port", "")),
                mac=str(data.get("mac", "")),
                net_mbps=int(data.get("net_mbps", 0)),
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
        data = {**dataclasses.asdict(net), "lxc_path": str(self.home)}
        for path, text in ((meta, json.dumps(data, indent=1)), (frag, self.fragment(net))):
            tmp = path.with_name("." + path.name + ".tmp")  # the nft include glob skips dot files
            tmp.write_text(text)
            tmp.replace(path)

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        return file_lock(self.dir / ".lock")

    # -- operations ------------------------------------------------------------------------------
    def apply(self, net: SandboxNet) -> SandboxNet:
        """Record ``net`` and make it live (a new sandbox, or egress set on a running one); returns
        what was recorded (with its resolver port). All or nothing: on any failure the previous
        state - files, live rules, resolver - is what remains, and the error is raised."""
        with self._locked():
            old = self.read(net.sandbox_id)
            old_conf = self.resolvers.read(net.sandbox_id)
            keep = old.dns_port if old is not None else None  # a sandbox keeps its port while it has one
            new = dataclasses.replace(net, dns_port=keep if net.names else None)
            busy: set[int] = set()
            for _attempt in range(_PORT_ATTEMPTS):
                if new.names and new.dns_port is None:
                    taken = {n.dns_port for n in self.all() if n.dns_port is not None} | busy
                    new = dataclasses.replace(new, dns_port=self.resolvers.pick_port(taken))
                try:
                    self._apply(old, old_conf, new)
                except PortBusy:
                    busy.add(int(new.dns_port or 0))
                    new = dataclasses.replace(new, dns_port=None)
                    continue
                break
            else:
                raise BackendError(f"no free port for the resolver of {net.sandbox_id}", step="network")
            if not new.names and old_conf is not None:
                self.resolvers.stop(net.sandbox_id)  # its map element is gone: no DNS reaches it now
                self.resolvers.write(net.sandbox_id, None)
            return new

    def _apply(self, old: SandboxNet | None, old_conf: str | None, new: SandboxNet) -> None:
        sid = new.sandbox_id
        conf = None
        if new.names and new.dns_port is not None:
            conf = self.resolvers.config(sid, new.dns_port, new.chain + "_dns", new.names)
        try:
            self._write(new)  # record, then grant
            if conf is not None:
                self.resolvers.write(sid, conf)
                if conf != old_conf or not self.resolvers.running(sid):
                    self.resolvers.start(sid, int(new.dns_port or 0))
            self._transact(self.replace_script(old, new), f"the network state of {sid}")
        except BaseException as exc:
            self._restore(new, old, old_conf, exc)
            raise

    def _restore(
        self, new: SandboxNet, old: SandboxNet | None, old_conf: str | None, exc: BaseException
    ) -> None:
        """Put back the files and the resolver of ``old`` after a failed change to ``new``. The live
        nft rules need nothing: the transaction failed as a whole, or never ran."""
        sid = new.sandbox_id
        try:
            self._write(old if old is not None else SandboxNet(sid, new.ip))
            if old_conf is None or old is None or old.dns_port is None:
                self.resolvers.stop(sid)
                self.resolvers.write(sid, None)
            elif self.resolvers.read(sid) != old_conf or not self.resolvers.running(sid):
                self.resolvers.write(sid, old_conf)
                self.resolvers.start(sid, old.dns_port)
        except (OSError, BackendError) as err:  # keep the first error; say what is left
            exc.add_note(f"restoring the previous network state of {sid} also failed: {err}")

    def set_internet(self, sandbox_id: str, ip: str, enabled: bool) -> None:
        """Toggle internet. On: record, then grant. Off: revoke, then record. So a crash or a
        reload in between never leaves a permission without its state file."""
        with self._locked():
            old = self.read(sandbox_id) or SandboxNet(sandbox_id, ip)
            net = dataclasses.replace(old, ip=ip, internet=enabled)
            if enabled:
                self._write(net)
                addr = f"{{ {ipaddress.IPv4Address(ip)} }}"
                self._nft("add", "element", self.family, self.table, self.internet_set, addr)
            else:
                self._drop_element(self.internet_set, ip)
                self._write(net)

    def internet_enabled(self, ip: str) -> bool:
        """Whether ``ip`` is in the live internet set now (what the kernel applies, not the file)."""
        return NftInternetSet(self.family, self.table, self.internet_set).contains(ip)

    def remove(self, sandbox_id: str, ip: str | None) -> bool:
        """Forget the sandbox's state: its port objects, live elements, chain and sets (one
        transaction), then its resolver, then its files (idempotent). True if it had internet or an
        egress list (its forwarded connections should then be forgotten too). A sandbox without a
        state file has nothing live: every change records before it grants and revokes before it
        forgets, so then no ``nft`` runs at all."""
        if not self._paths(sandbox_id)[0].exists() and not self._has_resolver(sandbox_id):
            return False  # nothing recorded: no lock, no nft, no process
        with self._locked():
            old = self.read(sandbox_id)
            has_resolver = self._has_resolver(sandbox_id)
            if old is None and not has_resolver:
                return False
            if old is not None:
                net = dataclasses.replace(old, ip=ip or old.ip)
                lines = self._port_remove(net)
                lines += self._remove(net, internet=True, egress=bool(old.egress), dns=True)
                script = "\n".join(lines) + "\n"
                proc = self._nft_script(script)
                if proc.returncode != 0 and self._table_loaded():  # no table: nothing of it is live
                    raise BackendError(
                        f"cannot remove the network state of {sandbox_id}", step="network", detail=proc.stderr
                    )
            if has_resolver:
                self.resolvers.stop(sandbox_id)
                self.resolvers.write(sandbox_id, None)
            for path in self._paths(sandbox_id):
                path.unlink(missing_ok=True)
            return has_resolver or (old is not None and old.forwards)

    def _has_resolver(self, sandbox_id: str) -> bool:
        return self.resolvers.read(sandbox_id) is not None or self.resolvers.running(sandbox_id)

    def _table_loaded(self) -> bool:
        return self._nft("list", "table", self.family, self.table, check=False).returncode == 0

    def orphans(self, busy: set[str]) -> list[str]:
        """Sandboxes of this LXC path with network state but no container directory (a destroy
        that failed after the container went), except ``busy`` ones (creates in progress)."""
        out: list[str] = []
        for path in sorted(self.dir.glob("sbx-*.json")) if self.dir.is_dir() else []:
            sid = path.stem
            try:
                home = json.loads(path.read_text()).get("lxc_path")
            except (OSError, ValueError, AttributeError):
                continue
            if home == str(self.home) and sid not in busy and not (self.home / sid).exists():
                out.append(sid)
        return out

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
