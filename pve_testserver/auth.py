"""Users, API tokens, roles, ACLs and permission checks, evaluated the way pve-access-control does.

* ``root@pam`` has every privilege everywhere (``root@pam!tok`` tokens only through their own rules).
* ACLs live on paths (``/``, ``/vms/100``, ``/pool/sandbox``, ``/storage/local``,
  ``/sdn/zones/localnetwork/vmbr1`` ...) for users, groups or tokens, each role with a
  ``propagate`` flag. Walking the path from ``/``, the deepest level that assigns roles to the
  subject wins (token entries, then user entries, then group entries); a level only counts for
  deeper paths if the entry propagates. ``NoAccess`` wins over everything on its level.
* A pool's roles apply to its member guests (``/vms/<id>``) and storages, without propagation.
* A privilege-separated token (``privsep=1``) gets the intersection of its own ACLs and its
  user's; a ``privsep=0`` token gets exactly its user's privileges.
* ``permissions.check`` expressions of the schema (``perm``, ``and``, ``or``, ``userid-param``,
  ``userid-group``, ``perm-modify``) are evaluated by :meth:`AccessControl.check_api2`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import PVEError, fail, perm_error
from .formats import REALM_RE, TOKEN_SUBID_RE, USER_RE, split_list
from .privileges import BUILTIN_ROLES, PRIVILEGES
from .state import State

ROOT = "root@pam"
_TOKENID_RE = re.compile(rf"^(({USER_RE})@({REALM_RE}))!({TOKEN_SUBID_RE})$")
_USERID_RE = re.compile(rf"^({USER_RE})@({REALM_RE})$")
_AUTH_HEADER_RE = re.compile(r"(?:^|\s)PVEAPIToken(?:=| )([^;]*)")
_CHECK_PATH_RE = re.compile(
    r"^(/|/access|/access/groups|/access/groups/[\w.\-]+|/access/realm|/access/realm/[\w.\-]+"
    r"|/nodes|/nodes/[\w.\-]+|/pool|/pool/[A-Za-z0-9.\-_]+(?:/[A-Za-z0-9.\-_]+){0,2}"
    r"|/sdn|/sdn/[a-z-]+|/sdn/[a-z-]+/[\w.\-]+|/sdn/zones/[\w.\-]+/[\w.\-]+"
    r"|/sdn/zones/[\w.\-]+/[\w.\-]+/[1-9][0-9]{0,3}|/storage|/storage/[\w.\-]+|/vms|/vms/[1-9][0-9]{2,}"
    r"|/mapping|/mapping/[\w.\-]+|/mapping/[\w.\-]+/[\w.\-]+)$"
)

Privs = dict[str, bool]  # privilege -> propagate flag (PVE's permissions() result)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def split_tokenid(authid: str) -> tuple[str, str] | None:
    """``user@realm!name`` -> (``user@realm``, ``name``); None if not a token ID."""
    m = _TOKENID_RE.match(authid)
    return (m.group(1), m.group(4)) if m else None


def verify_username(userid: str) -> tuple[str, str]:
    """PVE's verify_username -> (userid, realm); raises the 500 PVE raises."""
    if len(userid) < 3:
        raise fail(f"user name '{userid}' is too short")
    if len(userid) > 64:
        raise fail(f"user name '{userid}' is too long ({len(userid)} > 64)")
    m = _USERID_RE.match(userid)
    if not m:
        raise fail(f"value '{userid}' does not look like a valid user name")
    return userid, m.group(2)


def normalize_path(path: str | None) -> str | None:
    """PVE::AccessControl::normalize_path."""
    if not path:
        return None
    path = re.sub(r"/+", "/", path)
    path = path.removesuffix("/") or "/"
    if not path.startswith("/"):
        path = "/" + path
    return path if re.match(r"^[A-Za-z0-9.\-_/]+$", path) else None


