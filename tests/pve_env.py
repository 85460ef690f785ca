"""A Proxmox environment for the runtime suite: the PVE API test server backed by real LXC, wired to
the runtime's ``Settings`` (here, beside the tests and benchmarks that use it: the server itself never
imports the runtime).

Set up as an operator would on a real PVE (what the proxmox_access role does): a pool, a
least-privilege role, a user with a privilege-separated API token, ACLs on the pool, the storage and
the bridge, and a CT template in the pool. The runtime then gets only that token.
With SANDBOX_RT_PVE_URL (+ _TOKEN_ID, _TOKEN_SECRET, _TEMPLATE_VMID ...) set, the suite uses that
real PVE instead (see docs/proxmox.md).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import yaml  # type: ignore[import-untyped]
from proxmoxer import ProxmoxAPI
from proxmoxer.tools import Tasks

from pve_testserver import LxcEngine, PVETestServer
from sandbox_rt import Settings

NODE = "pve"
POOL = "sandbox-pool"
TEMPLATE_VMID = 9000
ROLE = "SandboxRuntime"
USER = "sandbox-rt@pve"
TOKEN = "runtime"
# The least privileges the runtime's calls need: the proxmox_access role's own list (one source;
# tests/integration/test_proxmox_least_privilege.py proves each one is needed).
ROLE_DEFAULTS = Path(__file__).resolve().parents[1] / "roles" / "proxmox_access" / "defaults" / "main.yml"
_DEFAULTS = yaml.safe_load(ROLE_DEFAULTS.read_text())
PRIVILEGES: list[str] = list(_DEFAULTS["proxmox_access_privileges"])
# The template sits outside the pool with a read/clone-only role; "/" gets Sys.Audit (not propagated).
TEMPLATE_ROLE = "SandboxTemplateClone"
TEMPLATE_PRIVILEGES: list[str] = list(_DEFAULTS["proxmox_access_template_privileges"])
AUDIT_ROLE = "SandboxRuntimeAudit"
AUDIT_PRIVILEGES: list[str] = list(_DEFAULTS["proxmox_access_audit_privileges"])


def grant_runtime_access(
    root: ProxmoxAPI,
    user: str,
    tokenid: str,
    bridge: str,
    privileges: list[str],
    *,
    role: str = ROLE,
    template_privileges: list[str] | None = None,
    audit_privileges: list[str] | None = None,
    suffix: str = "",
    template_vmids: Sequence[int] = (TEMPLATE_VMID,),
    node_audit: bool = False,
) -> None:
    """The runtime's roles and ACLs as the proxmox_access role makes them: ``role`` on the pool, the
    storage and the bridge; a read/clone-only role on each template (outside the pool); Sys.Audit on
    "/" itself (not propagated), and with ``node_audit`` (``proxmox_access_node_audit``) on
    ``/nodes``, propagated. For user and token (a privsep token gets the intersection)."""
    roles = [(role, privileges), (TEMPLATE_ROLE + suffix, template_privileges or TEMPLATE_PRIVILEGES)]
    roles.append((AUDIT_ROLE + suffix, audit_privileges or AUDIT_PRIVILEGES))
    existing = {r["roleid"] for r in root.access.roles.get()}
    for roleid, privs in roles:
        if roleid not in existing:
            root.access.roles.post(roleid=roleid, privs=",".join(privs))
    pool_paths = (f"/pool/{POOL}", "/storage/local-lvm", f"/sdn/zones/localnetwork/{bridge}")
    grants = [(path, role, 1) for path in pool_paths]
    grants += [(f"/vms/{vmid}", TEMPLATE_ROLE + suffix, 0) for vmid in template_vmids]
    grants.append(("/", AUDIT_ROLE + suffix, 0))
    if node_audit:
        grants.append(("/nodes", AUDIT_ROLE + suffix, 1))
    for path, roleid, propagate in grants:
        root.access.acl.put(path=path, roles=roleid, users=user, propagate=propagate)
        root.access.acl.put(path=path, roles=roleid, tokens=tokenid, propagate=propagate)


def _wait(api: ProxmoxAPI, upid: str) -> None:
    status = Tasks.blocking_status(api, upid, timeout=60, polling_interval=0.05)
    assert status is not None and status["exitstatus"] == "OK", status


def make_ct_template(api: ProxmoxAPI, node: str, vmid: int, bridge: str) -> None:
    """A CT template at ``vmid`` on ``node``, as site.yml leaves one: outside the pool (the token must
    not be able to change it)."""
    _wait(
        api,
        api.nodes(node).lxc.post(
            vmid=vmid,
            ostemplate="local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst",
            storage="local-lvm",
            unprivileged=1,
            swap=0,
            net0=f"name=eth0,bridge={bridge},ip=dhcp",
        ),
    )
    api.nodes(node).lxc(vmid).template.post()


def real_pve_settings(base: Settings) -> Settings | None:
    """Settings for a real PVE from the environment, or None."""
    if not os.environ.get("SANDBOX_RT_PVE_URL"):
        return None
    return dataclasses.replace(
        Settings.load(env={**os.environ, "SANDBOX_RT_BACKEND": "proxmox"}),
        state_dir=base.state_dir,
    )


def runtime_token(root: ProxmoxAPI, bridge: str, template_vmids: Sequence[int]) -> str:
    """On a fresh test server (``root``: its root token): the runtime's pool, user and token with the
    proxmox_access role's grants (the clone-only role on ``template_vmids``) and the datacenter
    firewall on (else no CT firewall applies and the runtime refuses). The token's secret."""
    root.pools.post(poolid=POOL)
    root.access.users.post(userid=USER)
    token = root.access.users(USER).token(TOKEN).post(privsep=1)
    runtime = f"{USER}!{TOKEN}"
    grant_runtime_access(root, USER, runtime, bridge, PRIVILEGES, template_vmids=tuple(template_vmids))
    root.cluster.firewall.options.put(enable=1)
    return str(token["value"])


