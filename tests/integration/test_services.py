"""The runtime's services on a systemd host (issue 20 item 2): sandbox_runtime installs the reaper and
the HTTP API as systemd units; the reaper then destroys an expired sandbox with no operator action,
and the API answers with the token the role generated (0600, never printed).

The systemd host is the session's emulated PVE node (a Debian 12 system container with systemd;
tests/pve_node), which sees this repository and its .venv read-only at the same path. The services
run the embedded default's backend there on a scratch LXC path; the test plants sandbox records
(what a crashed caller leaves) and watches the reaper act on them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sandbox_rt.backends.lxc.container import write_record
from sandbox_rt.models import SandboxRecord, SandboxSpec
from tests.integration.provision_helpers import REPO, PlaybookRun, parse_recap, wait_for
from tests.pve_node import PVENode
from tests.pve_node.__main__ import exports
from tests.pve_node.provisioning import ProvisionedNode

pytestmark = [pytest.mark.slow]

CONFIG = "/etc/sandbox_rt-services-test"
LXC_PATH = "/var/lib/sandbox_rt-services-test/lxc"
PORT = 8797
UNITS = ("sandbox-rt-reaper.service", "sandbox-rt-api.service")


def _play(path: Path, *, enabled: bool) -> None:
    role_vars = {
        "sandbox_runtime_config_dir": CONFIG,
        "sandbox_runtime_ssh_key": f"{CONFIG}/ssh/id_ed25519",
        "sandbox_runtime_backend": "lxc",
        "sandbox_runtime_lxc_path": LXC_PATH,
        "lxc_host_storage": "dir",  # a plain directory, not the btrfs storage site.yml makes: no disk limits
        "sandbox_runtime_net_state_dir": "/var/lib/sandbox_rt-services-test/net",
        "sandbox_runtime_python": str(REPO / ".venv" / "bin" / "python"),
        "sandbox_runtime_reaper_interval": 1,
        "sandbox_runtime_api_enabled": enabled,
        "sandbox_runtime_api_port": PORT,
    }
    path.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "The runtime's services on the node",
                    "hosts": "proxmox_hosts",
                    "gather_facts": True,
                    "gather_subset": ["!all", "!min", "service_mgr"],
                    "roles": [{"role": "sandbox_runtime", "vars": role_vars}],
                }
            ]
        )
    )


def _run(node: PVENode, play: Path) -> PlaybookRun:
    args = [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", "inventories/pve_emulated", str(play)]
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", **exports(node))
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    return PlaybookRun(args, proc.returncode, proc.stdout + proc.stderr, parse_recap(proc.stdout), 0.0)


def _in_node(node: PVENode, *cmd: str) -> subprocess.CompletedProcess[str]:
    return node.attach(*cmd, check=False)


@pytest.fixture(scope="module")
def services(emulated_pve: ProvisionedNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PVENode]:
    node = emulated_pve.node
    play = tmp_path_factory.mktemp("services") / "services.yml"
    _play(play, enabled=True)
    try:
        first = _run(node, play)
        assert first.returncode == 0 and first.total("failed") == 0, first.tail(80)
        second = _run(node, play)
        assert second.returncode == 0 and second.total("changed") == 0, second.tail(80)
        yield node
    finally:
        for unit in UNITS:
            _in_node(node, "systemctl", "disable", "--now", unit)
            _in_node(node, "rm", "-f", f"/etc/systemd/system/{unit}")
        _in_node(node, "systemctl", "daemon-reload")
        _in_node(node, "rm", "-rf", CONFIG, str(Path(LXC_PATH).parent))


def test_the_units_are_enabled_and_running(services: PVENode) -> None:
    for unit in UNITS:
        assert _in_node(services, "systemctl", "is-enabled", unit).stdout.strip() == "enabled", unit
        active = wait_for(
            lambda u=unit: _in_node(services, "systemctl", "is-active", u).stdout.strip() == "active",  # type: ignore[misc]
            30,
            f"{unit} active",
        )
        assert active


def _plant(node: PVENode, sandbox_id: str, expires_in: float) -> Path:
    """A sandbox's dir with its record as a caller that died would leave it (no container)."""
    cdir = node.spec.rootfs / LXC_PATH.lstrip("/") / sandbox_id
    cdir.mkdir(parents=True)
    (cdir / "config").write_text(f"lxc.uts.name = {sandbox_id}\n")
    now = time.time()
    record = SandboxRecord(
        id=sandbox_id, hostname=sandbox_id, ip="10.99.1.9", host_key="", spec=SandboxSpec(ttl_s=1),
        created_at=now, expires_at=now + expires_in, owner_pid=0, owner_host="elsewhere", backend="lxc",
    )  # fmt: skip
    write_record(cdir, dataclasses.replace(record), owner_start=None)
    return cdir


def test_the_reaper_destroys_what_expired_and_spares_the_rest(services: PVENode) -> None:
    expired = _plant(services, "sbx-00000000f1", expires_in=-5)
    alive = _plant(services, "sbx-00000000f2", expires_in=3600)
    wait_for(lambda: not expired.exists(), 60, "the reaper to destroy the expired sandbox")
    assert alive.exists()
    log = _in_node(services, "journalctl", "-u", "sandbox-rt-reaper", "--no-pager", "-o", "cat").stdout
    assert "reaped sbx-00000000f1: expired" in log
    assert "sbx-00000000f2" not in log


_GET = """
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=5)
c.request("GET", sys.argv[2], headers={"Authorization": "Bearer " + sys.argv[3]} if len(sys.argv) > 3 else {})
r = c.getresponse()
print(r.status, r.read().decode())
"""


def _get(node: PVENode, path: str, *token: str) -> tuple[int, str]:
    """GET ``path`` of the API from inside the node (its loopback), with the token if given."""
    proc = _in_node(node, str(REPO / ".venv" / "bin" / "python"), "-c", _GET, str(PORT), path, *token)
    status, _, body = proc.stdout.strip().partition(" ")
    return (int(status) if status.isdigit() else 0), body


def test_the_api_answers_with_the_generated_token_only(services: PVENode) -> None:
    token_file = services.spec.rootfs / CONFIG.lstrip("/") / "api.token"
    st = token_file.stat()
    assert st.st_mode & 0o777 == 0o600 and st.st_uid == 0
    token = token_file.read_text().strip()
    assert len(token) >= 32
    wait_for(lambda: _get(services, "/healthz")[0] == 200, 30, "the API to listen")
    status, body = _get(services, "/v1/templates", token)
    contract = json.loads((services.spec.rootfs / CONFIG.lstrip("/") / "host.json").read_text())
    assert status == 200 and json.loads(body) == {"templates": ["default", *sorted(contract["templates"])]}
    assert _get(services, "/v1/templates")[0] == 401
    assert _get(services, "/v1/templates", "x" * 43)[0] == 401


def test_the_token_is_never_in_the_playbook_output(services: PVENode, tmp_path: Path) -> None:
    token = (services.spec.rootfs / CONFIG.lstrip("/") / "api.token").read_text().strip()
    play = tmp_path / "services.yml"
    _play(play, enabled=True)
    run = _run(services, play)
    assert run.returncode == 0 and token not in run.output
