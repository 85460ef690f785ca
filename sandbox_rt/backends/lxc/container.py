"""One container dir of the LXC path: its LXC ``config`` (read, replaced atomically; the keys the
runtime writes per clone) and the
runtime's record beside it (``sandbox_rt.json``: outside the container's root, so the sandbox
cannot alter it)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any

from ...errors import BackendError, SandboxNotFound
from ...models import SandboxRecord
from ..records import spec_from_json, spec_to_json
from .userinit import INIT_KEYS

__all__ = [
    "ISOLATION_KEYS",
    "LIMIT_KEYS",
    "RECORD_FILE",
    "RUNTIME_KEYS",
    "config_lines",
    "config_value",
    "id_base",
    "read_record",
    "replace_config",
    "rootfs_dirs",
    "write_record",
]

RECORD_FILE = "sandbox_rt.json"

# config keys the runtime writes per clone (whatever the template had for them is replaced)
RUNTIME_KEYS = (
    "lxc.uts.name",
    "lxc.net.0.link",
    "lxc.net.0.ipv4.",
    "lxc.net.0.hwaddr",
    "lxc.net.0.veth.pair",
    "lxc.cgroup.memory.",
    "lxc.cgroup.pids.",
    "lxc.cgroup.cpu.",
    "lxc.cgroup2.memory.",
    "lxc.cgroup2.pids.",
    "lxc.cgroup2.cpu.",
    "lxc.cgroup.cpuset.",
    "lxc.cgroup2.cpuset.",
    "lxc.cgroup.blkio.",
    "lxc.cgroup2.io.",
    *INIT_KEYS,
)
LIMIT_KEYS = tuple(k for k in RUNTIME_KEYS if k.startswith("lxc.cgroup"))  # the limit keys among them
ISOLATION_KEYS = ("lxc.idmap", "lxc.rootfs.path")  # replaced per clone with isolated id maps


def config_lines(cdir: Path) -> list[str]:
    return (cdir / "config").read_text().splitlines()


def config_value(lines: list[str], key: str) -> str | None:
    """The first value of ``key`` in config ``lines``."""
    for line in lines:
        k, sep, v = line.partition("=")
        if sep and k.strip() == key:
            return v.strip()
    return None


def replace_config(cdir: Path, lines: list[str]) -> None:
    """Write the container's config whole (a reader sees the old one or the new one)."""
    tmp = cdir / "config.new"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(cdir / "config")


def rootfs_dirs(cdir: Path) -> tuple[Path, Path]:
    """(lower, upper) of an overlay clone."""
    value = config_value(config_lines(cdir), "lxc.rootfs.path") or ""
    kind, _, rest = value.partition(":")
    if kind not in ("overlay", "overlayfs") or ":" not in rest:
        raise BackendError(f"{cdir.name} is not an overlay clone (rootfs {value!r})", step="clone")
    lower, _, upper = rest.partition(":")
    return Path(lower), Path(upper)


def id_base(cdir: Path, default: int) -> int:
    """The host uid that is root in the container (its ``lxc.idmap = u 0 <base> ...``)."""
    for line in config_lines(cdir):
        key, _, value = line.partition("=")
        words = value.split()
        if key.strip() == "lxc.idmap" and len(words) == 4 and words[:2] == ["u", "0"]:
            return int(words[2])
    return default


def write_record(
    cdir: Path, record: SandboxRecord, owner_start: int | None, template_container: str | None = None
) -> None:
    """Write the record whole; ``template_container`` (the template generation the sandbox was cloned
    from, generations.py) is given by the clone and kept from the stored record after that."""
    path = cdir / RECORD_FILE
    if template_container is None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            template_container = json.loads(path.read_text()).get("template_container")
    data = dataclasses.asdict(record)
    data["spec"] = spec_to_json(record.spec)
    data["owner_start_time"] = owner_start
    if template_container is not None:
        data["template_container"] = template_container
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)


def read_record(cdir: Path) -> tuple[SandboxRecord, dict[str, Any]]:
    """(the record, what else was stored: ``owner_start_time``, ``template_container`` (None in a
    record written before template generations)); SandboxNotFound without one."""
    try:
        data = json.loads((cdir / RECORD_FILE).read_text())
    except FileNotFoundError as exc:
        raise SandboxNotFound(cdir.name) from exc
    except (OSError, ValueError) as exc:
        raise BackendError(f"record of {cdir.name} is unreadable: {exc}", step="attach") from exc
    extra = {
        "owner_start_time": data.pop("owner_start_time", None),
        "template_container": data.pop("template_container", None),
    }
    data["spec"] = spec_from_json(data["spec"])
    return SandboxRecord(**data), extra
