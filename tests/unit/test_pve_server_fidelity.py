"""The PVE test server answers as PVE does where an independent client run against PVE's source found
it did not (issue 15, item 6), and the runtime copes with both answers where PVE versions differ.
Also: the datacenter firewall options, the template upload (multipart, as proxmoxer and
community.proxmox.proxmox_template send it), and the emulated pve-firewall's compiled rules."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proxmoxer import ResourceException
from proxmoxer.tools import Tasks

from pve_testserver import PVETestServer, pvefw
from sandbox_rt import Settings
from sandbox_rt.backends.proxmox import HOSTKEY_PREFIX, RECORD_PREFIX, ProxmoxBackend
from sandbox_rt.models import SandboxSpec

NODE = "pve"
OSTEMPLATE = "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"


@pytest.fixture
def server() -> Iterator[PVETestServer]:
    with PVETestServer() as srv:
        yield srv


@pytest.fixture
def api(server: PVETestServer) -> Any:
    return server.client(timeout=10)


def wait_ok(api: Any, upid: str) -> None:
    status = Tasks.blocking_status(api, upid, timeout=10, polling_interval=0.02)
    assert status is not None and status["exitstatus"] == "OK", status


def create(api: Any, vmid: int, **extra: Any) -> None:
    wait_ok(api, api.nodes(NODE).lxc.post(vmid=vmid, ostemplate=OSTEMPLATE, storage="local-lvm", **extra))


def refused(exc: pytest.ExceptionInfo[ResourceException]) -> tuple[int, str]:
    return exc.value.status_code, str(exc.value.content)


# --- item 6: fidelity -----------------------------------------------------------------------------


def test_description_reads_back_with_its_trailing_newline(api: Any) -> None:
    """PVE keeps a description as '#' lines of the config and reads each back with its newline."""
    create(api, 200, description="first line\nsecond line")
    assert api.nodes(NODE).lxc(200).config.get()["description"] == "first line\nsecond line\n"
    api.nodes(NODE).lxc(200).config.put(description="one")
    assert api.nodes(NODE).lxc(200).config.get()["description"] == "one\n"


def test_the_host_key_contract_survives_the_trailing_newline(server: PVETestServer, api: Any) -> None:
    """The runtime reads its record and the published host key from a description that ends in
    "\\n" (every PVE version) and from one that does not (what it wrote)."""
    backend = _backend(server, Path("/nonexistent"))
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDrY7qzqZ1E7r0pYvQvRmC8w5m6x3cQpWc1nbNnRk1dM root@sbx"
    record = RECORD_PREFIX + '{"id":"sbx-0123456789"}'
    for description in (f"{record}\n{HOSTKEY_PREFIX}{key}", f"{record}\n{HOSTKEY_PREFIX}{key}\n"):
        assert backend._host_key_of(description) == key
        assert (backend._parse_record(description) or {}).get("id") == "sbx-0123456789"


def test_a_linked_clone_of_a_ct_that_is_no_template_fails(api: Any) -> None:
    create(api, 201)
    with pytest.raises(ResourceException) as err:
        api.nodes(NODE).lxc(201).clone.post(newid=202, full=0)
    status, message = refused(err)
    assert status == 500 and "Linked clone feature for 'local-lvm:vm-201-disk-0' is not available" in message
    assert all(r["vmid"] != 202 for r in api.cluster.resources.get(type="vm"))
    wait_ok(api, api.nodes(NODE).lxc(201).clone.post(newid=203))  # full is the default for a CT: fine


def test_template_refuses_a_ct_with_snapshots(api: Any) -> None:
    create(api, 204)
    wait_ok(api, api.nodes(NODE).lxc(204).snapshot.post(snapname="before"))
    with pytest.raises(ResourceException) as err:
        api.nodes(NODE).lxc(204).template.post()
    assert refused(err) == (500, "unable to create template, because CT contains snapshots")
    assert not api.nodes(NODE).lxc(204).config.get().get("template")


def test_create_without_hostname_stores_ct_vmid(api: Any) -> None:
    create(api, 205)
    assert api.nodes(NODE).lxc(205).config.get()["hostname"] == "CT205"
    create(api, 206, hostname="named")
    assert api.nodes(NODE).lxc(206).config.get()["hostname"] == "named"


def test_nextid_is_a_json_string(server: PVETestServer, api: Any) -> None:
    nextid = api.cluster.nextid.get()
    assert isinstance(nextid, str) and nextid == "100"
    assert api.cluster.nextid.get(vmid=4242) == "4242"


class _NextId:
    """proxmoxer's ``api.cluster.nextid`` answering as an older (int) or current (str) PVE."""

    def __init__(self, value: object) -> None:
        self.value = value

    def get(self, **_: Any) -> object:
        return self.value


