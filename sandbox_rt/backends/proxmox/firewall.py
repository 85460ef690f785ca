"""A sandbox's network permissions on Proxmox VE: its CT's own firewall (outbound DROP; the
internet rules set_internet turns on and off; the egress allow-list as rules), and the datacenter
firewall gate every change checks first (a CT firewall applies only while it is on)."""

from __future__ import annotations

import builtins
import dataclasses
from typing import Any

from ...errors import BackendError, ConfigError, FirewallDisabled
from ...models import SandboxRecord
from ...validation import split_egress
from .core import PveCore, pve_bool
from .description import TAG

__all__ = ["EGRESS_COMMENT", "RULE_COMMENT", "PveFirewall"]

RULE_COMMENT = "sandbox-rt internet"
EGRESS_COMMENT = "sandbox-rt egress"


class PveFirewall(PveCore):
    """The CT firewall half of the backend."""

    def _setup_firewall(self, node: str, vmid: int) -> None:
        """The CT's firewall: outbound DROP, the address and MAC bound to the port, and the internet
        rules, created off (``set_internet`` turns them on)."""
        fw = self._ct(node, vmid).firewall
        for rule in (
            {"proto": "tcp", "dport": "80,443"},
            {"proto": "udp", "dport": "53", "dest": self.settings.dns_server},
            # DNS over TCP too (answers too large for UDP), as the embedded default allows (SBX-NET-11)
            {"proto": "tcp", "dport": "53", "dest": self.settings.dns_server},
        ):
            self._call(
                "firewall",
                lambda r=rule: fw.rules.post(  # type: ignore[misc]
                    type="out", action="ACCEPT", enable=0, comment=RULE_COMMENT, **r
                ),
            )
        self._call(
            "firewall",
            lambda: fw.options.put(enable=1, policy_out="DROP", policy_in="ACCEPT", ipfilter=1, macfilter=1),
        )

    def _internet_rules(self, record: SandboxRecord) -> tuple[Any, builtins.list[dict[str, Any]]]:
        node, vmid = self._find(record.id)
        fw = self._ct(node, vmid).firewall
        rules = self._call("internet", lambda: fw.rules.get())
        return fw, [r for r in rules if r.get("comment") == RULE_COMMENT]

    def _check_firewall_gate(self) -> None:
        """Fail closed unless the datacenter firewall is on: PVE applies no CT firewall at all while
        it is off, so the CT rules that gate a sandbox's internet would do nothing (every sandbox
        would reach whatever the node's own tables let through). ``GET /cluster/firewall/options``
        needs ``Sys.Audit`` on ``/`` (the proxmox_access role grants it there, not propagated)."""
        opts = self._call("firewall", lambda: self.api.cluster.firewall.options.get())
        if str(opts.get("enable", "0")).strip() not in ("1", "true", "True"):
            raise FirewallDisabled(
                "the PVE datacenter firewall is off, so the CT firewalls that keep sandboxes off the "
                "internet would do nothing; refusing. Turn it on (Datacenter -> Firewall -> Options, or "
                "`pvesh set /cluster/firewall/options --enable 1`; the node play does it with "
                "proxmox_access_datacenter_firewall: true) after checking the datacenter's input policy "
                "keeps your management access (22, 8006)",
                step="firewall",
            )

    def set_internet(self, record: SandboxRecord, enabled: bool) -> None:
        self._check_firewall_gate()
        fw, rules = self._internet_rules(record)
        if not rules:
            raise BackendError(f"sandbox {record.id} has no sandbox-rt firewall rules", step="internet")
        for rule in rules:
            pos = int(rule["pos"])
            self._call("internet", lambda p=pos: fw.rules(p).put(enable=pve_bool(enabled)))  # type: ignore[misc]

    def internet_enabled(self, record: SandboxRecord) -> bool:
        _fw, rules = self._internet_rules(record)
        return bool(rules) and all(int(r.get("enable", 0)) == 1 for r in rules)

    @staticmethod
    def _check_egress(egress: tuple[str, ...]) -> None:
        names = split_egress(egress)[1]
        if names:
            raise ConfigError(
                f"egress by domain name ({', '.join(names)}) needs the host's dnsmasq (lxc backend); "
                "the PVE firewall matches addresses only: give IPv4 addresses or networks"
            )

    def set_egress(self, record: SandboxRecord, egress: tuple[str, ...]) -> None:
        """One enabled OUT ACCEPT rule per address/network (HTTP/HTTPS ports) in the CT's firewall."""
        self._check_egress(egress)
        self._check_firewall_gate()
        node, vmid = self._find(record.id)
        fw = self._ct(node, vmid).firewall
        rules = self._call("egress", lambda: fw.rules.get())
        # delete from the highest position down, so the positions of the rest stay valid
        for rule in sorted(rules, key=lambda r: -int(r["pos"])):
            if rule.get("comment") == EGRESS_COMMENT:
                pos = int(rule["pos"])
                self._call("egress", lambda p=pos: fw.rules(p).delete())  # type: ignore[misc]
        for dest in egress:
            self._call(
                "egress",
                lambda d=dest: fw.rules.post(  # type: ignore[misc]
                    type="out",
                    action="ACCEPT",
                    enable=1,
                    proto="tcp",
                    dport="80,443",
                    dest=d,
                    comment=EGRESS_COMMENT,
                ),
            )
        stored = self.get(record.id)
        new = dataclasses.replace(stored, spec=dataclasses.replace(stored.spec, egress=egress))
        conf = self._call("egress", lambda: self._ct(node, vmid).config.get())
        description = self._description(new, conf)
        self._call("egress", lambda: self._ct(node, vmid).config.put(description=description))

    def _drop_cloned_rules(self, node: str, vmid: int) -> None:
        """Remove the runtime's own firewall rules a full clone copied from its source (internet,
        egress); ``_setup_firewall`` then adds this sandbox's. Rules of the template stay."""
        fw = self._ct(node, vmid).firewall
        rules = self._call("firewall", lambda: fw.rules.get())
        for rule in sorted(rules, key=lambda r: -int(r["pos"])):  # highest first: positions stay valid
            if str(rule.get("comment", "")).startswith(TAG + " "):
                pos = int(rule["pos"])
                self._call("firewall", lambda p=pos: fw.rules(p).delete())  # type: ignore[misc]
