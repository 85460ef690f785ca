"""The HTTP API's requests as :class:`~sandbox_rt.remote.wire.Call` values: one builder per route,
shared by the sync and the async client (which only send them)."""

from __future__ import annotations

import builtins
import logging
import os
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, Unpack

from ..api_token import check_token, is_loopback, load_token  # the server's token rules, shared
from ..errors import ConfigError
from ..files import LIST_MAX_ENTRIES, MAX_LIST_DEPTH
from ..models import (
    EntryInfo,
    ExecResult,
    ProcessInfo,
    SandboxRecord,
    SandboxStatus,
    SnapshotInfo,
    VolumeMount,
)
from ..options import CreateOptions, door_options, mounts_to_wire, named, take
from ..output_limits import DEFAULT_READ_MAX_BYTES
from ..validation import (
    MAX_TTL_S,
    check_max_bytes,
    check_remote_path,
    check_sandbox_id,
    check_signal,
    check_snapshot_name,
    check_timeout,
)
from ..volumes import check_mounts
from . import answers, wire
from .error_map import ErrorContext
from .wire import Call

T = TypeVar("T")

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_URL",
    "check_pid",
    "close_stdin",
    "create",
    "destroy",
    "egress",
    "endpoint",
    "exec_json",
    "get_process",
    "internet",
    "kill_process",
    "list_processes",
    "list_sandboxes",
    "process_logs",
    "read_file",
    "snapshot",
    "start_process",
    "status",
    "wait_process",
    "write_file",
    "write_stdin",
]


def _none(_body: bytes) -> None:
    return None


def create(**options: Unpack[CreateOptions]) -> Call[SandboxStatus]:
    """``POST /v1/sandboxes``: the options given, as the API spells them; what is left out (or None,
    or the API's own default) takes the server's default, so a server that predates an option
    still serves a create that does not ask for it."""
    take(options, "http")  # a name that is no create option is a TypeError, as in process
    body: dict[str, Any] = {}
    for opt in door_options("http"):
        value = options.get(opt.name)
        if value is None or value == opt.default_at("http"):
            continue
        if opt.kind == "string_list" and (isinstance(value, str | bytes) or not isinstance(value, Sequence)):
            raise ConfigError(f"{opt.name}={value!r:.60} must be a list of strings")
        if opt.kind == "string_map" and not isinstance(value, Mapping):
            raise ConfigError(f"{opt.name}={value!r:.60} must be a mapping of strings")
        wire = _WIRE.get(opt.kind)
        body[opt.name] = wire(value) if wire is not None else value
    return Call(
        "POST",
        "/v1/sandboxes",
        201,
        lambda raw: answers.parse_status(answers.decode_json(raw, "the create answer")),
        ErrorContext(snapshot=named(options, "snapshot_name")),  # a 404 names the snapshot forked
        json=body,
    )


def _volume_map(volumes: Sequence[VolumeMount]) -> dict[str, dict[str, Any]]:
    """The API's ``volumes``: mount path -> its source (checked first: a mount path given twice
    would otherwise be lost in the map)."""
    return mounts_to_wire(check_mounts(volumes))


# how a create option of each kind goes into the JSON body (the rest as it is)
_WIRE: dict[str, Callable[[Any], Any]] = {"string_list": list, "string_map": dict, "mounts": _volume_map}


def _listing(path: str, parse: Callable[[Any], T], what: str) -> Call[T]:
    """``GET path`` of a host-wide list (no sandbox, no name to blame an error on)."""
    return Call("GET", path, 200, lambda raw: parse(answers.decode_json(raw, what)), ErrorContext())


def templates() -> Call[builtins.list[str]]:
    """``GET /v1/templates``: the template names create() takes."""
    return _listing("/v1/templates", answers.parse_templates, "the template list")


def status(sandbox_id: str) -> Call[SandboxStatus]:
    return Call(
        "GET",
        wire.sandbox_path(sandbox_id),
        200,
        lambda raw: answers.parse_status(answers.decode_json(raw, "the status"), sandbox_id),
        ErrorContext(sandbox_id=sandbox_id),
    )


