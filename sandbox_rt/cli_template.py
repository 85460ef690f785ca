"""The CLI's templates: ``sandbox-rt template ls``, ``template build FILE.py:NAME`` (a
:class:`~sandbox_rt.Template` defined in a Python file, built with progress output) and
``template rm NAME`` (a template built from code; refused while sandboxes or snapshots use it)."""

from __future__ import annotations

import argparse
import dataclasses
import runpy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .manager import Manager
from .templates import Template, list_templates, remove_template

__all__ = ["add_template_command", "load_definition", "template_command"]


def add_template_command(command: Callable[..., argparse.ArgumentParser]) -> None:
    tp = command("template", help="the templates sandboxes are cloned from (create --template NAME)")
    tp.add_argument(
        "action",
        choices=["ls", "build", "rm"],
        help="ls: the template names this host has; build FILE.py:VAR: build the Template that "
        "FILE.py assigns to VAR; rm NAME: remove a template built from code",
    )
    tp.add_argument("target", nargs="?", metavar="FILE.py:VAR | NAME", help="what to build or remove")
    tp.add_argument("--name", help="build: the template's name (default: the Template's name=, else VAR)")
    tp.add_argument("--skip-cache", action="store_true", help="build: rebuild even if nothing changed")


def load_definition(target: str) -> tuple[Template, str]:
    """(the Template, its default name) from ``FILE.py:VAR``: the file runs as a script (it is the
    caller's own code, as with pyinfra's deploy files) and must assign a Template to ``VAR``."""
    path_text, sep, var = target.rpartition(":")
    if not sep or not path_text or not var.isidentifier():
        raise ConfigError(f"template build takes FILE.py:VAR, not {target!r}")
    path = Path(path_text)
    if not path.is_file():
        raise ConfigError(f"template build: no file {path}")
    namespace = runpy.run_path(str(path), run_name="__sandbox_rt_template__")
    template = namespace.get(var)
    if not isinstance(template, Template):
        found = type(template).__name__ if var in namespace else "nothing"
        raise ConfigError(f"{path}: {var} must be a sandbox_rt.Template (found {found})")
    return template, template.name or var.lower().replace("_", "-")


def template_command(
    args: argparse.Namespace,
    mgr: Manager,
    out: Callable[[Any, str], None],
    progress: Callable[[str], None],
) -> int:
    if args.action == "ls":
        names = mgr.templates()
        built = {e.name: e for e in list_templates(mgr)} if mgr.settings.backend == "lxc" else {}
        if args.json:
            out(names, "")
            return 0
        lines = []
        for name in names:
            entry = built.get(name)
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.built_at)) if entry else ""
            lines.append(f"{name:40} built {when} from {entry.base}" if entry else name)
        out(names, "\n".join(lines))
        return 0
    if not args.target:
        raise ConfigError(
            f"template {args.action} needs a {'FILE.py:VAR' if args.action == 'build' else 'NAME'}"
        )
    if args.action == "build":
        template, default_name = load_definition(args.target)
        result = mgr.build_template(
            template, args.name or default_name, on_log=progress, skip_cache=args.skip_cache
        )
        data = {
            **dataclasses.asdict(result.template),
            "cached": result.cached,
            "duration_s": result.duration_s,
        }
        out(data, f"{result.name}{' (cached)' if result.cached else ''}")
        return 0
    entry = remove_template(mgr, args.target)
    out({"removed": entry.name, "container": entry.container}, "")
    return 0
