"""Proxmox VE end to end on the emulated PVE node (issue 15; issue 23 items 7 and 9).

One node for the module (tests/pve_node, index 0): site.yml against ``inventories/pve_emulated``
builds the node's network (vmbr1 as an ifupdown2 stanza, dnsmasq and the nftables tables as systemd
units), the API access and the hardened CT template through the PVE API; a second run changes
nothing and ``--check`` is clean. Then ``Manager.from_env()`` with only the host contract site.yml
wrote creates PVE-backed sandboxes there: nested unprivileged containers on the node's own vmbr1,
whose internet is the CT's PVE firewall (emulated pve-firewall, datacenter gate included), proven
against servers in the node's wan network namespace. The node reboots (container stop and start)
with its network coming back by itself. The fixture removes the node and asserts nothing is left.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox_rt
from sandbox_rt import FirewallDisabled, Manager
from tests.integration.provision_helpers import REPO, PlaybookRun, parse_recap, wait_for
from tests.pve_node import PVENode, spec_for_index
from tests.pve_node.__main__ import exports

pytestmark = [pytest.mark.slow, pytest.mark.root]

LABELS = {"test-session": "pve-emulated"}
WAN_WEB = "198.18.0.80"  # a "public" web server in the node's wan netns (not a blocked range)
WAN_NAME = "example.test"
SERVER = REPO / "tests" / "hardening" / "netns_server.py"
TEMPLATE_VMID = 9000


def run_site(node: PVENode, *extra: str, timeout: float = 1200) -> PlaybookRun:
    """``ansible-playbook -i inventories/pve_emulated site.yml`` with the node's environment."""
    args = [
        str(REPO / ".venv" / "bin" / "ansible-playbook"),
        "-i",
        "inventories/pve_emulated",
        "site.yml",
        *extra,
    ]
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", **exports(node))
    proc = subprocess.run(
        args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    return PlaybookRun(args, proc.returncode, proc.stdout + proc.stderr, parse_recap(proc.stdout), 0.0)


@contextlib.contextmanager
def node_environment(node: PVENode) -> Iterator[None]:
    """``python -m tests.pve_node env`` for this process (Manager.from_env reads SANDBOX_RT_CONFIG)."""
    saved = dict(os.environ)
    os.environ.update(exports(node))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def node() -> Iterator[PVENode]:
    if os.geteuid() != 0:
        pytest.fail("the emulated PVE node is a privileged container: run as root", pytrace=False)
    pve = PVENode(spec_for_index(0))
    pve.stop()  # what a crashed earlier session left
    try:
        pve.start()
        pve.api_start()
        yield pve
    finally:
        pve.stop()
        assert pve.leftovers() == [], "the node helper left things behind"


@pytest.fixture(scope="module")
def first_run(node: PVENode) -> PlaybookRun:
    run = run_site(node)
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
    with node_environment(node):
        mgr = Manager.from_env()
    yield mgr
    for record in mgr.list(labels=LABELS):
        with contextlib.suppress(sandbox_rt.SandboxError):
            mgr.destroy(record.id)


def api(node: PVENode) -> object:
    """proxmoxer with the node's root token (the admin), TLS verified against the server's CA."""
    from proxmoxer import ProxmoxAPI

    info = json.loads((node.spec.api_dir / "info.json").read_text())
    tokenid, secret = (node.spec.api_dir / "root.token").read_text().strip().split("=", 1)
    user, name = tokenid.split("!")
    return ProxmoxAPI(
        info["host"],
        port=info["port"],
        user=user,
        token_name=name,
        token_value=secret,
        verify_ssl=info["ca_file"],
        timeout=60,
    )


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


# --- hardening controls on PVE-backed sandboxes (the SBX catalogue's ids; see docs/proxmox.md for the
# controls that need raw LXC keys on the node and are not yet applied to PVE CTs) -------------------------


def _ssh_refused(sb: sandbox_rt.Sandbox, **connect: object) -> bool:
    """A login other than the runtime's (root, a password) is refused; the host key stays pinned."""
    import paramiko

    client = paramiko.SSHClient()
    client.get_host_keys().add(sb.ip, "ssh-ed25519", paramiko.Ed25519Key(data=_key_blob(sb)))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(sb.ip, look_for_keys=False, allow_agent=False, timeout=10, **connect)  # type: ignore[arg-type]
    except paramiko.AuthenticationException:
        return True
    finally:
        client.close()
    return False


def _key_blob(sb: sandbox_rt.Sandbox) -> bytes:
    import base64

    kind, blob = sb.record.host_key.split()[:2]
    assert kind == "ssh-ed25519"
    return base64.b64decode(blob)


def test_SBX_controls_hold_on_pve_sandboxes(node: PVENode, manager: Manager) -> None:
    """SBX-USER-01/02, SBX-SSH-01/02, SBX-LIM-01/03, SBX-ESC-01/03/09, SBX-ID-01/02 on two sandboxes."""
    with (
        manager.create(labels=LABELS, memory_mb=256) as a,
        manager.create(labels=LABELS, memory_mb=256) as b,
    ):
        sudo = "sudo -n true >/dev/null 2>&1 && echo SUDO || echo nosudo"
        out = a.exec(f"id -u; id -Gn; {sudo}").stdout.decode().split("\n")
        privileged = {"sudo", "adm", "root", "disk", "lxd"}
        assert out[0] == "1000" and not privileged & set(out[1].split())  # USER-01
        assert out[2] == "nosudo"  # USER-02
        key = str(manager.settings.ssh_key)
        assert _ssh_refused(a, username="root", key_filename=key)  # SSH-01
        assert _ssh_refused(a, username="sandbox", password="sandbox")  # SSH-02
        limits = a.exec("ulimit -Su; ulimit -Hu; ulimit -Sc; ulimit -Hc").stdout.decode().split()
        assert limits == ["256", "512", "0", "0"]  # LIM-01, LIM-03 (the login's pam_limits)
        uid_map = a.exec("cat /proc/self/uid_map").stdout.decode().split()
        assert uid_map == ["0", "100000", "65536"]  # ESC-01: an unprivileged CT
        assert a.exec("head -c 1 /dev/kmsg").exit_code != 0  # ESC-03
        procs = a.exec("ps -eo comm=").stdout.decode().split()
        assert "dnsmasq" not in procs and "lxc-start" not in procs and len(procs) < 40  # ESC-09
        ids = [
            (sb.record.host_key.split()[1], sb.exec("cat /etc/machine-id").stdout.decode().strip())
            for sb in (a, b)
        ]
        assert (
            ids[0][0] != ids[1][0] and ids[0][1] != ids[1][1] and all(len(m) == 32 for _, m in ids)
        )  # ID-01/02
