"""What the backends share about a sandbox's stored record: the spec as JSON (LXC's record file,
PVE's description line) and the marker of a ``root=True`` sandbox in PID 1's environment."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from typing import Any

from ..models import SandboxRecord, SandboxSpec, VolumeMount

__all__ = ["ROOT_ENV", "new_record", "spec_from_json", "spec_to_json", "updated_record"]

# PID 1's environment entry of a sandbox made with root=True (LXC: lxc.environment of the clone's
# config; PVE: the CT's ``env`` option). The template's /sbin/sandbox-init lets root log in over SSH
# only when it sees it (roles/sandbox_template: SBX-SSH-01's exception); nothing inside sets it.
ROOT_ENV = "SANDBOX_RT_ROOT=1"


def spec_to_json(spec: SandboxSpec) -> dict[str, Any]:
    return dataclasses.asdict(spec)


def spec_from_json(data: dict[str, Any]) -> SandboxSpec:
    """A stored spec; fields it lacks (a record written by an older version) take their defaults,
    fields this version does not know are ignored."""
    known = {f.name for f in dataclasses.fields(SandboxSpec)}
    values = {k: v for k, v in data.items() if k in known}
    values["egress"] = tuple(values.get("egress") or ())
    mount_fields = {f.name for f in dataclasses.fields(VolumeMount)}
    values["volumes"] = tuple(
        VolumeMount(**{k: v for k, v in m.items() if k in mount_fields}) for m in values.get("volumes") or ()
    )
    return SandboxSpec(**values)


def new_record(sandbox_id: str, spec: SandboxSpec, *, ip: str, host_key: str, backend: str) -> SandboxRecord:
    """The record of a sandbox being made now by this process: its name (the id unless the spec
    names one), its expiry from ``ttl_s``, and its owner (none for a detached one)."""
    now = time.time()
    return SandboxRecord(
        id=sandbox_id,
        hostname=spec.hostname or sandbox_id,
        ip=ip,
        host_key=host_key,
        spec=spec,
        created_at=now,
        expires_at=now + spec.ttl_s if spec.ttl_s else None,
        owner_pid=0 if spec.detached else os.getpid(),
        owner_host=socket.gethostname(),
        backend=backend,
    )


def updated_record(record: SandboxRecord, spec: SandboxSpec) -> SandboxRecord:
    """``record`` given a new spec (a warm sandbox handed out, a TTL extended): the spec's name or
    the old one, the expiry counted from now; ``root`` and ``template`` stay what the sandbox was
    made with."""
    hostname = spec.hostname or record.hostname
    ttl = spec.ttl_s
    return dataclasses.replace(
        record,
        hostname=hostname,
        spec=dataclasses.replace(
            spec, hostname=hostname, root=record.spec.root, template=record.spec.template
        ),
        expires_at=time.time() + ttl if ttl else None,
    )
