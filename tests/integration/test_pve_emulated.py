"""Proxmox VE end to end on the emulated PVE node (issue 15; issue 23 items 7 and 9).

One node for the session (tests/pve_node, index 0; the ``emulated_pve`` fixture of tests/conftest.py,
shared with the hardening catalogue's ``pve-node`` site): site.yml against ``inventories/pve_emulated``
builds the node's network (vmbr1 as an ifupdown2 stanza, dnsmasq and the nftables tables as systemd
units), the API access and the hardened CT template through the PVE API; a second run changes
nothing and ``--check`` is clean. Then ``Manager.from_env()`` with only the host contract site.yml
wrote creates PVE-backed sandboxes there: nested unprivileged containers on the node's own vmbr1,
whose internet is the CT's PVE firewall (emulated pve-firewall, datacenter gate included), proven
against servers in the node's wan network namespace. The node reboots (container stop and start)
with its network coming back by itself. The session fixture removes the node and asserts nothing is
left.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sandbox_rt
from sandbox_rt import FirewallDisabled, Manager
from tests.integration.provision_helpers import REPO, PlaybookRun, wait_for
from tests.pve_node import PVENode
from tests.pve_node.provisioning import ProvisionedNode, admin_api, node_manager, run_site

pytestmark = [pytest.mark.slow, pytest.mark.root]

LABELS = {"test-session": "pve-emulated"}
WAN_WEB = "198.18.0.80"  # a "public" web server in the node's wan netns (not a blocked range)
WAN_NAME = "example.test"
SERVER = REPO / "tests" / "hardening" / "netns_server.py"
TEMPLATE_VMID = 9000
NAMED_VMID = 9001  # the inventory's named template "base" (inventories/pve_emulated)


@pytest.fixture(scope="module")
def node(emulated_pve: ProvisionedNode) -> PVENode:
    """The session's emulated node (tests/conftest.py: started, provisioned, removed at the end)."""
    return emulated_pve.node


@pytest.fixture(scope="module")
def first_run(emulated_pve: ProvisionedNode) -> PlaybookRun:
    run = emulated_pve.first_run
    assert run.returncode == 0 and run.total("failed") == 0, run.tail(80)
    return run


@pytest.fixture(scope="module")
def wan(node: PVENode) -> Iterator[None]:
    """A web server (80, 8080) and a resolver (example.test) in the node's wan netns."""
    ns = node.spec.wan_netns
    subprocess.run(["ip", "-n", ns, "addr", "add", f"{WAN_WEB}/32", "dev", "lo"], check=False)
    procs = [
        subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, str(SERVER), f"{WAN_WEB}:80", f"{WAN_WEB}:8080"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        ),
        subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                ns,
                "dnsmasq",
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                f"--listen-address={node.spec.wan_gateway_ip}",
                f"--address=/{WAN_NAME}/{WAN_WEB}",
                "--user=root",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        ),
    ]
    try:
        assert procs[0].stdout is not None
        assert procs[0].stdout.readline().strip() == b"ready"
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def manager(node: PVENode, first_run: PlaybookRun) -> Iterator[Manager]:
    with node_manager(node, LABELS) as mgr:
        yield mgr


def api(node: PVENode) -> Any:
    """proxmoxer with the node's root token (the admin)."""
    return admin_api(node)


def in_node(node: PVENode, *cmd: str) -> str:
    return node.attach(*cmd).stdout


def http(sb: sandbox_rt.Sandbox, url: str) -> str:
    return sb.exec(f"curl -s -m 3 {url} || echo FAIL", timeout=30).stdout.decode().strip()


# --- site.yml --------------------------------------------------------------------------------------------