@pytest.mark.parametrize("answer", [130, "130"])
def test_the_runtime_takes_nextid_as_string_or_integer(
    server: PVETestServer, tmp_path: Path, answer: object
) -> None:
    """Whatever type nextid comes as, the clone request carries the number as newid."""
    root = server.client()
    root.pools.post(poolid="sandbox-pool")
    root.cluster.firewall.options.put(enable=1)
    create(root, 9000, net0="name=eth0,bridge=vmbr1,ip=dhcp", pool="sandbox-pool")
    root.nodes(NODE).lxc(9000).template.post()
    backend = _backend(server, tmp_path)

    class Api:
        def __init__(self, real: Any) -> None:
            self._real = real

        def __getattr__(self, name: str) -> Any:
            if name == "cluster":
                return _Cluster(self._real.cluster)
            return getattr(self._real, name)

    class _Cluster:
        def __init__(self, real: Any) -> None:
            self._real = real
            self.nextid = _NextId(answer)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._real, name)

    backend.api = Api(backend.api)
    backend.begin("sbx-00000000aa")
    record = backend.clone("sbx-00000000aa", SandboxSpec())
    assert record.id == "sbx-00000000aa"
    assert {r["vmid"] for r in root.cluster.resources.get(type="vm")} == {9000, 130}
    backend.destroy("sbx-00000000aa")
    backend.end("sbx-00000000aa")


def _backend(server: PVETestServer, state_dir: Path) -> ProxmoxBackend:
    tokenid, secret = server.root_token
    settings = Settings(
        backend="proxmox",
        pve_url=f"https://{server.host}:{server.port}",
        pve_token_id=tokenid,
        pve_token_secret=secret,
        pve_verify=str(server.ca_file),
        pve_template_vmid=9000,
        state_dir=state_dir,
    )
    return ProxmoxBackend(settings)


# --- the datacenter firewall ------------------------------------------------------------------------


def test_datacenter_firewall_options(server: PVETestServer, api: Any) -> None:
    """Off by default (PVE: enable unset); PUT/GET with digest; Sys.Audit on / to read it."""
    opts = api.cluster.firewall.options.get()
    assert "enable" not in opts and opts["digest"]
    api.cluster.firewall.options.put(enable=1, policy_in="DROP")
    opts = api.cluster.firewall.options.get()
    assert opts["enable"] == 1 and opts["policy_in"] == "DROP"
    with pytest.raises(ResourceException) as err:
        api.cluster.firewall.options.put(enable=0, digest="0" * 40)
    assert err.value.status_code == 500 and "file changed by other user" in str(err.value.content)
    api.cluster.firewall.options.put(delete="policy_in")
    assert "policy_in" not in api.cluster.firewall.options.get()
    # a token with nothing on "/" may not read it; Sys.Audit on "/" alone (not propagated) is enough
    api.access.users.post(userid="fw@pve")
    secret = api.access.users("fw@pve").token("tk").post(privsep=0)["value"]
    reader = server.client("fw@pve!tk", secret)
    with pytest.raises(ResourceException) as err:
        reader.cluster.firewall.options.get()
    assert err.value.status_code == 403 and "Sys.Audit" in str(err.value.content)
    api.access.roles.post(roleid="Audit", privs="Sys.Audit")
    api.access.acl.put(path="/", roles="Audit", users="fw@pve", propagate=0)
    assert reader.cluster.firewall.options.get()["enable"] == 1
    with pytest.raises(ResourceException) as err:
        reader.nodes(NODE).status.get()  # not propagated: nothing below "/"
    assert err.value.status_code == 403


