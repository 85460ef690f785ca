"""Isolated id maps (issue 23, item 9): each LXC sandbox has host ids of its own, so a process that
escapes one sandbox (it runs as that sandbox's host uid) cannot touch another sandbox's files.

Checked from the host on real sandboxes; the negative proof runs the same check on two sandboxes
made with the shared map (``idmap_isolated=false``, main's behaviour) and sees it fail.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox_rt
from sandbox_rt import Manager, Settings
from sandbox_rt.backends.lxc.idmap import ID_RANGE

from .conftest import SESSION_LABEL


class SharedIds(AssertionError):
    """Two sandboxes' id maps overlap, or one sandbox's root reaches the other's files."""


def uid_map(mgr: Manager, sb: sandbox_rt.Sandbox) -> tuple[int, int]:
    pid = subprocess.run(
        ["lxc-info", "-P", str(mgr.settings.lxc_path), "-n", sb.id, "-p", "-H"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    inside, outside, count = (int(w) for w in Path(f"/proc/{pid}/uid_map").read_text().split())
    assert inside == 0 and count == ID_RANGE
    return outside, count


def as_host_uid(uid: int, *cmd: str) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` on the host as ``uid``: what a process that escaped that sandbox would be."""
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *cmd],
        capture_output=True,
        text=True,
        timeout=30,
    )


def check_isolated(mgr: Manager, a: sandbox_rt.Sandbox, b: sandbox_rt.Sandbox) -> None:
    """Raise SharedIds unless a and b have disjoint maps, both outside the template's, and a's root
    cannot read a root-only file of b."""
    (base_a, n), (base_b, _) = uid_map(mgr, a), uid_map(mgr, b)
    template = mgr.settings.idmap_base
    if not (base_a + n <= base_b or base_b + n <= base_a):
        raise SharedIds(f"{a.id} and {b.id} share host ids ({base_a}, {base_b})")
    if template in (base_a, base_b):
        raise SharedIds(f"a sandbox runs with the template's ids ({template})")
    # b's private host key (0600; its sshd's: the sandbox user's, root's in a root=True sandbox)
    secret = Path(f"/var/lib/sandbox_rt/lxc/{b.id}/overlay/delta/etc/ssh/ssh_host_ed25519_key")
    if not secret.is_file():
        raise AssertionError(f"precondition: {secret} exists (b's own host key, owner-only)")
    owner = secret.stat().st_uid
    if not base_b <= owner < base_b + n or as_host_uid(owner, "cat", str(secret)).returncode != 0:
        raise AssertionError(f"precondition: b's own id {owner} (of {base_b}..) reads its own key")
    for who, uid in (("root", base_a), ("sandbox user", base_a + owner - base_b)):
        if as_host_uid(uid, "cat", str(secret)).returncode == 0:
            raise SharedIds(f"{a.id}'s {who} (host uid {uid}) reads {b.id}'s private host key")


@pytest.fixture(scope="module")
def pair(lxc_manager: Manager) -> Iterator[tuple[sandbox_rt.Sandbox, sandbox_rt.Sandbox]]:
    with lxc_manager.create(labels=SESSION_LABEL) as a, lxc_manager.create(labels=SESSION_LABEL) as b:
        yield a, b


def test_sandboxes_have_disjoint_id_maps(lxc_manager: Manager, pair: tuple[sandbox_rt.Sandbox, ...]) -> None:
    a, b = pair
    check_isolated(lxc_manager, a, b)
    for sb in pair:  # and inside, everything looks as in the template
        assert sb.exec(
            "id -u; stat -c %u:%g /etc/passwd /home/sandbox; touch ~/x && stat -c %u ~/x"
        ).text.split() == [
            "1000",
            "0:0",
            "1000:1000",
            "1000",
        ]


def test_proof_a_shared_map_is_caught(settings: Settings) -> None:
    shared = Manager(dataclasses.replace(settings, idmap_isolated=False))
    with (
        shared.create(labels=SESSION_LABEL) as a,
        shared.create(labels=SESSION_LABEL) as b,
        pytest.raises(SharedIds),
    ):
        check_isolated(shared, a, b)


def test_the_idmapped_template_view_is_never_left_mounted(lxc_manager: Manager) -> None:
    lxc = str(lxc_manager.settings.lxc_path)
    with lxc_manager.create(labels=SESSION_LABEL) as sb:
        mounts = Path("/proc/self/mountinfo").read_text()
        assert f"{lxc}/{sb.id}/lower" not in mounts  # detached right after the start
        assert sb.exec("test -x /usr/sbin/sshd && echo ok").text == "ok\n"  # the overlay still has it


def test_a_fork_gets_its_own_ids_for_the_files_it_inherits(lxc_manager: Manager) -> None:
    name = "idmapfork"
    with lxc_manager.create(labels=SESSION_LABEL) as src:
        src.exec("echo mine > ~/f && chmod 600 ~/f", check=True)
        src.snapshot(name)
    try:
        with lxc_manager.create(labels=SESSION_LABEL, from_snapshot=name) as fork:
            assert fork.read_file("/home/sandbox/f") == b"mine\n"
            base, _ = uid_map(lxc_manager, fork)
            upper = lxc_manager.settings.lxc_path / fork.id / "overlay/delta/home/sandbox/f"
            assert upper.stat().st_uid == base + 1000
    finally:
        lxc_manager.delete_snapshot(name)
