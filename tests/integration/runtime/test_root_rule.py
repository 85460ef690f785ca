"""Nothing runs as root in a sandbox made without root (issue 35 items 1 and 2; SBX-ESC-28).

Code is planted on every vector root processes of a later sandbox would execute or load (PAM
session, account and auth stacks, an NSS module, ``ld.so.preload``, ``ld.so.conf.d``, a replaced
sshd, ``/bin/sh`` and init, sshd's AuthorizedKeysCommand, setuid and file-capability programs, cron
and unit files: ``root_plants.py``), through the two channels the red team used: a step of a
template built from code, and a ``root=True`` sandbox whose snapshot is forked. A sandbox made
from either without root is then used every way the runtime reaches it (commands, a terminal,
files, a background process, a second connection, NSS lookups, the planted programs), and:

* no process of it ever has uid 0 in any of its ids, read from the host's /proc (its PID 1 included);
* no planted piece ran as root: every line the pieces logged names the sandbox user.

A sandbox made *with* root from the same source shows the plants are live (root ran them), so the
first two are not empty claims.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
from collections.abc import Iterator

import pytest

import sandbox_rt
from sandbox_rt import Manager, Settings, Template
from sandbox_rt.templates import TemplateRegistry, remove_template
from tests.integration.provision_helpers import destroy_labelled

from .conftest import SESSION_LABEL
from .root_plants import ALL_VECTORS, BUILD_VECTORS, LOG, exercise, logged, plant_script, process_ids

LABELS = {**SESSION_LABEL, "test": "root-rule"}


@pytest.fixture(scope="module")
def manager(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Manager]:
    """The embedded default with a registry of its own (templates built here stay here)."""
    own = dataclasses.replace(settings, state_dir=tmp_path_factory.mktemp("root-rule-state"))
    mgr = Manager(own)
    yield mgr
    destroy_labelled(mgr, LABELS)
    for entry in TemplateRegistry(own.state_dir).read().values():
        with contextlib.suppress(sandbox_rt.SandboxError):
            remove_template(mgr, entry.name)


def _uids(manager: Manager, sb: sandbox_rt.Sandbox) -> dict[int, tuple[int, ...]]:
    """Host view: every process of ``sb`` and its uids as the host numbers them."""
    pid = manager.backend._init_pid(sb.id)  # type: ignore[attr-defined]
    assert pid is not None, f"{sb.id} has no init"
    return process_ids(pid)


def _root_uid(manager: Manager, sb: sandbox_rt.Sandbox) -> int:
    """The host uid that is root in ``sb`` (its isolated id map)."""
    config = (manager.settings.lxc_path / sb.id / "config").read_text().splitlines()
    for line in config:
        key, _, value = line.partition("=")
        words = value.split()
        if key.strip() == "lxc.idmap" and words[:2] == ["u", "0"]:
            return int(words[2])
    raise AssertionError(f"{sb.id}: no uid map")


def _use_every_way(manager: Manager, sb: sandbox_rt.Sandbox, vectors: tuple[str, ...]) -> list[set[int]]:
    """Reach ``sb`` every way the runtime does; the host's view of its uids at each step."""
    seen = [set().union(*_uids(manager, sb).values())]
    assert sb.exec(exercise(vectors), timeout=60).exit_code == 0
    with sb.pty(80, 24) as term:
        term.write("id -u\n")
        seen.append(set().union(*_uids(manager, sb).values()))
        term.write("exit\n")
        term.wait(timeout=30)
    sb.write_file("/tmp/root-rule", b"x")
    assert sb.read_file("/tmp/root-rule") == b"x"
    bg = sb.exec("sleep 30", background=True)
    seen.append(set().union(*_uids(manager, sb).values()))
    bg.kill()
    again = manager.attach(sb.id)  # a second SSH connection: a login of its own
    try:
        assert again.exec("id -un").text == "sandbox\n"
        seen.append(set().union(*_uids(manager, again).values()))
    finally:
        again.close()
    return seen