def list_sandboxes(labels: Mapping[str, str] | None) -> Call[builtins.list[SandboxRecord]]:
    want = dict(labels or {})
    params: list[tuple[str, str]] = []
    for key, value in want.items():
        if not isinstance(key, str) or not key or "=" in key or not isinstance(value, str):
            raise ConfigError(f"label filter {key!r}={value!r} must be a string key (without '=') and value")
        params.append(("label", f"{key}={value}"))
    return Call(
        "GET",
        "/v1/sandboxes",
        200,
        lambda raw: answers.parse_list(answers.decode_json(raw, "the list"), want),
        params=params,
        max_bytes=answers.LIST_ANSWER_BYTES,
    )


def destroy(sandbox_id: str) -> Call[None]:
    return Call("DELETE", wire.sandbox_path(sandbox_id), 204, _none, ErrorContext(sandbox_id=sandbox_id))


def exec_json(
    sandbox_id: str, body: dict[str, Any], timeout: float | None, max_output: int, command: str
) -> Call[ExecResult]:
    """``POST .../exec`` answered as one JSON result (``body`` from :func:`wire.exec_body`)."""
    return Call(
        "POST",
        wire.sandbox_path(sandbox_id, "/exec"),
        200,
        lambda raw: answers.parse_exec_result(answers.decode_json(raw, "the exec result"), max_output),
        ErrorContext(sandbox_id=sandbox_id, command=command, max_output=max_output),
        json=body,
        max_bytes=wire.exec_answer_bytes(max_output),
        read_timeout=wire.exec_wait(timeout),
    )


def write_file(sandbox_id: str, path: str, data: bytes | str, mode: int | None) -> Call[None]:
    check_remote_path(path)
    if not isinstance(data, bytes | str):
        raise ConfigError(f"data must be bytes or str, not {type(data).__name__}")
    content = data.encode("utf-8") if isinstance(data, str) else data
    params = [("path", path)]
    if mode is not None:
        if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
            raise ConfigError(f"mode={mode!r} must be permission bits from 0 to 0o7777")
        params.append(("mode", f"{mode:04o}"))
    return Call(
        "PUT",
        wire.sandbox_path(sandbox_id, "/files"),
        200,
        lambda raw: answers.parse_written(answers.decode_json(raw, "the write answer"), path, len(content)),
        ErrorContext(sandbox_id=sandbox_id, path=path),
        content=content,
        params=params,
    )


def read_file(sandbox_id: str, path: str, max_bytes: int = DEFAULT_READ_MAX_BYTES) -> Call[bytes]:
    check_remote_path(path)
    cap = check_max_bytes(max_bytes, "max_bytes")
    return Call(
        "GET",
        wire.sandbox_path(sandbox_id, "/files"),
        200,
        bytes,
        ErrorContext(sandbox_id=sandbox_id, path=path),
        params=[("path", path)],
        max_bytes=cap,
        raw=True,
    )


def internet(sandbox_id: str, enabled: bool) -> Call[None]:
    if not isinstance(enabled, bool):
        raise ConfigError(f"enabled={enabled!r} must be True or False")
    return Call(
        "POST",
        wire.sandbox_path(sandbox_id, "/internet"),
        200,
        lambda raw: answers.parse_internet(answers.decode_json(raw, "the answer"), sandbox_id, enabled),
        ErrorContext(sandbox_id=sandbox_id),
        json={"enabled": enabled},
    )


def egress(sandbox_id: str, entries: Sequence[str]) -> Call[tuple[str, ...]]:
    if isinstance(entries, str | bytes) or not isinstance(entries, Sequence):
        raise ConfigError(f"egress={entries!r:.60} must be a list of addresses, networks or domain names")
    listed = list(entries)
    return Call(
        "PUT",
        wire.sandbox_path(sandbox_id, "/egress"),
        200,
        lambda raw: answers.parse_egress(answers.decode_json(raw, "the answer"), sandbox_id, len(listed)),
        ErrorContext(sandbox_id=sandbox_id),
        json={"egress": listed},
    )


def snapshot(sandbox_id: str, name: str) -> Call[SnapshotInfo]:
    check_sandbox_id(sandbox_id)
    check_snapshot_name(name)
    return Call(
        "POST",
        wire.sandbox_path(sandbox_id, "/snapshots"),
        201,
        lambda raw: answers.parse_snapshot(answers.decode_json(raw, "the snapshot"), name, sandbox_id),
        ErrorContext(sandbox_id=sandbox_id, snapshot=name),
        json={"name": name},
    )