def test_site_yml_builds_network_access_and_template(node: PVENode, first_run: PlaybookRun) -> None:
    # the network, as systemd units and an ifupdown2 stanza
    assert "iface vmbr1 inet static" in in_node(node, "cat", "/etc/network/interfaces.d/vmbr1")
    assert f"{node.spec.sandbox_gateway}/16" in in_node(node, "ip", "-br", "addr", "show", "vmbr1")
    for unit in ("sandbox-dnsmasq.service", "sandbox-nftables.service"):
        assert in_node(node, "systemctl", "is-enabled", unit).strip() == "enabled", unit
    assert in_node(node, "systemctl", "is-active", "sandbox-dnsmasq.service").strip() == "active"
    tables = in_node(node, "nft", "list", "tables")
    assert "table inet sandbox" in tables and "table bridge sandbox" in tables
    # the template: built from the uploaded OS template, a template, outside the runtime's pool
    root = api(node)
    conf = root.nodes(node.spec.name).lxc(TEMPLATE_VMID).config.get()  # type: ignore[attr-defined]
    assert conf.get("template") == 1 and "sandbox-rt-template-source: local:vztmpl/" in conf["description"]
    pool = root.pools("sandbox-pool").get()  # type: ignore[attr-defined]
    assert TEMPLATE_VMID not in {m.get("vmid") for m in pool["members"]}
    assert int(root.cluster.firewall.options.get()["enable"]) == 1  # type: ignore[attr-defined]
    # the host contract names the proxmox backend and nothing secret
    contract = json.loads((node.spec.home / "controller" / "host.json").read_text())
    assert contract["backend"] == "proxmox" and contract["pve_template_vmid"] == TEMPLATE_VMID
    assert (
        "pve_token_secret" not in contract
        and Path(contract["pve_token_secret_file"]).stat().st_mode & 0o077 == 0
    )


def test_site_yml_builds_the_named_template(node: PVENode, first_run: PlaybookRun) -> None:
    """template_build_templates: a CT template of its own (lean, hardened like the default, confined
    by the same raw keys), outside the pool, clone-only for the runtime, in the host contract."""
    root = api(node)
    conf = root.nodes(node.spec.name).lxc(NAMED_VMID).config.get()  # type: ignore[attr-defined]
    default = root.nodes(node.spec.name).lxc(TEMPLATE_VMID).config.get()  # type: ignore[attr-defined]
    assert conf.get("template") == 1 and conf["hostname"] == f"{default['hostname']}-base"
    assert conf["lxc"] == default["lxc"]  # the same kernel confinement
    pool = root.pools("sandbox-pool").get()  # type: ignore[attr-defined]
    assert NAMED_VMID not in {m.get("vmid") for m in pool["members"]}
    acl = {(a["path"], a["roleid"], a["type"]) for a in root.access.acl.get()}  # type: ignore[attr-defined]
    assert {(f"/vms/{NAMED_VMID}", "SandboxTemplateClone", t) for t in ("user", "token")} <= acl
    contract = json.loads((node.spec.home / "controller" / "host.json").read_text())
    assert contract["pve_templates"] == {"base": NAMED_VMID}


def test_second_run_changes_nothing_and_check_is_clean(node: PVENode, first_run: PlaybookRun) -> None:
    second = run_site(node)
    assert second.returncode == 0 and second.total("changed") == 0, second.tail(80)
    check = run_site(node, "--check")
    assert check.returncode == 0 and check.total("changed") == 0, check.tail(80)


# --- the runtime -------------------------------------------------------------------------------------------


def test_manager_from_env_makes_nested_unprivileged_sandboxes_on_the_node(
    node: PVENode, manager: Manager
) -> None:
    assert manager.settings.backend == "proxmox"
    before = set(in_node(node, "ls", "/var/lib/lxc").split())
    with manager.create(labels=LABELS, memory_mb=256) as sb:
        assert ipaddress.IPv4Address(sb.ip) in ipaddress.IPv4Network(node.spec.sandbox_cidr)
        assert sb.ip != node.spec.sandbox_gateway
        r = sb.exec("id -u; cat /proc/self/uid_map; ip -o -4 route show default")
        uid, uid_map, route = r.stdout.decode().splitlines()
        assert uid == "1000" and uid_map.split() == ["0", "100000", "65536"]  # unprivileged, nested
        assert f"via {node.spec.sandbox_gateway}" in route
        # it is the node's own CT on the node's vmbr1
        vmid = next(
            str(r["vmid"])
            for r in api(node).cluster.resources.get(type="vm")  # type: ignore[attr-defined]
            if sb.id in str(r.get("tags"))
        )
        assert f"veth{vmid}i0" in in_node(node, "ip", "-br", "link", "show", "master", "vmbr1")
    after = set(in_node(node, "ls", "/var/lib/lxc").split())
    assert after == before  # destroy left no container
    assert "jump ct" not in in_node(node, "nft", "list", "table", "inet", "pve-firewall-emu")
    assert not list((node.spec.home / "controller" / "state" / "proxmox" / "creating").glob("*.json"))


