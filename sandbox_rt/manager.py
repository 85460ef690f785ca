"""The entry point: create, attach, list, destroy and garbage-collect sandboxes."""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import logging
import math
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack, cast

import paramiko

from . import logs
from .backends.base import (
    Backend,
    TemplateGenerations,
    pause_backend,
    placement_backend,
    snapshot_backend,
)
from .config import Settings
from .errors import ConfigError, SandboxError, SandboxNotFound, SnapshotNotFound
from .models import DEFAULT_TEMPLATE, SandboxRecord, SandboxSpec, SnapshotInfo, VolumeMount
from .options import CreateOptions, all_options
from .pool import POOL_LABEL, WarmPool
from .process_limits import raise_open_files_limit
from .sandbox import Sandbox
from .ssh import SSHExecutor, load_private_key, parse_public_key
from .validation import check_create, check_sandbox_id, check_snapshot_name, make_spec, respec
from .volumes import VolumeStore
from .volumes.store import open_host_source

if TYPE_CHECKING:
    from .templates import BuildResult, Template

__all__ = ["PAUSED_STATES", "GcResult", "Manager", "new_sandbox_id"]

# what Backend.state says of a paused sandbox (the lxc backend: its cgroup freezer), or of one whose
# freeze is still settling
PAUSED_STATES = ("frozen", "freezing")


def _since(t0: float) -> float:
    return round(time.monotonic() - t0, 4)


# How long root's connection to a running root=True sandbox may take (sshd is up by then).
ROOT_CONNECT_TIMEOUT_S = 10.0

Progress = Callable[[str], None]


def new_sandbox_id() -> str:
    return "sbx-" + secrets.token_hex(5)


@dataclasses.dataclass(frozen=True)
class GcResult:
    """One sandbox (or remains of one) that ``gc`` removed, and why."""

    sandbox_id: str
    reason: str


def _make_backend(settings: Settings) -> Backend:
    if settings.backend == "lxc":
        from .backends.lxc import LxcBackend

        return LxcBackend(settings)
    if settings.backend == "proxmox":
        from .backends.proxmox import ProxmoxBackend

        return ProxmoxBackend(settings)
    raise ConfigError(f"backend {settings.backend!r} is not available in this build")


