"""The host-key hookscript (roles/proxmox_hookscript/files/sandbox-rt-hookscript.pl) against stub PVE modules.

Real PVE cannot run here, so PVE::LXC, PVE::LXC::Config and PVE::Storage are replaced by small Perl
stubs: the CT config is a JSON file, ``mount_all`` returns a directory standing in for the rootfs.
What is real: the script, perl, ssh-keygen, chroot and the file ownership it sets. It does what
pve_testserver/hostkey.py emulates: a fresh CT gets one ed25519 host key (owned by the mapped root)
and the public half as the ``sandbox-rt-ssh-host-key:`` line of its description; a restart keeps
both; symlinks planted in the rootfs never lead outside it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from pve_testserver import hostkey_of

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
1;
""",
    "PVE/LXC/Config.pm": """package PVE::LXC::Config;
use strict; use warnings; use JSON::PP;
sub _file { return "$ENV{STUB_DIR}/$_[1].json"; }
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
1;
""",
}


@dataclass
class CT:
    stubs: Path
    rootfs: Path
    vmid: int = 123

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
    made.config_file.write_text(json.dumps({"hostname": "sbx-0123456789", "description": RECORD + "\n"}))
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


@pytest.mark.parametrize("phase", ["post-start", "pre-stop", "post-stop"])
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
