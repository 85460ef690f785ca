"""The host trusts nothing a sandbox sends back (issue 23, items 1 and 3).

Two kinds of sandbox here:
- a real one (real sshd), doing what any agent's code can do as the sandbox user: 2 GiB of output,
  a symlink to /dev/zero, a 1 TB sparse file, local symlinks planted where a download goes;
- a lying one: ``hostile_sshd.py``, a paramiko SSH/SFTP server started INSIDE a real sandbox (as the
  sandbox user, on port 2222, with the sandbox's python3 and a copy of paramiko), answering with
  traversal names, false sizes, endless streams, forged end markers and data past the SSH window.
  The host reaches it with the runtime's own executor and ``Sandbox`` (a sandbox with root, issue 17,
  could put it on port 22 instead of sshd).

Each test failed on main before issue 23 (download wrote ``../`` names outside the destination,
exec and read_file buffered everything, a forged exit marker raised ValueError, ...).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import secrets
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import sandbox_rt
from sandbox_rt import BackendError, ConnectionLost, FileOperationError, Manager
from sandbox_rt.download import download_file, download_tree
from sandbox_rt.sandbox import Sandbox
from sandbox_rt.ssh import SSHExecutor, load_private_key, parse_public_key

from .conftest import SESSION_LABEL, Factory

MIB = 1 << 20
HOSTILE_PORT = 2222
LIBS = ("paramiko", "cryptography", "bcrypt", "nacl", "cffi", "pycparser")
DISTS = ("paramiko", "cryptography", "bcrypt", "pynacl", "cffi", "pycparser")  # their metadata


def _site_packages() -> Path:
    return Path(paramiko.__file__).resolve().parent.parent


def _poll(sb: sandbox_rt.Sandbox, path: str, timeout_s: float = 30) -> None:
    r = sb.exec(
        f"for i in $(seq {int(timeout_s * 20)}); do [ -e {path} ] && exit 0; sleep 0.05; done; exit 1"
    )
    assert r.exit_code == 0, f"{path} did not appear in the sandbox"


@pytest.fixture(scope="module")
def real(lxc_manager: Manager) -> Iterator[sandbox_rt.Sandbox]:
    with lxc_manager.create(memory_mb=1024, labels=SESSION_LABEL) as sb:
        yield sb


@pytest.fixture(scope="module")
def hostile(lxc_manager: Manager, real: sandbox_rt.Sandbox) -> Iterator[Sandbox]:
    """A ``Sandbox`` whose SSH peer is the lying server running inside ``real``."""
    site = _site_packages()
    libs = "/tmp/hostile-libs"
    for name in LIBS:
        real.upload(site / name, f"{libs}/{name}")
    for extra in site.iterdir():
        dist = extra.name.lower().split("-", 1)[0]
        if extra.name.startswith("_cffi_backend") or (extra.suffix == ".dist-info" and dist in DISTS):
            real.upload(extra, f"{libs}/{extra.name}")
    real.upload(Path(__file__).with_name("hostile_sshd.py"), "/tmp/hostile_sshd.py")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    pub = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    real.write_file("/tmp/hostile_hk", pem, mode=0o600)
    server = real.exec(
        f"PYTHONPATH={libs} exec python3 /tmp/hostile_sshd.py {HOSTILE_PORT} /tmp/hostile_hk "
        "/tmp/hostile_ready",
        background=True,
    )
    try:
        _poll(real, "/tmp/hostile_ready")
    except AssertionError:
        pytest.fail(f"the hostile server did not start: {server.logs()[1].decode()[-2000:]}")
    s = lxc_manager.settings
    executor = SSHExecutor(
        real.ip,
        port=HOSTILE_PORT,
        user=s.ssh_user,
        key=load_private_key(s.ssh_key),
        host_key=parse_public_key(pub),
    )
    executor.connect(20)
    sb = Sandbox(real.record, lxc_manager.backend, executor, 60.0)
    yield sb
    executor.close()
    server.kill()


@pytest.fixture
def dst(tmp_path: Path) -> Path:
    """A download destination with a sibling that must stay empty (nothing lands beside ``dst``)."""
    (tmp_path / "outside").mkdir()
    return tmp_path / "dst"


def _files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# -- downloads stay inside their destination ------------------------------------------------------
@pytest.mark.parametrize("kind", ["traversal", "absolute"])
def test_a_listed_name_cannot_escape_the_destination(hostile: Sandbox, dst: Path, kind: str) -> None:
    tag = secrets.token_hex(6)
    escape = Path(f"/tmp/escape-{tag}")
    with pytest.raises(FileOperationError) as caught:
        hostile.download(f"/hostile/{kind}-{tag}", dst)
    assert caught.value.errno == errno.EINVAL and f"escape-{tag}" in str(caught.value)
    assert not escape.exists()
    assert _files_under(dst.parent) == ["dst", "outside"]


@pytest.mark.parametrize(
    ("kind", "code"), [("slash", errno.EINVAL), ("nul", errno.EINVAL), ("long", errno.ENAMETOOLONG)]
)
def test_names_that_are_not_one_component_are_refused(
    hostile: Sandbox, dst: Path, kind: str, code: int
) -> None:
    with pytest.raises(FileOperationError) as caught:
        hostile.download(f"/hostile/{kind}", dst)
    assert caught.value.errno == code
    assert _files_under(dst) == []


def test_a_listing_is_bounded_and_the_connection_still_works(hostile: Sandbox, dst: Path) -> None:
    with pytest.raises(FileOperationError) as caught:
        download_tree(hostile._ssh, "/hostile/many-5000", dst, 1 << 30, max_entries=1000)
    assert caught.value.errno == errno.E2BIG
    assert _files_under(dst) == []
    # the SFTP session left mid-listing was dropped: a new listing starts clean
    assert hostile.download("/hostile/fine", dst) == 3 and (dst / "ok.txt").read_bytes() == b"ok\n"


def test_an_endless_tree_is_bounded_in_depth(hostile: Sandbox, dst: Path) -> None:
    with pytest.raises(FileOperationError) as caught:
        download_tree(hostile._ssh, "/hostile/deep", dst, 1 << 30, max_depth=10)
    assert caught.value.errno == errno.ELOOP
    assert max(len(Path(p).parts) for p in _files_under(dst)) == 10


# -- sizes and streams are bounded -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("lying-size", errno.EFBIG),
        ("endless", errno.EFBIG),
        ("huge-size", errno.EFBIG),
        ("bad-size", errno.EIO),
    ],
)
def test_lying_file_sizes_cost_at_most_max_bytes(
    hostile: Sandbox, tmp_path: Path, name: str, code: int
) -> None:
    with pytest.raises(FileOperationError) as caught:
        hostile.read_file(f"/x/{name}", max_bytes=MIB)
    assert caught.value.errno == code
    target = tmp_path / "copy"
    with pytest.raises(FileOperationError):
        download_file(hostile._ssh, f"/x/{name}", target, MIB)
    assert _files_under(tmp_path) == []  # neither the copy nor its temporary file


def test_a_flood_on_stdout_keeps_max_output(hostile: Sandbox) -> None:
    r = hostile.exec("FLOOD_STDOUT 96", max_output=MIB, timeout=120)
    assert r.exit_code == 0 and r.truncated
    assert len(r.stdout) == MIB and r.stdout_dropped == 95 * MIB


def test_a_flood_on_stderr_without_markers_keeps_max_output(hostile: Sandbox) -> None:
    r = hostile.exec("FLOOD_STDERR 32", max_output=MIB, timeout=120)
    assert r.exit_code == 0 and r.truncated
    assert len(r.stderr) == MIB and r.stderr_dropped == 31 * MIB


def test_data_past_the_window_drops_the_connection(hostile: Sandbox) -> None:
    with pytest.raises(ConnectionLost):
        hostile.exec("PAST_WINDOW", timeout=60)
    assert hostile.read_file("/x/ok.txt") == b"ok\n"  # the executor reconnects


def test_forged_markers_are_output_not_numbers(hostile: Sandbox) -> None:
    r = hostile.exec("FORGED_MARKERS", timeout=60)
    assert r.exit_code == 3  # from the SSH exit status: the forged marker's 5000 digits were not taken
    assert r.stdout.startswith(b"out")


# -- the real sshd: what any agent's code can do ---------------------------------------------------
_MEASURE = textwrap.dedent(
    """
    import json, resource, sys
    import sandbox_rt
    sb = sandbox_rt.Manager.from_env().attach(sys.argv[1])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = sb.exec("head -c 2G /dev/zero; echo done >&2", max_output=16 << 20, timeout=300)
    stream = sb.exec_stream("head -c 1G /dev/zero", max_output=1 << 20, timeout=300)
    streamed = sum(len(c.data) for c in stream)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"before_kib": before, "peak_kib": peak, "kept": len(r.stdout),
                      "dropped": r.stdout_dropped, "stderr": r.stderr.decode(), "streamed": streamed}))
    """
)


def test_two_gib_of_output_cost_a_bounded_amount_of_host_memory(real: sandbox_rt.Sandbox) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, real.id], capture_output=True, text=True, timeout=600, check=True
    )
    got = json.loads(proc.stdout)
    assert got["kept"] == 16 << 20 and got["dropped"] == (2 << 30) - (16 << 20)
    assert got["stderr"] == "done\n" and got["streamed"] == 1 << 30
    # before issue 23 the process peaked at 4.1 GiB; the cap is 16 MiB, the SSH window 2 MiB
    assert got["peak_kib"] - got["before_kib"] < 160 * 1024, got


def test_read_file_takes_regular_files_only(real: sandbox_rt.Sandbox) -> None:
    real.exec("ln -sf /dev/zero /tmp/zero && rm -f /tmp/fifo && mkfifo /tmp/fifo", check=True)
    for path in ("/tmp/zero", "/tmp/fifo"):
        with pytest.raises(FileOperationError) as caught:
            real.read_file(path)
        assert caught.value.errno == errno.EINVAL, path


def test_a_sparse_terabyte_is_refused_at_once(real: sandbox_rt.Sandbox, dst: Path) -> None:
    real.exec("truncate -s 1T /tmp/sparse && mkdir -p /tmp/sp && ln -f /tmp/sparse /tmp/sp/big", check=True)
    with pytest.raises(FileOperationError) as caught:
        real.read_file("/tmp/sparse")
    assert caught.value.errno == errno.EFBIG
    with pytest.raises(FileOperationError) as caught:
        real.download("/tmp/sp", dst, max_bytes=1 << 30)
    assert caught.value.errno == errno.EFBIG
    assert _files_under(dst) == []


def test_downloads_never_follow_local_symlinks(real: sandbox_rt.Sandbox, dst: Path) -> None:
    outside = dst.parent / "outside"
    victim = outside / "victim"
    victim.write_bytes(b"keep")
    real.exec(
        "rm -rf /tmp/t && mkdir -p /tmp/t/sub && echo new > /tmp/t/sub/f && echo new > /tmp/t/f2", check=True
    )
    dst.mkdir()
    (dst / "f2").symlink_to(victim)  # a file where the download writes f2
    assert real.download("/tmp/t/f2", dst / "f2") == 4
    assert victim.read_bytes() == b"keep" and (dst / "f2").read_bytes() == b"new\n"
    assert not (dst / "f2").is_symlink()  # the link was replaced, not written through
    (dst / "sub").symlink_to(outside)  # a directory of the tree
    with pytest.raises(FileOperationError) as caught:
        real.download("/tmp/t", dst)
    assert caught.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert sorted(os.listdir(outside)) == ["victim"]


def test_background_handles_read_bounded_numbers(make: Factory) -> None:
    sb = make()
    bg = sb.exec("exit 7", background=True)
    assert bg.wait(timeout=20) == 7
    sb.exec(f"echo {'9' * 5000} > ~/.sandbox_rt/bg/{bg.handle}.rc", check=True)
    assert bg.exit_code() is None  # 5000 digits are not an exit status (int() would raise on them)


def test_a_new_hostname_never_writes_through_sandbox_symlinks(lxc_manager: Manager) -> None:
    """Root in a sandbox (issue 17) links /etc/hostname and /etc/hosts to host paths; a warm-pool
    hand-out that renames the sandbox (``backend.update``) must not write those host paths (through
    /proc/<pid>/root an absolute link resolves against the host's /; main wrote them, as root)."""
    with lxc_manager.create(labels=SESSION_LABEL) as sb:  # the LXC backend writes it from the host
        _hostname_through_links(lxc_manager, sb)


def _hostname_through_links(lxc_manager: Manager, sb: sandbox_rt.Sandbox) -> None:
    tag = secrets.token_hex(6)
    s = lxc_manager.settings
    as_root = ["lxc-attach", "-P", str(s.lxc_path), "-n", sb.id, "--"]
    renamed = dataclasses.replace(sb.record.spec, hostname="renamed")
    for name in ("hostname", "hosts"):
        target = Path(f"/tmp/pwned-{tag}-{name}")
        subprocess.run([*as_root, "ln", "-sf", str(target), f"/etc/{name}"], check=True, timeout=30)
        with pytest.raises(BackendError, match=f"/etc/{name}"):
            lxc_manager.backend.update(sb.record, renamed)
        assert not target.exists()
        subprocess.run([*as_root, "rm", f"/etc/{name}"], check=True, timeout=30)
        subprocess.run([*as_root, "mkfifo", "-m", "644", f"/etc/{name}"], check=True, timeout=30)
        with pytest.raises(BackendError, match=r"No such device|not a regular file"):
            lxc_manager.backend.update(sb.record, renamed)  # a FIFO neither blocks nor is written
        restore = f"rm /etc/{name} && echo x > /etc/{name}"
        subprocess.run([*as_root, "sh", "-c", restore], check=True, timeout=30)
    new = lxc_manager.backend.update(sb.record, renamed)
    assert new.hostname == "renamed"
    assert sb.exec("cat /etc/hostname; hostname").text.split() == ["renamed", "renamed"]


def test_files_list_checks_every_name_and_bounds_the_count(hostile: Sandbox) -> None:
    for kind in ("traversal-x", "absolute-x", "slash", "nul", "long"):
        with pytest.raises(FileOperationError) as caught:
            hostile.files.list(f"/hostile/{kind}")
        assert caught.value.errno in (errno.EINVAL, errno.ENAMETOOLONG), kind
    with pytest.raises(FileOperationError) as caught:
        hostile.files.list("/hostile/many-5000", max_entries=1000)
    assert caught.value.errno == errno.E2BIG
    with pytest.raises(FileOperationError) as caught:
        hostile.files.list("/hostile/deep", depth=64, max_entries=50)  # an endless tree, bounded
    assert caught.value.errno == errno.E2BIG
    assert [e.name for e in hostile.files.list("/hostile/fine")] == ["ok.txt"]
