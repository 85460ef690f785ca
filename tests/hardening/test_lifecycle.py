"""SBX-LIFE: create, use, destroy, and collect what crashed callers leave.

The orphan test runs its own callers and ``gc`` in a scratch LXC path (the template's config copied
there, so clones share the real template rootfs) with its own address range: ``gc`` there sees only
this test's sandboxes, never those of other users of this host."""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_rt import Manager, Settings
from sandbox_rt.backends.lxc.nft import NftInternetSet
from tests.integration.runtime.test_crash_and_cli import CHILD as KILL_DURING_CREATE

from . import checks, hosts
from .checks import Footprint, Target
from .conftest import SESSION_LABEL, Factory
from .sites import Site
from .testnet import SimNet

pytestmark = [pytest.mark.slow]

# A caller that creates a sandbox, says its id, and lives on until it is killed.
KILL_MID_SESSION = textwrap.dedent(
    """
    import sys, time
    import sandbox_rt
    sb = sandbox_rt.Manager.from_env().create(labels={"test-session": "orphan"}, memory_mb=256)
    print(sb.id, flush=True)
    time.sleep(600)
    """
)


@pytest.fixture(scope="module")
def scratch(settings: Settings) -> Iterator[Settings]:
    """Settings for a scratch LXC path next to the real one, addresses 10.99.251.0/24."""
    path = settings.lxc_path.parent / f"hardening-{secrets.token_hex(4)}"
    (path / settings.template).mkdir(parents=True)
    path.chmod(0o755)
    shutil.copy(settings.lxc_path / settings.template / "config", path / settings.template / "config")
    scratch = dataclasses.replace(
        settings, lxc_path=path, ip_pool_start="10.99.251.0", ip_pool_end="10.99.251.254", disk_limits=False
    )
    try:
        yield scratch
    finally:
        leftover_mgr = Manager(scratch)
        for sid in _sandboxes(path):
            leftover_mgr.backend.destroy(sid)
        shutil.rmtree(path)


def _env(s: Settings) -> dict[str, str]:
    return dict(
        os.environ,
        SANDBOX_RT_LXC_PATH=str(s.lxc_path),
        SANDBOX_RT_IP_POOL_START=s.ip_pool_start,
        SANDBOX_RT_IP_POOL_END=s.ip_pool_end,
        SANDBOX_RT_DISK_LIMITS="false",  # the scratch path is a plain directory (not the btrfs storage)
        PYTHONPATH=str(checks.REPO),
    )


def _sandboxes(path: Path) -> set[str]:
    return {p.name for p in path.iterdir() if p.name.startswith("sbx-")}


def test_SBX_LIFE_01_destroy_leaves_nothing(
    site: Site, site_make: Factory, site_net: SimNet, site_nft: NftInternetSet
) -> None:
    if site.is_pve:  # a CT of the node: PVE's config, the node's container, veth, cgroups, firewall
        t = site_make(internet=True)
        pfp = checks.PveFootprint.of(t)
        assert checks.probe(t, "http", site_net.wan_ip, 80)["ok"], "precondition: it used the network"
        before = checks.pve_leftovers(pfp)
        assert any(x.startswith("CT ") for x in before) and any("veth" in x for x in before), before
        assert any("cgroup" in x for x in before) and any("pve-firewall" in x for x in before), before
        t.sb.destroy()
        checks.check_nothing_left_pve(pfp)
        return
    net, nft = site_net, site_nft
    t = site_make(internet=True)
    fp = Footprint.of(t.id, t.settings.lxc_path)
    # it left traces worth removing: a dir, a veth, cgroups, an nft element, tracked flows
    assert checks.probe(t, "http", net.wan_ip, 80)["ok"], "precondition: the sandbox used the network"
    before = checks.leftovers(fp, nft)
    assert any("container dir" in x for x in before) and any("nft element" in x for x in before), before
    assert any(f"veth {fp.port}" in x for x in before) and any("cgroup" in x for x in before), before
    t.sb.destroy()
    checks.check_nothing_left(fp, nft)


