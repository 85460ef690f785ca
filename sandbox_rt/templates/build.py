"""``Manager.build_template``: a template definition becomes a named template, all or nothing.

1. The cache: the definition's key (:mod:`.cache`) equals the registered one and its container is
   there: nothing is done (``skip_cache=True`` builds anyway).
2. A build sandbox from the base template, with root (``create(root=True)``) and an egress list of
   the package sources the steps need; the steps run as pyinfra operations over the runtime's own SSH
   connection (:mod:`.ops`, :mod:`.connector`), each operation's output streamed to ``on_log``.
3. The sandbox stops; the hardening checks read its delta (:mod:`.checks`); the delta over the base
   becomes a template container (:mod:`.lxc_store`), recorded in the registry
   (:mod:`sandbox_rt.template_registry`).
Any failure or interrupt: the build sandbox is destroyed and no template is recorded.

On Proxmox VE (:mod:`.pve_store`) the same build sandbox (its egress names resolved on this machine:
PVE's firewall matches addresses only), the same steps; the hardening controls are snapshots taken
inside the CT before and after the steps (:mod:`.ct_checks`); the stopped CT itself becomes a CT
template, outside the runtime's pool, with the operator's admin token (``pve_admin_token_file``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ConfigError, SandboxError, StateConflict
from ..models import DEFAULT_TEMPLATE, SnapshotInfo
from ..template_registry import BuiltTemplate, TemplateRegistry
from ..validation import check_template_name
from .cache import cache_key
from .definition import Template

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..config import Settings
    from ..sandbox import Sandbox

__all__ = [
    "BUILD_LABEL",
    "BuildResult",
    "ManagerLike",
    "build_template",
    "list_templates",
    "remove_template",
    "users_of",
]

BUILD_LABEL = "template-build"  # the build sandbox's label (its value: the template's name)
BUILD_TTL_S = 4 * 3600  # a build sandbox left by a crashed builder is reaped by gc after this
BUILD_MEMORY_MB = 2048
Log = Callable[[str], None]


class ManagerLike(Protocol):
    """What a build needs of the :class:`sandbox_rt.Manager` that runs it: templates sit below the
    manager (``Manager.build_template`` calls :func:`build_template` with itself) and never import it."""

    @property
    def settings(self) -> Settings: ...

    @property
    def backend(self) -> Backend: ...

    def create(self, *args: Any, **kwargs: Any) -> Sandbox: ...

    def destroy(self, sandbox_id: str) -> None: ...

    def list_snapshots(self) -> list[SnapshotInfo]: ...


@dataclasses.dataclass(frozen=True)
class BuildResult:
    """What a build made (or found in the cache)."""

    template: BuiltTemplate
    cached: bool
    duration_s: float

    @property
    def name(self) -> str:
        return self.template.name


def _backend_check(manager: ManagerLike) -> None:
    if manager.settings.backend not in ("lxc", "proxmox"):
        raise ConfigError(
            f"building templates from code is not available on backend {manager.settings.backend!r}"
        )


def _check_name(manager: ManagerLike, name: str) -> None:
    check_template_name(name)
    if name == DEFAULT_TEMPLATE:
        raise ConfigError(f"{DEFAULT_TEMPLATE!r} is the host's default template, not a name to build")
    if name in manager.settings.templates or name in manager.settings.pve_templates:
        raise ConfigError(f"template {name!r} is the inventory's (host.json templates): choose another name")


def users_of(manager: ManagerLike, name: str) -> list[str]:
    """The sandboxes and snapshots made from template ``name`` (they need its files)."""
    users = [f"sandbox {r.id}" for r in manager.backend.list() if r.spec.template == name]
    with contextlib.suppress(ConfigError):  # a backend without snapshots has none
        users += [f"snapshot {s.name}" for s in manager.list_snapshots() if s.template == name]
    return users


def _refuse_if_used(manager: ManagerLike, name: str, doing: str) -> None:
    users = users_of(manager, name)
    if users:
        shown = ", ".join(users[:10]) + (f" and {len(users) - 10} more" if len(users) > 10 else "")
        raise StateConflict(f"cannot {doing} template {name!r}: in use by {shown}")


def _build_sandbox(
    manager: ManagerLike, template: Template, name: str, egress: list[str], log: Log
) -> Sandbox:
    """The build sandbox: root on request, the base template, the build's egress list, a TTL after
    which gc reaps it if the builder crashed, and the build's label."""
    return manager.create(
        root=True,
        template=template.base,
        egress=egress,
        memory_mb=BUILD_MEMORY_MB,
        ttl_s=BUILD_TTL_S,
        labels={BUILD_LABEL: name},
        progress=lambda msg: log(f"build sandbox: {msg}"),
    )