DEFAULT_URL = "http://127.0.0.1:8787"


def endpoint(url: str, token: str | None, token_file: str | os.PathLike[str] | None) -> tuple[str, str]:
    """(base URL, bearer token) for a client, by the server's own token rules: ``token`` as given,
    else the first line of ``token_file`` (a 0600 regular file of root or this user), else
    ``$SANDBOX_RT_API_TOKEN``. The token is never logged."""
    if not isinstance(url, str):
        raise ConfigError(f"url={url!r} must be a string such as {DEFAULT_URL}")
    split = urllib.parse.urlsplit(url)
    if split.scheme not in ("http", "https") or not split.hostname:
        raise ConfigError(f"url={url!r} must be an http:// or https:// URL such as {DEFAULT_URL}")
    if split.query or split.fragment or split.username or split.password:
        raise ConfigError(f"url={url!r} must not carry a query, a fragment or credentials")
    if token is not None and token_file is not None:
        raise ConfigError("give token or token_file, not both")
    secret = check_token(token, "the token argument") if token is not None else load_token(token_file)
    if split.scheme == "http" and not is_loopback(split.hostname):
        log.warning("the sandbox-rt API at %s is plain HTTP: the token travels in clear text", url)
    return url.rstrip("/"), secret


def extend(sandbox_id: str, ttl_s: int) -> Call[SandboxStatus]:
    """``POST /v1/sandboxes/{id}/extend``: live ``ttl_s`` seconds from now; the new status."""
    check_sandbox_id(sandbox_id)
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or not 0 < ttl_s <= MAX_TTL_S:
        raise ConfigError(f"ttl_s={ttl_s!r} must be a whole number > 0 and <= {MAX_TTL_S}")
    return Call(
        "POST",
        wire.sandbox_path(sandbox_id, "/extend"),
        200,
        lambda raw: answers.parse_status(answers.decode_json(raw, "the status"), sandbox_id),
        ErrorContext(sandbox_id=sandbox_id),
        json={"ttl_s": ttl_s},
    )


def list_snapshots() -> Call[builtins.list[SnapshotInfo]]:
    """``GET /v1/snapshots``."""
    return _listing("/v1/snapshots", answers.parse_snapshot_list, "the snapshot list")


def delete_snapshot(name: str) -> Call[None]:
    """``DELETE /v1/snapshots/{name}``; SnapshotNotFound if there is none."""
    check_snapshot_name(name)
    return Call(
        "DELETE",
        f"/v1/snapshots/{name}",
        204,
        lambda _raw: None,
        ErrorContext(snapshot=name),
    )


# -- files (the server's sb.files) -------------------------------------------------------------------
_LIST_ANSWER_BYTES = LIST_MAX_ENTRIES * 8 << 10  # entries of at most a few KiB each (names, paths)


def list_files(sandbox_id: str, path: str, depth: int) -> Call[builtins.list[EntryInfo]]:
    check_remote_path(path)
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_LIST_DEPTH:
        raise ConfigError(f"depth={depth!r} must be a whole number from 1 to {MAX_LIST_DEPTH}")
    return Call(
        "GET",
        wire.sandbox_path(sandbox_id, "/files/list"),
        200,
        lambda raw: answers.parse_entry_list(answers.decode_json(raw, "the listing"), LIST_MAX_ENTRIES),
        ErrorContext(sandbox_id=sandbox_id, path=path),
        params=[("path", path), ("depth", str(depth))],
        max_bytes=_LIST_ANSWER_BYTES,
    )


def stat_file(sandbox_id: str, path: str, follow_symlinks: bool) -> Call[EntryInfo]:
    check_remote_path(path)
    return Call(
        "GET",
        wire.sandbox_path(sandbox_id, "/files/stat"),
        200,
        lambda raw: answers.parse_entry(answers.decode_json(raw, "the entry")),
        ErrorContext(sandbox_id=sandbox_id, path=path),
        params=[("path", path), ("follow_symlinks", "true" if follow_symlinks else "false")],
    )


