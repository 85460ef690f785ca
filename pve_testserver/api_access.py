"""/pools, /access/{users,roles,acl,permissions} and API tokens (pve-manager, pve-access-control)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .api_cluster import ct_stats
from .auth import ROOT, check_acl_path, hash_secret, normalize_path, split_tokenid
from .core import Call, route
from .errors import PVEError, fail, param_error
from .formats import split_list
from .privileges import BUILTIN_ROLES
from .state import State


@contextmanager
def user_config(call: Call, errmsg: str) -> Iterator[State]:
    """PVE's lock_user_config(code, errmsg): any error becomes ``500 <errmsg>: <error>``."""
    with call.state.lock:
        backup = call.state.snapshot()
        try:
            yield call.state
        except PVEError as exc:
            call.state.restore(backup)
            raise fail(f"{errmsg}: {exc.perl_string()}") from None
        except BaseException:
            call.state.restore(backup)
            raise
        call.state.save()


# --- pools -------------------------------------------------------------------------------------


def _pool_members(call: Call, pool: str, kind: str | None) -> list[dict[str, Any]]:
    data = call.state.pools[pool]
    members: list[dict[str, Any]] = []
    for vmid in sorted(data.get("vms", [])):
        ct = call.state.ct(vmid)
        if ct is None or kind not in (None, "lxc"):
            continue
        members.append({"id": f"lxc/{vmid}", "node": ct["node"], **ct_stats(call, vmid, ct)})
    if kind in (None, "storage"):
        for sid in sorted(data.get("storage", [])):
            if sid in call.state.storages:
                node = call.core.local_node
                members.append(
                    {"id": f"storage/{node}/{sid}", "node": node, "storage": sid, "type": "storage"}
                )
    return members


def _pool_info(call: Call, pool: str) -> dict[str, Any]:
    data = call.state.pools.get(pool)
    if data is None:
        raise fail(f"pool '{pool}' does not exist")
    info: dict[str, Any] = {"poolid": pool, "members": _pool_members(call, pool, call.params.get("type"))}
    if data.get("comment"):
        info["comment"] = data["comment"]
    return info


@route("GET", "/pools")
def pools_index(call: Call) -> list[dict[str, Any]]:
    with call.state.lock:
        if call.params.get("poolid"):
            pool = call.params["poolid"]
            call.acl.check(call.authid, f"/pool/{pool}", ["Pool.Audit"], noerr=True)
            return [_pool_info(call, pool)]
        out = []
        for pool, data in sorted(call.state.pools.items()):
            if call.acl.check(call.authid, f"/pool/{pool}", ["Pool.Audit"], noerr=True):
                entry = {"poolid": pool}
                if data.get("comment"):
                    entry["comment"] = data["comment"]
                out.append(entry)
        return out


@route("GET", "/pools/{poolid}")
def pool_read(call: Call) -> dict[str, Any]:
    with call.state.lock:
        info = _pool_info(call, call.params["poolid"])
    info.pop("poolid")
    return info


@route("POST", "/pools")
def pool_create(call: Call) -> None:
    pool = call.params["poolid"]
    with user_config(call, "create pool failed") as st:
        if pool in st.pools:
            raise fail(f"pool '{pool}' already exists")
        parent, slash, leaf = pool.rpartition("/")
        if slash and parent not in st.pools:
            raise fail(f"parent '{parent}' of pool '{pool}' does not exist")
        if not re.match(r"^[A-Za-z]", leaf):
            raise fail("pool name must start with a letter")
        st.pools[pool] = {"vms": [], "storage": []}
        if call.params.get("comment"):
            st.pools[pool]["comment"] = call.params["comment"]


