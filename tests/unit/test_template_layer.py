"""A build's overlay delta becoming a template, on plain directories: whiteouts delete, opaque
directories hide the base's entries, a link in the base is replaced (never followed), owners shift
from the build sandbox's ids to the template's, owners outside its range are refused; the hardening
checks name the control a delta breaks; the build sandbox's identity and root access are dropped."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandbox_rt import TemplateBuildError
from sandbox_rt.templates.checks import check_layer, strip_build_state
from sandbox_rt.templates.lxc_store import apply_layer

# overlay whiteouts are device nodes and the layer keeps owners: only root can make them; a developer's
# non-root run skips this module, .ci/run runs as root
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="whiteouts and owners need root")

LOW = 100000  # the template's root
SHIFT = 65536 * 3  # the build sandbox's ids: its root is LOW + SHIFT


def _own(path: Path, uid: int) -> None:
    os.lchown(path, uid, uid)


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    base, upper = tmp_path / "base", tmp_path / "upper"
    for d in ("etc", "etc/keep", "etc/gone-dir", "usr/bin", "opt/old"):
        (base / d).mkdir(parents=True)
    (base / "etc/passwd").write_text(
        "root:x:0:0::/root:/bin/bash\nsandbox:x:1000:1000::/home/sandbox:/bin/bash\n"
    )
    (base / "etc/group").write_text("root:x:0:\nsudo:x:27:\nsandbox:x:1000:\n")
    (base / "etc/keep/a").write_text("a")
    (base / "etc/gone").write_text("gone")
    (base / "etc/gone-dir/x").write_text("x")
    (base / "opt/old/stale").write_text("stale")
    (base / "usr/bin/passwd").write_text("setuid in the base")
    (base / "etc/ssh/authorized_keys").mkdir(parents=True)
    (base / "link").symlink_to("/etc")
    for p in [base, *base.rglob("*")]:
        _own(p, LOW)
    (base / "usr/bin/passwd").chmod(0o4755)  # after the chown (which clears it)
    upper.mkdir()
    return base, upper


def _layer(upper: Path) -> None:
    (upper / "etc").mkdir()
    (upper / "etc/new.conf").write_text("new")
    os.mknod(upper / "etc/gone", stat.S_IFCHR | 0o000, os.makedev(0, 0))  # whiteout
    os.mknod(upper / "etc/gone-dir", stat.S_IFCHR | 0o000, os.makedev(0, 0))
    (upper / "opt/old").mkdir(parents=True)
    os.setxattr(upper / "opt/old", "trusted.overlay.opaque", b"y")
    (upper / "opt/old/fresh").write_text("fresh")
    (upper / "link").mkdir()  # a directory where the base has a link to /etc
    (upper / "link/file").write_text("inside")
    (upper / "tool").write_text("#!/bin/sh\n")
    (upper / "tool").chmod(0o750)
    for p in [upper, *upper.rglob("*")]:
        _own(p, LOW + SHIFT + (1000 if p.name == "tool" else 0))


def test_a_delta_applies_like_the_overlay_showed_it(tmp_path: Path) -> None:
    base, upper = _tree(tmp_path)
    _layer(upper)
    apply_layer(upper, base, shift=SHIFT, low=LOW)
    assert (base / "etc/new.conf").read_text() == "new" and (base / "etc/keep/a").read_text() == "a"
    assert not (base / "etc/gone").exists() and not (base / "etc/gone-dir").exists()
    assert os.listdir(base / "opt/old") == ["fresh"]  # opaque: the base's entries are hidden
    assert not (base / "link").is_symlink() and (base / "link/file").read_text() == "inside"
    assert not Path("/etc/file").exists()  # the base's link was replaced, never followed
    st = (base / "tool").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (LOW + 1000, LOW + 1000, 0o750)
    assert (base / "etc/new.conf").stat().st_uid == LOW


def test_an_owner_outside_the_sandbox_range_is_refused(tmp_path: Path) -> None:
    base, upper = _tree(tmp_path)
    (upper / "x").write_text("x")
    _own(upper / "x", 0)  # a host uid: nothing the build sandbox could own
    with pytest.raises(TemplateBuildError, match="outside the build sandbox's ids"):
        apply_layer(upper, base, shift=SHIFT, low=LOW)


def _setuid_file(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_text("x")
    path.chmod(0o4755)


@pytest.mark.parametrize(
    ("make", "control"),
    [
        (lambda u: _setuid_file(u / "usr/bin/newsuid"), "SBX-ESC-05"),
        (lambda u: (u / "etc/sudoers.d").mkdir(parents=True) or (u / "etc/sudoers.d/agent").write_text("x"),
         "SBX-USER-02"),
        (lambda u: (u / "etc/ssh").mkdir(parents=True) or (u / "etc/ssh/sshd_config").write_text("x"),
         "SBX-SSH-01"),
        (lambda u: (u / "etc/ssh/authorized_keys").mkdir(parents=True)
         or (u / "etc/ssh/authorized_keys/sandbox").write_text("x"), "SBX-USER-04"),
        (lambda u: (u / "etc").mkdir() or (u / "etc/group").write_text("root:x:0:\nsudo:x:27:sandbox\n"),
         "SBX-USER-01"),
        (lambda u: (u / "etc").mkdir() or (u / "etc/passwd").write_text("sandbox:x:0:0::/:/bin/sh\n"),
         "SBX-USER-01"),
        (lambda u: os.mknod(u / "disk", stat.S_IFBLK | 0o600, os.makedev(8, 0)), "SBX-ESC-04"),
    ],
)  # fmt: skip
def test_a_delta_that_breaks_a_control_is_refused(tmp_path: Path, make: object, control: str) -> None:
    base, upper = _tree(tmp_path)
    make(upper)  # type: ignore[operator]
    with pytest.raises(TemplateBuildError) as err:
        check_layer(upper, base)
    assert err.value.step == "hardening checks" and control in err.value.detail


def test_a_harmless_delta_passes_and_a_setuid_file_of_the_base_may_stay(tmp_path: Path) -> None:
    base, upper = _tree(tmp_path)
    _layer(upper)
    (upper / "usr/bin").mkdir(parents=True)
    (upper / "usr/bin/passwd").write_text("reinstalled, same mode")
    (upper / "usr/bin/passwd").chmod(0o4755)
    (upper / "etc/ssh/authorized_keys").mkdir(parents=True)  # a copied-up parent is no change
    check_layer(upper, base)


def test_the_build_sandboxs_identity_and_root_access_are_dropped(tmp_path: Path) -> None:
    upper = tmp_path / "upper"
    for rel in (
        "etc/ssh/ssh_host_ed25519_key",
        "etc/ssh/ssh_host_rsa_key",
        "etc/ssh/authorized_keys/root",
        "etc/ssh/sshd_config.root",
        "etc/machine-id",
        "etc/hostname",
        "var/lib/apt/lists/x_Packages",
        "tmp/scratch",
        "opt/keep",
    ):
        (upper / rel).parent.mkdir(parents=True, exist_ok=True)
        (upper / rel).write_text("x")
    strip_build_state(upper)
    left = sorted(str(p.relative_to(upper)) for p in upper.rglob("*") if p.is_file())
    assert left == ["opt/keep"]