def remove_file(sandbox_id: str, path: str, recursive: bool) -> Call[None]:
    check_remote_path(path)
    return Call(
        "DELETE",
        wire.sandbox_path(sandbox_id, "/files"),
        204,
        lambda _raw: None,
        ErrorContext(sandbox_id=sandbox_id, path=path),
        params=[("path", path), ("recursive", "true" if recursive else "false")],
    )


def mkdir(sandbox_id: str, path: str, parents: bool) -> Call[bool]:
    check_remote_path(path)
    return Call(
        "POST",
        wire.sandbox_path(sandbox_id, "/files/mkdir"),
        200,
        lambda raw: answers.parse_mkdir(answers.decode_json(raw, "the mkdir answer")),
        ErrorContext(sandbox_id=sandbox_id, path=path),
        json={"path": path, "parents": bool(parents)},
    )


def rename_file(sandbox_id: str, src: str, dst: str) -> Call[EntryInfo]:
    check_remote_path(src, "src")
    check_remote_path(dst, "dst")
    return Call(
        "POST",
        wire.sandbox_path(sandbox_id, "/files/rename"),
        200,
        lambda raw: answers.parse_entry(answers.decode_json(raw, "the entry")),
        ErrorContext(sandbox_id=sandbox_id, path=src),
        json={"src": src, "dst": dst},
    )


# -- background commands (the server's sb.commands) --------------------------------------------------
LOG_CHUNK_BYTES = 1 << 20  # what one logs request asks of each stream (the server's default)
MAX_LOG_CHUNK_BYTES = 64 << 20  # the most the server gives of a stream per request
STDIN_WAIT_S = 30.0  # the server blocks a write on a full pipe this long (BackgroundProcess.send_stdin)
# a wait that times out is answered with the output so far (all of it, in text): read that far
WAIT_ANSWER_BYTES = answers.LIST_ANSWER_BYTES
_PROCESS_LIST_BYTES = answers.MAX_PROCESSES * (8 << 10)  # entries of a few KiB (a command shown cut)
# a started process echoes its command (up to MAX_TEXT characters, at most 6 bytes each in JSON)
_STARTED_BYTES = 6 * answers.MAX_TEXT + answers.SMALL_ANSWER_BYTES


def check_pid(pid: object) -> int:
    """A background command's pid as the API takes it (2..MAX_PID), before anything is sent."""
    if isinstance(pid, bool) or not isinstance(pid, int) or not 2 <= pid <= answers.MAX_PID:
        raise ConfigError(f"pid={pid!r:.40} must be a process id from 2 to {answers.MAX_PID}")
    return pid


def _process_path(sandbox_id: str, pid: int, tail: str = "") -> str:
    return wire.sandbox_path(sandbox_id, f"/processes/{check_pid(pid)}{tail}")


def start_process(
    sandbox_id: str, command: str | Sequence[str], cwd: str | None, env: Mapping[str, str] | None
) -> Call[ProcessInfo]:
    """``POST .../processes``: a background command (own session, stdin a pipe); its process."""
    if isinstance(command, bytes) or not isinstance(command, str | Sequence):
        raise ConfigError(f"command {command!r:.60} must be a string or a list of strings")
    if env is not None and not isinstance(env, Mapping):
        raise ConfigError(f"env={env!r:.60} must be a mapping of strings")
    body: dict[str, Any] = {"command": command if isinstance(command, str) else list(command)}
    if cwd is not None:
        body["cwd"] = check_remote_path(cwd, "cwd")
    if env:
        body["env"] = dict(env)
    return Call(
        "POST",
        wire.sandbox_path(sandbox_id, "/processes"),
        201,
        lambda raw: answers.parse_process(answers.decode_json(raw, "the process")),
        ErrorContext(sandbox_id=sandbox_id, command=wire.command_text(command)),
        json=body,
        max_bytes=_STARTED_BYTES,
    )


def list_processes(sandbox_id: str) -> Call[builtins.list[ProcessInfo]]:
    """``GET .../processes``: newest first, at most MAX_PROCESSES."""
    return Call(
        "GET",
        wire.sandbox_path(sandbox_id, "/processes"),
        200,
        lambda raw: answers.parse_process_list(answers.decode_json(raw, "the process list")),
        ErrorContext(sandbox_id=sandbox_id),
        max_bytes=_PROCESS_LIST_BYTES,
    )


