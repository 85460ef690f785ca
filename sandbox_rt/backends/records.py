"""What the backends share about a sandbox's stored record: the spec as JSON (LXC's record file,
PVE's description line) and the marker of a ``root=True`` sandbox in PID 1's environment."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..models import SandboxSpec

__all__ = ["ROOT_ENV", "spec_from_json", "spec_to_json"]

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
    return SandboxSpec(**values)
