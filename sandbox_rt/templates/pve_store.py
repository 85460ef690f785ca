"""Built templates on Proxmox VE: a stopped build CT becomes a CT template the runtime's token can
only clone.

The runtime's own token (roles/proxmox_access: its role on the pool, a clone-only role on each
template) cannot convert a CT to a template (``POST /nodes/{node}/lxc/{vmid}/template`` needs
``VM.Allocate`` on ``/vms/{vmid}``, which the pool's role would give, but the template must then leave
the pool), move a CT out of its pool (``PUT /pools``: ``Pool.Allocate`` on the pool and
``Permissions.Modify`` or ``VM.Allocate`` on the CT) or grant an ACL (``PUT /access/acl``:
``Permissions.Modify`` on the path, or VM.Allocate there with a superset of the role's privileges).
Those calls take the operator's admin token (``pve_admin_token_file``, a root-only file holding
``USER@REALM!TOKENID=SECRET``); the secret is read when needed and never logged.

The steps, in order (any failure destroys the build CT, half-converted or not, and records nothing):

1. The runtime's token, while the CT is still its pool's sandbox: the runtime's firewall rules of the
   CT go (the egress of the build; clones copy a template's firewall), the sandbox's tags (its id,
   address, expiry: gc and list must not see a template), its root-on-request ``env`` and its record
   in the description go; the description names the built template; the hostname is its container
   name (``built-<name>-<key>``).
2. The admin token: the CT leaves the runtime's pool (``PUT /pools``, PVE 8.2+; ``PUT
   /pools/{poolid}`` on older), becomes a template (``POST .../template``; PVE answers null and
   converts in a ``vztemplate`` worker, which is waited for), and the runtime's user and token get the
   clone-only role (``pve_template_role``) on ``/vms/<vmid>`` without propagation, as the inventory's
   templates have it.
3. The VMID is recorded in the registry; :meth:`Settings.pve_template_vmids` merges it, so
   ``create(template=name)`` clones it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import socket
import stat
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..config import Settings
from ..errors import BackendError, ConfigError, PermissionDenied, SandboxError, StateConflict
from ..template_registry import BuiltTemplate
from ..validation import split_egress

if TYPE_CHECKING:
    from ..backends.proxmox import ProxmoxBackend
    from ..backends.proxmox.core import PveCore

__all__ = [
    "BUILT_PREFIX",
    "HOSTS_BEGIN",
    "HOSTS_END",
    "admin_core",
    "base_identity",
    "built_info",
    "convert",
    "delete_template",
    "discard_build",
    "hosts_block",
    "read_admin_token",
    "resolve_egress",
    "template_exists",
]

BUILT_PREFIX = "sandbox-rt-built-template: "  # the description line of a built CT template
HOSTS_BEGIN = "# sandbox-rt build egress {"
HOSTS_END = "# sandbox-rt build egress }"
_TOKEN_ID = re.compile(r"[^@!\s=]+@[^@!\s=]+![A-Za-z][A-Za-z0-9._-]*")
_LINKED = re.compile(r"in use by linked clone", re.I)
Log = Callable[[str], None]

WHAT_ADMIN_NEEDS = (
    "VM.Allocate on /vms/<vmid> (convert, delete), Pool.Allocate on /pool/<pve_pool> and "
    "Permissions.Modify on /vms (leave the pool, grant the clone-only role)"
)


@dataclasses.dataclass(frozen=True)
class AdminToken:
    tokenid: str
    secret: str = dataclasses.field(repr=False)


def read_admin_token(settings: Settings, doing: str = "build templates from code") -> AdminToken:
    """The operator's admin token from ``pve_admin_token_file`` (ConfigError saying what to provide)."""
    path = settings.pve_admin_token_file
    if not path:
        raise ConfigError(
            f"to {doing} on Proxmox VE the runtime needs the operator's admin API token (its own token "
            "may only clone templates): set pve_admin_token_file in host.json (or "
            "SANDBOX_RT_PVE_ADMIN_TOKEN_FILE) to a root-only (0600) file holding "
            f"USER@REALM!TOKENID=SECRET of a token with {WHAT_ADMIN_NEEDS} (docs/templates.md)"
        )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"cannot read pve_admin_token_file {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"pve_admin_token_file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise ConfigError(
                f"pve_admin_token_file {path} is readable by others (mode {stat.S_IMODE(st.st_mode):o}): "
                "it holds an admin secret; chmod 600 it"
            )
        with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as fh:
            fd = -1
            text = fh.read(4096).strip()
    finally:
        if fd >= 0:
            os.close(fd)
    tokenid, sep, secret = text.partition("=")
    if not sep or not secret or not _TOKEN_ID.fullmatch(tokenid) or any(c.isspace() for c in secret):
        raise ConfigError(
            f"pve_admin_token_file {path} must hold one line USER@REALM!TOKENID=SECRET "
            "(the secret is not shown)"
        )
    return AdminToken(tokenid, secret)


