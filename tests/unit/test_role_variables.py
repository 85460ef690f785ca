"""One variable contract for the roles (issue 36): every role variable has one default, in one role's
``defaults/main.yml``; the host variables several roles read are declared in ``roles/sandbox_host_vars``,
which every role that reads one depends on (so a play that uses one role alone gets the same value as
site.yml); and no role or playbook restates another role's default as a ``| default(...)`` fallback (42
of them did: the collection's stand-alone sandbox_runtime play wrote ``disk_limits: false`` into
host.json where site.yml writes true)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES_DIR = REPO / "roles"
SHARED = "sandbox_host_vars"
# What a role reads: its defaults, vars, tasks, handlers and templates.
ROLE_PARTS = ("defaults", "vars", "tasks", "handlers", "templates")
# ``name | default(`` and ``(name | default(``: a fallback for the variable ``name``.
FALLBACK = re.compile(r"\b([a-z][a-z0-9_]*)\s*\|\s*default\(")
WORD = re.compile(r"\b[a-z][a-z0-9_]*\b")


def _role_defaults(role: Path) -> dict[str, object]:
    path = role / "defaults" / "main.yml"
    return dict(yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def owners(roles_dir: Path = ROLES_DIR) -> dict[str, str]:
    """Each role variable -> the one role whose defaults declare it (a second declaration fails)."""
    out: dict[str, str] = {}
    for role in sorted(p for p in roles_dir.iterdir() if p.is_dir()):
        for name in _role_defaults(role):
            assert name not in out, f"{name} has a default in roles/{out[name]} and roles/{role.name}"
            out[name] = role.name
    return out


def role_files(role: Path) -> Iterator[Path]:
    for part in ROLE_PARTS:
        yield from sorted(p for p in (role / part).rglob("*") if p.is_file())


def playbooks() -> list[Path]:
    return [REPO / "site.yml", *sorted((REPO / "playbooks").rglob("*.yml"))]


def foreign_fallbacks(text: str, role: str | None, owner: dict[str, str]) -> list[str]:
    """The ``| default(...)`` fallbacks in ``text`` (a file of ``role``, or a playbook: None) for a
    variable whose default is another role's."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for name in FALLBACK.findall(line):
            if owner.get(name, role) != role:
                found.append(f"{number}: {name} (roles/{owner[name]})")
    return found


def every_foreign_fallback(roles_dir: Path = ROLES_DIR, books: list[Path] | None = None) -> list[str]:
    owner = owners(roles_dir)
    out = []
    for role in sorted(p for p in roles_dir.iterdir() if p.is_dir()):
        for path in role_files(role):
            found = foreign_fallbacks(path.read_text(errors="replace"), role.name, owner)
            out += [f"roles/{path.relative_to(roles_dir)}:{f}" for f in found]
    for path in playbooks() if books is None else books:
        out += [f"{path.relative_to(REPO)}:{f}" for f in foreign_fallbacks(path.read_text(), None, owner)]
    return out


def test_no_role_or_playbook_restates_another_roles_default() -> None:
    assert every_foreign_fallback() == []


def test_a_restated_default_is_found(tmp_path: Path) -> None:
    for role, text in {
        "a": "a_path: /x\n",
        "b": "b_path: \"{{ (a_path | default('/y')) ~ '/b' }}\"\n",
    }.items():
        (tmp_path / role / "defaults").mkdir(parents=True)
        (tmp_path / role / "defaults" / "main.yml").write_text(text)
    (tmp_path / "b" / "tasks").mkdir()
    (tmp_path / "b" / "tasks" / "main.yml").write_text(
        "x: \"{{ b_path | default('') }} {{ a_path|default('/z') }}\"\n"
    )
    assert every_foreign_fallback(tmp_path, books=[]) == [
        "roles/b/defaults/main.yml:1: a_path (roles/a)",
        "roles/b/tasks/main.yml:1: a_path (roles/a)",
    ]


def _dependencies(role: Path) -> list[str]:
    meta = yaml.safe_load((role / "meta" / "main.yml").read_text()) or {}
    return [d if isinstance(d, str) else d["role"] for d in meta.get("dependencies") or []]


def _reads(role: Path, names: set[str]) -> set[str]:
    return {w for path in role_files(role) for w in WORD.findall(path.read_text(errors="replace"))} & names


@pytest.mark.parametrize(
    "role", sorted(p for p in ROLES_DIR.iterdir() if p.name != SHARED), ids=lambda p: p.name
)
def test_a_role_that_reads_a_shared_variable_depends_on_the_shared_role(role: Path) -> None:
    shared = set(_role_defaults(ROLES_DIR / SHARED))
    read = _reads(role, shared)
    if read:
        assert SHARED in _dependencies(role), f"roles/{role.name} reads {sorted(read)}"
    assert not set(_role_defaults(role)) & shared


def test_the_shared_role_holds_only_what_several_read() -> None:
    """sandbox_host_vars declares only variables that two or more roles (or a role and the playbooks)
    read, and has no tasks: it is the contract, not a role that does something."""
    shared = set(_role_defaults(ROLES_DIR / SHARED))
    assert not (ROLES_DIR / SHARED / "tasks").exists()
    readers: dict[str, set[str]] = {name: set() for name in shared}
    for role in ROLES_DIR.iterdir():
        if role.name != SHARED:
            for name in _reads(role, shared):
                readers[name].add(role.name)
    in_playbooks = {w for p in playbooks() for w in WORD.findall(p.read_text())}
    for name in shared & in_playbooks:
        readers[name].add("playbooks")
    assert {name: sorted(r) for name, r in readers.items() if len(r) < 2} == {}