def build_template(
    manager: ManagerLike,
    template: Template,
    name: str,
    *,
    on_log: Log | None = None,
    skip_cache: bool = False,
) -> BuildResult:
    """Build ``template`` as ``name`` on ``manager``'s host (see the module's docstring)."""
    from .lxc_store import base_identity, commit_build, remove_container

    if not isinstance(template, Template):
        raise ConfigError(f"build_template needs a sandbox_rt.Template, not {type(template).__name__}")
    _backend_check(manager)
    _check_name(manager, name)
    log = on_log or (lambda _line: None)
    if manager.settings.backend == "proxmox":
        return _build_on_pve(manager, template, name, log, skip_cache)
    settings = manager.settings
    registry = TemplateRegistry(settings.state_dir)
    t0 = time.monotonic()
    settings.check_template(template.base)
    with registry.building(name):
        entries = registry.read()
        key = cache_key(template, base_identity(settings, template.base, entries.get(template.base)))
        old = entries.get(name)
        if (
            old is not None
            and old.key == key
            and not skip_cache
            and (settings.lxc_path / old.container).is_dir()
        ):
            log(f"cache hit: {name} is {old.container} (key {key[:12]})")
            return BuildResult(old, True, time.monotonic() - t0)
        if old is not None:
            _refuse_if_used(manager, name, "rebuild")
        log(f"building {name} from {template.base} ({len(template.steps)} steps, key {key[:12]})")
        from .ops import apply_steps  # pyinfra: imported only when something is built

        egress = template.egress()
        log(f"build sandbox egress: {', '.join(egress) or '(none)'}")
        sandbox = _build_sandbox(manager, template, name, egress, log)
        try:
            apply_steps(sandbox, list(template.steps), log, timeout_s=max(settings.command_timeout_s, 1800.0))
            log("stopping the build sandbox")
            sandbox.close()
            manager.backend.stop(sandbox.id)
            log("checking hardening controls and storing the template")
            entry = commit_build(
                settings,
                sandbox.id,
                base=template.base,
                name=name,
                key=key,
                steps=tuple(s.describe() for s in template.steps),
            )
        finally:
            with contextlib.suppress(SandboxError):
                manager.destroy(sandbox.id)
        try:
            replaced = registry.put(entry)
        except BaseException:  # all or nothing: a stored container no registry names must not stay
            remove_container(settings, entry.container)
            raise
        if replaced is not None and replaced.container != entry.container:
            remove_container(settings, replaced.container)
    took = time.monotonic() - t0
    log(f"built {name} ({entry.container}) in {took:.1f} s")
    return BuildResult(entry, False, took)


def list_templates(manager: ManagerLike) -> list[BuiltTemplate]:
    """The templates built from code on this host, by name."""
    return sorted(TemplateRegistry(manager.settings.state_dir).read().values(), key=lambda e: e.name)


def remove_template(manager: ManagerLike, name: str) -> BuiltTemplate:
    """Remove a built template; StateConflict while sandboxes or snapshots use it, ConfigError if
    there is no built template of that name (the inventory's are site.yml's to remove)."""
    from .lxc_store import remove_container

    _backend_check(manager)
    check_template_name(name)
    registry = TemplateRegistry(manager.settings.state_dir)
    with registry.building(name):
        found = registry.get(name)
        if found is None or found.backend != manager.settings.backend:
            raise ConfigError(f"no template named {name!r} was built from code on this host")
        if found.backend == "proxmox":
            from .pve_store import admin_core, delete_template

            admin = admin_core(manager.settings, "remove templates built from code")
            _refuse_if_used(manager, name, "remove")
            assert found.vmid is not None
            delete_template(admin, found.vmid, name=name)  # PVE's refusal keeps the entry
            registry.remove(name)
            return found
        _refuse_if_used(manager, name, "remove")
        entry = registry.remove(name)
        assert entry is not None
        remove_container(manager.settings, entry.container)
    return entry


