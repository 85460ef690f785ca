"""OpenSandbox's egress NetworkPolicy mapped onto a sandbox's internet flag and egress allow-list,
exactly or not at all: a policy the sandbox cannot enforce as written is a ConfigError (400), never
quietly a wider one.

The two models:

- OpenSandbox: ``defaultAction`` (allow | deny) and rules ``{action, target}`` evaluated in order,
  the first match wins; a target is a name (``example.com``: that name only), a wildcard
  (``*.example.com``: its subdomains, not itself) or an IPv4 address or network.
- sandbox_rt: internet on (HTTP/HTTPS anywhere but the LAN) or off, and an allow-list reachable while
  it is off, of IPv4 addresses, networks and domains, where a domain ``example.com`` is the name and
  all its subdomains, that is exactly the pair ``example.com`` + ``*.example.com``.

So ``defaultAction: deny`` is internet off and ``allow`` internet on (narrower: HTTP/HTTPS only); the
effective allow rules become the list when each name comes with its wildcard, or is covered by a
listed domain; a deny rule is fine where it changes nothing (under ``deny``, or shadowed) or removes
an allow rule whole, and refused where it would cut an exception out of one.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from ...errors import ConfigError
from ...validation import egress_entry

__all__ = ["Rule", "merge_rules", "policy_document", "remove_targets", "rules_of", "to_egress"]

Action = Literal["allow", "deny"]
Net = ipaddress.IPv4Network


@dataclasses.dataclass(frozen=True)
class Rule:
    action: Action
    target: str

    def to_json(self) -> dict[str, str]:
        return {"action": self.action, "target": self.target}


@dataclasses.dataclass(frozen=True)
class _Target:
    """A target classified: a network, a name (exact) or a wildcard's base (its subdomains)."""

    kind: Literal["net", "name", "wildcard"]
    value: str  # the name, the wildcard's base, or the network's text
    net: Net | None = None


def _target(text: str) -> _Target:
    raw = text.strip().lower().removesuffix(".")
    if raw.startswith("*."):
        kind, norm = egress_entry(raw[2:])
        if kind != "name":
            raise ConfigError(f"egress target {text!r:.80}: a wildcard must be '*.' and a domain name")
        return _Target("wildcard", norm)
    if "*" in raw:
        raise ConfigError(f"egress target {text!r:.80}: '*' may only lead a wildcard ('*.example.com')")
    kind, norm = egress_entry(raw)
    if kind == "network":
        return _Target("net", norm, ipaddress.IPv4Network(norm, strict=False))
    return _Target("name", norm)


def _sub(name: str, base: str) -> bool:
    """Is ``name`` a proper subdomain of ``base``?"""
    return name.endswith("." + base)


def _covers(d: _Target, a: _Target) -> bool:
    """Does every destination ``a`` matches also match ``d``?"""
    if d.net is not None or a.net is not None:
        return d.net is not None and a.net is not None and a.net.subnet_of(d.net)
    if d.kind == "name":
        return a.kind == "name" and a.value == d.value
    if a.kind == "name":
        return _sub(a.value, d.value)
    return a.value == d.value or _sub(a.value, d.value)


def _overlaps(d: _Target, a: _Target) -> bool:
    if d.net is not None or a.net is not None:
        return d.net is not None and a.net is not None and d.net.overlaps(a.net)
    if d.kind == "name" and a.kind == "name":
        return d.value == a.value
    if d.kind == "name":
        return _sub(d.value, a.value)
    if a.kind == "name":
        return _sub(a.value, d.value)
    return d.value == a.value or _sub(d.value, a.value) or _sub(a.value, d.value)


def rules_of(egress: Iterable[str]) -> list[Rule]:
    """A sandbox's allow-list as OpenSandbox rules: a domain is its name and its wildcard."""
    rules: list[Rule] = []
    for entry in egress:
        kind, norm = egress_entry(entry)
        if kind == "network":
            rules.append(Rule("allow", norm))
        else:
            rules += [Rule("allow", norm), Rule("allow", f"*.{norm}")]
    return rules