@route("PUT", "/pools")
@route("PUT", "/pools/{poolid}")
def pool_update(call: Call) -> None:
    p = call.params
    pool = p["poolid"]
    with user_config(call, "update pools failed") as st:
        data = st.pools.get(pool)
        if data is None:
            raise fail(f"pool '{pool}' does not exist")
        if "comment" in p:
            data["comment"] = p["comment"]
        for vmid in (int(v) for v in split_list(p.get("vms", ""))):
            call.acl.check_perm_modify(call.authid, f"/vms/{vmid}")
            if p.get("delete"):
                if vmid not in data["vms"]:
                    raise fail(f"VM {vmid} is not a pool member")
                data["vms"].remove(vmid)
                continue
            if vmid in data["vms"]:
                raise fail(f"VM {vmid} is already a pool member")
            other = st.pool_of(vmid)
            if other is not None:
                if not p.get("allow-move"):
                    raise fail(f"VM {vmid} belongs already to pool '{other}' and 'allow-move' is not set")
                call.acl.check(call.authid, f"/pool/{other}", ["Pool.Allocate"])
                st.pools[other]["vms"].remove(vmid)
            data["vms"].append(vmid)
        for sid in split_list(p.get("storage", "")):
            call.acl.check_perm_modify(call.authid, f"/storage/{sid}")
            if p.get("delete"):
                if sid not in data["storage"]:
                    raise fail(f"Storage '{sid}' is not a pool member")
                data["storage"].remove(sid)
            elif sid in data["storage"]:
                raise fail(f"Storage '{sid}' is already a pool member")
            else:
                data["storage"].append(sid)


@route("DELETE", "/pools")
@route("DELETE", "/pools/{poolid}")
def pool_delete(call: Call) -> None:
    pool = call.params["poolid"]
    with user_config(call, "delete pool failed") as st:
        data = st.pools.get(pool)
        if data is None:
            raise fail(f"pool '{pool}' does not exist")
        sub = sorted(p for p in st.pools if p.startswith(pool + "/"))
        vms = [v for v in sorted(data.get("vms", [])) if st.ct(v) is not None]
        stores = [s for s in sorted(data.get("storage", [])) if s in st.storages]
        if sub:
            raise fail(f"pool '{pool}' is not empty (contains pool '{sub[0]}')")
        if vms:
            raise fail(f"pool '{pool}' is not empty (contains VM {vms[0]})")
        if stores:
            raise fail(f"pool '{pool}' is not empty (contains storage '{stores[0]}')")
        del st.pools[pool]
        st.acl.pop(f"/pool/{pool}", None)


# --- users and tokens --------------------------------------------------------------------------

_USER_FIELDS = ("comment", "email", "firstname", "lastname", "expire", "enable", "keys")


def _user_entry(userid: str, data: dict[str, Any], full: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "userid": userid,
        "enable": int(data.get("enable", True)),
        "expire": data.get("expire", 0),
    }
    realm = userid.rsplit("@", 1)[1]
    entry["realm-type"] = realm if realm in ("pam", "pve") else "pve"
    for key in ("comment", "email", "firstname", "lastname"):
        if data.get(key):
            entry[key] = data[key]
    if full:
        entry["tokens"] = [_token_entry(name, tok) for name, tok in sorted(data.get("tokens", {}).items())]
    return entry


def _token_entry(name: str, tok: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "tokenid": name,
        "privsep": int(tok.get("privsep", True)),
        "expire": tok.get("expire", 0),
    }
    if tok.get("comment"):
        entry["comment"] = tok["comment"]
    return entry


def _user_or_fail(call: Call, userid: str) -> dict[str, Any]:
    data: dict[str, Any] | None = call.state.users.get(userid)
    if data is None:
        raise fail(f"no such user ('{userid}')")
    return data


@route("GET", "/access/users")
def users_index(call: Call) -> list[dict[str, Any]]:
    p = call.params
    me = split_tokenid(call.authid)
    own = me[0] if me else call.authid
    out = []
    with call.state.lock:
        can_all = call.acl.check_any(call.authid, "/access/groups", ["User.Modify", "Sys.Audit"], noerr=True)
        for userid, data in sorted(call.state.users.items()):
            if not can_all and userid != own:
                groups = [g for g, gd in call.state.groups.items() if userid in gd.get("users", [])]
                if not any(
                    call.acl.check_any(
                        call.authid, f"/access/groups/{g}", ["User.Modify", "Sys.Audit"], noerr=True
                    )
                    for g in groups
                ):
                    continue
            if "enabled" in p and bool(data.get("enable", True)) != p["enabled"]:
                continue
            out.append(_user_entry(userid, data, bool(p.get("full"))))
    return out