def _build_on_pve(
    manager: ManagerLike, template: Template, name: str, log: Log, skip_cache: bool
) -> BuildResult:
    """The Proxmox VE build (module docstring; the API side: :mod:`.pve_store`)."""
    from ..backends.proxmox import ProxmoxBackend
    from . import pve_store
    from .ct_checks import CLEANUP_SCRIPT, compare_controls, controls_of
    from .lxc_store import container_name

    settings = manager.settings
    admin = pve_store.admin_core(settings)  # a clear ConfigError before anything is made
    backend = manager.backend
    if not isinstance(backend, ProxmoxBackend):
        raise ConfigError(f"backend=proxmox with a {type(backend).__name__}: cannot build templates on it")
    registry = TemplateRegistry(settings.state_dir)
    t0 = time.monotonic()
    settings.check_template(template.base)
    with registry.building(name):
        entries = registry.read()
        base_entry = entries.get(template.base)
        if base_entry is not None and base_entry.backend != "proxmox":
            base_entry = None
        key = cache_key(template, pve_store.base_identity(backend, template.base, base_entry))
        old = entries.get(name)
        if old is not None and old.backend != "proxmox":
            old = None
        if (
            old is not None
            and old.key == key
            and not skip_cache
            and old.vmid is not None
            and pve_store.template_exists(backend, old.vmid)
        ):
            log(f"cache hit: {name} is CT template {old.vmid} (key {key[:12]})")
            return BuildResult(old, True, time.monotonic() - t0)
        if old is not None:
            _refuse_if_used(manager, name, "rebuild")
        log(f"building {name} from {template.base} ({len(template.steps)} steps, key {key[:12]})")
        from .ops import apply_steps  # pyinfra: imported only when something is built

        egress, hosts = pve_store.resolve_egress(template.egress())
        if hosts:
            log(
                "build egress names resolved here (PVE's firewall takes addresses): "
                + ", ".join(f"{n}={'/'.join(a)}" for n, a in sorted(hosts.items()))
            )
        log(f"build sandbox egress: {', '.join(egress) or '(none)'}")
        sandbox = _build_sandbox(manager, template, name, egress, log)
        user = settings.ssh_user
        timeout_s = max(settings.command_timeout_s, 1800.0)
        entry = BuiltTemplate(
            name=name,
            container=container_name(name, key),
            key=key,
            base=template.base,
            backend="proxmox",
            built_at=time.time(),
            steps=tuple(s.describe() for s in template.steps),
            vmid=None,
        )
        node = ""
        try:
            node, vmid = backend._find(sandbox.id)
            entry = dataclasses.replace(entry, vmid=vmid)
            if hosts:
                block = pve_store.hosts_block(hosts)
                sandbox.exec("cat >> /etc/hosts", user="root", stdin=block.encode(), check=True, timeout=60)
            log("reading the hardening controls before the steps")
            before = controls_of(sandbox, user=user)
            apply_steps(sandbox, list(template.steps), log, timeout_s=timeout_s)
            log("checking the hardening controls")
            compare_controls(before, controls_of(sandbox, user=user), user=user)
            log("removing the build's identity, root access and caches from the CT")
            sandbox.exec(CLEANUP_SCRIPT, user="root", check=True, timeout=300)
            log("stopping the build sandbox")
            sandbox.close()
            backend.stop(sandbox.id)
            pve_store.convert(backend, admin, node, vmid, entry, log)
        except BaseException:
            _discard_pve_build(manager, admin, sandbox.id, node, entry.vmid, log)
            raise
        try:
            replaced = registry.put(entry)
        except BaseException:  # all or nothing: a template no registry names must not stay
            with contextlib.suppress(SandboxError):
                pve_store.delete_template(admin, vmid, name=name)
            raise
        if replaced is not None and replaced.vmid is not None and replaced.vmid != entry.vmid:
            try:
                pve_store.delete_template(admin, replaced.vmid, name=name)
            except SandboxError as exc:
                log(f"the replaced template CT {replaced.vmid} stays (remove it by hand): {exc}")
    took = time.monotonic() - t0
    log(f"built {name} (CT template {entry.vmid}) in {took:.1f} s")
    return BuildResult(entry, False, took)


def _discard_pve_build(
    manager: ManagerLike, admin: object, sandbox_id: str, node: str, vmid: int | None, log: Log
) -> None:
    """Remove the build CT: by its id while the runtime still finds it (tagged), else by VMID with
    the admin token (untagged, out of the pool, or converted already)."""
    from . import pve_store

    with contextlib.suppress(SandboxError):
        manager.destroy(sandbox_id)
        return
    if vmid is not None and node:
        assert isinstance(admin, pve_store._AdminCore)
        pve_store.discard_build(admin, node, vmid, log)