class Manager:
    """Makes and finds sandboxes on one backend.

    ``Manager.from_env()`` reads ``/etc/sandbox_rt/host.json`` (written by site.yml) and
    ``SANDBOX_RT_*`` environment overrides.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        backend: Backend | None = None,
        ssh_key: paramiko.PKey | Path | str | None = None,
        pool_size: int = 0,
        pool_spec: Mapping[str, Any] | None = None,
    ) -> None:
        """``pool_size`` > 0 keeps that many started sandboxes of ``pool_spec`` (create()'s
        arguments) ready, so ``create()`` hands one out in milliseconds (see :mod:`sandbox_rt.pool`).
        """
        self.settings = settings or Settings.load()
        raise_open_files_limit()  # one socket per attached sandbox (sandbox_rt.process_limits)
        self.backend = backend or _make_backend(self.settings)
        if isinstance(ssh_key, paramiko.PKey):
            self._key: paramiko.PKey | None = ssh_key
            self._key_path: Path | None = None
        else:
            self._key = None
            self._key_path = Path(ssh_key) if ssh_key is not None else self.settings.ssh_key
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 0:
            raise ConfigError(f"pool_size={pool_size!r} must be a whole number >= 0")
        self.pool: WarmPool | None = None
        self._pool_template = DEFAULT_TEMPLATE  # the pool's sandboxes' template (pool_spec's)
        if pool_size:
            base = self._host_defaults(pool_spec or {})
            base["labels"] = {**dict(base.get("labels") or {}), POOL_LABEL: new_sandbox_id()[4:]}
            pool_base = make_spec(**base)  # a bad pool spec fails here, before any thread starts
            self.settings.check_template(pool_base.template)
            self._pool_template = pool_base.template
            self.key  # noqa: B018 - a missing key fails here too
            self.pool = WarmPool(pool_size, lambda: self._create_cold(pool_base, None))

    def close(self) -> None:
        """Stop the warm pool (destroying its idle sandboxes). Handed-out sandboxes stay."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def __enter__(self) -> Manager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def from_env(cls) -> Manager:
        return cls(Settings.load())

    @property
    def key(self) -> paramiko.PKey:
        if self._key is None:
            assert self._key_path is not None
            self._key = load_private_key(self._key_path)
        return self._key

    # -- lifecycle -------------------------------------------------------------------------------
    def create(self, *, progress: Progress | None = None, **options: Unpack[CreateOptions]) -> Sandbox:
        """Clone the template, apply limits, start, connect; all or nothing. The options are
        :class:`~sandbox_rt.options.CreateOptions` (their defaults, ranges and meaning are declared
        there); ``progress`` is called with a line per step.

        Any failure after the clone destroys what was made (container, address, nft element)
        before the error is raised. ``ttl_s`` (default ``settings.default_ttl_s``) bounds its life:
        ``gc``/the reaper destroy it once expired; ``detached=True`` means it does not belong to
        this process (``gc(dead_owners=True)`` spares it when the process is gone).
        ``egress`` lists what it may reach while internet is off: IPv4 addresses, networks and
        domain names (resolved by the host's DNS into the sandbox's own nft set).
        ``from_snapshot`` forks the named snapshot (see :meth:`Sandbox.snapshot`): its files, a new
        identity (id, address, host key, machine-id, name); SnapshotNotFound if there is none.
        ``net_mbps`` (Mbit/s each way), ``disk_mbps`` (MB/s) and ``disk_iops`` (each of read and
        write) cap what it takes of the host's network and disk; None: the host's default
        (``settings.default_*``), 0: no cap (see :mod:`sandbox_rt.caps`).
        ``root=True`` lets commands run as the sandbox's root (``exec(..., user="root")``, e.g. to
        ``apt-get install`` through its egress list); the container stays unprivileged. Such a
        sandbox is always made cold (never taken from the warm pool).
        ``template`` names the template to clone (:meth:`templates`; None: ``default``); an unknown
        name is a ConfigError before anything is made. A fork has its snapshot's template, so
        ``template`` and ``from_snapshot`` do not go together. Only sandboxes of the pool's template
        (``pool_spec``'s, default ``default``) come from the warm pool.
        ``volumes`` mounts named volumes (:attr:`volumes`; each must exist) and host directories
        under the operator's ``volume_host_dirs`` (:class:`VolumeMount`); LXC backend only.
        ``node`` (Proxmox VE cluster) puts it on that node instead of where the placement policy
        would (docs/proxmox.md, "Placement"); such a sandbox is always made cold. ConfigError on a
        backend with one host, for an unknown node or one without the template.
        """
        spec, how = check_create(self._host_defaults(options))  # the one check of every door's create
        self.settings.check_template(spec.template)
        if spec.volumes:
            self._check_volume_sources(spec.volumes)
        node, from_snapshot = how.get("node"), how.get("from_snapshot")
        if node is not None:  # placed by hand: never a warm-pool sandbox
            placement_backend(self.backend)
            return self._create_cold(spec, progress, node=node)
        if from_snapshot is not None:  # a fork is never a warm-pool sandbox
            snapshot_backend(self.backend)
            return self._create_cold(spec, progress, from_snapshot)
        # pool sandboxes are of the pool's template and start without root
        poolable = not spec.root and not spec.volumes and spec.template == self._pool_template
        if self.pool is not None and poolable:
            warm = self._take_warm()
            if warm is not None:
                try:
                    return self._hand_out(warm, spec)
                except SandboxError:
                    with contextlib.suppress(SandboxError):
                        warm.destroy()  # a pool sandbox that cannot take the spec: make one cold
        return self._create_cold(spec, progress)

    def _host_defaults(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """``given`` with this host's default (``host.json``) for each option left out or None
        whose declaration names one (the TTL, the caps)."""
        out = dict(given)
        for opt in all_options():
            if opt.host_default is not None and out.get(opt.name) is None:
                out[opt.name] = getattr(self.settings, opt.host_default)
        return out

    def _take_warm(self) -> Sandbox | None:
        """A warm sandbox of the pool's template as creates get it now: one made before the template
        was swapped (site.yml switched its generation) is destroyed, never handed out."""
        assert self.pool is not None
        backend = self.backend
        while (warm := self.pool.take()) is not None:
            try:
                if not isinstance(backend, TemplateGenerations) or backend.template_is_current(warm.record):
                    return warm
            except SandboxError:
                pass  # cannot tell: not handed out either
            logs.event("pool_stale", warm.id, backend=backend.name, reason="template swapped")
            with contextlib.suppress(SandboxError):
                warm.destroy()
        return None

    def prune_templates(self, *, dry_run: bool = False) -> builtins.list[str]:
        """Remove the template generations creates no longer clone and no sandbox, snapshot or create
        in progress uses (LXC: what site.yml's switch left; ``sandbox-rt gc`` and the reaper call this).
        Returns them; ``[]`` on a backend without template generations."""
        if not isinstance(self.backend, TemplateGenerations):
            return []
        return self.backend.prune_templates(dry_run=dry_run)

    @property
    def volumes(self) -> VolumeStore:
        """The host's named volumes: ``create``, ``list``, ``get``, ``remove`` (LXC backend)."""
        store = getattr(self.backend, "volume_store", None)
        if store is None:
            raise ConfigError(
                f"the {self.backend.name} backend has no volumes: a PVE mount point's storage volume "
                "is destroyed with its CT, and bind mounts of host paths need root@pam (docs/proxmox.md)"
            )
        return cast(VolumeStore, store())

    def _check_volume_sources(self, mounts: Sequence[VolumeMount]) -> None:
        """Every source exists and may be mounted, before anything is made (start checks again)."""
        store = self.volumes
        for mount in mounts:
            if mount.volume is not None:
                os.close(store.open_source(mount))  # VolumeNotFound, or a link on the way
            else:
                os.close(open_host_source(mount, self.settings.volume_host_dirs))

    def templates(self) -> builtins.list[str]:
        """The template names ``create(template=...)`` takes on this host (``default`` first)."""
        return self.settings.template_names()

    def build_template(
        self,
        template: Template,
        name: str,
        *,
        on_log: Callable[[str], None] | None = None,
        skip_cache: bool = False,
    ) -> BuildResult:
        """Build ``template`` (a :class:`sandbox_rt.Template`) into the named template ``name``:
        pyinfra applies its steps as root to a build sandbox (egress: the steps' package sources),
        the hardening controls are checked, the result is stored and joins :meth:`templates`. All or
        nothing (TemplateBuildError names the failed step); the same definition again is a cache
        hit (``skip_cache=True`` rebuilds). See :mod:`sandbox_rt.templates`."""
        from .templates.build import build_template

        return build_template(self, template, name, on_log=on_log, skip_cache=skip_cache)

    def _hand_out(self, sb: Sandbox, spec: SandboxSpec) -> Sandbox:
        """Give a warm sandbox the request's limits, name, labels and TTL, then internet."""
        t0 = time.monotonic()
        sb.record = self.backend.update(sb.record, spec)
        if spec.internet:
            self.backend.set_internet(sb.record, True)
        if spec.egress:
            self.backend.set_egress(sb.record, spec.egress)
        logs.event("create", sb.id, backend=self.backend.name, pooled=True, duration_s=_since(t0))
        return sb

    def _create_cold(
        self,
        spec: SandboxSpec,
        progress: Progress | None,
        from_snapshot: str | None = None,
        *,
        node: str | None = None,
    ) -> Sandbox:
        key = self.key  # fail on a missing key before anything is made
        say = progress or (lambda _msg: None)
        sandbox_id = new_sandbox_id()
        backend = self.backend
        backend.begin(sandbox_id)
        try:
            t0 = time.monotonic()
            if from_snapshot is None:
                say(f"cloning template {spec.template} -> {sandbox_id}")
                if node is None:
                    record = backend.clone(sandbox_id, spec)
                else:
                    record = placement_backend(backend).clone_on(sandbox_id, spec, node)
            else:
                say(f"forking snapshot {from_snapshot} -> {sandbox_id}")
                record = snapshot_backend(backend).clone_from_snapshot(sandbox_id, spec, from_snapshot)
            say(f"starting {sandbox_id} at {record.ip}")
            record = backend.start(sandbox_id)
            if spec.internet:
                backend.set_internet(record, True)
            if spec.egress:
                backend.set_egress(record, spec.egress)
            say("waiting for SSH")
            sandbox = self._connect(record, key)
            say(f"ready in {time.monotonic() - t0:.2f} s")
            logs.event("create", sandbox_id, backend=backend.name, pooled=False, duration_s=_since(t0))
            return sandbox
        except BaseException as exc:
            step = getattr(exc, "step", None)
            logs.event(
                "create_failed", sandbox_id, level=logging.WARNING, backend=backend.name,
                step=step if isinstance(step, str) else None, error=type(exc).__name__,
            )  # fmt: skip
            try:
                backend.destroy(sandbox_id)
            except Exception as cleanup_exc:  # keep the original error; note the cleanup failure
                exc.add_note(f"cleanup of {sandbox_id} also failed: {cleanup_exc}")
                failed = type(cleanup_exc).__name__
                logs.event("cleanup_failed", sandbox_id, level=logging.WARNING, error=failed)
            raise
        finally:
            backend.end(sandbox_id)

    def _connect(self, record: SandboxRecord, key: paramiko.PKey) -> Sandbox:
        def connect_as(user: str) -> SSHExecutor:
            executor = SSHExecutor(record.ip, user=user, key=key, host_key=parse_public_key(record.host_key))
            # the sandbox user's first connection waits for a booting sshd; root's comes later
            wait = self.settings.ssh_ready_timeout_s
            executor.connect(wait if user == self.settings.ssh_user else min(wait, ROOT_CONNECT_TIMEOUT_S))
            return executor

        return Sandbox(
            record,
            self.backend,
            connect_as(self.settings.ssh_user),
            self.settings.command_timeout_s,
            connect_as if record.spec.root else None,
        )

    def attach(self, sandbox_id: str) -> Sandbox:
        """Reconnect to an existing sandbox by id (from this or another process)."""
        check_sandbox_id(sandbox_id)
        record = self.backend.get(sandbox_id)
        state = self.backend.state(sandbox_id)
        if state in PAUSED_STATES:
            raise SandboxError(f"sandbox {sandbox_id} is paused ({state}): resume it first")
        if state != "running":
            raise SandboxError(f"sandbox {sandbox_id} is {state}, not running")
        return self._connect(record, self.key)

    def state(self, sandbox_id: str) -> str:
        """What the engine says of a sandbox now: ``running``, ``frozen`` (paused), ``stopped``, ...;
        SandboxNotFound if there is none."""
        self.backend.get(check_sandbox_id(sandbox_id))
        return self.backend.state(sandbox_id)

    def pause(self, sandbox_id: str) -> None:
        """Freeze every process of a running sandbox where it stands; nothing in it runs (and no new
        connection to it is made) until :meth:`resume`. Its TTL keeps counting. Idempotent; a backend
        that cannot pause raises ConfigError, a stopped sandbox StateConflict."""
        check_sandbox_id(sandbox_id)
        backend = pause_backend(self.backend)
        t0 = time.monotonic()
        backend.pause(sandbox_id)
        logs.event("pause", sandbox_id, backend=self.backend.name, duration_s=_since(t0))

    def resume(self, sandbox_id: str) -> None:
        """Let a paused sandbox run again from where it stood. Idempotent."""
        check_sandbox_id(sandbox_id)
        backend = pause_backend(self.backend)
        t0 = time.monotonic()
        backend.resume(sandbox_id)
        logs.event("resume", sandbox_id, backend=self.backend.name, duration_s=_since(t0))

    def extend(self, sandbox_id: str, ttl_s: int) -> SandboxRecord:
        """Let a sandbox (running or paused) live ``ttl_s`` seconds from now; its new record.
        :meth:`Sandbox.extend` by id, without connecting to it."""
        return self._respec(sandbox_id, ttl_s=ttl_s)

    def relabel(self, sandbox_id: str, labels: Mapping[str, str]) -> SandboxRecord:
        """Replace a sandbox's labels (running or paused); its expiry stays, to the second."""
        return self._respec(sandbox_id, labels=dict(labels))

    def _respec(self, sandbox_id: str, **changes: Any) -> SandboxRecord:
        record = self.backend.get(check_sandbox_id(sandbox_id))
        if "ttl_s" not in changes:  # the backend counts the expiry from now: keep the current one
            left = None if record.expires_at is None else math.ceil(record.expires_at - time.time())
            changes["ttl_s"] = None if left is None else max(1, left)
        return self.backend.update(record, respec(record.spec, **changes))

    def destroy(self, sandbox_id: str) -> None:
        """Destroy a sandbox by id; SandboxNotFound if there is none."""
        check_sandbox_id(sandbox_id)
        if not self.backend.destroy(sandbox_id):
            raise SandboxNotFound(sandbox_id)
        logs.event("destroy", sandbox_id, backend=self.backend.name)

    # -- snapshots -------------------------------------------------------------------------------
    def snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo:
        """Save a sandbox's files as snapshot ``name`` (see :meth:`Sandbox.snapshot`)."""
        check_sandbox_id(sandbox_id)
        check_snapshot_name(name)
        return snapshot_backend(self.backend).snapshot(sandbox_id, name)

    def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        return snapshot_backend(self.backend).list_snapshots()

    def delete_snapshot(self, name: str) -> None:
        """Delete a snapshot by name (forks made from it are not affected); SnapshotNotFound if none."""
        check_snapshot_name(name)
        if not snapshot_backend(self.backend).delete_snapshot(name):
            raise SnapshotNotFound(name)

    def get(self, sandbox_id: str) -> SandboxRecord:
        return self.backend.get(check_sandbox_id(sandbox_id))

    def list(self, labels: Mapping[str, str] | None = None) -> builtins.list[SandboxRecord]:
        """Sandboxes on this backend, optionally only those carrying all of ``labels``."""
        want = dict(labels or {})
        return [r for r in self.backend.list() if all(r.spec.labels.get(k) == v for k, v in want.items())]

    def gc(self, *, dead_owners: bool = False, dry_run: bool = False) -> builtins.list[GcResult]:
        """Remove leftovers: half-made sandboxes of crashed callers, expired ones and, with
        ``dead_owners``, those whose creating process is gone. Touches only the product's own."""
        out: builtins.list[GcResult] = []
        for cand in self.backend.gc_candidates(now=time.time(), dead_owners=dead_owners):
            if not dry_run:
                with contextlib.suppress(SandboxNotFound):
                    self.backend.destroy(cand.sandbox_id)
                logs.event("gc", cand.sandbox_id, backend=self.backend.name, reason=cand.reason)
            out.append(GcResult(cand.sandbox_id, cand.reason))
        return out