@route("GET", "/access/users/{userid}")
def user_read(call: Call) -> dict[str, Any]:
    with call.state.lock:
        entry = _user_entry(call.params["userid"], _user_or_fail(call, call.params["userid"]), full=False)
        entry["tokens"] = {
            n: _token_entry(n, t)
            for n, t in _user_or_fail(call, call.params["userid"]).get("tokens", {}).items()
        }
        for tok in entry["tokens"].values():
            tok.pop("tokenid")
    entry.pop("userid")
    entry.pop("realm-type")
    return entry


@route("POST", "/access/users")
def user_create(call: Call) -> None:
    p = call.params
    userid = p["userid"]
    with user_config(call, "create user failed") as st:
        if userid in st.users:
            raise fail(f"user '{userid}' already exists")
        if "password" in p and not userid.endswith("@pve"):
            raise fail(f"can't set password on auth realm '{userid.rsplit('@', 1)[1]}'")
        for group in split_list(p.get("groups", "")):
            if group not in st.groups:
                raise fail(f"no such group '{group}'")
        st.users[userid] = {"enable": p.get("enable", True), "expire": p.get("expire", 0), "tokens": {}}
        st.users[userid].update({k: p[k] for k in _USER_FIELDS if k in p})
        for group in split_list(p.get("groups", "")):
            st.groups[group].setdefault("users", []).append(userid)


@route("PUT", "/access/users/{userid}")
def user_update(call: Call) -> None:
    p = call.params
    with user_config(call, "update user failed") as st:
        data = _user_or_fail(call, p["userid"])
        data.update({k: p[k] for k in _USER_FIELDS if k in p})
        if "groups" in p:
            wanted = split_list(p["groups"])
            for group in wanted:
                if group not in st.groups:
                    raise fail(f"no such group '{group}'")
            for group, gd in st.groups.items():
                members = gd.setdefault("users", [])
                if group in wanted and p["userid"] not in members:
                    members.append(p["userid"])
                elif group not in wanted and not p.get("append") and p["userid"] in members:
                    members.remove(p["userid"])


@route("DELETE", "/access/users/{userid}")
def user_delete(call: Call) -> None:
    userid = call.params["userid"]
    with user_config(call, "delete user failed") as st:
        if userid == ROOT:
            raise fail("deleting the root user is not allowed")
        _user_or_fail(call, userid)
        tokens = [f"{userid}!{t}" for t in st.users[userid].get("tokens", {})]
        del st.users[userid]
        for entry in st.acl.values():
            entry.get("users", {}).pop(userid, None)
            for tok in tokens:
                entry.get("tokens", {}).pop(tok, None)
        for gd in st.groups.values():
            if userid in gd.get("users", []):
                gd["users"].remove(userid)


@route("GET", "/access/users/{userid}/token")
def tokens_index(call: Call) -> list[dict[str, Any]]:
    with call.state.lock:
        data = _user_or_fail(call, call.params["userid"])
        return [_token_entry(n, t) for n, t in sorted(data.get("tokens", {}).items())]


def _token_or_fail(call: Call, userid: str, name: str) -> dict[str, Any]:
    tok: dict[str, Any] | None = _user_or_fail(call, userid).get("tokens", {}).get(name)
    if tok is None:
        raise fail(f"no such token '{name}' for user '{userid}'")
    return tok


@route("GET", "/access/users/{userid}/token/{tokenid}")
def token_read(call: Call) -> dict[str, Any]:
    with call.state.lock:
        entry = _token_entry(
            call.params["tokenid"], _token_or_fail(call, call.params["userid"], call.params["tokenid"])
        )
    entry.pop("tokenid")
    return entry


def create_token(
    state: State, userid: str, name: str, privsep: bool, expire: int = 0, comment: str = ""
) -> str:
    """Add a token (state lock held by caller); returns the secret (shown once, stored hashed)."""
    secret = str(uuid.uuid4())
    tok: dict[str, Any] = {"privsep": privsep, "expire": expire, "secret_sha256": hash_secret(secret)}
    if comment:
        tok["comment"] = comment
    state.users[userid].setdefault("tokens", {})[name] = tok
    return secret