def test_a_sandbox_of_the_named_template_on_the_node(node: PVENode, manager: Manager) -> None:
    assert manager.templates() == ["default", "base"]
    with (
        manager.create(labels=LABELS, memory_mb=256, template="base") as sb,
        manager.create(labels=LABELS, memory_mb=256) as plain,
    ):
        assert sb.status().template == "base"
        assert sb.exec("command -v gcc").exit_code == 1 and plain.exec("command -v gcc").exit_code == 0
        out = sb.exec("id -u; grep -E '^(NoNewPrivs|Seccomp):' /proc/1/status | cut -f2").stdout.decode()
        assert out.split() == ["1000", "1", "2"]  # the sandbox user, PID 1 confined as in the default
        vmid = next(
            r["vmid"]
            for r in api(node).cluster.resources.get(type="vm")  # type: ignore[attr-defined]
            if sb.id in str(r.get("tags")).split(";")
        )
        lower = in_node(node, "grep", "^lxc.rootfs.path", f"/var/lib/lxc/{vmid}/config")
        assert f"/{NAMED_VMID}/" in lower, lower  # a linked clone of CT 9001


def test_internet_toggle_is_the_ct_firewall(node: PVENode, manager: Manager, wan: None) -> None:
    with manager.create(labels=LABELS, memory_mb=256, internet=False) as sb:
        assert http(sb, f"http://{WAN_WEB}/") == "FAIL"
        sb.set_internet(True)
        assert http(sb, f"http://{WAN_WEB}/") == f"{WAN_WEB}:80 ok"
        assert http(sb, f"http://{WAN_NAME}/") == f"{WAN_WEB}:80 ok"  # DNS through the node's dnsmasq
        assert http(sb, f"http://{WAN_WEB}:8080/") == "FAIL"  # only the allowed ports
        sb.set_internet(False)
        assert http(sb, f"http://{WAN_WEB}/") == "FAIL"
        assert http(sb, f"http://{WAN_NAME}/") == "FAIL"


def test_sandboxes_reach_neither_each_other_nor_the_lan_nor_the_controller(
    node: PVENode, manager: Manager, wan: None
) -> None:
    with (
        manager.create(labels=LABELS, memory_mb=256, internet=True) as a,
        manager.create(labels=LABELS, memory_mb=256, internet=True) as b,
    ):
        b.exec("nohup python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 &")
        wait_for(
            lambda: b.exec("curl -s -m 2 http://127.0.0.1:8000/ >/dev/null").exit_code == 0, 15, "b's server"
        )
        probes = {
            "sandbox": f"http://{b.ip}:8000/",
            "controller ssh": f"http://{node.spec.mgmt_host_ip}:22/",
            "node mgmt": f"http://{node.spec.mgmt_node_ip}:22/",
            "metadata": "http://169.254.169.254/",
            "node api port": f"http://{node.spec.sandbox_gateway}:8006/",
        }
        for what, url in probes.items():
            assert http(a, url) == "FAIL", what
        # DNS only through the node's dnsmasq: a resolver in the wan is not reachable directly
        out = a.exec(
            f"timeout 3 bash -c 'exec 3<>/dev/tcp/{node.spec.wan_gateway_ip}/53' && echo OPEN || echo CLOSED"
        )
        assert out.stdout.decode().strip() == "CLOSED"