def test_SBX_LIFE_02_orphans_are_collected(site: Site, request: pytest.FixtureRequest) -> None:
    if site.is_pve:
        _orphans_are_collected_pve(site)
        return
    scratch: Settings = request.getfixturevalue("scratch")
    mgr = Manager(scratch)
    nft = NftInternetSet(scratch.nft_family, scratch.nft_table, scratch.nft_internet_set)
    # 1. the caller dies in the middle of create: plain gc removes the half-made sandbox
    for step in ("starting", "waiting for SSH"):
        before = _sandboxes(scratch.lxc_path)
        proc = subprocess.run(
            [sys.executable, "-c", KILL_DURING_CREATE, step],
            env=_env(scratch),
            capture_output=True,
            timeout=120,
        )
        assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
        left = _sandboxes(scratch.lxc_path) - before
        assert left, f"precondition: killed at {step!r}, a clone is left"
        prints = {sid: Footprint.of(sid, scratch.lxc_path) for sid in left}
        removed = {r.sandbox_id for r in mgr.gc()}
        checks.require("SBX-LIFE-02", left <= removed, f"gc left {left - removed} (killed at {step!r})")
        for fp in prints.values():
            checks.check_nothing_left(fp, nft, "SBX-LIFE-02")
    # 2. the caller dies mid-session: gc(dead_owners=True) removes its sandbox (plain gc spares it)
    child = subprocess.Popen(
        [sys.executable, "-c", KILL_MID_SESSION], env=_env(scratch), stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        sid = child.stdout.readline().strip()
        assert sid.startswith("sbx-"), f"the caller did not create a sandbox ({sid!r})"
        fp = Footprint.of(sid, scratch.lxc_path)
        assert mgr.backend.state(sid) == "running"
    finally:
        child.kill()
        child.wait(timeout=30)
    assert sid not in {r.sandbox_id for r in mgr.gc()}, "plain gc destroyed a live-looking sandbox"
    removed = {r.sandbox_id for r in mgr.gc(dead_owners=True)}
    checks.require("SBX-LIFE-02", sid in removed, "gc(dead_owners=True) did not collect the orphan")
    checks.check_nothing_left(fp, nft, "SBX-LIFE-02")
    checks.require("SBX-LIFE-02", not _sandboxes(scratch.lxc_path), "sandboxes left in the scratch path")


def test_SBX_LIFE_03_clone_start_ssh_commands(site_make: Factory, site_manager: Manager) -> None:
    manager = site_manager
    t0 = time.monotonic()
    t = site_make()
    ready = time.monotonic() - t0
    checks.require("SBX-LIFE-03", ready < 10, f"create took {ready:.1f} s")
    r = t.sb.exec("uname -s; id -un", timeout=30)
    checks.require("SBX-LIFE-03", r.stdout == b"Linux\nsandbox\n", f"commands: {r}")
    again = Manager(manager.settings).attach(t.id)
    try:
        name = again.exec("hostname", timeout=30).text.strip()
        checks.require("SBX-LIFE-03", name == t.sb.hostname, f"attached to {name}, not {t.sb.hostname}")
    finally:
        again.close()
    assert t.sb.labels.items() >= SESSION_LABEL.items()


def test_SBX_LIFE_04_sftp_roundtrip(site_baseline: Target, tmp_path: Path) -> None:
    baseline = site_baseline
    data = os.urandom(1 << 20)
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "blob").write_bytes(data)
    baseline.sb.upload(tree, "/home/sandbox/lifecycle-tree")
    out = tmp_path / "back"
    baseline.sb.download("/home/sandbox/lifecycle-tree", out)
    checks.require("SBX-LIFE-04", (out / "sub" / "blob").read_bytes() == data, "directory round trip differs")
    baseline.sb.write_file("/tmp/lifecycle.bin", data)
    back = baseline.sb.read_file("/tmp/lifecycle.bin")
    checks.require("SBX-LIFE-04", back == data, "file round trip differs")
    baseline.sb.exec("rm -rf /home/sandbox/lifecycle-tree /tmp/lifecycle.bin", timeout=30)


def _orphans_are_collected_pve(site: Site) -> None:
    """SBX-LIFE-02 on the emulated PVE node: the same callers, killed the same ways, with the node's
    host contract; ``gc`` (the runtime's PVE backend: its create markers, the CTs' records) collects.
    Only this test's CTs can be collected: every other sandbox of the node belongs to this live
    pytest process and is neither half-made nor expired."""
    mgr = Manager(site.settings)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_RT_")}
    env.update(SANDBOX_RT_CONFIG=str(site.settings_file), PYTHONPATH=str(checks.REPO))

    def orphans() -> dict[str, checks.PveFootprint]:
        records = mgr.list(labels={"test-session": "crash"}) + mgr.list(labels={"test-session": "orphan"})
        return {r.id: checks.PveFootprint(r.id, r.ip, hosts.pve_vmid(mgr, r.id), site) for r in records}

    # 1. the caller dies in the middle of create: plain gc removes the half-made sandbox
    for step in ("starting", "waiting for SSH"):
        proc = subprocess.run(
            [sys.executable, "-c", KILL_DURING_CREATE, step], env=env, capture_output=True, timeout=180
        )
        assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
        left = orphans()
        assert left, f"precondition: killed at {step!r}, a CT is left"
        removed = {r.sandbox_id for r in mgr.gc()}
        gone = set(left) <= removed
        checks.require("SBX-LIFE-02", gone, f"gc left {set(left) - removed} (killed at {step!r})")
        for fp in left.values():
            checks.check_nothing_left_pve(fp, "SBX-LIFE-02")
    # 2. the caller dies mid-session: gc(dead_owners=True) removes its sandbox (plain gc spares it)
    child = subprocess.Popen(
        [sys.executable, "-c", KILL_MID_SESSION], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        sid = child.stdout.readline().strip()
        assert sid.startswith("sbx-"), f"the caller did not create a sandbox ({sid!r})"
        fp = orphans()[sid]
        assert mgr.backend.state(sid) == "running"
    finally:
        child.kill()
        child.wait(timeout=30)
    assert sid not in {r.sandbox_id for r in mgr.gc()}, "plain gc destroyed a live-looking sandbox"
    removed = {r.sandbox_id for r in mgr.gc(dead_owners=True)}
    checks.require("SBX-LIFE-02", sid in removed, "gc(dead_owners=True) did not collect the orphan")
    checks.check_nothing_left_pve(fp, "SBX-LIFE-02")
    checks.require("SBX-LIFE-02", not orphans(), "crashed callers' sandboxes are left")
