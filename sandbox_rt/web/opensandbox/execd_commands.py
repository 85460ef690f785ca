"""execd's commands: ``POST /command`` (foreground: its output as events; background: started and
answered at once), ``GET /command/status/{id}``, ``GET /command/{id}/logs?cursor=`` and ``DELETE
/command?id=`` (interrupt), plus ``/ping``.

A foreground command runs through the server's SSH connection like a native exec, with
``SANDBOX_RT_EXECD_ID=<its id>`` in its environment: an interrupt finds its processes by that
variable (as the sandbox user, inside the sandbox) and signals their process groups, TERM then KILL.
A background command is a runtime background process (:mod:`sandbox_rt.background`: its own
session, it outlives the server) whose stderr goes to its stdout, so that its log is one stream read
by byte offset, as execd's is; its id (``bg-<handle>-<pid>``) names it, so its status and log
survive a restart of the server.
"""

from __future__ import annotations

import re
import secrets
import shlex
import signal
import time
from typing import Annotated, Any

from fastapi import Depends, Path, Query, Response
from fastapi.responses import StreamingResponse

from ...errors import ConfigError, ProcessNotFound
from ...execution import command_text
from ...protocols import ProcessLike
from ...validation import check_env, check_remote_path
from ..errors import HttpError
from ..params import Context, Ctx, SandboxId, json_body
from . import state
from .execd_models import RunCommandRequest
from .execd_registry import CommandRecord, Reg, Registry
from .execd_runtime import ExecdSandbox, execd_router, sandbox_of
from .execd_sse import SSE_HEADERS, SSE_MEDIA_TYPE, command_events, complete_event, init_event

__all__ = [
    "ID_ENV",
    "KEEP_OUTPUT",
    "command_env",
    "interrupt_foreground",
    "router",
    "run_as",
    "timeout_s",
]

ID_ENV = "SANDBOX_RT_EXECD_ID"
KEEP_OUTPUT = 64 << 10  # what the server keeps of a streamed command's output (the events carry all)
LOG_MAX = 1 << 20  # what one /logs answer carries at most; the cursor says where to go on
MAX_CURSOR = 1 << 62
_BG_PREFIX = "exec 2>&1; "
_BG_ID = re.compile(r"bg-([0-9a-f]{16})-([0-9]{1,7})")
CURSOR_HEADER = "EXECD-COMMANDS-TAIL-CURSOR"

# the command's processes are those with ID_ENV=<id> in their environment: signal their process
# groups (and themselves); exit 3 if there is none
_KILL = r"""
id=$1
scan() {
  sig=$1; found=1
  for d in /proc/[0-9]*; do
    hit=1
    while IFS= read -r -d '' kv; do
      [ "$kv" = "SANDBOX_RT_EXECD_ID=$id" ] && { hit=0; break; }
    done < "$d/environ" 2>/dev/null
    [ $hit = 0 ] || continue
    st=$(cat "$d/stat" 2>/dev/null) || continue
    st=${st##*) }; set -- $st
    found=0
    [ "$sig" = 0 ] || kill -"$sig" -- "-$3" "${d#/proc/}" 2>/dev/null
  done
  return $found
}
scan TERM || exit 3
for i in $(seq 40); do sleep 0.05; scan 0 || exit 0; done
scan KILL; exit 0
"""

router = execd_router()

CommandId = Annotated[str, Path(pattern=r"^[A-Za-z0-9-]{1,64}$", description="A command's id.")]


def timeout_s(ms: int | None) -> float | None:
    """execd's milliseconds as the runtime's seconds; 0 or None: the host's default."""
    return None if not ms else ms / 1000


def command_env(ctx: Context, sandbox_id: str, envs: dict[str, str] | None) -> dict[str, str]:
    """The create-time env of the sandbox with the request's over it."""
    state.bind(ctx.manager)
    return {**state.default_env(sandbox_id), **check_env(envs)}


def run_as(uid: int | None, gid: int | None) -> str | None:
    """The runtime's user for execd's uid/gid: the sandbox user, or root (uid 0) where allowed."""
    if uid is None:
        if gid is not None:
            raise ConfigError("gid needs uid")
        return None
    if uid == 0 and gid in (None, 0):
        return "root"  # the runtime refuses it unless the sandbox was made with root=True
    raise ConfigError(
        f"uid={uid} gid={gid}: commands run as the sandbox user (no uid), or as root (uid 0) in a "
        "sandbox made with root"
    )


def _text(body: RunCommandRequest) -> str:
    if (body.command is None) == (body.argv is None):
        raise ConfigError("give exactly one of the fields 'command' (bash text) and 'argv' (an argv array)")
    text: str = command_text(body.command if body.command is not None else list(body.argv))
    return text


def _stream_response(events: Any) -> StreamingResponse:
    return StreamingResponse(events, media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS)


def _background(
    sb: ExecdSandbox, reg: Registry, text: str, cwd: str | None, env: dict[str, str], timeout: float | None
) -> StreamingResponse:
    started = time.monotonic()
    script = _BG_PREFIX + text
    if timeout is not None:
        script = _BG_PREFIX + f"exec timeout -k 5 {timeout:.3f} /bin/bash -c {shlex.quote(text)}"
    process = sb.commands.run(script, background=True, cwd=cwd, env=env)
    command_id = f"bg-{process.handle}-{process.pid}"
    reg.add_command(CommandRecord(command_id, sb.id, text, True, time.time()))
    elapsed = int((time.monotonic() - started) * 1000)
    return _stream_response(iter([init_event(command_id), complete_event(elapsed)]))