def test_the_datacenter_firewall_gate(node: PVENode, manager: Manager, wan: None) -> None:
    """With the datacenter firewall off PVE applies no CT firewall: a sandbox without internet reaches
    the wan (the negative proof). The runtime refuses to create or toggle then (FirewallDisabled)."""
    root = api(node)
    with manager.create(labels=LABELS, memory_mb=256, internet=False) as sb:
        assert http(sb, f"http://{WAN_WEB}/") == "FAIL"
        root.cluster.firewall.options.put(enable=0)  # type: ignore[attr-defined]
        try:
            assert http(sb, f"http://{WAN_WEB}/") == f"{WAN_WEB}:80 ok"  # nothing filters it now
            before = {r["vmid"] for r in root.cluster.resources.get(type="vm")}  # type: ignore[attr-defined]
            with pytest.raises(FirewallDisabled):
                manager.create(labels=LABELS, memory_mb=256)
            with pytest.raises(FirewallDisabled):
                sb.set_internet(True)
            assert {r["vmid"] for r in root.cluster.resources.get(type="vm")} == before  # type: ignore[attr-defined]
        finally:
            root.cluster.firewall.options.put(enable=1)  # type: ignore[attr-defined]
        assert http(sb, f"http://{WAN_WEB}/") == "FAIL"


def test_the_node_reboots_with_its_network(node: PVENode, manager: Manager, wan: None) -> None:
    """Stop and start the node container (no Ansible run): vmbr1, dnsmasq, the sandbox tables and
    forwarding come back from the units site.yml installed; sandboxes work as before."""
    node.reboot()
    assert f"{node.spec.sandbox_gateway}/16" in in_node(node, "ip", "-br", "addr", "show", "vmbr1")
    assert in_node(node, "systemctl", "is-active", "sandbox-dnsmasq.service").strip() == "active"
    tables = in_node(node, "nft", "list", "tables")
    assert "table inet sandbox" in tables and "table bridge sandbox" in tables
    assert in_node(node, "sysctl", "-n", "net.ipv4.ip_forward").strip() == "1"
    with manager.create(labels=LABELS, memory_mb=256, internet=False) as sb:
        assert http(sb, f"http://{WAN_WEB}/") == "FAIL"
        sb.set_internet(True)
        assert http(sb, f"http://{WAN_WEB}/") == f"{WAN_WEB}:80 ok"


# --- the kernel confinement of PVE-backed sandboxes: raw lxc.* keys root wrote on the template ------------
# (The whole SBX catalogue runs on PVE-backed sandboxes of this node too: tests/hardening, site pve-node.)

CONFINING_KEYS = {
    "lxc.init.cmd",
    "lxc.seccomp.profile",
    "lxc.cap.drop",
    "lxc.hook.mount",
    "lxc.mount.auto",
    "lxc.mount.entry",
}


def _wait_task(root: Any, upid: str) -> None:
    from proxmoxer.tools import Tasks

    status = Tasks.blocking_status(root, upid, timeout=120, polling_interval=0.1)
    assert status and status.get("exitstatus") == "OK", f"{upid}: {status}"


def test_raw_keys_confine_the_template_and_every_clone(node: PVENode, manager: Manager) -> None:
    """site.yml wrote the raw keys into the template's /etc/pve/lxc/9000.conf (root on the node); GET
    .../config lists them, pct clone copies them to every sandbox, pve-container appends them last to
    the CT's LXC config, and they are what its processes run under."""
    root = api(node)
    template = root.nodes(node.spec.name).lxc(TEMPLATE_VMID).config.get()["lxc"]
    keys = {key for key, _ in template}
    assert keys >= CONFINING_KEYS and any(key.endswith(".pids.max") for key in keys), keys
    assert not keys & {"lxc.no_new_privs", "lxc.hook.start-host"}  # PVE refuses them: never written
    text = in_node(node, "cat", f"/etc/pve/lxc/{TEMPLATE_VMID}.conf")
    assert all(f"{key}: {value}" in text.splitlines() for key, value in template)
    with manager.create(labels=LABELS, memory_mb=256) as sb:
        vmid = next(
            r["vmid"] for r in root.cluster.resources.get(type="vm") if sb.id in str(r.get("tags")).split(";")
        )
        assert root.nodes(node.spec.name).lxc(vmid).config.get()["lxc"] == template  # the clone's own
        lxc_conf = in_node(node, "cat", f"/var/lib/lxc/{vmid}/config").splitlines()
        assert lxc_conf[-len(template) :] == [f"{key} = {value}" for key, value in template]
        out = (
            sb.exec(
                "cat /proc/1/comm; grep -E '^(NoNewPrivs|Seccomp|CapBnd):' /proc/1/status | cut -f2; "
                "cat /proc/sys/user/max_user_namespaces; ip -4 -o addr show eth0 | cut -d' ' -f7"
            )
            .stdout.decode()
            .split()
        )
        comm, bounding, nnp, seccomp, userns, address = out  # (status lists CapBnd first)
        assert (comm, nnp, seccomp, userns) == ("tini", "1", "2", "0"), out  # sandbox-init; the hook
        assert not int(bounding, 16) & (1 << 12 | 1 << 13 | 1 << 21), bounding  # no net_admin/raw, sys_admin
        assert address.startswith(sb.ip + "/"), address  # the hook applied what pve-container wrote