@route("POST", "/access/users/{userid}/token/{tokenid}")
def token_create(call: Call) -> dict[str, Any]:
    p = call.params
    userid, name = p["userid"], p["tokenid"]
    with call.mutate():
        data = _user_or_fail(call, userid)
        if name in data.get("tokens", {}):
            raise param_error({"tokenid": "Token already exists."})
        secret = create_token(
            call.state, userid, name, p.get("privsep", True), p.get("expire", 0), p.get("comment", "")
        )
        info = _token_entry(name, data["tokens"][name])
    info.pop("tokenid")
    if not info.get("expire"):
        info.pop("expire")
    return {"full-tokenid": f"{userid}!{name}", "info": info, "value": secret}


@route("PUT", "/access/users/{userid}/token/{tokenid}")
def token_update(call: Call) -> dict[str, Any]:
    p = call.params
    with call.mutate():
        tok = _token_or_fail(call, p["userid"], p["tokenid"])
        for key in split_list(p.get("delete", "")):
            if key not in ("comment", "expire", "privsep"):
                raise param_error({"delete": f"unknown option '{key}'"})
            tok.pop(key, None)
        for key in ("comment", "expire", "privsep"):
            if key in p:
                tok[key] = p[key]
        entry = _token_entry(p["tokenid"], tok)
    entry.pop("tokenid")
    return entry


@route("DELETE", "/access/users/{userid}/token/{tokenid}")
def token_delete(call: Call) -> None:
    p = call.params
    with call.mutate() as st:
        _token_or_fail(call, p["userid"], p["tokenid"])
        del st.users[p["userid"]]["tokens"][p["tokenid"]]
        full = f"{p['userid']}!{p['tokenid']}"
        for entry in st.acl.values():
            entry.get("tokens", {}).pop(full, None)


# --- roles -------------------------------------------------------------------------------------


@route("GET", "/access/roles")
def roles_index(call: Call) -> list[dict[str, Any]]:
    with call.state.lock:
        out = [{"roleid": r, "privs": ",".join(sorted(p)), "special": 1} for r, p in BUILTIN_ROLES.items()]
        out += [
            {"roleid": r, "privs": ",".join(sorted(p)), "special": 0} for r, p in call.state.roles.items()
        ]
    return sorted(out, key=lambda e: str(e["roleid"]))


@route("GET", "/access/roles/{roleid}")
def role_read(call: Call) -> dict[str, int]:
    role = call.params["roleid"]
    with call.state.lock:
        if not call.acl.role_exists(role):
            raise fail(f"role '{role}' does not exist")
        return dict.fromkeys(sorted(call.acl.role_privs(role)), 1)


@route("POST", "/access/roles")
def role_create(call: Call) -> None:
    role = call.params["roleid"]
    if role.lower().startswith("pve"):
        raise param_error(
            {"roleid": "cannot use role ID starting with the (case-insensitive) 'PVE' namespace"}
        )
    with user_config(call, "create role failed") as st:
        if role in st.roles or role in BUILTIN_ROLES:
            raise fail(f"role '{role}' already exists")
        st.roles[role] = sorted(set(split_list(call.params.get("privs", ""))))


@route("PUT", "/access/roles/{roleid}")
def role_update(call: Call) -> None:
    role = call.params["roleid"]
    if role in BUILTIN_ROLES:
        raise fail(f"auto-generated role '{role}' cannot be modified")
    with user_config(call, "update role failed") as st:
        if role not in st.roles:
            raise fail(f"role '{role}' does not exist")
        privs = set(split_list(call.params.get("privs", "")))
        if call.params.get("append"):
            privs |= set(st.roles[role])
        st.roles[role] = sorted(privs)


@route("DELETE", "/access/roles/{roleid}")
def role_delete(call: Call) -> None:
    role = call.params["roleid"]
    if role in BUILTIN_ROLES:
        raise fail(f"auto-generated role '{role}' cannot be deleted")
    with user_config(call, "delete role failed") as st:
        if role not in st.roles:
            raise fail(f"role '{role}' does not exist")
        del st.roles[role]
        for entry in st.acl.values():
            for kind in ("users", "groups", "tokens"):
                for assigned in entry.get(kind, {}).values():
                    assigned.pop(role, None)


# --- ACL and permissions -----------------------------------------------------------------------

