"""A role's task files that playbooks run with ``tasks_from`` are declared entry points (issue 36):
each ``tasks_from`` of the playbooks, the molecule scenarios and the docs names an entry point of
that role's ``meta/argument_specs.yml``, which Ansible then checks before the file runs (it looks the
entry point up by the ``tasks_from`` value as written, hence no ``.yml``). Its options are exactly
the role's own variables the file reads, directly, through the files it includes or the templates it
renders, or through the defaults those read; each is the main entry point's option itself (a YAML
alias: one declaration). The host variables the roles share are checked by the sandbox_host_vars
dependency, which runs with every entry point.

Also: template_build's engines live apart (tasks/lxc/, tasks/proxmox/, neither includes the other's
files) and every include in a role names its file relative to the role's tasks directory."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"
WORD = re.compile(r"\b[a-z][a-z0-9_]*\b")
INCLUDES = ("include_tasks", "import_tasks")
DOC_TASKS_FROM = re.compile(r"tasks_from:\s*([\w/.-]+)")


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def specs(role: str) -> dict[str, Any]:
    return dict(_yaml(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"])


def _tasks(data: Any) -> Iterator[dict[str, Any]]:
    """Every task of a task list, blocks opened."""
    for task in data or []:
        yield task
        for part in ("block", "rescue", "always"):
            yield from _tasks(task.get(part))


def includes(path: Path) -> list[str]:
    """The files a task file includes or imports, as written."""
    out = []
    for task in _tasks(_yaml(path)):
        for key, value in task.items():
            if key.split(".")[-1] in INCLUDES:
                out.append(value["file"] if isinstance(value, dict) else value)
    return out


def _templates(role: Path, text: str) -> list[Path]:
    """The role's templates a task file renders (all of them where the name is computed)."""
    names = re.findall(r"\bsrc:\s*[\"']?([^\"'\s]+\.j2)", text)
    if any("{{" in n for n in names):
        return sorted((role / "templates").glob("*.j2"))
    return [role / "templates" / n for n in names if (role / "templates" / n).is_file()]


def reachable(role: Path, entry: str) -> list[Path]:
    """tasks/<entry>.yml, every task file it includes (transitively) and the templates they render."""
    todo, seen = [role / "tasks" / f"{entry}.yml"], []
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.append(path)
        if path.suffix == ".yml":
            todo += [role / "tasks" / name for name in includes(path)]
            todo += _templates(role, path.read_text())
    return seen


def _role_values(role: Path) -> dict[str, Any]:
    """The role's defaults and vars (what a variable of the role is made of)."""
    out: dict[str, Any] = {}
    for part in ("defaults", "vars"):
        path = role / part / "main.yml"
        if path.is_file():
            out.update(_yaml(path) or {})
    return out


def reads(role: Path, entry: str) -> set[str]:
    """The role's own options (its defaults) that tasks/<entry>.yml reads, through derived values too."""
    values = _role_values(role)
    text = " ".join(p.read_text() for p in reachable(role, entry))
    found, todo = set(), set(WORD.findall(text)) & set(values)
    while todo:
        name = todo.pop()
        found.add(name)
        todo |= (set(WORD.findall(str(values[name]))) & set(values)) - found
    defaults = _yaml(role / "defaults" / "main.yml") or {}
    return found & set(defaults)


def playbook_tasks_from() -> list[tuple[str, str, str]]:
    """(file, role, tasks_from) of every include_role/import_role with tasks_from in the playbooks and
    the molecule scenarios (a role named by ``{{ item }}``: each of the task's loop)."""
    out = []
    books = [REPO / "site.yml", *(REPO / "playbooks").rglob("*.yml"), *(REPO / "molecule").rglob("*.yml")]
    for path in sorted(books):
        stack: list[Any] = [_yaml(path)]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                for key, args in node.items():
                    if key.split(".")[-1] in ("include_role", "import_role") and "tasks_from" in args:
                        names = node["loop"] if args["name"] == "{{ item }}" else [args["name"]]
                        out += [(str(path.relative_to(REPO)), name, args["tasks_from"]) for name in names]
                stack += node.values()
            elif isinstance(node, list):
                stack += node
    return out


