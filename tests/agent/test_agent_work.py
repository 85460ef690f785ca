"""Ordinary agent work in a default sandbox, through an egress allow-list (issue 17), on both sites:
``pip install --user`` and a venv's pip from a package index, ``npm install`` of a package tarball,
``git clone`` over HTTP. The "internet" is the test network's wan namespace (testnet.py), where a
static file server on an address of its own serves a PEP 503 index, the tarball and a dumb-HTTP
repository made on this machine (tests/integration/agent_packages.py). The sites and the network are
the hardening suite's (conftest.py); a sandbox without the list reaches none of it.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hardening import checks
from tests.hardening.conftest import Factory
from tests.hardening.testnet import SimNet
from tests.integration import agent_packages as pkgs
from tests.integration.provision_helpers import sh, wait_for

pytestmark = [pytest.mark.slow]

FILE_SERVER = Path(checks.__file__).with_name("netns_files.py")
# An RFC 2544 address of the wan's own (beside public_web_ip), routed into the wan like any other.
FILES_IP = "198.18.0.90"
# plain HTTP: pip wants the host named as trusted (a real mirror would serve HTTPS)
INDEX = f"http://{FILES_IP}/simple/ --trusted-host {FILES_IP}"
# npm: no update check and no audit (they would ask the real registry, which the list does not allow)
NPM = "npm --no-audit --no-fund --no-update-notifier --loglevel=error"
IMPORT = f"import {pkgs.WHEEL_NAME}; print({pkgs.WHEEL_NAME}.VALUE)"


@pytest.fixture
def file_server(site_net: SimNet, tmp_path: Path) -> Iterator[str]:
    """The packages, served at FILES_IP:80 in the site's wan namespace; removed again after the test."""
    root = tmp_path / "www"
    pkgs.make_simple_index(root)
    pkgs.make_npm_tarball(root)
    pkgs.make_git_repo(root)
    pkgs.make_apt_repo(root)
    netns = site_net.wan_ns
    sh("ip", "-n", netns, "addr", "add", f"{FILES_IP}/32", "dev", "lo")
    proc = subprocess.Popen(
        ["ip", "netns", "exec", netns, sys.executable, str(FILE_SERVER), FILES_IP, "80", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: site_net.netns_tcp_open(netns, FILES_IP, 80), 15, f"the file server at {FILES_IP}:80"
        )
        yield FILES_IP
    finally:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        sh("ip", "-n", netns, "addr", "del", f"{FILES_IP}/32", "dev", "lo", check=False)


def _run(t: checks.Target, command: str) -> str:
    r = t.sb.exec(command, timeout=300)
    assert r.exit_code == 0, f"{command!r}: exit {r.exit_code}\n{r.text[-2000:]}\n{r.stderr_text[-3000:]}"
    return r.text


def test_agent_installs_and_clones_through_its_egress_list(
    site_make: Factory, site_net: SimNet, file_server: str
) -> None:
    t = site_make(egress=[file_server], memory_mb=1024)
    bystander = site_make()

    # pip, as README shows it: --user outside a venv (the template's pip.conf allows it), and in a venv
    out = _run(t, f"pip install --user --index-url {INDEX} {pkgs.WHEEL_NAME} && python3 -c '{IMPORT}'")
    assert out.splitlines()[-1] == pkgs.WHEEL_VALUE, out
    out = _run(
        t,
        f"python3 -m venv /tmp/venv && /tmp/venv/bin/pip install -q --index-url {INDEX} {pkgs.WHEEL_NAME} "
        "&& /tmp/venv/bin/python -c 'import sbxdemo, sys; print(sbxdemo.__file__.startswith(sys.prefix))'",
    )
    assert out.splitlines()[-1] == "True", out

    # npm: a package tarball from the "internet", required by node
    tarball = f"http://{file_server}/{pkgs.NPM_NAME}-{pkgs.NPM_VERSION}.tgz"
    require = f"console.log(require('{pkgs.NPM_NAME}').value)"
    out = _run(t, f'mkdir -p ~/proj && cd ~/proj && {NPM} install {tarball} && node -e "{require}"')
    assert out.splitlines()[-1] == pkgs.NPM_VALUE, out

    # git: a clone over (dumb) HTTP
    out = _run(t, f"git clone -q http://{file_server}/{pkgs.GIT_REPO} /tmp/demo && cat /tmp/demo/README")
    assert out.strip() == pkgs.GIT_TEXT, out

    # the list is what lets it through: the bystander reaches none of it, and neither does pip
    assert checks.sweep(bystander, [f"{file_server}:80"]) == set()
    r = bystander.sb.exec(
        f"pip install --user --timeout 3 --retries 0 --index-url {INDEX} {pkgs.WHEEL_NAME}", timeout=120
    )
    assert r.exit_code != 0 and "sbxdemo" not in bystander.sb.exec("pip list --user 2>/dev/null").text


# apt as root in a root=True sandbox: only the test repository (the template's Debian sources would
# need the real internet), unsigned but trusted by the source line
APT = (
    "apt-get -o Dir::Etc::SourceList=/etc/apt/sources.list.d/sbx-test.list -o Dir::Etc::SourceParts=- "
    "-o Acquire::Retries=0 -q"
)


def test_root_installs_a_debian_package_through_its_egress_list(
    site_make: Factory, site_net: SimNet, file_server: str
) -> None:
    t = site_make(egress=[file_server], memory_mb=1024, root=True)
    source = f"deb [trusted=yes] http://{file_server}/apt ./"
    setup = f"echo '{source}' > /etc/apt/sources.list.d/sbx-test.list"
    r = t.sb.exec(f"{setup} && {APT} update && {APT} -y install {pkgs.APT_PACKAGE}", timeout=300, user="root")
    assert r.exit_code == 0, f"exit {r.exit_code}\n{r.text[-2000:]}\n{r.stderr_text[-3000:]}"
    # installed for everyone: the sandbox user runs it
    assert _run(t, pkgs.APT_PACKAGE).strip() == pkgs.APT_TEXT
    assert _run(t, f"dpkg-query -W -f='${{Version}}' {pkgs.APT_PACKAGE}") == pkgs.APT_VERSION
    # the sandbox user cannot, and a sandbox without root=True has no root to ask for
    r = t.sb.exec(f"{APT} -y install {pkgs.APT_PACKAGE}", timeout=60)
    assert r.exit_code != 0