_PM = "'Permissions.Modify'"


@route("GET", "/access/acl")
def acl_index(call: Call) -> list[dict[str, Any]]:
    out = []
    with call.state.lock:
        audit = call.acl.check(call.authid, "/access", ["Sys.Audit"], noerr=True)
        for path, entry in sorted(call.state.acl.items()):
            if not (audit or call.acl.check_perm_modify(call.authid, path, noerr=True)):
                continue
            for kind, typ in (("users", "user"), ("groups", "group"), ("tokens", "token")):
                for ugid, assigned in sorted(entry.get(kind, {}).items()):
                    for role, prop in sorted(assigned.items()):
                        out.append(
                            {"path": path, "type": typ, "ugid": ugid, "roleid": role, "propagate": int(prop)}
                        )
    return out


@route("PUT", "/access/acl")
def acl_update(call: Call) -> None:
    p = call.params
    if not (p.get("users") or p.get("groups") or p.get("tokens")):
        raise param_error(
            dict.fromkeys(("users", "groups", "tokens"), "either 'users', 'groups' or 'tokens' is required.")
        )
    path = normalize_path(p["path"])
    if not path or (not p.get("delete") and not check_acl_path(path)):
        raise param_error({"path": f"invalid ACL path '{p['path']}'"})
    propagate = bool(p.get("propagate", True))
    with user_config(call, "ACL update failed") as st:
        mine = call.acl.permissions(call.authid, path)
        entry = st.acl.setdefault(path, {"users": {}, "groups": {}, "tokens": {}})
        for role in split_list(p["roles"]):
            if not call.acl.role_exists(role):
                raise fail(f"role '{role}' does not exist")
            if "Permissions.Modify" not in mine:
                verb = "remove" if p.get("delete") else "add"
                for priv in call.acl.role_privs(role):
                    if priv not in mine:
                        raise param_error(
                            {
                                "role": f"Cannot {verb} role '{role}' - "
                                f"requires {_PM} or superset of privileges."
                            }
                        )
                    if propagate and mine[priv] != propagate and not p.get("delete"):
                        raise param_error(
                            {
                                "role": f"Cannot {verb} role '{role}' with propagation - "
                                f"requires {_PM} or propagated superset of privileges."
                            }
                        )
                if role == "NoAccess":
                    raise param_error(
                        {"role": f"Cannot {verb} role '{role}' - requires 'Permissions.Modify'"}
                    )
            subjects: list[tuple[str, str]] = []
            for group in split_list(p.get("groups", "")):
                if group not in st.groups:
                    raise fail(f"group '{group}' does not exist")
                subjects.append(("groups", group))
            for userid in split_list(p.get("users", "")):
                if userid not in st.users:
                    raise fail(f"user '{userid}' does not exist")
                subjects.append(("users", userid))
            for tokenid in split_list(p.get("tokens", "")):
                tok = split_tokenid(tokenid)
                if not tok or tok[1] not in st.users.get(tok[0], {}).get("tokens", {}):
                    user, _, name = tokenid.partition("!")
                    raise fail(f"no such token '{name}' for user '{user}'")
                subjects.append(("tokens", tokenid))
            for kind, ugid in subjects:
                assigned = entry.setdefault(kind, {}).setdefault(ugid, {})
                if p.get("delete"):
                    assigned.pop(role, None)
                else:
                    assigned[role] = int(propagate)
        for kind in ("users", "groups", "tokens"):
            entry[kind] = {k: v for k, v in entry.get(kind, {}).items() if v}
        if not any(entry.values()):
            del st.acl[path]


@route("GET", "/access/permissions")
def permissions(call: Call) -> dict[str, dict[str, int]]:
    target = call.params.get("userid") or call.authid
    tok = split_tokenid(target)
    with call.state.lock:
        if not (target == call.authid or (tok and tok[0] == call.authid)):
            call.acl.check(call.authid, "/access", ["Sys.Audit"])
        if call.params.get("path"):
            path = call.params["path"]
            perms = {path: call.acl.permissions(target, path)}
        else:
            perms = call.acl.effective_permissions(target)
    return {path: {priv: int(prop) for priv, prop in sorted(privs.items())} for path, privs in perms.items()}
