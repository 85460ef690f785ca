"""The host contract's template VMIDs, re-read when ``host.json`` changes (issue 20 item 3).

A template update on Proxmox VE (roles/template_build, docs/proxmox.md "Template updates") builds the
new CT template at another VMID beside the old one, then rewrites ``host.json`` with the new VMIDs
(``pve_template_vmid``, ``pve_templates``, ``pve_node_templates``); the old template stays while its
linked clones live. The processes that load :class:`~sandbox_rt.config.Settings` once and run for
long (``sandbox-rt serve``, the reaper, the warm pool) must clone the new template from then on
without a restart: :class:`TemplateContract` stats the file on each use (one ``stat`` per create)
and, when its inode, size or mtime changed, loads it again (environment overrides applied as at
start) and takes its three template keys; every other setting stays as loaded.

Only a file the settings came from is watched: at start the file's template keys must be the
settings' own (settings built in code, or overridden by the environment, are left alone). A file that
does not load (invalid, or a template name this process does not know) keeps the last good VMIDs and
is logged once per change.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...config import DEFAULT_HOST_CONFIG, ENV_PREFIX, Settings
from ...errors import ConfigError

__all__ = ["TEMPLATE_KEYS", "TemplateContract"]

log = logging.getLogger(__name__)

# the host contract's keys that name template VMIDs (the ones a template update switches)
TEMPLATE_KEYS = ("pve_template_vmid", "pve_templates", "pve_node_templates")

_Stamp = tuple[int, int, int, int]


def _templates_of(settings: Settings) -> dict[str, Any]:
    return {key: getattr(settings, key) for key in TEMPLATE_KEYS}


class TemplateContract:
    """The template VMIDs of ``settings``, following ``host.json`` (module docstring)."""

    def __init__(self, settings: Settings, env: Mapping[str, str] | None = None) -> None:
        self._env = dict(os.environ if env is None else env)
        self._path = Path(self._env.get(ENV_PREFIX + "CONFIG") or DEFAULT_HOST_CONFIG)
        self._lock = threading.Lock()
        self._settings = settings
        self._stamp = self._stat()
        self._watched = self._stamp is not None and self._loads_as(settings)

    @property
    def watched(self) -> bool:
        """Whether the settings came from a file that is followed (else they are fixed)."""
        return self._watched

    def _stat(self) -> _Stamp | None:
        try:
            st = self._path.stat()
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def _loads_as(self, settings: Settings) -> bool:
        try:
            loaded = Settings.load(self._path, env=self._env)
        except ConfigError:
            return False
        return _templates_of(loaded) == _templates_of(settings)

    def current(self) -> Settings:
        """The settings with the template VMIDs the host contract names now."""
        if not self._watched:
            return self._settings
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return self._settings  # unchanged (or gone for a moment: keep what was read)
        with self._lock:
            if stamp == self._stamp:
                return self._settings
            self._stamp = stamp
            before = _templates_of(self._settings)
            try:
                loaded = Settings.load(self._path, env=self._env)
                after = _templates_of(loaded)
                if after != before:
                    self._settings = dataclasses.replace(self._settings, **after)
            except ConfigError as exc:
                log.warning(
                    "host contract %s changed but does not load; keeping its template VMIDs: %s",
                    self._path,
                    exc,
                )
                return self._settings
            if after != before:
                log.info(
                    "host contract %s: templates now %s (were %s)",
                    self._path,
                    _summary(after),
                    _summary(before),
                )
            return self._settings


def _summary(templates: Mapping[str, Any]) -> str:
    named = {"default": templates["pve_template_vmid"], **templates["pve_templates"]}
    text = ", ".join(f"{name}={vmid}" for name, vmid in named.items())
    for node, copies in sorted(templates["pve_node_templates"].items()):
        text += f"; {node}: " + ", ".join(f"{name}={vmid}" for name, vmid in copies.items())
    return text