@router.get("/ping", summary="The sandbox answers (its SSH connection is up)")
def ping(ctx: Ctx, id: SandboxId) -> Response:
    sandbox_of(ctx, id)
    return Response(status_code=200)


@router.post("/command", summary="Run a command: its output as events, or started in the background")
def run_command(
    ctx: Ctx,
    reg: Reg,
    id: SandboxId,
    body: Annotated[RunCommandRequest, Depends(json_body(RunCommandRequest, "command"))],
) -> StreamingResponse:
    text = _text(body)
    cwd = None if body.cwd is None else check_remote_path(body.cwd, "cwd")
    user = run_as(body.uid, body.gid)
    env = command_env(ctx, id, body.envs)
    timeout = timeout_s(body.timeout)
    sb = sandbox_of(ctx, id)
    if body.background:
        if user is not None:
            raise ConfigError("background commands run as the sandbox user: drop uid/gid")
        return _background(sb, reg, text, cwd, env, timeout)
    command_id = "cmd-" + secrets.token_hex(12)
    stream = sb.exec_stream(
        text, timeout=timeout, cwd=cwd, env={**env, ID_ENV: command_id}, max_output=KEEP_OUTPUT, user=user
    )
    reg.add_command(CommandRecord(command_id, id, text, False, time.time(), user=user))
    return _stream_response(command_events(stream, command_id, reg))


def _unknown(command_id: str) -> HttpError:
    return HttpError(404, "not_found", f"no command {command_id!r} in this sandbox")


def _process(sb: ExecdSandbox, command_id: str) -> ProcessLike | None:
    """The background process a ``bg-`` id names; None for another kind of id."""
    m = _BG_ID.fullmatch(command_id)
    if m is None:
        return None
    try:
        process = sb.commands.connect(int(m.group(2)))
    except ProcessNotFound:
        raise _unknown(command_id) from None
    if process.handle != m.group(1):  # the pid was reused by another background command
        raise _unknown(command_id)
    return process


def _when(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


@router.get("/command/status/{command_id}", summary="A command's status: running, exit code, times")
def command_status(ctx: Ctx, reg: Reg, id: SandboxId, command_id: CommandId) -> dict[str, Any]:
    record = reg.command(id, command_id)
    process = _process(sandbox_of(ctx, id), command_id)
    if process is not None:
        code = process.exit_code()
        running = code is None and process.is_running()
        if not running:
            code = process.exit_code() if code is None else code  # it may have ended just now
            reg.finish(command_id, code)
        content = record.content if record is not None else process.command.removeprefix(_BG_PREFIX)
        started = record.started_at if record is not None else None
        finished = record.finished_at if record is not None else None
        answer: dict[str, Any] = {"id": command_id, "content": content, "running": running, "exit_code": code}
    elif record is not None:
        answer = {"id": command_id, "content": record.content, "running": record.running}
        answer["exit_code"] = record.exit_code
        if record.error:
            answer["error"] = record.error
        started, finished = record.started_at, record.finished_at
    else:
        raise _unknown(command_id)
    if started is not None:
        answer["started_at"] = _when(started)
    answer["finished_at"] = None if answer["running"] else _when(finished)
    return answer


@router.get("/command/{command_id}/logs", summary="A background command's output from a byte cursor on")
def command_logs(
    ctx: Ctx,
    reg: Reg,
    id: SandboxId,
    command_id: CommandId,
    cursor: Annotated[int, Query(ge=0, le=MAX_CURSOR, description="Bytes read already.")] = 0,
) -> Response:
    process = _process(sandbox_of(ctx, id), command_id)
    if process is None:
        if reg.command(id, command_id) is not None:
            raise ConfigError(f"command {command_id!r} ran in the foreground: its output was its events")
        raise _unknown(command_id)
    out, _ = process.logs_from(cursor, cursor, max_bytes=LOG_MAX)
    out = out[:LOG_MAX]
    return Response(
        out, media_type="text/plain; charset=utf-8", headers={CURSOR_HEADER: str(cursor + len(out))}
    )


def interrupt_foreground(sb: ExecdSandbox, record: CommandRecord) -> None:
    """TERM (then, after 2 s, KILL) the process groups of a foreground command's processes."""
    sb.exec(["bash", "-c", _KILL, "bash", record.id], timeout=30, max_output=4096, user=record.user)


@router.delete("/command", summary="Interrupt a command: TERM, then KILL after 2 s")
def interrupt_command(
    ctx: Ctx,
    reg: Reg,
    id: SandboxId,
    command_id: Annotated[str, Query(alias="id", pattern=r"^[A-Za-z0-9-]{1,64}$")],
) -> Response:
    sb = sandbox_of(ctx, id)
    process = _process(sb, command_id)
    if process is not None:
        if process.exit_code() is None:
            process.kill(int(signal.SIGTERM))
            if process.is_running():
                process.kill(int(signal.SIGKILL))
        reg.finish(command_id, process.exit_code())
        return Response(status_code=200)
    record = reg.command(id, command_id)
    if record is None:
        raise _unknown(command_id)
    if record.running:
        interrupt_foreground(sb, record)
    return Response(status_code=200)
