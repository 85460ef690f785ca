"""Every role documents every option with its default (issue 20): meta/argument_specs.yml carries
defaults/main.yml's value for each (scripts/argument_spec_defaults.py writes them), so ansible-doc
shows what a role really does when the inventory says nothing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "argument_spec_defaults.py"
_SPEC = importlib.util.spec_from_file_location("argument_spec_defaults", SCRIPT)
assert _SPEC is not None and _SPEC.loader is not None
specs = importlib.util.module_from_spec(_SPEC)
sys.modules["argument_spec_defaults"] = specs
_SPEC.loader.exec_module(specs)
ROLES = sorted(p for p in (REPO / "roles").iterdir() if (p / "meta" / "argument_specs.yml").is_file())


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_the_spec_carries_every_default(role: Path) -> None:
    assert specs.problems(role) == []  # fix: scripts/argument_spec_defaults.py


def _role(tmp_path: Path, defaults: str, spec: str) -> Path:
    """A role ``r`` with these defaults/main.yml and meta/argument_specs.yml texts."""
    role = tmp_path / "r"
    (role / "defaults").mkdir(parents=True)
    (role / "meta").mkdir()
    (role / "defaults" / "main.yml").write_text(defaults)
    (role / "meta" / "argument_specs.yml").write_text(spec)
    return role


def test_a_stale_default_is_found(tmp_path: Path) -> None:
    role = _role(
        tmp_path,
        "r_a: 1\nr_b: [x]\nr_c: '{{ r_a }}'\n",
        "argument_specs:\n  main:\n    options:\n"
        "      r_a:\n        type: int\n        default: 2\n"
        "      r_b:\n        type: list\n        description: b\n"
        "      r_d:\n        type: str\n",
    )
    assert specs.problems(role) == [
        "r: r_c has a default but no spec option",
        "r: r_d has a spec option but no default",
        "r: r_a: the spec's default is not defaults/main.yml's",
        "r: r_b: the spec's default is not defaults/main.yml's",
    ]
    specs.write(role)
    assert specs.problems(role) == [
        "r: r_c has a default but no spec option",
        "r: r_d has a spec option but no default",
    ]


def test_an_anchored_option_gets_its_default_and_the_aliases_stay(tmp_path: Path) -> None:
    """Entry points besides main name main's options by YAML alias (`r_a: *r_a`, one declaration):
    the anchored option still gets its default line, and the aliases see it."""
    role = _role(
        tmp_path,
        "r_a: 1\nr_b: x\n",
        "argument_specs:\n  main:\n    options:\n"
        "      r_a: &r_a\n        type: int\n        description: a\n"
        "      r_b:\n        type: str\n"
        "  other:\n    options:\n      r_a: *r_a\n",
    )
    specs.write(role)
    assert specs.problems(role) == []
    written = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    assert written["other"]["options"]["r_a"] == {"type": "int", "default": 1, "description": "a"}
