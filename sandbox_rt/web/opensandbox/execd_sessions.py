"""execd's bash sessions (``POST /session``, ``POST /session/{id}/run``, ``DELETE /session/{id}``):
runs whose working directory and exported variables carry over to the next run.

No shell stays behind in the sandbox: the host keeps each session's directory and environment, and
every run is a foreground command started from them. The run's bash saves where it ended
(``pwd``, then ``env -0``) into a file of its own in the sandbox when it exits (an EXIT trap, so an
``exit`` in the command is saved too); the server reads that file back after the run (bounded) and
parses it strictly: a path, then ``NAME=value`` entries of valid names and UTF-8 values. A variable
the run unset is unset in the next one. What does not fit (more than 64 KiB of environment, an
unreadable state) leaves the session as it was, and the run's output says so on stderr.
"""

from __future__ import annotations

import re
import secrets
import shlex
import time
from typing import Annotated

from fastapi import Depends, Path, Response
from fastapi.responses import StreamingResponse

from ...errors import ConfigError, SandboxError
from ...models import ExecResult
from ...validation import check_remote_path
from ..errors import HttpError
from ..params import Ctx, SandboxId, json_body
from .execd_commands import ID_ENV, KEEP_OUTPUT, command_env, interrupt_foreground, timeout_s
from .execd_models import RunInSessionRequest, SessionRequest
from .execd_registry import CommandRecord, Reg, Session
from .execd_runtime import ExecdSandbox, execd_router, sandbox_of
from .execd_sse import SSE_HEADERS, SSE_MEDIA_TYPE, After, command_events

__all__ = ["STATE_MAX", "SessionState", "parse_state", "router", "session_script"]