# --- template upload ----------------------------------------------------------------------------------


def test_vztmpl_upload_as_proxmoxer_sends_it(api: Any, tmp_path: Path) -> None:
    """multipart/form-data, the file in the 'filename' part: an imgcopy task, then the volume is
    listed and usable as ostemplate."""
    tarball = tmp_path / "debian-12-sandbox_1_amd64.tar.zst"
    tarball.write_bytes(b"\x28\xb5\x2f\xfd" + b"x" * 5000)
    upid = api.nodes(NODE).storage("local").upload.post(content="vztmpl", filename=tarball.open("rb"))
    assert ":imgcopy:" in upid
    wait_ok(api, upid)
    volid = "local:vztmpl/debian-12-sandbox_1_amd64.tar.zst"
    listed = {v["volid"]: v for v in api.nodes(NODE).storage("local").content.get(content="vztmpl")}
    assert listed[volid]["size"] == 5004
    wait_ok(api, api.nodes(NODE).lxc.post(vmid=300, ostemplate=volid, storage="local-lvm"))


def test_upload_checks_name_content_and_spool(server: PVETestServer, api: Any, tmp_path: Path) -> None:
    bad = tmp_path / "rootfs.tar"  # PVE wants a compressed CT template
    bad.write_bytes(b"x")
    with pytest.raises(ResourceException) as err:
        api.nodes(NODE).storage("local").upload.post(content="vztmpl", filename=bad.open("rb"))
    assert err.value.status_code == 400 and "wrong file extension" in str(err.value.errors)
    good = tmp_path / "t.tar.gz"
    good.write_bytes(b"x")
    with pytest.raises(ResourceException) as err:
        api.nodes(NODE).storage("local-lvm").upload.post(content="vztmpl", filename=good.open("rb"))
    assert err.value.status_code == 400 and "does not support 'vztmpl'" in str(err.value.errors)
    with pytest.raises(ResourceException) as err:  # only pveproxy sets tmpfilename
        api.nodes(NODE).storage("local").upload.post(
            content="vztmpl", filename="t.tar.gz", tmpfilename="/var/tmp/pveupload-0123"
        )
    assert err.value.status_code == 400
    assert server.core.uploads == {}  # refused uploads leave no spool file behind


# --- the emulated pve-firewall -------------------------------------------------------------------------


def _state(
    cluster_enable: int,
    ct_enable: int = 1,
    internet: int = 0,
    options: dict[str, Any] | None = None,
    rate: str = "",
) -> dict[str, Any]:
    net0 = "name=eth0,bridge=vmbr1,firewall=1,gw=10.98.0.1,hwaddr=BC:24:11:00:00:01,ip=10.98.1.7/16,type=veth"
    net0 += f",rate={rate}" if rate else ""
    rules = [
        {"type": "out", "action": "ACCEPT", "proto": "tcp", "dport": "80,443", "enable": internet},
        {
            "type": "out",
            "action": "ACCEPT",
            "proto": "udp",
            "dport": "53",
            "dest": "10.98.0.1",
            "enable": internet,
        },
    ]
    return {
        "cluster_firewall": {"options": {"enable": cluster_enable}},
        "cts": {
            "120": {"node": NODE, "config": {"net0": net0}},
            "9000": {"node": NODE, "config": {"net0": net0.replace("1.7", "0.9"), "template": 1}},
        },
        "firewall": {
            "120": {
                "options": {"enable": ct_enable, "policy_out": "DROP", "policy_in": "ACCEPT"}
                | (options or {}),
                "rules": rules,
            },
        },
    }


def _chain(text: str, name: str) -> str:
    start = text.index(f"chain {name} {{")
    return text[start : text.index("\n\t}", start)]


def test_no_guest_is_filtered_while_the_datacenter_firewall_is_off() -> None:
    text = pvefw.render(_state(cluster_enable=0), NODE)
    assert "ct120" not in text and "10.98.1.7" not in text
    assert text.count(f"delete table inet {pvefw.TABLE}") == 1  # the old rules go in the same load