def policy_document(internet: bool, egress: Iterable[str]) -> dict[str, Any]:
    """The PolicyStatusResponse of a sandbox's state."""
    default: Action = "allow" if internet else "deny"
    return {
        "status": "ok",
        "mode": "allow_all" if internet else "deny_all",
        "enforcementMode": "dns+nft",
        "policy": {"defaultAction": default, "egress": [r.to_json() for r in rules_of(egress)]},
    }


def _key(target: str) -> str:
    return target.strip().lower().removesuffix(".")


def merge_rules(current: Sequence[Rule], incoming: Sequence[Rule]) -> list[Rule]:
    """The egress sidecar's PATCH: incoming rules first (the first of a repeated target wins), then
    the current rules whose targets the incoming ones do not name."""
    seen: set[str] = set()
    out: list[Rule] = []
    for rule in incoming:
        if _key(rule.target) not in seen:
            seen.add(_key(rule.target))
            out.append(rule)
    return out + [r for r in current if _key(r.target) not in seen]


def remove_targets(current: Sequence[Rule], targets: Iterable[str]) -> list[Rule]:
    """The egress sidecar's DELETE: the rules whose targets are not named (unknown ones ignored)."""
    gone = {_key(t) for t in targets}
    return [r for r in current if _key(r.target) not in gone]


def _effective_allows(rules: Sequence[Rule]) -> list[_Target]:
    denied: list[tuple[_Target, str]] = []
    allowed: list[_Target] = []
    for rule in rules:
        target = _target(rule.target)
        if rule.action == "deny":
            denied.append((target, rule.target))
            continue
        if any(_covers(d, target) for d, _ in denied):
            continue  # shadowed whole by an earlier deny: it allows nothing
        for d, text in denied:
            if _overlaps(d, target):
                raise ConfigError(
                    f"the deny rule {text!r} cuts an exception out of the allow rule {rule.target!r}: "
                    "sandbox_rt's allow-list has no exceptions"
                )
        allowed.append(target)
    return allowed


def to_egress(default_action: Action, rules: Sequence[Rule]) -> tuple[bool, list[str]]:
    """(internet, egress list) enforcing exactly ``default_action`` + ``rules``; ConfigError if the
    sandbox cannot."""
    if default_action == "allow":
        denies = [r.target for r in rules if r.action == "deny"]
        if denies:
            raise ConfigError(
                f"defaultAction allow with deny rules ({', '.join(map(repr, denies[:5]))}) cannot be "
                "enforced: with internet on, sandbox_rt blocks nothing in particular"
            )
    allowed = _effective_allows(rules)
    nets = [t.value for t in allowed if t.kind == "net"]
    names = {t.value for t in allowed if t.kind == "name"}
    wildcards = {t.value for t in allowed if t.kind == "wildcard"}
    domains = sorted(names & wildcards)
    # a domain listed twice (example.com and a.example.com both whole) is the outer one
    domains = [d for d in domains if not any(_sub(d, o) for o in domains)]

    def covered(value: str) -> bool:
        return any(value == d or _sub(value, d) for d in domains)

    for name in sorted(names - wildcards):
        if not covered(name):
            raise ConfigError(
                f"allow {name!r} alone cannot be enforced: sandbox_rt allows a domain with all its "
                f"subdomains; allow both {name!r} and '*.{name}'"
            )
    for base in sorted(wildcards - names):
        if not covered(base):
            raise ConfigError(
                f"allow '*.{base}' alone cannot be enforced: sandbox_rt allows a domain with all its "
                f"subdomains, the domain itself included; allow both {base!r} and '*.{base}'"
            )
    egress: list[str] = []
    for entry in [*nets, *domains]:
        if entry not in egress:
            egress.append(entry)
    return default_action == "allow", egress
