"""Reliability under load and faults on the LXC backend (issue 9): no shared, half-made or leaked sandbox.

Every test is bounded in count and time; each fault gives a documented error type and leaves nothing.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox_rt
from sandbox_rt import BackendError, Manager, SandboxNotReady, Settings
from sandbox_rt.backends.lxc.egress_dns import bound_ports
from sandbox_rt.backends.lxc.netstate import NetState
from sandbox_rt.backends.lxc.nft import NftInternetSet

from .conftest import SESSION_LABEL


def _leftovers(mgr: Manager, label: dict[str, str]) -> dict[str, object]:
    s = mgr.settings
    ours = [r for r in mgr.list(labels=label)]
    intents = list((s.lxc_path / ".runtime" / "creating").glob("*.json"))
    return {"sandboxes": ours, "intents": intents}


def _no_leaks(mgr: Manager, label: dict[str, str], ips: set[str]) -> None:
    left = _leftovers(mgr, label)
    assert left == {"sandboxes": [], "intents": []}, left
    s = mgr.settings
    nft = NftInternetSet(s.nft_family, s.nft_table, s.nft_internet_set)
    assert not (nft.members() & ips)
    used = {
        ln.split("=", 1)[1].strip().split("/")[0]
        for cfg in s.lxc_path.glob("*/config")
        for ln in cfg.read_text().splitlines()
        if ln.startswith("lxc.net.0.ipv4.address")
    }
    assert not (used & ips)  # every address went back to the pool
    state = NetState(s)
    assert not [n for n in state.all() if n.ip in ips]  # no network state file left
    # no egress resolver (config, pid file, bound port) without its sandbox's state; read in the
    # order a concurrent create writes them (state first, resolver after), so no false alarm
    resolvers = set(state.resolvers.leftovers(set()))
    ports = bound_ports(s.dns_server) & set(range(s.egress_dns_port_min, s.egress_dns_port_max + 1))
    recorded = state.all()
    assert resolvers <= {n.sandbox_id for n in recorded}, resolvers
    assert ports <= {n.dns_port for n in recorded}, ports


def test_50_creates_from_8_threads(lxc_manager: Manager) -> None:
    """50 sandboxes alive at once, made by 8 threads: distinct ids and addresses, all work."""
    label = {**SESSION_LABEL, "load": "threads"}
    sandboxes: list[sandbox_rt.Sandbox] = []
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            futures = [
                ex.submit(
                    lxc_manager.create,
                    memory_mb=128,
                    internet=i % 2 == 0,
                    egress=["example.test"] if i % 3 == 0 else None,  # 17 own resolvers
                    labels=label,
                )
                for i in range(50)
            ]
            for f in futures:
                sandboxes.append(f.result())
        assert len({sb.id for sb in sandboxes}) == 50 and len({sb.ip for sb in sandboxes}) == 50
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            names = list(ex.map(lambda sb: sb.exec("cat /etc/hostname").text.strip(), sandboxes))
        assert names == [sb.id for sb in sandboxes]
    finally:
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda sb: sb.destroy(), sandboxes))
    _no_leaks(lxc_manager, label, {sb.ip for sb in sandboxes})


def _process_worker(n: int, label: dict[str, str], out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    mgr = Manager.from_env()
    made = [mgr.create(memory_mb=128, labels=label) for _ in range(n)]
    for sb in made:
        out.put((sb.id, sb.ip, sb.exec("echo ok").stdout))
    # the worker exits without destroying: its sandboxes outlive it, so the test sees all 52 alive


def test_creates_from_4_processes(lxc_manager: Manager) -> None:
    """52 sandboxes made by 4 processes at once: distinct addresses across processes (flock)."""
    label = {**SESSION_LABEL, "load": "processes"}
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_process_worker, args=(13, label, out)) for _ in range(4)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=180) for _ in range(52)]
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        assert len({r[0] for r in results}) == 52 and all(r[2] == b"ok\n" for r in results)
        alive = lxc_manager.list(labels=label)
        assert len({r.ip for r in alive}) == len(alive) == 52  # all alive together, no address shared
    finally:
        for record in lxc_manager.list(labels=label):
            lxc_manager.destroy(record.id)
    _no_leaks(lxc_manager, label, {r[1] for r in results})


def test_200_parallel_execs_on_5_sandboxes(make_lxc) -> None:  # type: ignore[no-untyped-def]
    boxes = [make_lxc(memory_mb=256) for _ in range(5)]

    def run(i: int) -> tuple[int, bytes]:
        return i, boxes[i % 5].exec(f"echo {i}; echo err{i} >&2").stdout

    with concurrent.futures.ThreadPoolExecutor(40) as ex:
        results = list(ex.map(run, range(200)))
    assert all(out == f"{i}\n".encode() for i, out in results)


def test_commands_work_with_fds_above_fd_setsize(make_lxc) -> None:  # type: ignore[no-untyped-def]
    """A process holding ~1,000 attached sandboxes has fds above FD_SETSIZE (1024); select() refuses
    those (ValueError), so exec, exec_stream and a command's timeout must not depend on it. The fds
    are opened after the connection, so the command's own (its channel's wake-up pipe) come last."""
    sb = make_lxc(memory_mb=256)
    assert sb.exec("true").exit_code == 0  # connected before the fds pile up
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 1200:
        pytest.fail(f"this host's hard RLIMIT_NOFILE ({hard}) is too low to hold 1,100 fds", pytrace=False)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    filler: list[int] = []
    try:
        while not filler or filler[-1] < 1100:
            filler.append(os.open("/dev/null", os.O_RDONLY))
        result = sb.exec("echo out; echo err >&2; exit 3")
        assert (result.stdout, result.stderr, result.exit_code) == (b"out\n", b"err\n", 3)
        assert b"".join(c.data for c in sb.exec_stream("seq 3")) == b"1\n2\n3\n"
        with pytest.raises(sandbox_rt.CommandTimeout):
            sb.exec("sleep 30", timeout=0.5)
        assert sb.exec("echo still").stdout == b"still\n"
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_2000_short_execs_never_drop_the_connection(make_lxc) -> None:  # type: ignore[no-untyped-def]
    """Commands that end before their input's EOF is sent: sshd must never see EOF after CLOSE.

    With paramiko's own ``shutdown_write`` about 1 in 400 such calls lost the whole connection
    (sshd: "ieof packet referred to nonexistent channel"); every call here must work, including
    ones given input they never read.
    """
    boxes = [make_lxc(memory_mb=256) for _ in range(5)]

    def run(i: int) -> bytes:
        stdin = b"x" * (i % 3) * 40000 if i % 2 else None  # unread input: none, 40 kB or 80 kB
        return boxes[i % 5].exec(f"echo {i}", stdin=stdin).stdout

    with concurrent.futures.ThreadPoolExecutor(40) as ex:
        outs = list(ex.map(run, range(2000)))
    assert outs == [f"{i}\n".encode() for i in range(2000)]
    assert all(sb.exec("cat", stdin=b"in").stdout == b"in" for sb in boxes)  # input still arrives


# -- faults ----------------------------------------------------------------------------------------
@pytest.fixture
def scratch_settings(settings: Settings) -> Iterator[Settings]:
    """An LXC path of its own with a copy of the template's config (same rootfs), own address range.

    It sits beside the real LXC path: container root (an unprivileged id) must be able to traverse it.
    """
    base = Path(tempfile.mkdtemp(prefix="test-", dir=settings.lxc_path.parent))
    path = base / "lxc"
    (path / settings.template).mkdir(parents=True)
    shutil.copy(settings.lxc_path / settings.template / "config", path / settings.template / "config")
    for p in (base, path):
        p.chmod(0o711)
    try:
        yield dataclasses.replace(
            settings,
            lxc_path=path,
            ip_pool_start="10.99.240.0",
            ip_pool_end="10.99.240.255",
            ssh_ready_timeout_s=3,
            disk_limits=False,  # a plain directory on the host's filesystem, not the btrfs storage
        )
    finally:
        for cdir in path.glob("sbx-*"):  # a failed test's leftovers, never the real path
            subprocess.run(["lxc-stop", "-P", str(path), "-n", cdir.name, "-k"], capture_output=True)
            subprocess.run(["lxc-destroy", "-P", str(path), "-n", cdir.name], capture_output=True)
        shutil.rmtree(base)


def _assert_empty(s: Settings) -> None:
    assert sorted(p.name for p in s.lxc_path.iterdir() if p.name.startswith("sbx-")) == []
    assert not list((s.lxc_path / ".runtime" / "creating").glob("*.json"))


def test_disk_limits_off_btrfs_are_a_clear_error(scratch_settings: Settings) -> None:
    s = dataclasses.replace(scratch_settings, disk_limits=True)
    with pytest.raises(BackendError, match="not on a btrfs filesystem, so disk_gb cannot be enforced") as err:
        Manager(s).create()
    assert err.value.step == "clone"
    _assert_empty(s)


def test_missing_template_is_a_clear_error(scratch_settings: Settings) -> None:
    s = dataclasses.replace(scratch_settings, template="no-such-template")
    with pytest.raises(BackendError, match=r"template 'default' \(no-such-template\) not found"):
        Manager(s).create()
    _assert_empty(s)


def test_sshd_that_never_answers(scratch_settings: Settings) -> None:
    cfg = scratch_settings.lxc_path / scratch_settings.template / "config"
    cfg.write_text(
        cfg.read_text().replace("lxc.init.cmd = /sbin/sandbox-init", "lxc.init.cmd = /bin/sleep 600")
    )
    t0 = time.monotonic()
    with pytest.raises(SandboxNotReady):
        Manager(scratch_settings).create()
    assert time.monotonic() - t0 < 15
    _assert_empty(scratch_settings)


def test_missing_bridge(scratch_settings: Settings) -> None:
    s = dataclasses.replace(scratch_settings, bridge="nosuchbr0")
    with pytest.raises(BackendError) as err:
        Manager(s).create()
    assert err.value.step == "start"
    _assert_empty(s)


def test_disk_full_during_create(scratch_settings: Settings) -> None:
    tmp_path = scratch_settings.lxc_path.parent
    image = tmp_path / "small.img"
    subprocess.run(["truncate", "-s", "16M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", str(image)], check=True)
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        mnt.chmod(0o711)
        (mnt / scratch_settings.template).mkdir()
        shutil.copy(
            scratch_settings.lxc_path / scratch_settings.template / "config", mnt / scratch_settings.template
        )
        s = dataclasses.replace(scratch_settings, lxc_path=mnt)
        Manager(s).create().destroy()  # works while there is room
        subprocess.run(["dd", "if=/dev/zero", f"of={mnt}/fill", "bs=1M"], capture_output=True)  # until ENOSPC
        with pytest.raises(sandbox_rt.SandboxError) as err:
            Manager(s).create()
        assert isinstance(err.value, BackendError | SandboxNotReady)
        assert "space" in str(err.value).lower() or isinstance(err.value, SandboxNotReady)
        _assert_empty(s)
    finally:
        for cdir in mnt.glob("sbx-*"):
            subprocess.run(["lxc-stop", "-P", str(mnt), "-n", cdir.name, "-k"], capture_output=True)
            subprocess.run(["lxc-destroy", "-P", str(mnt), "-n", cdir.name], capture_output=True)
        subprocess.run(["umount", str(mnt)], check=True)


def test_key_re_exchanges_while_commands_end_never_hang_the_connection(lxc_manager: Manager) -> None:
    """paramiko re-keys every 512 MiB; a command's channel that closed during a re-key made the
    reader thread wait for the re-key it alone could finish (30 s, then the connection died: on main
    3 runs out of 3 of 45 x 32 MiB failed). Here the transport re-keys every 2 MiB, so a hundred short
    commands cross dozens of re-keys while channels open and close."""
    with lxc_manager.create(labels=SESSION_LABEL) as sb:
        sb.exec("true")
        transport = sb._ssh._transport()  # the test shortens paramiko's re-key interval
        transport.packetizer.REKEY_BYTES = 2 << 20  # type: ignore[attr-defined]
        transport.packetizer.REKEY_PACKETS = 1 << 30  # type: ignore[attr-defined]
        for _ in range(100):  # a hung re-key ends in ConnectionLost after 30 s
            r = sb.exec("head -c 1M /dev/zero", timeout=30, max_output=1 << 10)
            assert r.exit_code == 0 and r.stdout_dropped == (1 << 20) - (1 << 10)
        assert sb.is_connected()
