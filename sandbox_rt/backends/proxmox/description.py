"""What a sandbox's CT carries about it, as text the runtime writes through the API: its tags (the
product's tag, the sandbox id, its address, its expiry), the record line and the published host key
in the description, the template note of a snapshot's description."""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

from ...models import DEFAULT_TEMPLATE
from ...validation import SANDBOX_ID, TEMPLATE_NAME

__all__ = [
    "HOSTKEY_PREFIX",
    "RECORD_PREFIX",
    "TAG",
    "TEMPLATE_NOTE",
    "host_key_of",
    "parse_record",
    "sandbox_id_tag",
    "snapshot_template",
    "tags_of",
]

TAG = "sandbox-rt"
RECORD_PREFIX = "sandbox-rt-record: "
HOSTKEY_PREFIX = "sandbox-rt-ssh-host-key: "
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
