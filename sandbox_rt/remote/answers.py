"""The HTTP API's answers read strictly: an answer is input like any other (the server may be an
impostor, a proxy may mangle it). Each value is checked for type and range, identities are
compared with what was asked (a status answered for another sandbox is refused), and a malformed
answer is a :class:`~sandbox_rt.errors.BackendError` at step ``remote API``, never a half-read
object or a deep traceback."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import ipaddress
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..errors import BackendError, ConfigError
from ..models import (
    DEFAULT_TEMPLATE,
    EntryInfo,
    ExecResult,
    ProcessInfo,
    ResourceUsage,
    SandboxRecord,
    SandboxSpec,
    SandboxStatus,
    SnapshotInfo,
)
from ..options import MAX_EGRESS_ENTRIES, Option, all_options
from ..output_limits import MAX_NAME_BYTES
from ..validation import TEMPLATE_NAME, check_sandbox_id, check_snapshot_name

__all__ = [
    "bad_answer",
    "decode_json",
    "parse_egress",
    "parse_entry",
    "parse_entry_list",
    "parse_exec_result",
    "parse_internet",
    "parse_list",
    "parse_logs",
    "parse_mkdir",
    "parse_process",
    "parse_process_exit",
    "parse_process_list",
    "parse_record",
    "parse_snapshot",
    "parse_snapshot_list",
    "parse_status",
    "parse_templates",
    "parse_usage",
    "parse_written",
]

T = TypeVar("T")

STEP = "remote API"
# the most bytes read of an answer that is not a file or a command's output (status, errors)
SMALL_ANSWER_BYTES = 1 << 20
LIST_ANSWER_BYTES = 64 << 20
# a command echoed back, a message: longer is cut or refused
MAX_TEXT = 1 << 20
MAX_MESSAGE = 8 << 10
MAX_LIST_ENTRIES = 100_000
MAX_TEMPLATES = 1024  # names in a template list (a host contract holds a handful)
MAX_PID = 1 << 22  # the kernel's largest pid_max: a background command's pid is 2..MAX_PID
MAX_PROCESSES = 1000  # background commands a process list holds at most
MIN_EXIT, MAX_EXIT = -(1 << 31), 1 << 31  # an exit status the server reports

_LABEL_KEY = re.compile(r"[A-Za-z0-9_.\-/]{1,63}")
_HANDLE = re.compile(r"[0-9a-f]{16}")


def bad_answer(what: str) -> BackendError:
    """The server's answer is not what the API documents."""
    return BackendError(f"the server's answer is not valid: {what}", step=STEP)


# -- strict readers of JSON values ------------------------------------------------------------------
def read_object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_answer(f"{what} is not an object")
    return value


def read_member(data: Mapping[str, Any], name: str, what: str) -> Any:
    if name not in data:
        raise bad_answer(f"{what} lacks {name!r}")
    return data[name]


def read_str(value: Any, what: str, max_len: int = 4096) -> str:
    if not isinstance(value, str) or len(value) > max_len or "\x00" in value:
        raise bad_answer(f"{what} is not a string of at most {max_len} characters")
    return value


def read_bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise bad_answer(f"{what} is not true or false")
    return value


def read_num(value: Any, what: str, lo: float = 0.0, hi: float = 1e15) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad_answer(f"{what} is not a finite number")
    if not lo <= value <= hi:
        raise bad_answer(f"{what}={value!r} is out of range")
    return float(value)


def read_int(value: Any, what: str, lo: int = 0, hi: int = 1 << 62) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise bad_answer(f"{what}={value!r:.40} is not a whole number from {lo} to {hi}")
    return value


def read_opt(read: Callable[..., T], value: Any, what: str, *args: Any) -> T | None:
    return None if value is None else read(value, what, *args)


def read_ip(value: Any, what: str) -> str:
    text = read_str(value, what, 64)
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise bad_answer(f"{what}={text!r} is not an IP address") from None
    return text