def test_the_ct_setup_hook_and_refused_keys(node: PVENode, first_run: PlaybookRun) -> None:
    """A throw-away clone of the template, started by the admin with a static net0. Keys PVE refuses,
    added by root, never reach LXC (a start-host hook of /bin/false would fail the start); without any
    raw key the CT is PVE's own default: systemd, no address (nothing applies the one pve-container
    wrote), no user namespace lock: the CT setup hook is what gives both."""
    root, name = api(node), node.spec.name
    vmid = int(root.cluster.nextid.get())
    _wait_task(root, root.nodes(name).lxc(TEMPLATE_VMID).clone.post(newid=vmid, hostname=f"hook-{vmid}"))
    conf = node.spec.rootfs / "etc" / "pve" / "lxc" / f"{vmid}.conf"
    address = str(ipaddress.IPv4Network(node.spec.sandbox_cidr).broadcast_address - 7)

    def as_root(edit: Any) -> None:  # root edits the CT's file on the node (the API cannot)
        lines = conf.read_text().splitlines()
        conf.write_text("\n".join(edit(lines)) + "\n")

    def in_ct(*cmd: str) -> str:
        return in_node(node, "lxc-attach", "-n", str(vmid), "--", *cmd).strip()

    def run_once() -> tuple[str, str, str]:
        _wait_task(root, root.nodes(name).lxc(vmid).status.start.post())
        try:
            ip = in_ct("ip", "-4", "-o", "addr", "show", "eth0")
            return in_ct("cat", "/proc/1/comm"), ip, in_ct("cat", "/proc/sys/user/max_user_namespaces")
        finally:
            _wait_task(root, root.nodes(name).lxc(vmid).status.stop.post())

    try:
        net0 = f"name=eth0,bridge=vmbr1,ip={address}/16,gw={node.spec.sandbox_gateway}"
        root.nodes(name).lxc(vmid).config.put(net0=net0)
        refused = ["lxc.hook.start-host: /bin/false", "lxc.no_new_privs: 1", "lxc.rootfs.path: /tmp"]
        as_root(lambda lines: [*lines, *refused])
        assert not {k for k, _ in root.nodes(name).lxc(vmid).config.get()["lxc"]} & {"lxc.no_new_privs"}
        comm, ip, userns = run_once()  # it starts: the start-host hook was not applied
        lxc_conf = in_node(node, "cat", f"/var/lib/lxc/{vmid}/config")
        assert "start-host" not in lxc_conf and "no_new_privs" not in lxc_conf and "= /tmp" not in lxc_conf
        assert (comm, userns) == ("tini", "0") and f"inet {address}/16" in ip, (comm, ip, userns)

        as_root(lambda lines: [ln for ln in lines if not ln.startswith("lxc.")])
        assert "lxc" not in root.nodes(name).lxc(vmid).config.get()
        comm, ip, userns = run_once()
        assert comm == "systemd" and "inet " not in ip and userns != "0", (comm, ip, userns)
    finally:
        if root.nodes(name).lxc(vmid).status.current.get()["status"] == "running":
            _wait_task(root, root.nodes(name).lxc(vmid).status.stop.post())
        _wait_task(root, root.nodes(name).lxc(vmid).delete())
