"""The hookscript (roles/proxmox_hookscript/files/sandbox-rt-hookscript.pl) against stub PVE modules.

Real PVE cannot run here, so PVE::LXC, PVE::LXC::Config, PVE::LXC::CGroup and PVE::Storage are
replaced by small Perl stubs: the CT config is a JSON file, ``mount_all`` returns a directory standing
in for the rootfs, the CT's limiting cgroup is a directory of plain files. What is real: the script,
perl, ssh-keygen, chroot, the file ownership it sets and the device numbers it reads. pre-start does
what pve_testserver/hostkey.py emulates: a fresh CT gets one ed25519 host key (owned by the mapped
root) and the public half as the ``sandbox-rt-ssh-host-key:`` line of its description; a restart keeps
both; symlinks planted in the rootfs never lead outside it. post-start writes the caps the runtime
asked for (``sandbox-rt-caps:``), bounded by the node's ceilings, into the cgroup and publishes what
holds (``sandbox-rt-caps-applied:``); on real nested containers the emulated PVE node runs the same
script (tests/hardening SBX-RES-01/10 on the pve-node site).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pve_testserver import hostkey_of
from sandbox_rt.caps import PID_RESERVE_FRACTION, pid_budget

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "roles" / "proxmox_hookscript" / "files" / "sandbox-rt-hookscript.pl"
ROOT_UID = ROOT_GID = 100000
RECORD = 'sandbox-rt-record: {"id":"sbx-0123456789"}'

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="chroot and chown need root"),
    pytest.mark.skipif(
        not (shutil.which("perl") and shutil.which("ssh-keygen")), reason="needs perl, ssh-keygen"
    ),
]

STUBS = {
    "PVE/Storage.pm": """package PVE::Storage;
use strict; use warnings;
sub config { return {}; }
sub path { return $ENV{STUB_VOLUME_PATH}; }
1;
""",
    "PVE/LXC/Config.pm": """package PVE::LXC::Config;