def check_acl_path(path: str) -> bool:
    """PVE::AccessControl::check_path: is ``path`` a valid ACL path."""
    return bool(_CHECK_PATH_RE.match(path))


def template_replace(template: str, params: Mapping[str, Any]) -> str:
    """PVE::Tools::template_replace: ``/vms/{vmid}`` with missing/false values as ``-``."""

    def sub(m: re.Match[str]) -> str:
        val = params.get(m.group(1))
        return str(val) if val not in (None, "", 0, "0", False) else "-"

    return re.sub(r"\{([^}]+)\}", sub, template)


class AccessControl:
    """Permission evaluation over the server :class:`State` (callers hold ``state.lock``)."""

    def __init__(self, state: State) -> None:
        self.state = state

    # --- roles and privileges -------------------------------------------------------------
    def role_privs(self, role: str) -> frozenset[str]:
        if role in BUILTIN_ROLES:
            return BUILTIN_ROLES[role]
        return frozenset(self.state.roles.get(role, ()))

    def role_exists(self, role: str) -> bool:
        return role in BUILTIN_ROLES or role in self.state.roles

    def _in_group(self, group: str, user: str) -> bool:
        return user in self.state.groups.get(group, {}).get("users", [])

    def roles(self, user: str, path: str) -> dict[str, bool]:
        """PVE::AccessControl::roles: role -> propagate for ``user`` (user or token ID) on ``path``."""
        tok = split_tokenid(user)
        if tok:
            info = self.state.users.get(tok[0], {}).get("tokens", {}).get(tok[1])
            if info is None:
                return {}
            if not info.get("privsep", True):
                return self.roles(tok[0], path)
        comps = [""] if path == "/" else path.split("/")
        roles: dict[str, bool] = {}
        acl_path = ""
        for i, comp in enumerate(comps):
            final = i == len(comps) - 1
            acl_path = "/" if i == 0 else (acl_path.rstrip("/") + "/" + comp)
            entry = self.state.acl.get(acl_path)
            if not entry:
                continue
            found: dict[str, bool] | None = None
            for kind in ("tokens", "users"):
                assigned = entry.get(kind, {}).get(user)
                if assigned:
                    new = {r: bool(p) for r, p in assigned.items() if final or p}
                    if new:
                        found = new
                        break
            if found is None:
                new = {}
                for group, assigned in entry.get("groups", {}).items():
                    if self._in_group(group, user):
                        new.update({r: bool(p) for r, p in assigned.items() if final or p})
                if new:
                    found = new
            if found is not None:
                roles = found
        if "NoAccess" in roles:
            return {"NoAccess": roles["NoAccess"]}
        return roles

    def _pool_roles(self, user: str, path: str) -> dict[str, bool]:
        m = re.match(r"^/(vms|storage)/(.+)$", path)
        if not m:
            return {}
        out: dict[str, bool] = {}
        for pool, data in self.state.pools.items():
            members = (
                [str(v) for v in data.get("vms", [])] if m.group(1) == "vms" else data.get("storage", [])
            )
            if m.group(2) not in members:
                continue
            for role in self.roles(user, f"/pool/{pool}"):
                out[role] = False
        return out

    def _compile(self, user: str, path: str) -> Privs:
        roles = self.roles(user, path)
        pool_roles = self._pool_roles(user, path)
        if pool_roles and "NoAccess" not in roles:
            if "NoAccess" in pool_roles:
                roles = {"NoAccess": False}
            else:
                for role in pool_roles:
                    roles.setdefault(role, False)
        privs: Privs = {}
        for role, prop in roles.items():
            for priv in self.role_privs(role):
                privs[priv] = privs.get(priv, False) or prop
        return privs

    def permissions(self, user: str, path: str) -> Privs:
        """PVE's RPCEnvironment::permissions: privilege -> propagate flag."""
        if user == ROOT:
            return dict.fromkeys(PRIVILEGES, True)
        tok = split_tokenid(user)
        if tok:
            username, name = tok
            info = self.state.users.get(username, {}).get("tokens", {}).get(name)
            if info is None:
                return {}
            user_perms = self.permissions(username, path)
            if not info.get("privsep", True):
                return user_perms
            privs = self._compile(user, path)
            if username != ROOT:
                privs = {p: user_perms[p] and v for p, v in privs.items() if p in user_perms}
            return privs
        if not _USERID_RE.match(user):
            return {}
        return self._compile(user, path)

    def check(self, user: str, path: str, privs: Sequence[str], noerr: bool = False) -> bool:
        have = self.permissions(user, path)
        for priv in privs:
            if priv not in have:
                if noerr:
                    return False
                raise perm_error(f"{path}, {priv}")
        return True

    def check_any(self, user: str, path: str, privs: Sequence[str], noerr: bool = False) -> bool:
        have = self.permissions(user, path)
        if any(p in have for p in privs):
            return True
        if noerr:
            return False
        raise perm_error(f"{path}, {'|'.join(privs)}")

    def check_full(self, user: str, path: str, privs: Sequence[str], any_: bool, noerr: bool = False) -> bool:
        return self.check_any(user, path, privs, noerr) if any_ else self.check(user, path, privs, noerr)

    def check_vm_perm(self, user: str, vmid: int, pool: str | None, privs: Sequence[str]) -> bool:
        if pool and self.check(user, f"/pool/{pool}", privs, noerr=True):
            return True
        return self.check(user, f"/vms/{vmid}", privs)

    def check_perm_modify(self, user: str, path: str | None, noerr: bool = False) -> bool:
        if not path:
            return self.check(user, "/access", ["Permissions.Modify"], noerr)
        test = ["Permissions.Modify"]
        if re.match(r"^/storage/.+$", path):
            test.append("Datastore.Allocate")
        elif re.match(r"^/vms/.+$", path):
            test.append("VM.Allocate")
        elif re.match(r"^/pool/.+$", path):
            test.append("Pool.Allocate")
        return self.check_any(user, path, test, noerr)

    def check_sdn_bridge(self, user: str, bridge: str, tag: str | None = None) -> None:
        """SDN.Use on the bridge (PVE 8+: guests may only use bridges they may use)."""
        if user == ROOT:
            return
        zone_path = f"/sdn/zones/localnetwork/{bridge}"
        self.check(user, f"{zone_path}/{tag}" if tag else zone_path, ["SDN.Use"])

    # --- users and tokens -----------------------------------------------------------------
    def check_user_exist(self, userid: str, noerr: bool = False) -> bool:
        if not noerr:
            verify_username(userid)
        elif not _USERID_RE.match(userid):
            return False
        if userid in self.state.users:
            return True
        if noerr:
            return False
        raise fail(f"no such user ('{userid}')")

    def verify_api_token(self, header: str | None) -> str:
        """Authenticate ``Authorization: PVEAPIToken=user@realm!name=secret``; returns the token ID."""
        m = _AUTH_HEADER_RE.search(header or "")
        if not m or not m.group(1):
            raise PVEError(401, "No ticket")
        value = urllib.parse.unquote(m.group(1))
        tokenid, sep, secret = value.rpartition("=")
        tok = split_tokenid(tokenid) if sep else None
        if not tok:
            raise PVEError(401, "Authentication failed!")
        username, name = tok
        user = self.state.users.get(username)
        now = time.time()
        info = (user or {}).get("tokens", {}).get(name)
        if (
            user is None
            or not user.get("enable", True)
            or (user.get("expire") and user["expire"] < now)
            or info is None
            or (info.get("expire") and info["expire"] < now)
            or not hmac.compare_digest(str(info.get("secret_sha256", "")), hash_secret(secret))
        ):
            raise PVEError(401, "Authentication failed!")
        return tokenid

    # --- schema permission expressions ----------------------------------------------------
    def _filter_groups(self, user: str, privs: Sequence[str]) -> set[str]:
        return {
            g for g in self.state.groups if self.check_any(user, f"/access/groups/{g}", privs, noerr=True)
        }

    def exec_check(
        self, check: Sequence[Any], user: str, params: Mapping[str, Any], noerr: bool = False
    ) -> bool:
        test = check[0]
        if test == "and":
            for sub in check[1:]:
                self.exec_check(sub, user, params)
            return True
        if test == "or":
            for sub in check[1:]:
                if self.exec_check(sub, user, params, noerr=True):
                    return True
            if noerr:
                return False
            raise perm_error()
        if test == "perm":
            tmpl, privs = str(check[1]), list(check[2])
            opts = dict(zip(check[3::2], check[4::2], strict=False))
            req = opts.get("require_param")
            if req and params.get(req) is None:
                if noerr:
                    return False
                raise perm_error()
            path = normalize_path(template_replace(tmpl, params)) or tmpl
            return self.check_full(user, path, privs, bool(opts.get("any")), noerr)
        if test == "userid-group":
            return self._check_userid_group(check, user, params, noerr)
        if test == "userid-param":
            userid, realm = verify_username(str(params.get("userid") or ""))
            if check[1] == "self":
                if not self.check_user_exist(userid, noerr):
                    return False
                if user == userid:
                    return True
                if noerr:
                    return False
                raise perm_error()
            return self.check(user, f"/access/realm/{realm}", ["Realm.AllocateUser"], noerr)
        if test == "perm-modify":
            mod_path = normalize_path(template_replace(str(check[1]), params))
            if mod_path is None:
                return False
            return self.check_perm_modify(user, mod_path, noerr)
        raise fail("unknown permission test")

    def _check_userid_group(
        self, check: Sequence[Any], user: str, params: Mapping[str, Any], noerr: bool
    ) -> bool:
        userid = str(params.get("userid") or "")
        privs = list(check[1])
        opts = dict(zip(check[2::2], check[3::2], strict=False))
        check_existing = opts.get("groups_param") != "create"
        if check_existing and not self.check_user_exist(userid, noerr):
            return False
        if self.check_any(user, "/access/groups", privs, noerr=True):
            return True
        groups = self._filter_groups(user, privs)
        if opts.get("groups_param"):
            wanted = split_list(str(params.get("groups") or ""))
            if not wanted:
                raise perm_error(f"/access/groups, {'|'.join(privs)}")
            for g in wanted:
                if g not in groups:
                    raise perm_error(f"/access/groups/{g}, {'|'.join(privs)}")
        if check_existing:
            allowed = {u for g in groups for u in self.state.groups.get(g, {}).get("users", [])}
            if userid not in allowed:
                if noerr:
                    return False
                raise perm_error()
        return True

    def check_api2(self, perm: Mapping[str, Any] | None, user: str, params: Mapping[str, Any]) -> None:
        """RPCEnvironment::check_api2_permissions."""
        if user == ROOT:
            return
        if perm is None:
            raise perm_error("user != root@pam")
        if perm.get("user") in ("all", "world"):
            return
        if perm.get("check"):
            self.exec_check(perm["check"], user, params)
            return
        raise perm_error()

    def effective_permissions(self, user: str) -> dict[str, Privs]:
        """RPCEnvironment::get_effective_permissions (GET /access/permissions without path)."""
        paths = {"/", "/access", "/access/groups", "/nodes", "/pool", "/sdn", "/storage", "/vms"}
        paths.update(self.state.acl)
        for data in self.state.pools.values():
            paths.update(f"/vms/{v}" for v in data.get("vms", []))
            paths.update(f"/storage/{s}" for s in data.get("storage", []))
        out: dict[str, Privs] = {}
        for path in sorted(paths):
            privs = self.permissions(user, path)
            if privs:
                out[path] = privs
        return out