def read_sandbox_id(value: Any, what: str, expect: str | None = None) -> str:
    text = read_str(value, what, 64)
    try:
        check_sandbox_id(text)
    except ConfigError:
        raise bad_answer(f"{what}={text!r} is not a sandbox id") from None
    if expect is not None and text != expect:
        raise bad_answer(f"{what} is {text!r}, not the sandbox asked about ({expect})")
    return text


def read_array(data: Mapping[str, Any], key: str, what: str, limit: int, noun: str) -> list[Any]:
    """Member ``key`` of ``data``: an array of at most ``limit`` items (each still to be checked)."""
    items = read_member(data, key, what)
    if not isinstance(items, list) or len(items) > limit:
        raise bad_answer(f"{what} is not an array of at most {limit} {noun}")
    return items


def read_labels(value: Any, what: str) -> dict[str, str]:
    data = read_object(value, what)
    if len(data) > 256:
        raise bad_answer(f"{what} has more than 256 labels")
    for key, val in data.items():
        if not _LABEL_KEY.fullmatch(key):
            raise bad_answer(f"{what} has a label key {key!r:.80} that no sandbox can carry")
        read_str(val, f"{what}[{key!r}]", 256)
    return dict(data)


def read_strings(value: Any, what: str, max_items: int, max_len: int = 255) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > max_items:
        raise bad_answer(f"{what} is not a list of at most {max_items} strings")
    return tuple(read_str(v, f"{what} entry", max_len) for v in value)


