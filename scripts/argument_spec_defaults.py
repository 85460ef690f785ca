#!/usr/bin/env python3
"""Keep every role's ``meta/argument_specs.yml`` carrying each option's default, as written in its
``defaults/main.yml`` (issue 20: ``ansible-doc -t role`` then documents every default; Ansible takes
the actual value from the role defaults, never from the spec).

    scripts/argument_spec_defaults.py          write the missing or stale ``default:`` lines
    scripts/argument_spec_defaults.py --check  exit 1 and name every option whose default differs

Each option's ``default:`` line sits right after its ``type:`` line; lists and mappings are written in
flow style, strings quoted when YAML needs it. Every default must have a spec option and the other
way round.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROLES = Path(__file__).resolve().parents[1] / "roles"
OPTION_INDENT = " " * 6  # options of the main entry point: argument_specs.main.options.<name>
# An option's name line, with the YAML anchor the other entry points' aliases name (`<name>: &<name>`).
OPTION = re.compile(rf"^{OPTION_INDENT}(?P<name>[A-Za-z0-9_]+):( &[A-Za-z0-9_]+)?$")


def _defaults(role: Path) -> dict[str, Any]:
    data = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    return dict(data)


def _spec_options(role: Path) -> dict[str, Any]:
    spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    return dict(spec["argument_specs"]["main"]["options"])


class _IndentedDumper(yaml.SafeDumper):
    """Block sequences indented under their key (as yamllint and the rest of the repository want)."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    """Strings of several lines (Jinja templates) as literal blocks, as defaults/main.yml has them."""
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_IndentedDumper.add_representer(str, _text)


def _render(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=100_000, allow_unicode=True).strip()
    return text.removesuffix("\n...").strip()


def _default_lines(value: Any) -> list[str]:
    """``default: <value>`` on one line, or in block style where that line would be too long."""
    inline = f"{OPTION_INDENT}  default: {_render(value)}"
    if len(inline) <= 150 and not (isinstance(value, str) and "\n" in value):
        return [inline]
    block = yaml.dump(
        {"default": value}, Dumper=_IndentedDumper, default_flow_style=False, width=120, allow_unicode=True,
        sort_keys=False,
    )  # fmt: skip
    return [f"{OPTION_INDENT}  {line}" for line in block.rstrip().splitlines()]


def problems(role: Path) -> list[str]:
    defaults, options = _defaults(role), _spec_options(role)
    names, specs = set(defaults), set(options)
    out = [f"{role.name}: {n} has a default but no spec option" for n in sorted(names - specs)]
    out += [f"{role.name}: {n} has a spec option but no default" for n in sorted(specs - names)]
    for name in sorted(set(defaults) & set(options)):
        if "default" not in options[name] or options[name]["default"] != defaults[name]:
            out.append(f"{role.name}: {name}: the spec's default is not defaults/main.yml's")
    return out


def write(role: Path) -> None:
    path = role / "meta" / "argument_specs.yml"
    defaults = _defaults(role)
    lines = path.read_text().splitlines()
    out: list[str] = []
    current: str | None = None
    skipping = False
    key, deeper = OPTION_INDENT + "  ", OPTION_INDENT + "   "  # an option's own keys; anything under them
    for line in lines:
        option = OPTION.match(line)
        if option:
            current = option["name"]
        elif line.startswith(key + "default:") and not line.startswith(deeper):
            skipping = True  # rewritten after the type line (with its block lines, below)
            continue
        elif skipping and line.startswith(deeper):
            continue
        skipping = False
        out.append(line)
        if current in defaults and line.startswith(key + "type:") and not line.startswith(deeper):
            out += _default_lines(defaults[current])
    path.write_text("\n".join(out) + "\n")


def main(argv: list[str]) -> int:
    roles = sorted(p for p in ROLES.iterdir() if (p / "meta" / "argument_specs.yml").is_file())
    if "--check" not in argv:
        for role in roles:
            write(role)
    found = [p for role in roles for p in problems(role)]
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
