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
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from sandbox_rt import Settings

from .checks import role_defaults
from .sites import Site

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


def without_caps(settings: Settings, keep: tuple[str, ...]) -> dict[str, str]:
    """The template's lxc.cap.drop without ``keep`` (a change for :func:`template_variant`)."""
    config = (settings.lxc_path / settings.template / "config").read_text().splitlines()
    drops = [ln.partition("=")[2].split() for ln in config if ln.partition("=")[0].strip() == "lxc.cap.drop"]
    assert drops, "precondition: the template drops capabilities"
    kept = [cap for cap in drops[-1] if cap not in keep]
    assert len(kept) == len(drops[-1]) - len(keep), f"precondition: the template drops all of {keep}"
    return {"lxc.cap.drop": " ".join(kept)}


def _removed(line: str, keep: Collection[str], drop: Collection[str] | None) -> bool:
    """Whether a line of a PVE CT's config is a raw ``lxc.*`` line :func:`pve_template_variant` takes out."""
    if not line.startswith("lxc."):
        return False
    key = line.split(":", 1)[0].strip()
    return key in drop if drop is not None else key not in keep


@contextlib.contextmanager
def pve_template_variant(
    site: Site, keep: Collection[str] = (), drop: Collection[str] | None = None
) -> Iterator[Settings]:
    """Settings of ``site`` (a PVE one) whose template is a throw-away linked clone of the real
    template, whose raw ``lxc.*`` lines root removed from its ``/etc/pve/lxc/<vmid>.conf`` on the node
    (all but the keys in ``keep``; with ``drop``: only those keys), converted to a template the
    runtime's token may clone (the same clone-only ACL as the real one). The real template is never
    touched; the variant and its ACL go when the ``with`` block ends (its clones must be gone by then:
    the factories destroy them first)."""
    from proxmoxer.tools import Tasks

    admin: Any = site.admin_api
    s = site.settings
    role = role_defaults("proxmox_access")["proxmox_access_template_role"]
    template = s.pve_template_vmid
    node = next(str(r["node"]) for r in admin.cluster.resources.get(type="vm") if r["vmid"] == template)

    def wait(upid: str) -> None:
        status = Tasks.blocking_status(admin, upid, timeout=300, polling_interval=0.1)
        assert status and status.get("exitstatus") == "OK", f"task {upid}: {status}"

    vmid = int(admin.cluster.nextid.get())
    wait(admin.nodes(node).lxc(template).clone.post(newid=vmid, full=0, hostname=f"variant-{vmid}"))
    # a privilege-separated token holds what both it and its user hold: both get the role
    user = s.pve_token_id.split("!")[0]
    acl = {"path": f"/vms/{vmid}", "roles": role, "users": user, "tokens": s.pve_token_id, "propagate": 0}
    try:
        conf = site.path(f"/etc/pve/lxc/{vmid}.conf")
        lines = conf.read_text().splitlines()
        kept = [ln for ln in lines if not _removed(ln, keep, drop)]
        assert len(kept) < len(lines), f"precondition: the clone carries the template's raw lines ({conf})"
        tmp = conf.with_name(f".{conf.name}.variant")
        tmp.write_text("\n".join(kept) + "\n")
        tmp.replace(conf)  # as root on the node does it (the API cannot touch raw keys)
        admin.nodes(node).lxc(vmid).template.post()
        admin.access.acl.put(**acl)
        yield dataclasses.replace(s, pve_template_vmid=vmid)
    finally:
        with contextlib.suppress(Exception):
            admin.access.acl.put(**acl, delete=1)
        wait(admin.nodes(node).lxc(vmid).delete())