def runtime_settings(base: Settings, srv: PVETestServer, secret: str, **fields: object) -> Settings:
    """``base`` as the proxmox backend's settings for ``srv`` with the runtime's token
    (:func:`runtime_token`) and pool; ``fields`` set the rest (templates, state dir)."""
    return dataclasses.replace(
        base,
        backend="proxmox",
        pve_url=f"https://{srv.host}:{srv.port}",
        pve_token_id=f"{USER}!{TOKEN}",
        pve_token_secret=secret,
        pve_verify=str(srv.ca_file),
        pve_pool=POOL,
        **fields,  # type: ignore[arg-type]
    )


_SESSIONS_TAKEN: set[int] = set()  # the session numbers this process's test servers drew


@contextmanager
def pve_test_server(
    base: Settings, state_dir: Path, engine_prefix: str | None = None
) -> Iterator[tuple[Settings, PVETestServer]]:
    # Several test sessions may share this machine's LXC path and bridge: each gets its own
    # container names (engine prefix) and VMID range (VMIDs name veths and pick addresses); the test
    # servers of one process never share one (only tests/lanes.py's host lane starts them)
    session = secrets.choice([n for n in range(50) if n not in _SESSIONS_TAKEN])
    _SESSIONS_TAKEN.add(session)
    # each named template of the host (base.templates) is a CT template of its own, VMIDs after the
    # default's, whose clones copy that LXC template
    named = {name: TEMPLATE_VMID + 1 + i for i, name in enumerate(sorted(base.templates))}
    engine = LxcEngine(
        base.lxc_path,
        base.template,
        prefix=engine_prefix or f"pve{session:02d}-",
        templates={vmid: base.templates[name] for name, vmid in named.items()},
    )
    srv = PVETestServer(engine=engine, first_vmid=10_000 + 1000 * session).start()
    made: list[int] = []
    try:
        root = srv.client()
        secret = runtime_token(root, base.bridge, (TEMPLATE_VMID, *named.values()))
        for vmid in (TEMPLATE_VMID, *named.values()):
            made.append(vmid)
            make_ct_template(root, NODE, vmid, base.bridge)
        settings = runtime_settings(
            base, srv, secret, pve_template_vmid=TEMPLATE_VMID, pve_templates=named, state_dir=state_dir
        )
        yield settings, srv
    finally:
        srv.stop()
        made.extend(int(vmid) for vmid in srv.state.cts)  # whatever a test left behind
        for vmid in sorted(set(made)):
            with suppress(Exception):
                engine.destroy(vmid)


def world(srv: PVETestServer) -> dict[str, set[str]]:
    """What the test server holds: CT configs, firewall configs, and the LXC containers its engine
    made (``<engine prefix><vmid>``). A test that must leave nothing compares this before and after."""
    engine = srv.engine
    assert isinstance(engine, LxcEngine)
    with srv.state.lock:
        cts = set(srv.state.cts)
        firewall = set(srv.state.firewall)
    lxc = {p.name for p in engine.lxc_path.glob(f"{engine.prefix}*")}
    return {"cts": cts, "firewall": firewall, "lxc": lxc}


def create_markers(settings: Settings) -> list[str]:
    """The proxmox backend's create markers (none may outlive its create, unless abandoned)."""
    return sorted(p.stem for p in (settings.state_dir / "proxmox" / "creating").glob("*.json"))


@contextmanager
def pve_cluster_test_server(
    base: Settings, state_dir: Path, nodes: Sequence[str] = ("pve1", "pve2", "pve3")
) -> Iterator[tuple[Settings, PVETestServer]]:
    """A cluster of ``nodes`` on the test server, each node's CTs real LXC containers of an engine
    of its own (its own container prefix), set up as site.yml leaves a cluster: one copy of the
    default template per node (VMIDs 9000, 9100, ...: the host contract's ``pve_template_vmid``
    and ``pve_node_templates``), the runtime's least-privilege token and ACLs (the proxmox_access
    role's lists). Every container the engines made is removed afterwards."""
    session = secrets.randbelow(50)
    engines = {
        name: LxcEngine(base.lxc_path, base.template, prefix=f"pvc{session:02d}{i}-")
        for i, name in enumerate(nodes)
    }
    copies = {name: TEMPLATE_VMID + 100 * i for i, name in enumerate(nodes)}
    srv = PVETestServer(engines=engines, first_vmid=60_000 + 1000 * session).start()
    try:
        root = srv.client()
        secret = runtime_token(root, base.bridge, tuple(copies.values()))
        for name, vmid in copies.items():
            make_ct_template(root, name, vmid, base.bridge)
        settings = runtime_settings(
            base,
            srv,
            secret,
            pve_template_vmid=copies[nodes[0]],
            pve_templates={},
            pve_node_templates={name: {"default": vmid} for name, vmid in copies.items() if name != nodes[0]},
            state_dir=state_dir,
        )
        yield settings, srv
    finally:
        srv.stop()
        with srv.state.lock:
            where = {int(vmid): str(ct["node"]) for vmid, ct in srv.state.cts.items()}
        for vmid, name in sorted(where.items()):
            with suppress(Exception):
                engines[name].destroy(vmid)