class _AdminCore:
    """Typed calls with the admin token (PermissionDenied says it is the admin token that lacks it)."""

    def __init__(self, core: PveCore) -> None:
        self.core = core
        self.api = core.api

    def call(self, step: str, fn: Callable[[], Any]) -> Any:
        try:
            return self.core._retrying(step, fn)
        except PermissionDenied as exc:
            raise PermissionDenied(
                f"the admin token (pve_admin_token_file) lacks a privilege: "
                f"{str(exc).removeprefix(step + ': ').removeprefix('the API token lacks a privilege: ')} "
                f"(it needs {WHAT_ADMIN_NEEDS})",
                step=step,
            ) from exc

    def wait(self, upid: str, step: str) -> None:
        self.core._wait(upid, step)


def admin_core(settings: Settings, doing: str = "build templates from code", api: Any = None) -> _AdminCore:
    """The admin token's connection (same URL and TLS checks as the runtime's)."""
    from ..backends.proxmox.core import PveCore

    token = read_admin_token(settings, doing)
    admin_settings = dataclasses.replace(
        settings, pve_token_id=token.tokenid, pve_token_secret=token.secret, pve_token_secret_file=""
    )
    return _AdminCore(PveCore(admin_settings, api))


# --- the build's inputs ----------------------------------------------------------------------------


