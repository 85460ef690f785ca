"""The Proxmox backend's ground floor: the API connection, every call through it (typed errors,
retries while a CT is locked, tasks waited for and bounded) and finding a sandbox's CT."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import re
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException
from proxmoxer.tools import Tasks

from ...config import Settings
from ...errors import BackendError, ConfigError, PermissionDenied, SandboxNotFound
from ...models import SandboxRecord
from ..intents import CreateMarkers
from ..owner import process_start_time
from ..records import spec_from_json, spec_to_json
from .description import (
    CAPS_APPLIED_PREFIX,
    HOSTKEY_PREFIX,
    RECORD_PREFIX,
    TAG,
    caps_line,
    host_key_of,
    parse_record,
    tags_of,
)

__all__ = ["NodeUnreachable", "PveCore", "pve_bool"]

T = TypeVar("T")
_LOCKED = re.compile(r"is locked|got timeout|can't lock file", re.I)


class NodeUnreachable(BackendError):
    """PVE answered 595: the API node cannot reach the node the call was for (it is offline, or its
    pveproxy is down). Only that node is affected: the placement tries the next one."""


def pve_bool(value: bool) -> int:
    """PVE takes 0/1 for booleans at the top level (proxmoxer would send 'True')."""
    return 1 if value else 0


class PveCore:
    """The connection, the API calls and the lookups every other part of the backend uses."""

    name = "proxmox"

    def __init__(self, settings: Settings, api: ProxmoxAPI | None = None) -> None:
        self.settings = settings
        self.api = api or self._connect(settings)
        self.net = settings.network
        self.state_dir = settings.state_dir / "proxmox"
        self.intents = self.state_dir / "creating"
        self.markers = CreateMarkers(self.intents)
        self.task_timeout_s = settings.pve_task_timeout_s
        # CTs a create left on a node it could not reach (595) before it moved on to another node:
        # <vmid>.json {sandbox_id, node, vmid}; never the sandbox's CT, removed by gc once reachable
        self.stranded_dir = self.state_dir / "stranded"

    @staticmethod
    def _connect(s: Settings) -> ProxmoxAPI:
        url = urlparse(s.pve_url)
        if url.scheme != "https" or not url.hostname:
            raise ConfigError(f"pve_url={s.pve_url!r} must be an https:// URL")
        user, _, token_name = s.pve_token_id.partition("!")
        secret = s.pve_token_secret
        if not secret and s.pve_token_secret_file:
            try:
                secret = Path(s.pve_token_secret_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read pve_token_secret_file: {exc.strerror}") from exc
        verify: bool | str = True
        if s.pve_verify.lower() in ("false", "0", "no"):
            # only when the operator set pve_verify=false explicitly, and never silently
            warnings.warn("TLS verification of the PVE API is off (pve_verify=false)", stacklevel=3)
            verify = False
        elif s.pve_verify.lower() not in ("true", "1", "yes"):
            if not Path(s.pve_verify).is_file():
                raise ConfigError(f"pve_verify={s.pve_verify!r} is neither true/false nor a CA file")
            verify = s.pve_verify
        return ProxmoxAPI(
            url.hostname,
            port=url.port or 8006,
            user=user,
            token_name=token_name,
            token_value=secret,
            verify_ssl=verify,
            timeout=30,
        )

    def _call(self, step: str, fn: Callable[[], T]) -> T:
        """One API call; PVE's errors become typed errors naming the step.

        502/503/504 (the proxy did not pass the call on: pvedaemon restarting or overloaded) are
        tried 3 times over ~0.75 s; other answers are final at once.
        """
        for attempt in range(3):
            try:
                return fn()
            except ResourceException as exc:
                # proxmoxer: status_message is the generic HTTP phrase, content PVE's own message
                message = str(exc.content or exc.status_message).strip()
                if exc.errors:
                    message += f" {exc.errors}"
                if exc.status_code == 403:
                    raise PermissionDenied(f"the API token lacks a privilege: {message}", step=step) from exc
                if exc.status_code == 595:
                    raise NodeUnreachable(f"595 {message}", step=step) from exc
                if exc.status_code not in (502, 503, 504):
                    raise BackendError(f"{exc.status_code} {message}", step=step) from exc
                if attempt == 2:
                    raise BackendError(
                        f"{exc.status_code} {message} (3 attempts): the PVE API at {self.settings.pve_url} "
                        "is unavailable; check pveproxy and pvedaemon on the node, then retry",
                        step=step,
                    ) from exc
            except OSError as exc:  # requests' connection errors are OSErrors
                raise BackendError(
                    f"cannot reach the PVE API at {self.settings.pve_url}: {exc}", step=step
                ) from exc
            time.sleep(0.25 * 2**attempt)
        raise AssertionError("unreachable")

    def _retrying(
        self, step: str, fn: Callable[[], T], *, attempts: int | None = None, vmid: int | None = None
    ) -> T:
        """Retry ``fn`` while PVE says the CT is locked (another task holds it), with jittered
        back-off, for at most ``pve_task_timeout_s`` (and ``attempts`` tries, if given): the task
        holding the lock is itself bounded by that time. ``vmid`` names the CT in the error."""
        start = time.monotonic()
        delay = 0.05
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._call(step, fn)
            except BackendError as exc:
                if isinstance(exc, PermissionDenied) or not _LOCKED.search(str(exc)):
                    raise
                elapsed = time.monotonic() - start
                if elapsed + delay > self.task_timeout_s or (attempts is not None and attempt >= attempts):
                    ct = f"CT {vmid}" if vmid is not None else "the CT"
                    raise BackendError(
                        f"{str(exc).removeprefix(step + ': ')} - still locked after {attempt} attempts "
                        f"in {elapsed:.1f} s (pve_task_timeout_s={self.task_timeout_s:g}): another PVE "
                        f"task holds {ct}; let it finish (node's task list), or if none runs any more, "
                        f"unlock it on the node: pct unlock {vmid if vmid is not None else '<vmid>'}",
                        step=step,
                    ) from exc
            time.sleep(delay * random.uniform(0.5, 1.0))  # back-off while another task holds the lock
            delay = min(delay * 2, 1.0)

    def _wait(self, upid: str, step: str) -> None:
        """Wait for a task, at most ``pve_task_timeout_s``; then it is stopped (PVE's worker runs its
        own cleanup, e.g. a stopped clone removes the new CT) and the step fails."""
        status = self._call(
            step,
            lambda: Tasks.blocking_status(self.api, upid, timeout=self.task_timeout_s, polling_interval=0.05),
        )
        if status is None:
            node = Tasks.decode_upid(upid)["node"]
            with contextlib.suppress(BackendError):  # best effort; the error below says what to do
                self._call(step, lambda: self.api.nodes(node).tasks(upid).delete())
                self._call(
                    step,
                    lambda: Tasks.blocking_status(
                        self.api, upid, timeout=min(self.task_timeout_s, 10.0), polling_interval=0.05
                    ),
                )
            raise BackendError(
                f"PVE task {upid} did not finish within pve_task_timeout_s={self.task_timeout_s:g} s "
                f"and was stopped; see its log on node {node} (a hung storage or lock is the usual "
                "cause), or raise pve_task_timeout_s if the node is only slow",
                step=step,
                detail=self._task_log(upid),
            )
        exitstatus = str(status.get("exitstatus", ""))
        if exitstatus != "OK":
            raise BackendError(f"task failed: {exitstatus}", step=step, detail=self._task_log(upid))

    def _task_log(self, upid: str) -> str:
        node = Tasks.decode_upid(upid)["node"]
        with contextlib.suppress(Exception):
            lines = self.api.nodes(node).tasks(upid).log.get(limit=50)
            return "\n".join(str(entry.get("t", "")) for entry in lines)
        return ""

    def _ct(self, node: str, vmid: int) -> Any:
        return self.api.nodes(node).lxc(vmid)

    def _resources(self) -> list[dict[str, Any]]:
        items = self._call("list", lambda: self.api.cluster.resources.get(type="vm"))
        return [r for r in items if r.get("type") == "lxc"]

    def _ours(self) -> list[dict[str, Any]]:
        return [r for r in self._resources() if TAG in tags_of(r.get("tags"))]

    def _strand(self, sandbox_id: str, node: str, vmid: int) -> None:
        """Remember CT ``vmid`` on ``node`` as left behind by a create that moved on (see gc)."""
        self.stranded_dir.mkdir(parents=True, exist_ok=True)
        entry = {"sandbox_id": sandbox_id, "node": node, "vmid": vmid}
        (self.stranded_dir / f"{vmid}.json").write_text(json.dumps(entry))

    def _stranded(self) -> dict[int, dict[str, Any]]:
        """VMID -> {sandbox_id, node, vmid} of every CT a create left on an unreachable node."""
        out: dict[int, dict[str, Any]] = {}
        if self.stranded_dir.is_dir():
            for f in self.stranded_dir.glob("*.json"):
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    entry = json.loads(f.read_text())
                    out[int(entry["vmid"])] = entry
        return out

    def _unstrand(self, vmid: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.stranded_dir / f"{vmid}.json").unlink()

    def _find(self, sandbox_id: str) -> tuple[str, int]:
        resources = self._resources()
        stranded = self._stranded()
        hits = [
            (str(r["node"]), int(r["vmid"]))
            for r in resources
            if sandbox_id in tags_of(r.get("tags"))
            and stranded.get(int(r["vmid"]), {}).get("node") != str(r["node"])
        ]
        if not hits:
            raise SandboxNotFound(sandbox_id)
        if len(hits) > 1:  # a fork being made carries its source's tags until its config write
            for where in hits:
                with contextlib.suppress(BackendError):
                    if self._is_ours(where, sandbox_id):  # the description names the CT's own id
                        return where
        return hits[0]

    def _is_ours(self, where: tuple[str, int], sandbox_id: str) -> bool:
        """A CT (maybe untagged yet) is ours if its description carries our record for this id."""
        node, vmid = where
        conf = self._call("destroy", lambda: self._ct(node, vmid).config.get())
        rec = self._parse_record(str(conf.get("description", "")))
        return rec is not None and rec.get("id") == sandbox_id

    def _record_line(self, record: SandboxRecord) -> str:
        data = dataclasses.asdict(record)
        data["spec"] = spec_to_json(record.spec)
        data["host_key"] = ""  # the published key line is the source of truth
        data["owner_start_time"] = process_start_time(record.owner_pid)
        return RECORD_PREFIX + json.dumps(data, sort_keys=True, separators=(",", ":"))

    def _spec_description(self, record: SandboxRecord) -> str:
        """What the runtime writes into a CT's description: the record line and the caps it asks the
        node's hookscript for (description.py)."""
        return self._record_line(record) + "\n" + caps_line(record.spec)

    def _description(self, record: SandboxRecord, conf: dict[str, Any]) -> str:
        """The CT's description for ``record``, keeping the lines the hookscript published (the host
        key, the caps it applied at the CT's start)."""
        lines = [self._spec_description(record)]
        for line in str(conf.get("description", "")).splitlines():
            if line.startswith((HOSTKEY_PREFIX, CAPS_APPLIED_PREFIX)):
                lines.append(line)
        return "\n".join(lines)

    @staticmethod
    def _parse_record(description: str) -> dict[str, Any] | None:
        return parse_record(description)

    @staticmethod
    def _host_key_of(description: str) -> str:
        return host_key_of(description)

    def get(self, sandbox_id: str) -> SandboxRecord:
        return self._record_at(*self._find(sandbox_id))

    def _record_at(self, node: str, vmid: int) -> SandboxRecord:
        """The record in the description of CT ``vmid`` on ``node``."""
        conf = self._call("attach", lambda: self._ct(node, vmid).config.get())
        return self._record_of(conf, vmid)

    def _record_of(self, conf: dict[str, Any], vmid: int) -> SandboxRecord:
        """The record in CT ``vmid``'s config ``conf`` (its description)."""
        description = str(conf.get("description", ""))
        data = self._parse_record(description)
        if data is None:
            raise BackendError(f"CT {vmid} carries no sandbox-rt record", step="attach")
        data.pop("owner_start_time", None)
        spec = spec_from_json(data.pop("spec", {}))
        data["host_key"] = self._host_key_of(description)
        return SandboxRecord(spec=spec, **data)