def read_b64(value: Any, what: str, max_bytes: int) -> bytes:
    text = read_str(value, what, 4 * (max_bytes // 3 + 1))
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise bad_answer(f"{what} is not base64") from None
    if len(data) > max_bytes:
        raise bad_answer(f"{what} holds {len(data)} bytes, more than the {max_bytes} asked for")
    return data


def decode_json(body: bytes, what: str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise bad_answer(f"{what} is not JSON") from None


# -- answers ---------------------------------------------------------------------------------------
def parse_usage(value: Any) -> ResourceUsage:
    data = read_object(value, "usage")
    return ResourceUsage(
        memory_bytes=read_opt(read_int, data.get("memory_bytes"), "usage.memory_bytes"),
        memory_peak_bytes=read_opt(read_int, data.get("memory_peak_bytes"), "usage.memory_peak_bytes"),
        cpu_time_s=read_opt(read_num, data.get("cpu_time_s"), "usage.cpu_time_s"),
        pids=read_opt(read_int, data.get("pids"), "usage.pids"),
        disk_bytes=read_opt(read_int, data.get("disk_bytes"), "usage.disk_bytes"),
    )


def read_option(opt: Option, value: Any, what: str) -> Any:
    """A create option's value as the server reports it (its kind's reader; the ranges are loose: a
    record may predate today's bounds)."""
    if opt.kind == "number":
        return read_num(value, what, 0, 1 << 16)
    if opt.kind == "integer":
        return read_int(value, what)
    if opt.kind == "boolean":
        return read_bool(value, what)
    if opt.kind == "string_map":
        return read_labels(value, what)
    if opt.kind == "string_list":
        return read_strings(value, what, opt.max_items or MAX_LIST_ENTRIES)
    if opt.syntax == "template_name":
        return read_template(value, what)
    return read_str(value, what, 253)


def parse_status(value: Any, expect_id: str | None = None) -> SandboxStatus:
    """A sandbox's status (``GET /v1/sandboxes/{id}``, ``POST /v1/sandboxes``): what it was made
    with (the create options the status holds: each required unless the status has a default for
    it, which older servers leave out) and its state."""
    data = read_object(value, "the status")

    def get(name: str) -> Any:
        return read_member(data, name, "the status")

    kwargs: dict[str, Any] = {
        "id": read_sandbox_id(get("id"), "status.id", expect_id),
        "state": read_str(get("state"), "status.state", 32),
        "ip": read_ip(get("ip"), "status.ip"),
        "uptime_s": read_opt(read_num, get("uptime_s"), "status.uptime_s"),
        "usage": parse_usage(get("usage")),
        "expires_at": read_opt(read_num, get("expires_at"), "status.expires_at"),
    }
    for opt in all_options():
        field = _STATUS_FIELDS.get(opt.name)
        if field is None or (opt.name not in data and field.default is not dataclasses.MISSING):
            continue
        kwargs[opt.name] = read_option(opt, get(opt.name), f"status.{opt.name}")
    return SandboxStatus(**kwargs)


_STATUS_FIELDS = {f.name: f for f in dataclasses.fields(SandboxStatus)}


def read_template(value: Any, what: str) -> str:
    """A template name as the server reports it (the pattern create() takes)."""
    name = read_str(value, what, 40)
    if not TEMPLATE_NAME.fullmatch(name):
        raise bad_answer(f"{what} is not a template name")
    return name


def parse_templates(value: Any) -> list[str]:
    """``GET /v1/templates``: the names create() may use (``default`` first)."""
    data = read_object(value, "the template list")
    items = read_array(data, "templates", "the template list", MAX_TEMPLATES, "names")
    return [read_template(item, "templates[]") for item in items]


def parse_record(value: Any) -> SandboxRecord:
    """A list entry. The API lists what the backend knows without connecting: no host key, no
    owner (those fields are empty), and of the spec the create options it lists (their
    declaration's ``listed``: always, or by newer servers)."""
    data = read_object(value, "a list entry")

    def get(name: str) -> Any:
        return read_member(data, name, "a list entry")

    listed = (o for o in all_options() if o.listed == "always" or (o.listed and o.name in data))
    spec = SandboxSpec(**{o.name: read_option(o, get(o.name), f"sandbox.{o.name}") for o in listed})
    return SandboxRecord(
        id=read_sandbox_id(get("id"), "sandbox.id"),
        hostname=read_str(get("hostname"), "sandbox.hostname", 253),
        ip=read_ip(get("ip"), "sandbox.ip"),
        host_key="",
        spec=spec,
        created_at=read_num(get("created_at"), "sandbox.created_at"),
        expires_at=read_opt(read_num, get("expires_at"), "sandbox.expires_at"),
        owner_pid=0,
        owner_host="",
        backend=read_str(get("backend"), "sandbox.backend", 32),
    )


def parse_list(value: Any, labels: Mapping[str, str]) -> list[SandboxRecord]:
    data = read_object(value, "the list")
    items = read_array(data, "sandboxes", "the list", MAX_LIST_ENTRIES, "sandboxes")
    records = [parse_record(item) for item in items]
    for r in records:  # what was asked for: a server that ignores the filter must not widen it
        if any(r.spec.labels.get(k) != v for k, v in labels.items()):
            raise bad_answer(f"the list holds {r.id}, which lacks the labels asked for")
    return records


def parse_exec_result(value: Any, max_output: int) -> ExecResult:
    """A JSON exec answer (asked with ``encoding: base64``: the exact bytes)."""
    data = read_object(value, "the exec result")

    def get(name: str) -> Any:
        return read_member(data, name, "the exec result")

    if get("encoding") != "base64":
        raise bad_answer("the exec result is not base64-encoded as asked")
    result = ExecResult(
        command=read_str(get("command"), "result.command", MAX_TEXT),
        stdout=read_b64(get("stdout"), "result.stdout", max_output),
        stderr=read_b64(get("stderr"), "result.stderr", max_output),
        exit_code=read_int(get("exit_code"), "result.exit_code", -(1 << 31), 1 << 31),
        duration_s=read_num(get("duration_s"), "result.duration_s"),
        stdout_dropped=read_int(get("stdout_dropped"), "result.stdout_dropped"),
        stderr_dropped=read_int(get("stderr_dropped"), "result.stderr_dropped"),
    )
    if read_bool(get("truncated"), "result.truncated") != result.truncated:
        raise bad_answer("result.truncated disagrees with stdout_dropped/stderr_dropped")
    return result


def parse_snapshot(value: Any, name: str, source_id: str | None) -> SnapshotInfo:
    data = read_object(value, "the snapshot")

    def get(field: str) -> Any:
        return read_member(data, field, "the snapshot")

    got = read_str(get("name"), "snapshot.name", 64)
    if got != name:
        raise bad_answer(f"snapshot.name is {got!r}, not the name asked for ({name!r})")
    return SnapshotInfo(
        name=got,
        source_id=read_sandbox_id(get("source_id"), "snapshot.source_id", source_id),
        created_at=read_num(get("created_at"), "snapshot.created_at"),
        backend=read_str(get("backend"), "snapshot.backend", 32),
        size_bytes=read_opt(read_int, data.get("size_bytes"), "snapshot.size_bytes"),
        template=(
            read_template(data["template"], "snapshot.template") if "template" in data else DEFAULT_TEMPLATE
        ),
    )


_ENTRY_TYPES = ("file", "dir", "symlink", "other")
MAX_PATH = 4096


def _read_remote_path(value: Any, what: str) -> str:
    text = read_str(value, what, MAX_PATH)
    if not text.startswith("/") or "\x00" in text:
        raise bad_answer(f"{what} {text!r:.60} is not an absolute path")
    return text


def parse_entry(value: Any, what: str = "the entry") -> EntryInfo:
    """A file system entry the server reports (``sb.files.stat``/``list``), every field checked."""
    data = read_object(value, what)

    def get(name: str) -> Any:
        return read_member(data, name, what)

    name = read_str(get("name"), f"{what}.name", MAX_NAME_BYTES)
    path = _read_remote_path(get("path"), f"{what}.path")
    if name != "/" and (name in ("", ".", "..") or "/" in name or "\x00" in name):
        raise bad_answer(f"{what}.name {name!r:.60} is not one path component")
    kind = read_str(get("type"), f"{what}.type", 16)
    if kind not in _ENTRY_TYPES:
        raise bad_answer(f"{what}.type {kind!r} is not one of {', '.join(_ENTRY_TYPES)}")
    mode = read_int(get("mode"), f"{what}.mode")
    if mode > 0o7777:
        raise bad_answer(f"{what}.mode {mode} is more than permission bits")
    target = data.get("symlink_target")
    return EntryInfo(
        name=name,
        path=path,
        type=kind,  # type: ignore[arg-type]  # checked against the literal's values above
        size=read_int(get("size"), f"{what}.size"),
        mode=mode,
        mtime=read_num(get("mtime"), f"{what}.mtime"),
        symlink_target=None if target is None else read_str(target, f"{what}.symlink_target", MAX_PATH),
    )


def parse_entry_list(value: Any, max_entries: int) -> list[EntryInfo]:
    """``GET .../files/list``: at most ``max_entries`` entries, each checked."""
    data = read_object(value, "the listing")
    items = read_array(data, "entries", "the listing", max_entries, "entries")
    return [parse_entry(item, "an entry") for item in items]


def parse_mkdir(value: Any) -> bool:
    data = read_object(value, "the mkdir answer")
    return read_bool(read_member(data, "created", "the mkdir answer"), "mkdir.created")


def parse_snapshot_list(value: Any) -> list[SnapshotInfo]:
    """``GET /v1/snapshots``: each entry checked as the snapshot answer is (any source, any name)."""
    data = read_object(value, "the snapshot list")
    items = read_array(data, "snapshots", "the snapshot list", MAX_LIST_ENTRIES, "snapshots")
    out = []
    for item in items:
        entry = read_object(item, "a snapshot")
        name = read_str(read_member(entry, "name", "a snapshot"), "snapshot.name", 64)
        try:
            check_snapshot_name(name)
        except ConfigError:
            raise bad_answer(f"snapshot.name {name!r:.60} is not a snapshot name") from None
        out.append(parse_snapshot(entry, name, None))
    return out


def parse_internet(value: Any, sandbox_id: str, enabled: bool) -> None:
    data = read_object(value, "the internet answer")
    read_sandbox_id(read_member(data, "id", "the internet answer"), "internet.id", sandbox_id)
    if read_bool(read_member(data, "internet", "the internet answer"), "internet.internet") is not enabled:
        raise bad_answer(f"the server says internet is {not enabled}, not {enabled} as asked")


def parse_egress(value: Any, sandbox_id: str, asked: int) -> tuple[str, ...]:
    data = read_object(value, "the egress answer")
    read_sandbox_id(read_member(data, "id", "the egress answer"), "egress.id", sandbox_id)
    listed = read_member(data, "egress", "the egress answer")
    entries = read_strings(listed, "egress.egress", MAX_EGRESS_ENTRIES)
    if len(entries) > asked:  # normalising merges duplicates, never adds
        raise bad_answer(f"the server allows {len(entries)} egress entries; {asked} were asked for")
    return entries


def parse_written(value: Any, path: str, size: int) -> None:
    data = read_object(value, "the write answer")
    if read_member(data, "path", "the write answer") != path:
        raise bad_answer("the write answer names another path")
    if read_int(read_member(data, "size", "the write answer"), "write.size") != size:
        raise bad_answer(f"the server wrote {data['size']} bytes, not the {size} sent")


# -- background commands (sb.commands) --------------------------------------------------------------
def read_pid(value: Any, what: str, expect: int | None = None) -> int:
    """A background command's pid (its process group): 2..MAX_PID, the one asked about if any."""
    pid = read_int(value, what, 2, MAX_PID)
    if expect is not None and pid != expect:
        raise bad_answer(f"{what} is {pid}, not the process asked about ({expect})")
    return pid


def parse_process(value: Any, what: str = "the process", expect_pid: int | None = None) -> ProcessInfo:
    """A background command the server reports (started, listed, looked up, killed), every field
    checked; a command said to be running with an exit code is a contradiction, refused."""
    data = read_object(value, what)

    def get(name: str) -> Any:
        return read_member(data, name, what)

    handle = read_str(get("handle"), f"{what}.handle", 16)
    if not _HANDLE.fullmatch(handle):
        raise bad_answer(f"{what}.handle {handle!r} is not 16 hex digits")
    info = ProcessInfo(
        pid=read_pid(get("pid"), f"{what}.pid", expect_pid),
        handle=handle,
        command=read_str(get("command"), f"{what}.command", MAX_TEXT),
        running=read_bool(get("running"), f"{what}.running"),
        exit_code=read_opt(read_int, get("exit_code"), f"{what}.exit_code", MIN_EXIT, MAX_EXIT),
    )
    if info.running and info.exit_code is not None:
        raise bad_answer(f"{what} is running and has exit code {info.exit_code}")
    return info


def parse_process_list(value: Any) -> list[ProcessInfo]:
    """``GET .../processes``: at most MAX_PROCESSES entries, each checked."""
    data = read_object(value, "the process list")
    items = read_array(data, "processes", "the process list", MAX_PROCESSES, "processes")
    return [parse_process(item, "a process") for item in items]


def parse_process_exit(value: Any, pid: int) -> int:
    """``POST .../processes/{pid}/wait``: the exit status of the process asked about."""
    data = read_object(value, "the wait answer")
    read_pid(read_member(data, "pid", "the wait answer"), "wait.pid", pid)
    return read_int(read_member(data, "exit_code", "the wait answer"), "wait.exit_code", MIN_EXIT, MAX_EXIT)


def parse_logs(value: Any, stdout_offset: int, stderr_offset: int, max_bytes: int) -> tuple[bytes, bytes]:
    """``GET .../logs`` asked with ``encoding=base64``: (stdout, stderr), each at most ``max_bytes``
    from the offsets given. The offsets answered must be those plus the bytes given back: a server
    that says otherwise would make the next read skip or repeat output, so it is refused."""
    data = read_object(value, "the logs")

    def get(name: str) -> Any:
        return read_member(data, name, "the logs")

    if get("encoding") != "base64":
        raise bad_answer("the logs are not base64-encoded as asked")
    out: list[bytes] = []
    for name, offset in (("stdout", stdout_offset), ("stderr", stderr_offset)):
        chunk = read_b64(get(name), f"logs.{name}", max_bytes)
        told = read_int(get(f"{name}_offset"), f"logs.{name}_offset")
        if told != offset + len(chunk):
            raise bad_answer(
                f"logs.{name}_offset is {told}, not {offset + len(chunk)} ({offset} asked from, "
                f"{len(chunk)} bytes given)"
            )
        out.append(chunk)
    return out[0], out[1]
