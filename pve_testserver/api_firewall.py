"""/nodes/{node}/lxc/{vmid}/firewall/{options,rules,ipset} and /cluster/firewall/options
(pve-firewall semantics).

As in PVE, a guest firewall config exists independently of the guest (``/etc/pve/firewall/
<vmid>.fw``): it is copied by clone and removed by destroy. Lists carry PVE's SHA-1 ``digest``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from typing import Any

from .core import Call, route
from .errors import fail, param_error
from .formats import split_list

_RULE_KEYS = (
    "type",
    "action",
    "macro",
    "source",
    "dest",
    "proto",
    "sport",
    "dport",
    "iface",
    "log",
    "comment",
    "icmp-type",
    "enable",
)
_ALIAS_RE = re.compile(r"^(dc/|guest/)?[A-Za-z][A-Za-z0-9\-_]+$")


def _fw(call: Call) -> dict[str, Any]:
    fw: dict[str, Any] = call.state.firewall.setdefault(
        str(call.params["vmid"]), {"options": {}, "rules": [], "ipsets": {}}
    )
    return fw


def _digest_of_list(items: list[dict[str, Any]]) -> str:
    sha = hashlib.sha1()
    for entry in items:
        for key in sorted(entry):
            if entry[key] is not None and not isinstance(entry[key], (dict, list)):
                sha.update(f"{key}:{entry[key]}\n".encode())
    return sha.hexdigest()


def _with_digest(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    digest = _digest_of_list(items)
    return [{**item, "digest": digest} for item in items]


def _object_digest(obj: dict[str, Any]) -> str:
    sha = hashlib.sha1()
    for key in sorted(obj):
        sha.update(f"{key}:{obj[key]}\n".encode())
    return sha.hexdigest()


def _assert_digest(current: str, given: Any) -> None:
    if given and given != current:
        raise fail("detected modified configuration - file changed by other user? Try again.")


def _flag(value: Any) -> Any:
    return int(value) if isinstance(value, bool) else value


# --- options ----------------------------------------------------------------------------------


@route("GET", "/nodes/{node}/lxc/{vmid}/firewall/options")
def get_options(call: Call) -> dict[str, Any]:
    with call.state.lock:
        opts = dict(_fw(call)["options"])
    return {**opts, "digest": _object_digest(opts)}


@route("PUT", "/nodes/{node}/lxc/{vmid}/firewall/options")
def set_options(call: Call) -> None:
    p = call.params
    settable = set(call.method.properties) - {"node", "vmid", "delete", "digest"}
    with call.mutate():
        opts = _fw(call)["options"]
        _assert_digest(_object_digest(opts), p.get("digest"))
        for opt in split_list(p.get("delete", "")):
            if opt not in settable:
                raise param_error({"delete": f"no such option '{opt}'"})
            opts.pop(opt, None)
        for key in settable & set(p):
            opts[key] = _flag(p[key])


# --- the datacenter firewall (/cluster/firewall/options) ---------------------------------------


def _cluster_options(call: Call) -> dict[str, Any]:
    """``/etc/pve/firewall/cluster.fw``'s [OPTIONS]; PVE's default: ``enable`` unset (off)."""
    section: dict[str, Any] = call.state.data.setdefault("cluster_firewall", {"options": {}})
    opts: dict[str, Any] = section.setdefault("options", {})
    return opts


@route("GET", "/cluster/firewall/options")
def get_cluster_options(call: Call) -> dict[str, Any]:
    with call.state.lock:
        opts = dict(_cluster_options(call))
    return {**opts, "digest": _object_digest(opts)}


@route("PUT", "/cluster/firewall/options")
def set_cluster_options(call: Call) -> None:
    p = call.params
    settable = set(call.method.properties) - {"delete", "digest"}
    with call.mutate():
        opts = _cluster_options(call)
        _assert_digest(_object_digest(opts), p.get("digest"))
        for opt in split_list(p.get("delete", "")):
            if opt not in settable:
                raise param_error({"delete": f"no such option '{opt}'"})
            opts.pop(opt, None)
        for key in settable & set(p):
            opts[key] = _flag(p[key])


# --- rules ------------------------------------------------------------------------------------


def _rules(call: Call) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = _fw(call)["rules"]
    return rules


def _verify_rule(rule: dict[str, Any]) -> None:
    action, typ = rule.get("action"), rule.get("type")
    if typ == "group":
        raise param_error({"action": f"no such security group '{action}'"})
    if action not in ("ACCEPT", "DROP", "REJECT"):
        raise param_error({"action": f"unknown action '{action}'"})
    if rule.get("macro"):
        raise param_error({"macro": f"unknown macro '{rule['macro']}'"})


def _copy_rule_data(rule: dict[str, Any], params: dict[str, Any]) -> None:
    for key in _RULE_KEYS:
        if key in params:
            value = _flag(params[key])
            if value in ("", "-"):
                rule.pop(key, None)
            else:
                rule[key] = value


@route("GET", "/nodes/{node}/lxc/{vmid}/firewall/rules")
def get_rules(call: Call) -> list[dict[str, Any]]:
    with call.state.lock:
        rules = [dict(r) for r in _rules(call)]
    out = _with_digest(rules)
    for pos, rule in enumerate(out):
        rule["pos"] = pos
    return out


@route("POST", "/nodes/{node}/lxc/{vmid}/firewall/rules")
def create_rule(call: Call) -> None:
    with call.mutate():
        rules = _rules(call)
        _assert_digest(_digest_of_list(rules), call.params.get("digest"))
        rule: dict[str, Any] = {}
        _copy_rule_data(rule, call.params)
        _verify_rule(rule)
        rule.setdefault("enable", 0)
        rules.insert(0, rule)


def _rule_at(call: Call, rules: list[dict[str, Any]]) -> dict[str, Any]:
    pos = int(call.params["pos"])
    if pos >= len(rules):
        raise fail(f"no rule at position {pos}")
    return rules[pos]


@route("GET", "/nodes/{node}/lxc/{vmid}/firewall/rules/{pos}")
def get_rule(call: Call) -> dict[str, Any]:
    with call.state.lock:
        rules = [dict(r) for r in _rules(call)]
        rule = dict(_rule_at(call, rules))
    rule["pos"] = int(call.params["pos"])
    return rule


@route("PUT", "/nodes/{node}/lxc/{vmid}/firewall/rules/{pos}")
def update_rule(call: Call) -> None:
    p = call.params
    with call.mutate():
        rules = _rules(call)
        _assert_digest(_digest_of_list(rules), p.get("digest"))
        pos = int(p["pos"])
        rule = _rule_at(call, rules)
        moveto = p.get("moveto")
        if moveto is not None and moveto != pos:
            rules.pop(pos)
            rules.insert(min(int(moveto) if moveto < pos else int(moveto) - 1, len(rules)), rule)
            return
        for key in split_list(p.get("delete", "")):
            rule.pop(key, None)
        _copy_rule_data(rule, p)
        _verify_rule(rule)


@route("DELETE", "/nodes/{node}/lxc/{vmid}/firewall/rules/{pos}")
def delete_rule(call: Call) -> None:
    with call.mutate():
        rules = _rules(call)
        _assert_digest(_digest_of_list(rules), call.params.get("digest"))
        _rule_at(call, rules)
        rules.pop(int(call.params["pos"]))


# --- ipsets -----------------------------------------------------------------------------------


def _ipsets(call: Call) -> dict[str, Any]:
    sets: dict[str, Any] = _fw(call)["ipsets"]
    return sets


def _ipset(call: Call) -> dict[str, Any]:
    ipset: dict[str, Any] | None = _ipsets(call).get(call.params["name"])
    if ipset is None:
        raise fail(f"no such IPSet '{call.params['name']}'")
    return ipset


def _clean_cidr(cidr: str) -> str:
    """Plain addresses stay as given; networks get their host bits cleared (clean_cidr)."""
    if _ALIAS_RE.match(cidr):
        raise param_error({"cidr": f"no such alias '{cidr}'"})
    if "/" not in cidr:
        return cidr
    net = ipaddress.ip_network(cidr, strict=False)
    return f"{net.network_address}/{net.prefixlen}"


@route("GET", "/nodes/{node}/lxc/{vmid}/firewall/ipset")
def ipset_index(call: Call) -> list[dict[str, Any]]:
    with call.state.lock:
        sets = {name: dict(data) for name, data in _ipsets(call).items()}
    out = []
    for name in sorted(sets):
        entry: dict[str, Any] = {"name": name, "digest": _digest_of_list(sets[name]["entries"])}
        if sets[name].get("comment"):
            entry["comment"] = sets[name]["comment"]
        out.append(entry)
    return out


@route("POST", "/nodes/{node}/lxc/{vmid}/firewall/ipset")
def ipset_create(call: Call) -> None:
    p = call.params
    with call.mutate():
        sets = _ipsets(call)
        if p.get("rename"):
            if p["rename"] not in sets:
                raise param_error({"name": f"IPSet '{p['rename']}' does not exist"})
            if p["name"] in sets:
                raise param_error({"name": f"IPSet '{p['name']}' does already exist"})
            sets[p["name"]] = sets.pop(p["rename"])
        else:
            if p["name"] in sets:
                raise param_error({"name": f"IPSet '{p['name']}' already exists"})
            sets[p["name"]] = {"entries": []}
        if "comment" in p:
            sets[p["name"]]["comment"] = p["comment"]


@route("GET", "/nodes/{node}/lxc/{vmid}/firewall/ipset/{name}")
def ipset_read(call: Call) -> list[dict[str, Any]]:
    with call.state.lock:
        entries = [dict(e) for e in _ipset(call)["entries"]]
    return _with_digest(entries)


@route("DELETE", "/nodes/{node}/lxc/{vmid}/firewall/ipset/{name}")
def ipset_delete(call: Call) -> None:
    with call.mutate():
        sets = _ipsets(call)
        ipset = sets.get(call.params["name"])
        if ipset is None:
            return
        if ipset["entries"] and not call.params.get("force"):
            raise fail(f"IPSet '{call.params['name']}' is not empty")
        del sets[call.params["name"]]


@route("POST", "/nodes/{node}/lxc/{vmid}/firewall/ipset/{name}")
def ipset_add(call: Call) -> None:
    p = call.params
    with call.mutate():
        ipset = _ipset(call)
        cidr = _clean_cidr(p["cidr"])
        if any(e["cidr"] == cidr for e in ipset["entries"]):
            raise param_error({"cidr": f"address '{cidr}' already exists"})
        if re.search(r"/0+$", cidr):
            raise param_error({"cidr": "a zero prefix is not allowed in ipset entries"})
        entry: dict[str, Any] = {"cidr": cidr}
        if p.get("comment"):
            entry["comment"] = p["comment"]
        if p.get("nomatch"):
            entry["nomatch"] = 1
        ipset["entries"].append(entry)


def _entry(call: Call, ipset: dict[str, Any]) -> dict[str, Any]:
    for entry in ipset["entries"]:
        if entry["cidr"] == call.params["cidr"]:
            found: dict[str, Any] = entry
            return found
    raise param_error({"cidr": "no such IP/Network"})


@route("GET", "/nodes/{node}/lxc/{vmid}/firewall/ipset/{name}/{cidr}")
def ipset_entry_read(call: Call) -> dict[str, Any]:
    with call.state.lock:
        ipset = _ipset(call)
        entry = dict(_entry(call, ipset))
        entry["digest"] = _digest_of_list(ipset["entries"])
    return entry


@route("PUT", "/nodes/{node}/lxc/{vmid}/firewall/ipset/{name}/{cidr}")
def ipset_entry_update(call: Call) -> None:
    p = call.params
    with call.mutate():
        ipset = _ipset(call)
        _assert_digest(_digest_of_list(ipset["entries"]), p.get("digest"))
        entry = _entry(call, ipset)
        if "nomatch" in p:
            if p["nomatch"]:
                entry["nomatch"] = 1
            else:
                entry.pop("nomatch", None)
        if p.get("comment"):
            entry["comment"] = p["comment"]


@route("DELETE", "/nodes/{node}/lxc/{vmid}/firewall/ipset/{name}/{cidr}")
def ipset_entry_delete(call: Call) -> None:
    p = call.params
    with call.mutate():
        ipset = _ipset(call)
        _assert_digest(_digest_of_list(ipset["entries"]), p.get("digest"))
        ipset["entries"] = [e for e in ipset["entries"] if e["cidr"] != p["cidr"]]