def _assert_nothing_ran_as_root(manager: Manager, sb: sandbox_rt.Sandbox, vectors: tuple[str, ...]) -> None:
    root = _root_uid(manager, sb)
    wrong = [(step, sorted(uids)) for step, uids in enumerate(_use_every_way(manager, sb, vectors))]
    wrong = [(step, uids) for step, uids in wrong if uids != [root + 1000]]
    lines = logged(sb.read_file(LOG).decode(errors="replace"), sb.hostname)
    as_root = sorted({vector for vector, ruid, euid in lines if 0 in (ruid, euid)})
    assert not as_root and not wrong, (
        f"planted code ran as root in {sb.id}: {as_root}; "
        f"host uids of its processes (root is {root}, the user {root + 1000}) by step: {wrong}"
    )
    # the user's own lookups reached the planted modules: they are live, just not root's
    ran = {vector for vector, _, _ in lines}
    assert {"nss", "ld-preload"} & set(vectors) <= ran, ran


def _assert_the_rule(manager: Manager, vectors: tuple[str, ...], **source: str) -> None:
    """A sandbox of ``source`` (template= or from_snapshot=) without root runs none of the plants as
    root; one with root does run them (they are live)."""
    sb = manager.create(labels=LABELS, memory_mb=512, **source)  # type: ignore[arg-type]
    try:
        _assert_nothing_ran_as_root(manager, sb, vectors)
    finally:
        sb.destroy()
    with manager.create(root=True, labels=LABELS, memory_mb=512, **source) as rooted:  # type: ignore[arg-type]
        _assert_root_would_run_them(rooted)


def _assert_root_would_run_them(sb: sandbox_rt.Sandbox) -> None:
    """The same plants in a sandbox made with root: root runs them (the plants work)."""
    sb.exec("id -u", user="root")  # a root login: sshd, PAM and NSS as root
    lines = logged(sb.read_file(LOG).decode(errors="replace"), sb.hostname)
    as_root = {vector for vector, ruid, euid in lines if ruid == 0 or euid == 0}
    assert {"pam-session", "pam-account", "nss", "ld-preload", "sshd"} <= as_root, lines


# -- through a template step ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def planted_template(manager: Manager) -> str:
    name = f"rootplant{secrets.token_hex(3)}"
    log: list[str] = []
    try:
        manager.build_template(Template().run(plant_script(BUILD_VECTORS)), name, on_log=log.append)
    except sandbox_rt.SandboxError:
        print("\n".join(log))
        raise
    return name


def test_a_template_step_cannot_plant_code_that_runs_as_root(manager: Manager, planted_template: str) -> None:
    _assert_the_rule(manager, BUILD_VECTORS, template=planted_template)


# -- through a root sandbox's snapshot --------------------------------------------------------------
@pytest.fixture(scope="module")
def planted_snapshot(manager: Manager) -> Iterator[str]:
    name = f"rootplant{secrets.token_hex(3)}"
    with manager.create(root=True, labels=LABELS, memory_mb=512) as source:
        r = source.exec(plant_script(ALL_VECTORS), user="root", timeout=300)
        assert r.exit_code == 0, r.stderr_text
        source.snapshot(name)
    yield name
    manager.delete_snapshot(name)


def test_a_fork_without_root_runs_nothing_a_root_sandbox_planted(
    manager: Manager, planted_snapshot: str
) -> None:
    _assert_the_rule(manager, ALL_VECTORS, from_snapshot=planted_snapshot)


# -- Proxmox VE: init and sshd still start as root there, so root-tainted sources are refused -------
def test_on_proxmox_a_root_sandboxs_forks_keep_root(pve_manager: Manager) -> None:
    name = f"rootfork{secrets.token_hex(3)}"
    with pve_manager.create(root=True, labels=LABELS, memory_mb=256) as source:
        source.snapshot(name)
        before = {r.id for r in pve_manager.list()}
        with pytest.raises(sandbox_rt.ConfigError, match="root=True only"):
            pve_manager.create(from_snapshot=name, labels=LABELS, memory_mb=256)
        assert {r.id for r in pve_manager.list()} == before  # nothing was made
        with pve_manager.create(from_snapshot=name, root=True, labels=LABELS, memory_mb=256) as fork:
            assert fork.exec("id -u", user="root").text == "0\n"