def test_a_guest_firewall_compiles_to_its_rules_and_policy() -> None:
    text = pvefw.render(_state(cluster_enable=1, internet=0), NODE)
    out = _chain(text, "ct120-out")
    assert out.split() == ["chain", "ct120-out", "{", "counter", "drop"]  # rules disabled: policy DROP
    text = pvefw.render(_state(cluster_enable=1, internet=1), NODE)
    out = _chain(text, "ct120-out")
    assert "meta l4proto tcp th dport { 80, 443 } counter accept" in out
    assert "ip daddr 10.98.0.1 meta l4proto udp th dport 53 counter accept" in out
    # its OUT rules follow its port (pve-firewall binds them to the interface), not its address
    assert "meta mark 120 jump ct120-out" in text
    assert 'iifname "veth120i0" meta mark set 120' in text
    assert "ip daddr 10.98.1.7 jump ct120-in" in text
    assert "ct9000" not in text  # templates do not run
    assert pvefw.render(_state(cluster_enable=1, ct_enable=0), NODE).count("jump ct") == 0


def test_macfilter_is_on_by_default_and_ipfilter_only_when_set() -> None:
    mac = 'iifname "veth120i0" ether saddr != bc:24:11:00:00:01 counter drop'
    ip = 'iifname "veth120i0" ether type ip ip saddr != 10.98.1.7 counter drop'
    arp = 'iifname "veth120i0" ether type arp arp saddr ip != 10.98.1.7 counter drop'
    plain = pvefw.render(_state(cluster_enable=1), NODE)
    assert mac in plain and ip not in plain and arp not in plain  # PVE's defaults
    filtered = pvefw.render(_state(cluster_enable=1, options={"ipfilter": 1, "macfilter": 1}), NODE)
    assert mac in filtered and ip in filtered and arp in filtered
    bare = pvefw.render(_state(cluster_enable=1, options={"macfilter": 0}), NODE)
    assert mac not in bare
    # the filters come before the mark (a forged frame is dropped, not marked)
    assert filtered.index(arp) < filtered.index("meta mark set 120")


def test_net0_rate_polices_the_port_both_ways_in_mebibytes() -> None:
    text = pvefw.render(_state(cluster_enable=1, rate="1.5"), NODE)
    rate = int(1.5 * 1024 * 1024)
    assert f'iifname "veth120i0" limit rate over {rate} bytes/second counter drop' in text
    assert f'oifname "veth120i0" limit rate over {rate} bytes/second counter drop' in text
    # tc, not the firewall: it holds with the datacenter firewall off too
    assert f"limit rate over {rate} bytes/second" in pvefw.render(_state(cluster_enable=0, rate="1.5"), NODE)
    assert "limit rate" not in pvefw.render(_state(cluster_enable=1), NODE)


@pytest.mark.skipif(
    subprocess.run(["nft", "--version"], capture_output=True).returncode != 0, reason="no nft"
)
def test_the_compiled_firewall_is_valid_nftables() -> None:
    """``nft -c`` (check only, nothing loaded) accepts what the node engine would load."""
    filters = {"ipfilter": 1, "macfilter": 1}
    states = (_state(1, internet=1), _state(1, internet=0), _state(0), _state(1, options=filters, rate="10"))
    for state in states:
        text = pvefw.render(state, NODE)
        proc = subprocess.run(["nft", "-c", "-f", "-"], input=text, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr + text


def test_rule_line_skips_what_it_cannot_express() -> None:
    assert pvefw.rule_line({"type": "out", "action": "ACCEPT", "enable": 0}) is None
    assert pvefw.rule_line({"type": "out", "action": "ACCEPT", "enable": 1, "macro": "SSH"}) is None
    assert pvefw.rule_line({"type": "out", "action": "ACCEPT", "enable": 1, "proto": "sctp"}) is None
    assert pvefw.rule_line({"type": "in", "action": "REJECT", "enable": 1, "source": "192.0.2.0/24"}) == (
        "ip saddr 192.0.2.0/24 counter reject"
    )
    assert dataclasses.is_dataclass(Settings)