use strict; use warnings; use JSON::PP;
sub _file { return "$ENV{STUB_DIR}/$_[1].json"; }
sub parse_volume {
    my ($class, $key, $text) = @_; my ($vol) = split(/,/, $text // ''); return { volume => $vol };
}
sub load_config {
    my ($class, $vmid) = @_;
    open(my $fh, '<', $class->_file($vmid)) or die "Configuration file for $vmid does not exist\\n";
    local $/; my $conf = decode_json(<$fh>); close($fh); return $conf;
}
sub write_config {
    my ($class, $vmid, $conf) = @_;
    open(my $fh, '>', $class->_file($vmid)) or die;
    print {$fh} JSON::PP->new->canonical->encode($conf);
    close($fh);
}
1;
""",
    "PVE/LXC.pm": """package PVE::LXC;
use strict; use warnings;
sub _log { open(my $fh, '>>', "$ENV{STUB_DIR}/calls.log") or die; print {$fh} "$_[0]\\n"; close($fh); }
sub parse_id_maps { return (undef, $ENV{STUB_ROOT_UID}, $ENV{STUB_ROOT_GID}); }
sub mount_all { _log("mount $_[0]"); return $ENV{STUB_ROOTFS}; }
sub umount_all { _log("umount $_[0]"); return 1; }
sub find_lxc_pid { return $ENV{STUB_PID}; }
1;
""",
    "PVE/LXC/CGroup.pm": """package PVE::LXC::CGroup;
use strict; use warnings;
sub new { my ($class, $vmid) = @_; return bless { vmid => $vmid }, $class; }
sub get_path {
    my ($self, $controller, $limiting) = @_;
    die "not the limiting cgroup\\n" if !$limiting;
    my $ver = $ENV{STUB_CGROUP_VERSION};
    return ("$ENV{STUB_CGROUP}/" . ($ver == 2 ? 'unified' : $controller), $ver);
}
sub get_any_path {
    my ($self, $limiting, @controllers) = @_;
    return $self->get_path($ENV{STUB_CGROUP_VERSION} == 2 ? $controllers[0] : $controllers[1], $limiting);
}
1;
""",
}


@dataclass
class CT:
    stubs: Path
    rootfs: Path
    vmid: int = 123
    cgroup_version: int = 1
    pid: int = 0  # the CT's init as find_lxc_pid names it (0: this process, whose root is /)
    volume_path: str = "/"  # what PVE::Storage::path gives for the rootfs volume

    @property
    def cgroup(self) -> Path:
        return self.stubs / "cgroup"

    @property
    def ceilings(self) -> Path:
        return self.stubs / "pve-hookscript.conf"

    @property
    def description(self) -> str:
        return str(self.config.get("description", ""))

    def set_description(self, text: str) -> None:
        conf = self.config
        conf["description"] = text
        self.config_file.write_text(json.dumps(conf))

    @property
    def config_file(self) -> Path:
        return self.stubs / f"{self.vmid}.json"

    @property
    def config(self) -> dict[str, object]:
        data: dict[str, object] = json.loads(self.config_file.read_text())
        return data

    @property
    def calls(self) -> list[str]:
        log = self.stubs / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    def hook(self, phase: str = "pre-start") -> subprocess.CompletedProcess[str]:
        env = dict(
            os.environ,
            STUB_DIR=str(self.stubs),
            STUB_ROOTFS=str(self.rootfs),
            STUB_ROOT_UID=str(ROOT_UID),
            STUB_ROOT_GID=str(ROOT_GID),
            STUB_PID=str(self.pid or os.getpid()),
            STUB_CGROUP=str(self.cgroup),
            STUB_CGROUP_VERSION=str(self.cgroup_version),
            STUB_VOLUME_PATH=self.volume_path,
            SANDBOX_RT_HOOKSCRIPT_CONF=str(self.ceilings),
            SANDBOX_RT_HOOKSCRIPT_PIDS_LOCK=str(self.stubs / "pids.lock"),
        )
        return subprocess.run(
            ["perl", "-I", str(self.stubs), str(SCRIPT), str(self.vmid), phase],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )


@pytest.fixture
def ct(tmp_path: Path) -> CT:
    stubs, rootfs = tmp_path / "stubs", tmp_path / "rootfs"
    for rel, text in STUBS.items():
        (stubs / rel).parent.mkdir(parents=True, exist_ok=True)
        (stubs / rel).write_text(text)
    (rootfs / "etc" / "ssh").mkdir(parents=True)
    os.chown(rootfs, ROOT_UID, ROOT_GID)
    made = CT(stubs, rootfs)
    made.config_file.write_text(
        json.dumps(
            {
                "hostname": "sbx-0123456789",
                "description": RECORD + "\n",
                "rootfs": "local-lvm:vm-123-disk-0,size=8G",
            }
        )
    )
    for controller in ("pids", "blkio", "unified"):
        (made.cgroup / controller).mkdir(parents=True)
    return made


def _public_of(private: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-y", "-f", str(private)], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_first_start_writes_and_publishes_one_host_key(ct: CT) -> None:
    result = ct.hook()
    assert result.returncode == 0, result.stderr
    key = ct.rootfs / "etc/ssh/ssh_host_ed25519_key"
    pub = Path(f"{key}.pub")
    for path, mode in ((key, 0o600), (pub, 0o644)):
        st = path.lstat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (ROOT_UID, ROOT_GID, mode), path
    published = hostkey_of(str(ct.config["description"]))
    assert published is not None and published == pub.read_text().strip()
    assert published.startswith("ssh-ed25519 ") and published.endswith(" root@sbx-0123456789")
    assert published.split()[:2] == _public_of(key).split()[:2]  # the pair belongs together
    assert str(ct.config["description"]).splitlines()[0] == RECORD  # the runtime's record is kept
    assert ct.calls == ["mount 123", "umount 123"]


def test_a_restart_keeps_key_and_line(ct: CT) -> None:
    assert ct.hook().returncode == 0
    key = (ct.rootfs / "etc/ssh/ssh_host_ed25519_key").read_bytes()
    config = ct.config_file.read_text()
    assert ct.hook().returncode == 0
    assert (ct.rootfs / "etc/ssh/ssh_host_ed25519_key").read_bytes() == key
    assert ct.config_file.read_text() == config
    assert ct.calls == ["mount 123", "umount 123"]  # the second start did not even mount


@pytest.mark.parametrize("phase", ["pre-stop", "post-stop"])
def test_other_phases_do_nothing(ct: CT, phase: str) -> None:
    assert ct.hook(phase).returncode == 0
    assert not (ct.rootfs / "etc/ssh/ssh_host_ed25519_key").exists()
    assert hostkey_of(str(ct.config["description"])) is None


def test_a_key_file_symlink_is_replaced_not_followed(ct: CT, tmp_path: Path) -> None:
    target = tmp_path / "host-file"
    target.write_text("host data\n")
    # absolute inside the CT; on the host it would point at the host's file
    (ct.rootfs / "etc/ssh/ssh_host_ed25519_key").symlink_to(target)
    assert ct.hook().returncode == 0
    assert target.read_text() == "host data\n"
    assert not (ct.rootfs / "etc/ssh/ssh_host_ed25519_key").is_symlink()


def test_an_etc_ssh_symlink_out_of_the_rootfs_fails_closed(ct: CT, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(ct.rootfs / "etc/ssh")
    (ct.rootfs / "etc/ssh").symlink_to(outside)
    result = ct.hook()
    assert result.returncode != 0
    assert "is not a directory in the CT" in result.stderr
    assert list(outside.iterdir()) == []
    assert hostkey_of(str(ct.config["description"])) is None  # nothing published
    assert ct.calls == ["mount 123", "umount 123"]  # unmounted also on failure


# -- post-start: the caps ------------------------------------------------------------------------
CAPS = "sandbox-rt-caps: "
APPLIED = "sandbox-rt-caps-applied: "
THROTTLE_FILES = ("read_bps_device", "write_bps_device", "read_iops_device", "write_iops_device")


def _root_disk() -> str:
    """major:minor of the whole disk that holds this process's root (what the script must find)."""
    st = os.stat("/")
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    if Path(f"/sys/dev/block/{dev}/partition").exists():
        return Path(f"/sys/dev/block/{dev}/../dev").read_text().strip()
    return dev


def _applied(ct: CT) -> dict[str, str] | None:
    for line in ct.description.splitlines():
        if line.startswith(APPLIED):
            return dict(item.split("=", 1) for item in line[len(APPLIED) :].split())
    return None


def _ask(ct: CT, pids: int, mbps: int, iops: int) -> None:
    ct.set_description(f"{RECORD}\n{CAPS}pids_max={pids} disk_mbps={mbps} disk_iops={iops}\n")


# The disk caps' tests use this machine's root as the CT's rootfs device: where / is on no block
# device (an overlay or btrfs root reports major 0) there is nothing to throttle and they skip; on
# our machines and in CI / is a block device (major 254), so they run.
needs_block_root = pytest.mark.skipif(os.major(os.stat("/").st_dev) == 0, reason="/ is on no block device")


@needs_block_root
def test_post_start_writes_the_caps_v1_and_publishes_them(ct: CT) -> None:
    _ask(ct, 256, 20, 200)
    result = ct.hook("post-start")
    assert result.returncode == 0, result.stderr
    disk = _root_disk()
    assert (ct.cgroup / "pids/pids.max").read_text() == "256\n"
    want = {
        "read_bps_device": 20 << 20,
        "write_bps_device": 20 << 20,
        "read_iops_device": 200,
        "write_iops_device": 200,
    }
    for name, value in want.items():
        assert (ct.cgroup / f"blkio/blkio.throttle.{name}").read_text() == f"{disk} {value}\n"
    assert _applied(ct) == {"pids_max": "256", "disk_mbps": "20", "disk_iops": "200", "device": disk}
    assert ct.description.splitlines()[0] == RECORD  # the record and the request are kept
    assert f"{CAPS}pids_max=256 disk_mbps=20 disk_iops=200" in ct.description.splitlines()
    assert not (ct.rootfs / "etc/ssh/ssh_host_ed25519_key").exists()  # post-start makes no key
    assert hostkey_of(ct.description) is None


@needs_block_root
def test_post_start_writes_io_max_on_cgroup_v2(ct: CT) -> None:
    ct.cgroup_version = 2
    _ask(ct, 512, 0, 300)  # no bandwidth cap asked: the node's ceiling holds it
    ct.ceilings.write_text("# node ceilings\npids_max = 4096\ndisk_mbps = 500\n")
    assert ct.hook("post-start").returncode == 0
    disk = _root_disk()
    assert (ct.cgroup / "unified/pids.max").read_text() == "512\n"
    b = 500 << 20
    assert (ct.cgroup / "unified/io.max").read_text() == f"{disk} rbps={b} wbps={b} riops=300 wiops=300\n"
    assert _applied(ct) == {"pids_max": "512", "disk_mbps": "500", "disk_iops": "300", "device": disk}


@needs_block_root
def test_the_node_bounds_what_the_description_asks(ct: CT) -> None:
    ct.ceilings.write_text("pids_max = 2048\ndisk_mbps = 50\ndisk_iops = 1000\n")
    _ask(ct, 999999, 100000, 5000000)  # the description is the API token's to write: not trusted
    assert ct.hook("post-start").returncode == 0
    assert (ct.cgroup / "pids/pids.max").read_text() == "2048\n"
    assert _applied(ct) == {
        "pids_max": "2048",
        "disk_mbps": "50",
        "disk_iops": "1000",
        "device": _root_disk(),
    }


@needs_block_root
def test_a_ct_without_a_caps_line_gets_the_ceilings(ct: CT) -> None:
    ct.ceilings.write_text("pids_max = 3000\ndisk_mbps = 40\ndisk_iops = 400\n")
    assert ct.hook("post-start").returncode == 0
    assert (ct.cgroup / "pids/pids.max").read_text() == "3000\n"
    assert (ct.cgroup / "blkio/blkio.throttle.write_iops_device").read_text() == f"{_root_disk()} 400\n"
    assert _applied(ct) == {"pids_max": "3000", "disk_mbps": "40", "disk_iops": "400", "device": _root_disk()}


@pytest.mark.parametrize(
    "line",
    [
        "pids_max=256 disk_mbps=20",  # a cap missing
        "pids_max=256 disk_mbps=20 disk_iops=200; echo",  # anything after it
        "pids_max=-1 disk_mbps=20 disk_iops=200",
        "pids_max=1234567890 disk_mbps=20 disk_iops=200",  # more than 9 digits
    ],
)
def test_a_malformed_caps_line_fails_and_publishes_nothing(ct: CT, line: str) -> None:
    ct.set_description(f"{RECORD}\n{CAPS}{line}\n")
    result = ct.hook("post-start")
    assert result.returncode != 0
    assert "malformed caps line" in result.stderr
    assert _applied(ct) is None
    assert not (ct.cgroup / "pids/pids.max").exists()


def test_a_malformed_ceilings_file_fails(ct: CT) -> None:
    _ask(ct, 256, 20, 200)
    ct.ceilings.write_text("pids_max = lots\n")
    result = ct.hook("post-start")
    assert result.returncode != 0 and "cannot parse" in result.stderr
    assert _applied(ct) is None


@pytest.fixture
def anonymous_root(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A process whose root is a tmpfs directory (device 0:x, as zfs, btrfs and overlay report)."""
    shm = Path("/dev/shm") / f"hookscript-test-{os.getpid()}"
    shm.mkdir()
    assert os.major(os.stat(shm).st_dev) == 0, "precondition: /dev/shm is a tmpfs"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only sits in its chroot
        try:
            os.chroot(shm)
            time.sleep(60)
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 5
        while not os.path.samestat(os.stat(f"/proc/{pid}/root"), os.stat(shm)):
            assert time.monotonic() < deadline, "precondition: the child entered its chroot"
            time.sleep(0.01)
        yield pid, shm
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        shm.rmdir()


def test_disk_caps_without_a_block_device_fail_closed(ct: CT, anonymous_root: tuple[int, Path]) -> None:
    ct.pid, shm = anonymous_root
    ct.volume_path = str(shm)
    _ask(ct, 256, 20, 200)
    result = ct.hook("post-start")
    assert result.returncode != 0
    assert "no block device holds its rootfs" in result.stderr
    assert _applied(ct) is None


def test_without_disk_caps_no_block_device_is_needed(ct: CT, anonymous_root: tuple[int, Path]) -> None:
    ct.pid, shm = anonymous_root
    ct.volume_path = str(shm)
    ct.ceilings.write_text("disk_mbps = 0\ndisk_iops = 0\n")  # the node sets no disk ceiling
    _ask(ct, 256, 0, 0)
    assert ct.hook("post-start").returncode == 0
    assert (ct.cgroup / "pids/pids.max").read_text() == "256\n"
    applied = _applied(ct)
    assert applied is not None and applied["pids_max"] == "256"
    assert not any((ct.cgroup / "blkio").iterdir())


@needs_block_root
def test_pre_start_drops_a_former_starts_caps(ct: CT) -> None:
    _ask(ct, 256, 20, 200)
    assert ct.hook("pre-start").returncode == 0
    assert ct.hook("post-start").returncode == 0
    assert _applied(ct) is not None
    assert ct.hook("pre-start").returncode == 0  # the next start: the old line says nothing about it
    assert _applied(ct) is None
    assert hostkey_of(ct.description) is not None  # the key line stays
    assert f"{CAPS}pids_max=256 disk_mbps=20 disk_iops=200" in ct.description.splitlines()


# -- post-start: the node's pids budget ----------------------------------------------------------
REFUSED = "sandbox-rt-caps-refused: "


def _node_budget() -> int:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    return pid_budget(pid_max)


def _other_ct(ct: CT, name: str, pids_max: str) -> None:
    """Another CT's limiting cgroup beside this one's (pve-container's lxc/<vmid>), with its limit."""
    (ct.cgroup / name).mkdir()
    (ct.cgroup / name / "pids.max").write_text(f"{pids_max}\n")


def test_the_script_keeps_the_runtimes_pid_reserve() -> None:
    assert f"my $PID_RESERVE_FRACTION = {PID_RESERVE_FRACTION};" in SCRIPT.read_text()


def test_a_ct_that_would_overdraw_the_nodes_pids_budget_is_refused(ct: CT) -> None:
    _other_ct(ct, "201", str(_node_budget() - 100))
    _ask(ct, 256, 0, 0)
    result = ct.hook("post-start")
    assert result.returncode != 0 and "pids budget" in result.stderr
    assert not (ct.cgroup / "pids/pids.max").exists()  # no limit written, no caps published
    assert _applied(ct) is None
    refused = [line for line in ct.description.splitlines() if line.startswith(REFUSED)]
    assert len(refused) == 1 and "pids_max=256 does not fit" in refused[0], ct.description
    assert ct.hook("pre-start").returncode == 0  # the next start says for itself
    assert not any(line.startswith(REFUSED) for line in ct.description.splitlines())


@needs_block_root
def test_a_ct_that_fits_the_budget_starts_and_unlimited_cts_are_not_counted(ct: CT) -> None:
    _other_ct(ct, "201", str(_node_budget() - 300))
    _other_ct(ct, "202", "max")  # a CT without a limit cannot be budgeted
    _ask(ct, 256, 0, 0)
    result = ct.hook("post-start")
    assert result.returncode == 0, result.stderr
    assert (ct.cgroup / "pids/pids.max").read_text() == "256\n"
    applied = _applied(ct)
    assert applied is not None and applied["pids_max"] == "256"