def docs_tasks_from() -> list[tuple[str, str]]:
    docs = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *ROLES.glob("*/README.md")]
    return [
        (str(p.relative_to(REPO)), m) for p in sorted(docs) for m in DOC_TASKS_FROM.findall(p.read_text())
    ]


USED = playbook_tasks_from()
ENTRY_POINTS = sorted({(role, entry) for _, role, entry in USED})


def test_the_playbooks_use_entry_points() -> None:
    assert len(USED) >= 15 and ("template_build", "lxc/switch") in ENTRY_POINTS
    missing = [f"{f}: {role} {entry}" for f, role, entry in USED if entry not in specs(role)]
    assert missing == []  # declare it in roles/<role>/meta/argument_specs.yml


def test_the_docs_name_entry_points() -> None:
    declared = {entry for role in ROLES.iterdir() for entry in specs(role.name)}
    found = docs_tasks_from()
    assert found
    assert [(f, e) for f, e in found if e not in declared] == []


@pytest.mark.parametrize(("role", "entry"), ENTRY_POINTS, ids=lambda v: str(v))
def test_an_entry_point_declares_what_its_file_reads(role: str, entry: str) -> None:
    spec = specs(role)
    point, main = spec[entry], spec["main"]["options"]
    assert point.get("short_description") and point.get("options")
    options = point["options"]
    assert set(options) == reads(ROLES / role, entry)
    # one declaration: the main entry point's option itself (a YAML alias), not a copy
    text = (ROLES / role / "meta" / "argument_specs.yml").read_text()
    for name in options:
        assert options[name] is main[name], f"{name}: write `{name}: *{name}`"
        assert re.search(rf"^ {{6}}{name}: \*{name}$", text, re.M)


def test_what_an_entry_point_reads_is_found(tmp_path: Path) -> None:
    role = tmp_path / "r"
    for part, text in {
        "defaults": "r_a: 1\nr_b: '{{ r_a + 1 }}'\nr_c: 3\nr_d: 4\n",
        "vars": "r_v: '{{ r_c }}'\n",
        "tasks": "- ansible.builtin.include_tasks: {file: sub/x.yml}\n",
        "templates": "{{ r_d }}\n",
    }.items():
        (role / part).mkdir(parents=True)
        (role / part / ("t.j2" if part == "templates" else "main.yml")).write_text(text)
    (role / "tasks" / "sub").mkdir()
    (role / "tasks" / "sub" / "x.yml").write_text(
        "- block:\n    - ansible.builtin.template: {src: t.j2, dest: /x}\n      when: r_b and r_v\n"
    )
    assert [p.relative_to(role).as_posix() for p in reachable(role, "main")] == [
        "tasks/main.yml", "tasks/sub/x.yml", "templates/t.j2"
    ]  # fmt: skip
    assert reads(role, "main") == {"r_a", "r_b", "r_c", "r_d"}


def _task_files(role: Path) -> list[Path]:
    return sorted((role / "tasks").rglob("*.yml"))


@pytest.mark.parametrize(
    "role", sorted(p for p in ROLES.iterdir() if (p / "tasks").is_dir()), ids=lambda p: p.name
)
def test_includes_name_files_relative_to_the_tasks_directory(role: Path) -> None:
    for path in _task_files(role):
        for name in includes(path):
            assert (role / "tasks" / name).is_file(), f"{path.relative_to(REPO)} includes {name}"


def test_template_build_keeps_its_engines_apart() -> None:
    tasks = ROLES / "template_build" / "tasks"
    assert sorted(p.name for p in tasks.glob("*.yml")) == ["kernel.yml", "main.yml", "validate.yml"]
    assert sorted(p.name for p in tasks.iterdir() if p.is_dir()) == ["lxc", "proxmox"]
    for engine, other in (("lxc", "proxmox/"), ("proxmox", "lxc/")):
        assert len(list((tasks / engine).glob("*.yml"))) >= 6
        for path in (tasks / engine).glob("*.yml"):
            assert not [n for n in includes(path) if n.startswith(other)], path.name
    # and the playbooks reach into each engine through its own entry points only
    for _, role, entry in USED:
        if role == "template_build" and "/" in entry:
            assert entry.split("/")[0] in ("lxc", "proxmox")