STATE_MAX = 64 << 10  # the environment a session carries (it travels on the next run's command line)
MAX_VARS = 1000
MAX_CWD_BYTES = 4096
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
# set by bash, sshd or execd for each run, never carried over
VOLATILE = frozenset(
    {"_", "PWD", "OLDPWD", "SHLVL", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK", ID_ENV}
)
_STATE_DIR = "$HOME/.sandbox_rt/execd"  # expanded by the run's bash
_READ_STATE = 'f="$HOME/.sandbox_rt/execd/$1"; cat -- "$f" 2>/dev/null; rm -f -- "$f"'

router = execd_router()

SessionId = Annotated[str, Path(pattern=r"^ses-[0-9a-f]{24}$", description="A session's id.")]


class StateError(ValueError):
    """The state a run saved is not one a session can carry."""


SessionState = tuple[str, dict[str, str]]


def parse_state(raw: bytes) -> SessionState:
    """``pwd`` + NUL + ``env -0`` as the run's bash wrote it -> (cwd, env); StateError if it is not
    exactly that, or larger than the bounds."""
    if len(raw) > STATE_MAX + MAX_CWD_BYTES + 2:
        raise StateError(f"its environment is larger than {STATE_MAX} bytes")
    head, sep, rest = raw.partition(b"\n\0")
    if not sep:
        raise StateError("its state is cut short")
    try:
        cwd = head.decode("utf-8")
    except UnicodeDecodeError:
        raise StateError("its working directory is not UTF-8") from None
    if not cwd.startswith("/") or len(head) > MAX_CWD_BYTES or "\n" in cwd:
        raise StateError("its working directory is not an absolute path")
    entries = rest.split(b"\0")
    if entries.pop() != b"":
        raise StateError("its environment is cut short")
    env: dict[str, str] = {}
    size = 0
    for entry in entries:
        name, eq, value = entry.partition(b"=")
        key = name.decode("ascii", "replace")
        if not eq or not _NAME.fullmatch(key) or key in VOLATILE:
            continue  # bash exports only valid names; anything else is not ours to carry
        try:
            env[key] = value.decode("utf-8")
        except UnicodeDecodeError:
            continue  # a value that is not text cannot be given back on a command line
        size += len(entry) + 2
    if size > STATE_MAX:
        raise StateError(f"its environment is larger than {STATE_MAX} bytes")
    if len(env) > MAX_VARS:
        raise StateError(f"it exports more than {MAX_VARS} variables")
    return cwd, env


def session_script(command: str, state_file: str, keep: list[str] | None) -> str:
    """The run's bash text: where to save the state (fixed before the command can change HOME), the
    EXIT trap that saves it, the unsetting of what the session had unset, then the command (on the
    same first line: its own line numbers stay as written)."""
    prelude = (
        f'__sbrt_f="{_STATE_DIR}/"{shlex.quote(state_file)}; mkdir -p -- "${{__sbrt_f%/*}}" 2>/dev/null; '
        'trap \'{ pwd; printf "\\0"; env -0; } > "$__sbrt_f" 2>/dev/null\' EXIT; '
    )
    if keep is not None:
        names = " ".join(sorted({*keep, *VOLATILE}))
        prelude += (
            "for __sbrt_n in $(compgen -e); do case ' " + names + " ' in "
            '*" $__sbrt_n "*) ;; *) unset -v "$__sbrt_n";; esac; done; unset __sbrt_n; '
        )
    return prelude + command


def _saver(sb: ExecdSandbox, session: Session, state_file: str, home: dict[str, str]) -> After:
    def after(result: ExecResult | None) -> str | None:
        try:
            raw = sb.exec(
                ["sh", "-c", _READ_STATE, "sh", state_file],
                env=home,  # the HOME the run saved under
                timeout=30,
                max_output=STATE_MAX + MAX_CWD_BYTES + 3,
            )
            if raw.stdout_dropped:
                raise StateError(f"its environment is larger than {STATE_MAX} bytes")
            if not raw.stdout:
                return None  # killed before its EXIT trap ran: nothing to carry
            session.cwd, session.env = parse_state(raw.stdout)
            return None
        except (StateError, SandboxError) as exc:
            return f"sandbox_rt: the session's directory and environment were not saved: {exc}\n"
        finally:
            with session.lock:
                session.running = None

    return after


@router.post("/session", summary="Create a bash session")
def create_session(
    reg: Reg,
    ctx: Ctx,
    id: SandboxId,
    body: Annotated[SessionRequest, Depends(json_body(SessionRequest, "session", required=False))],
) -> dict[str, str]:
    cwd = None if body.cwd is None else check_remote_path(body.cwd, "cwd")
    sandbox_of(ctx, id)  # the sandbox is there and running
    session = Session("ses-" + secrets.token_hex(12), id, cwd)
    reg.add_session(session)
    return {"session_id": session.id}


def _session(reg: Reg, sandbox_id: str, session_id: str) -> Session:
    found = reg.session(sandbox_id, session_id)
    if found is None:
        raise HttpError(404, "not_found", f"no session {session_id!r} in this sandbox")
    return found


@router.post("/session/{session_id}/run", summary="Run a command in a session: its output as events")
def run_in_session(
    ctx: Ctx,
    reg: Reg,
    id: SandboxId,
    session_id: SessionId,
    body: Annotated[RunInSessionRequest, Depends(json_body(RunInSessionRequest, "run"))],
) -> StreamingResponse:
    session = _session(reg, id, session_id)
    if not body.command.strip():
        raise ConfigError("field 'command' is empty")
    cwd = check_remote_path(body.cwd, "cwd") if body.cwd is not None else session.cwd
    sb = sandbox_of(ctx, id)
    run_id = "cmd-" + secrets.token_hex(12)
    with session.lock:
        if session.running is not None:
            raise HttpError(
                409, "conflict", f"session {session_id} is running {session.running}: wait for it"
            )
        session.running = run_id
    try:
        state_file = f"{session.id}.{secrets.token_hex(6)}.state"
        env = session.env if session.env is not None else command_env(ctx, id, None)
        keep = None if session.env is None else list(session.env)
        home = {"HOME": env["HOME"]} if "HOME" in env else {}
        script = session_script(body.command, state_file, keep)
        stream = sb.exec_stream(
            script,
            timeout=timeout_s(body.timeout),
            cwd=cwd,
            env={**env, ID_ENV: run_id},
            max_output=KEEP_OUTPUT,
        )
    except BaseException:
        with session.lock:
            session.running = None
        raise
    reg.add_command(CommandRecord(run_id, id, body.command, False, time.time()))
    events = command_events(stream, run_id, reg, after=_saver(sb, session, state_file, home))
    return StreamingResponse(events, media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS)


@router.delete("/session/{session_id}", summary="Delete a session (its running command is interrupted)")
def delete_session(ctx: Ctx, reg: Reg, id: SandboxId, session_id: SessionId) -> Response:
    session = _session(reg, id, session_id)
    reg.drop_session(session.id)
    run_id = session.running
    record = reg.command(id, run_id) if run_id is not None else None
    if record is not None and record.running:
        interrupt_foreground(sandbox_of(ctx, id), record)
    return Response(status_code=200)