def resolve_egress(entries: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """(addresses and networks for the CT firewall, name -> its IPv4 addresses): PVE's firewall
    matches addresses only, so the steps' package sources are resolved here, on the controller, at
    build time (and the build CT's /etc/hosts names them, as its firewall lets no DNS through)."""
    nets, names = split_egress(entries)
    hosts: dict[str, list[str]] = {}
    for name in names:
        try:
            infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise ConfigError(
                f"the build's egress name {name!r} does not resolve on this machine ({exc}): on Proxmox "
                "VE the build CT's firewall takes addresses only, so the runtime resolves the steps' "
                "package sources here at build time; fix the resolver or give addresses (Template.allow)"
            ) from None
        hosts[name] = sorted({str(info[4][0]) for info in infos})
    out = list(nets)
    for addrs in hosts.values():
        out += [a for a in addrs if a not in out]
    return out, hosts


def hosts_block(hosts: dict[str, list[str]]) -> str:
    """The /etc/hosts lines that name the resolved package sources in the build CT."""
    named = [f"{addrs[0]} {name}" for name, addrs in sorted(hosts.items()) if addrs]
    return "\n".join([HOSTS_BEGIN, *named, HOSTS_END]) + "\n"


def _where(backend: ProxmoxBackend, vmid: int) -> tuple[str, dict[str, Any]] | None:
    for row in backend._resources():
        if int(row["vmid"]) == vmid:
            return str(row["node"]), row
    return None


def template_exists(backend: ProxmoxBackend, vmid: int) -> bool:
    """Is CT ``vmid`` there, a template, and visible to the runtime's token (the cache's check)."""
    found = _where(backend, vmid)
    return found is not None and bool(int(found[1].get("template") or 0))


def base_identity(backend: ProxmoxBackend, base: str, built: BuiltTemplate | None) -> str:
    """What identifies the base to the cache: a built base's own key; otherwise its VMID and its
    config's digest (PVE's, over the whole config: a rebuilt template differs)."""
    if built is not None:
        return f"built:{built.key}"
    vmid = backend._template_vmid(base)
    found = _where(backend, vmid)
    if found is None:
        raise ConfigError(f"template {base!r} (CT {vmid}) not found, or the runtime's token may not audit it")
    node = found[0]
    conf = backend._call("template", lambda: backend._ct(node, vmid).config.get())
    return f"pve:{vmid}:{conf.get('digest', '')}"


# --- making and removing the template ------------------------------------------------------------


def _description(entry: BuiltTemplate) -> str:
    data = {"name": entry.name, "key": entry.key, "base": entry.base, "built_at": int(entry.built_at)}
    return (
        BUILT_PREFIX
        + json.dumps(data, sort_keys=True, separators=(",", ":"))
        + "\nsteps: "
        + "; ".join(entry.steps)
    )[:8000]


def _wait_converted(admin: _AdminCore, node: str, vmid: int, since: float) -> None:
    """PVE converts in a ``vztemplate`` worker it does not return: wait for that task, then check."""
    tasks = admin.call(
        "template",
        lambda: admin.api.nodes(node).tasks.get(vmid=vmid, typefilter="vztemplate", source="all", limit=10),
    )
    upids = [str(t["upid"]) for t in tasks if float(t.get("starttime", 0)) >= int(since) - 1]
    if upids:
        admin.wait(upids[0], "template")
    conf = admin.call("template", lambda: admin.api.nodes(node).lxc(vmid).config.get())
    if not int(conf.get("template") or 0):
        raise BackendError(f"CT {vmid} is not a template after its conversion", step="template")


def _leave_pool(admin: _AdminCore, pool: str, vmid: int) -> None:
    """``PUT /pools`` (PVE 8.2+) with ``delete``; ``PUT /pools/{poolid}`` where that is missing."""
    try:
        admin.call("template", lambda: admin.api.pools.put(poolid=pool, vms=str(vmid), delete=1))
    except BackendError as exc:
        if not re.search(r"\b(501|404)\b|not implemented", str(exc)) or isinstance(exc, PermissionDenied):
            raise
        admin.call("template", lambda: admin.api.pools(pool).put(vms=str(vmid), delete=1))


def convert(
    backend: ProxmoxBackend,
    admin: _AdminCore,
    node: str,
    vmid: int,
    entry: BuiltTemplate,
    log: Log,
) -> None:
    """Turn the stopped build CT ``vmid`` into the template ``entry`` describes (module docstring).
    Its tags and record go in the same config write that names it a built template, so a failure
    at any point leaves a CT either the runtime finds by its id or :func:`discard_build` recognises."""
    settings = backend.settings
    ct = backend._ct(node, vmid)
    log("clearing the build state of the CT (firewall rules, tags, root, record)")
    backend._drop_cloned_rules(node, vmid)
    conf = backend._call("template", lambda: ct.config.get())
    delete = [opt for opt in ("tags", "env") if opt in conf]
    changes: dict[str, Any] = {"description": _description(entry), "hostname": entry.container}
    if delete:
        changes["delete"] = ",".join(delete)
    backend._retrying("template", lambda: ct.config.put(**changes), vmid=vmid)
    log(f"moving CT {vmid} out of pool {settings.pve_pool} and converting it to a template (admin token)")
    if settings.pve_pool:
        _leave_pool(admin, settings.pve_pool, vmid)
    since = time.time()
    admin.call("template", lambda: admin.api.nodes(node).lxc(vmid).template.post())
    _wait_converted(admin, node, vmid, since)
    user = settings.pve_token_id.partition("!")[0]
    log(f"granting {settings.pve_template_role} on /vms/{vmid} to {settings.pve_token_id} (clone only)")
    admin.call(
        "template",
        lambda: admin.api.access.acl.put(
            path=f"/vms/{vmid}",
            roles=settings.pve_template_role,
            users=user,
            tokens=settings.pve_token_id,
            propagate=0,
        ),
    )


def delete_template(admin: _AdminCore, vmid: int, *, name: str, must_be_built: bool = True) -> bool:
    """Delete CT ``vmid`` with the admin token (``purge``: its ACLs and pool membership go too).
    ``must_be_built``: only if its description says it is a built template (a VMID reused since is
    left alone). False when there was nothing to delete. PVE refuses a template whose disk linked
    clones still use: StateConflict."""
    rows = admin.call("remove", lambda: admin.api.cluster.resources.get(type="vm"))
    node = next((str(r["node"]) for r in rows if int(r.get("vmid", 0)) == vmid), None)
    if node is None:
        return False
    ct = admin.api.nodes(node).lxc(vmid)
    if must_be_built:
        info = built_info(admin.call("remove", lambda: ct.config.get()))
        if info is None or info.get("name") != name:
            return False
    try:
        upid = admin.call("remove", lambda: ct.delete(purge=1, force=1))
        admin.wait(str(upid), "remove")
    except BackendError as exc:
        if _LINKED.search(f"{exc} {exc.detail or ''}"):
            raise StateConflict(
                f"cannot remove template {name!r}: PVE refuses, CTs that are not this runtime's sandboxes "
                f"are linked clones of CT {vmid} (remove them first): {exc}"
            ) from exc
        raise
    return True


def discard_build(admin: _AdminCore, node: str, vmid: int, log: Log) -> None:
    """Remove a build CT the runtime can no longer find by its id (untagged, out of the pool or a
    template already): with the admin token, by VMID, if it is still the build's CT."""
    with contextlib.suppress(SandboxError):
        ct = admin.api.nodes(node).lxc(vmid)
        if built_info(admin.call("cleanup", lambda: ct.config.get())) is None:
            log(f"CT {vmid} is not the build's any more: left alone")
            return
        status = admin.call("cleanup", lambda: ct.status.current.get())
        if status.get("status") == "running":
            admin.wait(str(admin.call("cleanup", lambda: ct.status.stop.post())), "cleanup")
        upid = admin.call("cleanup", lambda: ct.delete(purge=1, force=1))
        admin.wait(str(upid), "cleanup")
        return
    log(f"could not remove the build CT {vmid} on node {node}: remove it by hand (pct destroy {vmid})")


def built_info(conf: dict[str, Any]) -> dict[str, Any] | None:
    """The built-template line of a CT's description (None: not a template built from code)."""
    first = str(conf.get("description", "")).partition("\n")[0]
    if not first.startswith(BUILT_PREFIX):
        return None
    with contextlib.suppress(ValueError):
        data = json.loads(first[len(BUILT_PREFIX) :])
        return data if isinstance(data, dict) else None
    return None
