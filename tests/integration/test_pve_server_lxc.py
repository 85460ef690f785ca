"""The PVE test server with the LXC engine: a "PVE" clone is a real container reachable over SSH.

Needs root, LXC and the host's template container (``/var/lib/sandbox_rt/lxc/sandbox-template``,
built by the template_build role; CI builds it first) and the sandbox bridge. Settings come from
``/etc/sandbox_rt/host.json`` when present; ``SANDBOX_RT_LXC_PATH``, ``SANDBOX_RT_TEMPLATE``,
``SANDBOX_RT_BRIDGE`` override. Only 127.0.0.1 and the sandbox bridge's addresses are contacted.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest
from proxmoxer.tools import Tasks

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for pve_testserver

from pve_testserver import LxcEngine, PVETestServer, hostkey_of

pytestmark = [pytest.mark.slow, pytest.mark.root]

NODE = "pve"
OSTEMPLATE = "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"
TIMEOUT = 30.0


def host_settings() -> dict[str, Any]:
    settings: dict[str, Any] = {
        "lxc_path": "/var/lib/sandbox_rt/lxc",
        "template": "sandbox-template",
        "bridge": "vmbr1",
        "network_cidr": "10.99.0.0/16",
        "gateway": "10.99.0.1",
    }
    host_json = Path("/etc/sandbox_rt/host.json")
    if host_json.is_file():
        settings.update({k: v for k, v in json.loads(host_json.read_text()).items() if k in settings})
    for key, env in (
        ("lxc_path", "SANDBOX_RT_LXC_PATH"),
        ("template", "SANDBOX_RT_TEMPLATE"),
        ("bridge", "SANDBOX_RT_BRIDGE"),
    ):
        settings[key] = os.environ.get(env, settings[key])
    return settings


SETTINGS = host_settings()


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (LXC containers)"
    engine = LxcEngine(Path(SETTINGS["lxc_path"]), SETTINGS["template"])
    reason = engine.unavailable_reason()
    if reason:
        return reason
    if not Path(f"/sys/class/net/{SETTINGS['bridge']}").exists():
        return f"bridge {SETTINGS['bridge']} does not exist (the sandbox_network role makes it)"
    return None


def _free_ip() -> ipaddress.IPv4Interface:
    """A static address high in the runtime pool that no container config of the LXC path uses."""
    net = ipaddress.ip_network(SETTINGS["network_cidr"])
    used = ""
    for cfg in Path(SETTINGS["lxc_path"]).glob("*/config"):
        used += cfg.read_text(errors="replace")
    for _ in range(200):
        addr = net.network_address + random.randint(net.num_addresses - 1024, net.num_addresses - 2)
        if f"= {addr}/" not in used:
            return ipaddress.IPv4Interface(f"{addr}/{net.prefixlen}")
    raise AssertionError("no free address found")


def _wait_task(api: Any, upid: str) -> dict[str, Any]:
    status: dict[str, Any] | None = Tasks.blocking_status(api, upid, timeout=TIMEOUT, polling_interval=0.05)
    assert status is not None, f"task {upid} did not finish in {TIMEOUT}s"
    assert status["exitstatus"] == "OK", status
    return status


def _port_open(ip: str, port: int = 22) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=0.5):
            return True
    except OSError:
        return False


def _poll(cond: Any, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _server_host_key(ip: str) -> str:
    sock = socket.create_connection((ip, 22), timeout=10)
    transport = paramiko.Transport(sock)
    try:
        transport.start_client(timeout=10)
        key = transport.get_remote_server_key()
        return f"{key.get_name()} {key.get_base64()}"
    finally:
        transport.close()


@pytest.fixture
def lxc_server() -> Iterator[tuple[PVETestServer, LxcEngine, list[int]]]:
    reason = _skip_reason()
    if reason:
        pytest.fail(reason, pytrace=False)  # CI always builds the template first: never pass by skipping
    engine = LxcEngine(Path(SETTINGS["lxc_path"]), SETTINGS["template"])
    made: list[int] = []
    srv = PVETestServer(engine=engine).start()
    try:
        yield srv, engine, made
    finally:
        srv.stop()
        errors = []
        for vmid in made:  # every container this test made goes, even after a failure
            try:
                engine.destroy(vmid)
            except Exception as exc:
                errors.append(f"{vmid}: {exc}")
        assert not errors, errors


def test_clone_start_reachable_then_destroyed(lxc_server: tuple[PVETestServer, LxcEngine, list[int]]) -> None:
    srv, engine, made = lxc_server
    api = srv.client()
    base = random.randint(990000, 998000)
    template_id, vmid = base, base + 1
    bridge, gw = SETTINGS["bridge"], SETTINGS["gateway"]

    made.append(template_id)
    _wait_task(
        api,
        api.nodes(NODE).lxc.post(
            vmid=template_id,
            ostemplate=OSTEMPLATE,
            storage="local-lvm",
            net0=f"name=eth0,bridge={bridge},ip=dhcp",
        ),
    )
    api.nodes(NODE).lxc(template_id).template.post()

    made.append(vmid)
    _wait_task(api, api.nodes(NODE).lxc(template_id).clone.post(newid=vmid, hostname=f"pve-it-{vmid}"))
    assert (Path(SETTINGS["lxc_path"]) / engine.ct_name(vmid) / "config").is_file()
    iface = _free_ip()
    ip = str(iface.ip)
    ct = api.nodes(NODE).lxc(vmid)
    ct.config.put(net0=f"name=eth0,bridge={bridge},ip={iface},gw={gw}", memory=256, swap=0, cores=1)
    _wait_task(api, ct.status.start.post())
    assert engine.is_running(vmid)
    _poll(lambda: _port_open(ip), f"TCP 22 on {ip}")

    published = hostkey_of(ct.config.get().get("description"))
    assert published is not None
    assert _server_host_key(ip) == " ".join(published.split()[:2])  # the pinned key is the real one
    eth0 = next(i for i in ct.interfaces.get() if i["name"] == "eth0")
    assert eth0["inet"] == str(iface)
    assert ct.status.current.get()["status"] == "running"

    _wait_task(api, ct.delete(force=1, purge=1))
    assert not (Path(SETTINGS["lxc_path"]) / engine.ct_name(vmid)).exists()
    _poll(lambda: not _port_open(ip), f"{ip} to go away")
    info = subprocess.run(
        ["lxc-info", "-P", SETTINGS["lxc_path"], "-n", engine.ct_name(vmid)], capture_output=True, check=False
    )
    assert info.returncode != 0
    _wait_task(api, api.nodes(NODE).lxc(template_id).delete())
    assert not (Path(SETTINGS["lxc_path"]) / engine.ct_name(template_id)).exists()
