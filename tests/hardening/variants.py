"""Throw-away variants of the sandbox template for the negative proofs: a copy of the template's LXC
config under another name, with some keys changed, beside the real one in the LXC path. Its
``rootfs`` is a symlink to the real template's (lxc-copy wants the source's rootfs path to name the
source), so its clones read the real rootfs as their lower layer, as every sandbox does, and are
made by the runtime as usual; the real template and its config are never touched. The variant is
removed when the ``with`` block ends (its clones must be gone by then: the factories destroy them
first); removing it removes the symlink, never what it points to.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

from sandbox_rt import Settings

# LXC's own profile on Debian (what sandboxes loaded before issue 16)
STOCK_SECCOMP = "/usr/share/lxc/config/common.seccomp"
# A filter that refuses nothing (an empty v2 denylist): seccomp on, no call refused
ALLOW_ALL_SECCOMP = "2\ndenylist\n"


def edit_config(lines: list[str], changes: Mapping[str, str | None]) -> list[str]:
    """``lines`` with every ``key = ...`` of ``changes`` replaced by its new value (None: removed);
    keys the config lacks are appended."""
    out, seen = [], set()
    for line in lines:
        key = line.partition("=")[0].strip()
        if "=" in line and key in changes:
            if key not in seen and changes[key] is not None:
                out.append(f"{key} = {changes[key]}")
            seen.add(key)
            continue
        out.append(line)
    out += [f"{k} = {v}" for k, v in changes.items() if k not in seen and v is not None]
    return out


@contextlib.contextmanager
def template_variant(settings: Settings, changes: Mapping[str, str | None]) -> Iterator[Settings]:
    """Settings whose template is a throw-away copy of the real one with ``changes`` applied."""
    name = f"{settings.template}-proof-{secrets.token_hex(4)}"
    real = settings.lxc_path / settings.template
    variant = settings.lxc_path / name
    variant.mkdir(mode=0o755)
    try:
        (variant / "rootfs").symlink_to(Path("..") / settings.template / "rootfs")
        rootfs = {"lxc.rootfs.path": f"dir:{variant / 'rootfs'}"}
        config = edit_config((real / "config").read_text().splitlines(), {**changes, **rootfs})
        (variant / "config").write_text("\n".join(config) + "\n")
        yield dataclasses.replace(settings, template=name)
    finally:
        shutil.rmtree(variant, ignore_errors=True)
