"""The host's templates as the LXC backend clones them: which container a template name, a sandbox
or a snapshot means.

A named template has a slot under ``settings.lxc_path`` (``sandbox-template`` for ``default``,
host.json's or the registry's container name for the others): a link to the generation new creates
clone, read live (generations.py), or on a host provisioned before generations the container dir
itself. A sandbox or snapshot remembers the generation it was made from, so a switch by site.yml
changes nothing of what is already there.
"""

from __future__ import annotations

import builtins
import contextlib
from pathlib import Path

from ...config import Settings
from ...errors import BackendError
from ...models import DEFAULT_TEMPLATE
from .container import config_lines, config_value
from .generations import legacy, prune, resolve
from .userinit import read_user

__all__ = ["TemplateSlots"]


class TemplateSlots:
    """The templates of one LXC path: slots, their current generations and their root file systems."""

    def __init__(self, settings: Settings, path: Path) -> None:
        self.settings = settings
        self.path = path

    def slot(self, template: str) -> str:
        """The container name the host contract gives the named template (``default``: ``template``)."""
        self.settings.check_template(template)
        if template == DEFAULT_TEMPLATE:
            return self.settings.template
        return self.settings.lxc_templates()[template]

    def slot_dir(self, template: str) -> Path:
        """The slot of the named template: a link to its current generation (or the container dir)."""
        return self.path / self.slot(template)

    def current(self, template: str) -> str:
        """The generation new creates of ``template`` clone now (the slot's link, read live, so a
        switch by site.yml counts at once in every process; generations.py)."""
        slot = self.slot(template)  # ConfigError for an unknown name
        try:
            return resolve(self.path, slot)
        except FileNotFoundError as exc:
            raise BackendError(
                f"template {template!r} ({slot}) not found in {self.path} (run site.yml)",
                step="clone",
            ) from exc
        except (OSError, ValueError) as exc:
            raise BackendError(f"template {template!r}: {exc}", step="clone") from exc

    def made_from(self, template: str, container: object) -> str:
        """The generation a sandbox or snapshot was made from: its stored ``template_container``, or for
        one stored before generations, the legacy generation of its template."""
        if isinstance(container, str) and container:
            return container
        slot = self.slot(template)
        try:
            return legacy(self.path, slot)
        except FileNotFoundError:
            return slot  # no such template here: the clone says so
        except (OSError, ValueError) as exc:
            raise BackendError(f"template {template!r}: {exc}", step="clone") from exc

    def container_rootfs(self, container: str) -> Path:
        try:
            value = config_value(config_lines(self.path / container), "lxc.rootfs.path") or ""
        except OSError as exc:
            raise BackendError(
                f"template container {container} is gone from {self.path}", step="clone", detail=str(exc)
            ) from exc
        return Path(value.removeprefix("dir:"))

    def rootfs(self, template: str) -> Path:
        return self.container_rootfs(self.current(template))

    def prune(self, *, dry_run: bool = False) -> builtins.list[str]:
        """Remove the template generations that creates no longer clone and nothing uses (no sandbox,
        snapshot or create in progress); returns them. ``sandbox-rt gc`` and the reaper run it."""
        removed: builtins.list[str] = []
        for name in self.settings.template_names():
            slot = self.slot(name)
            try:
                removed += prune(self.path, slot, name, dry_run=dry_run)
            except (OSError, ValueError) as exc:
                raise BackendError(f"cannot prune template {name!r}: {exc}", step="gc") from exc
        return removed

    def sandbox_uid(self) -> int:
        """The uid of the sandbox user (``ssh_user``) in the default template (1000 if unreadable)."""
        with contextlib.suppress(BackendError):
            return read_user(self.rootfs(DEFAULT_TEMPLATE), self.settings.ssh_user).uid
        return 1000