def get_process(sandbox_id: str, pid: int) -> Call[ProcessInfo]:
    """``GET .../processes/{pid}``: running, or its exit code; ProcessNotFound if there is none."""
    return Call(
        "GET",
        _process_path(sandbox_id, pid),
        200,
        lambda raw: answers.parse_process(answers.decode_json(raw, "the process"), expect_pid=pid),
        ErrorContext(sandbox_id=sandbox_id, pid=pid),
    )


def process_logs(
    sandbox_id: str, pid: int, stdout_offset: int, stderr_offset: int, max_bytes: int
) -> Call[tuple[bytes, bytes]]:
    """``GET .../processes/{pid}/logs`` as exact bytes (base64): at most ``max_bytes`` of each
    stream from the offsets given, the offsets answered checked against what came back."""
    for name, offset in (("stdout_offset", stdout_offset), ("stderr_offset", stderr_offset)):
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ConfigError(f"{name}={offset!r:.40} must be a whole number of bytes, at least 0")
    cap = check_max_bytes(max_bytes)
    if cap > MAX_LOG_CHUNK_BYTES:
        raise ConfigError(f"max_bytes={cap} must be at most {MAX_LOG_CHUNK_BYTES} per request")
    return Call(
        "GET",
        _process_path(sandbox_id, pid, "/logs"),
        200,
        lambda raw: answers.parse_logs(
            answers.decode_json(raw, "the logs"), stdout_offset, stderr_offset, cap
        ),
        ErrorContext(sandbox_id=sandbox_id, pid=pid),
        params=[
            ("stdout_offset", str(stdout_offset)),
            ("stderr_offset", str(stderr_offset)),
            ("max_bytes", str(cap)),
            ("encoding", "base64"),
        ],
        max_bytes=wire.exec_answer_bytes(cap),
    )


def write_stdin(sandbox_id: str, pid: int, data: bytes | str) -> Call[None]:
    """``POST .../processes/{pid}/stdin`` with the raw bytes (a str as UTF-8)."""
    if not isinstance(data, bytes | str):
        raise ConfigError(f"data must be bytes or str, not {type(data).__name__}")
    return Call(
        "POST",
        _process_path(sandbox_id, pid, "/stdin"),
        204,
        _none,
        ErrorContext(sandbox_id=sandbox_id, pid=pid),
        content=data.encode("utf-8") if isinstance(data, str) else data,
        read_timeout=STDIN_WAIT_S + wire.EXEC_GRACE_S,
    )


def close_stdin(sandbox_id: str, pid: int) -> Call[None]:
    """``DELETE .../processes/{pid}/stdin``: the command reads EOF once it has read what was sent."""
    return Call(
        "DELETE",
        _process_path(sandbox_id, pid, "/stdin"),
        204,
        _none,
        ErrorContext(sandbox_id=sandbox_id, pid=pid),
    )


def wait_process(sandbox_id: str, pid: int, timeout: float, command: str) -> Call[int]:
    """``POST .../processes/{pid}/wait`` for at most ``timeout`` seconds: the exit status, or
    CommandTimeout (504). The HTTP read waits that long plus a grace."""
    seconds = check_timeout(timeout)
    if seconds is None:
        raise ConfigError("a wait request needs a timeout (the client waits in slices)")
    return Call(
        "POST",
        _process_path(sandbox_id, pid, "/wait"),
        200,
        lambda raw: answers.parse_process_exit(answers.decode_json(raw, "the wait answer"), pid),
        ErrorContext(sandbox_id=sandbox_id, pid=pid, command=command),
        json={"timeout": seconds},
        max_bytes=WAIT_ANSWER_BYTES,
        read_timeout=seconds + wire.EXEC_GRACE_S,
    )


def kill_process(sandbox_id: str, pid: int, sig: int) -> Call[ProcessInfo]:
    """``POST .../processes/{pid}/kill``: ``sig`` to its whole process group; the process after."""
    n = check_signal(sig)
    return Call(
        "POST",
        _process_path(sandbox_id, pid, "/kill"),
        200,
        lambda raw: answers.parse_process(answers.decode_json(raw, "the process"), expect_pid=pid),
        ErrorContext(sandbox_id=sandbox_id, pid=pid),
        json={"signal": n},
    )
