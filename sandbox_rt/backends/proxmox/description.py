"""What a sandbox's CT carries about it, as text the runtime writes through the API: its tags (the
product's tag, the sandbox id, its address, its expiry), the record line, the caps it asks the node
for and the lines the node's hookscript publishes (host key, caps applied) in the description, the
template note of a snapshot's description."""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

from ...models import DEFAULT_TEMPLATE, SandboxSpec
from ...validation import SANDBOX_ID, TEMPLATE_NAME

__all__ = [
    "CAPS",
    "CAPS_APPLIED_PREFIX",
    "CAPS_PREFIX",
    "CAPS_REFUSED_PREFIX",
    "HOSTKEY_PREFIX",
    "RECORD_PREFIX",
    "TAG",
    "TEMPLATE_NOTE",
    "applied_caps_of",
    "caps_line",
    "caps_mismatch",
    "host_key_of",
    "parse_record",
    "refused_caps_of",
    "sandbox_id_tag",
    "snapshot_template",
    "tags_of",
]

TAG = "sandbox-rt"
RECORD_PREFIX = "sandbox-rt-record: "
HOSTKEY_PREFIX = "sandbox-rt-ssh-host-key: "
# The caps PVE's CT config has no option for: asked by the runtime, applied at post-start by the
# node's hookscript (roles/proxmox_hookscript), which bounds them by the node's ceilings and
# publishes what holds. One strict line each, so the hookscript's parser stays a regex.
CAPS = ("pids_max", "disk_mbps", "disk_iops")
CAPS_PREFIX = "sandbox-rt-caps: "
CAPS_APPLIED_PREFIX = "sandbox-rt-caps-applied: "
# published instead when the node refused the CT's caps (its pids budget): why, in the node's words
CAPS_REFUSED_PREFIX = "sandbox-rt-caps-refused: "
_APPLIED = re.compile(r"pids_max=(\d{1,9}) disk_mbps=(\d{1,9}) disk_iops=(\d{1,9}) device=(\d+:\d+|-)")
# a snapshot's description ends with this and its source's template (forks are of that template)
TEMPLATE_NOTE = "; template "


def tags_of(raw: Any) -> set[str]:
    return {t for t in re.split(r"[;, ]+", str(raw or "")) if t}


def sandbox_id_tag(tags: set[str]) -> str | None:
    """The sandbox id among a CT's tags (``sbx-<10 hex>``), if it carries one."""
    return next((t for t in sorted(tags) if SANDBOX_ID.fullmatch(t)), None)


def snapshot_template(description: str) -> str:
    """The template named at the end of a snapshot's description (older snapshots: ``default``)."""
    _, sep, name = description.rstrip().rpartition(TEMPLATE_NOTE)
    return name if sep and TEMPLATE_NAME.fullmatch(name) else DEFAULT_TEMPLATE


def parse_record(description: str) -> dict[str, Any] | None:
    """The runtime's record line of a CT's description (None without one)."""
    for line in description.splitlines():
        if line.startswith(RECORD_PREFIX):
            with contextlib.suppress(ValueError):
                data = json.loads(line[len(RECORD_PREFIX) :])
                return data if isinstance(data, dict) else None
    return None


def host_key_of(description: str) -> str:
    """The host key the hookscript published in a CT's description ("" without one)."""
    for line in description.splitlines():
        if line.startswith(HOSTKEY_PREFIX):
            return line[len(HOSTKEY_PREFIX) :].strip()
    return ""


def caps_line(spec: SandboxSpec) -> str:
    """The description line that asks the node's hookscript for ``spec``'s caps."""
    return CAPS_PREFIX + " ".join(f"{name}={getattr(spec, name)}" for name in CAPS)


def applied_caps_of(description: str) -> dict[str, int | str] | None:
    """The caps the hookscript published as applied at the CT's last start (None without a line, or
    with one that does not parse): ``pids_max``, ``disk_mbps``, ``disk_iops`` and ``device``."""
    for line in description.splitlines():
        if line.startswith(CAPS_APPLIED_PREFIX):
            m = _APPLIED.fullmatch(line[len(CAPS_APPLIED_PREFIX) :].strip())
            if m is None:
                return None
            values: dict[str, int | str] = {name: int(m.group(i + 1)) for i, name in enumerate(CAPS)}
            values["device"] = m.group(4)
            return values
    return None


def refused_caps_of(description: str) -> str | None:
    """Why the node's hookscript refused the CT's caps at its last start (None if it did not): the
    node's own words, shortened (they come from a node, not from the sandbox)."""
    for line in description.splitlines():
        if line.startswith(CAPS_REFUSED_PREFIX):
            return line[len(CAPS_REFUSED_PREFIX) :].strip()[:500]
    return None


def caps_mismatch(spec: SandboxSpec, applied: dict[str, int | str]) -> list[tuple[str, int, int]]:
    """(cap, asked, applied) for each cap that does not hold as ``spec`` asks: applied other than
    asked (0 asks for none: then whatever the node's ceiling set is fine)."""
    out = []
    for name in CAPS:
        asked, got = int(getattr(spec, name)), int(applied[name])
        if asked and got != asked:
            out.append((name, asked, got))
    return out
