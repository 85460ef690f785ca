"""What ``sandbox_rt.remote`` sends and how much it reads back, without any I/O: the sync and the
async client only move bytes, so every request is built and every answer bounded here, once."""

from __future__ import annotations

import base64
import dataclasses
import errno
import json
import shlex
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Literal, TypeVar

from ..errors import ConfigError, ConnectionLost, ExecError, FileOperationError
from ..models import ExecResult
from ..validation import check_max_bytes, check_remote_path, check_sandbox_id
from .answers import MAX_TEXT, SMALL_ANSWER_BYTES, bad_answer
from .error_map import ErrorContext

__all__ = ["Call", "exec_body", "json_body", "sandbox_path"]

T = TypeVar("T")

# seconds a JSON exec or a stream may stay silent past the command's own timeout before the client
# gives up (the server's default command timeout is unknown to the client: DEFAULT_EXEC_WAIT_S then)
EXEC_GRACE_S = 30.0
DEFAULT_EXEC_WAIT_S = 3600.0


@dataclasses.dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how to read its answer: ``parse(body)`` for the ``ok`` status, else
    :func:`answer_error` with ``context``; at most ``max_bytes`` of the body are read."""

    method: Literal["GET", "POST", "PUT", "DELETE"]
    path: str
    ok: int
    parse: Callable[[bytes], T]
    context: ErrorContext = dataclasses.field(default_factory=ErrorContext)
    json: Any = None
    content: bytes | None = None
    params: Sequence[tuple[str, str]] = ()
    max_bytes: int = SMALL_ANSWER_BYTES
    read_timeout: float | None = None  # None: the client's own
    raw: bool = False  # a raw byte answer (a file): Content-Length is checked against max_bytes first


def error_cap(call: Call[Any]) -> int:
    """The most bytes read of an error answer (a command timeout carries the output so far)."""
    return SMALL_ANSWER_BYTES if call.raw else max(SMALL_ANSWER_BYTES, call.max_bytes)


def check_length(call: Call[Any], declared: str | None, ok: bool) -> None:
    """Refuse an answer whose declared ``Content-Length`` is past its cap before reading it."""
    if declared is None:
        return
    if not declared.isascii() or not declared.isdigit() or len(declared) > 18:
        raise bad_answer(f"Content-Length {declared[:40]!r} is not a number")
    overflow(call, int(declared), ok)


def overflow(call: Call[Any], size: int, ok: bool) -> None:
    """Raise if ``size`` bytes are more than the answer may hold."""
    cap = call.max_bytes if ok else error_cap(call)
    if size <= cap:
        return
    if ok and call.raw:
        raise FileOperationError(
            errno.EFBIG, f"read: the file is larger than max_bytes ({cap} bytes)", call.context.path
        )
    raise bad_answer(f"the answer is larger than {cap} bytes")


def transport_error(exc: Exception, url: str) -> ConnectionLost:
    """An HTTP-level failure (no connection, a timeout, a broken answer) as ConnectionLost."""
    kind = type(exc).__name__
    if "Timeout" in kind:
        return ConnectionLost(f"the sandbox-rt API at {url} did not answer in time ({kind})")
    return ConnectionLost(f"the sandbox-rt API at {url} cannot be reached or broke off: {kind}: {exc}")


def check_client_timeout(timeout: float) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < 1e6:
        raise ConfigError(f"timeout={timeout!r} must be a positive number of seconds")
    return float(timeout)


def check_event_stream(content_type: str | None) -> None:
    """A streamed exec must be answered with server-sent events, not anything else."""
    if (content_type or "").split(";")[0].strip().lower() != "text/event-stream":
        raise bad_answer(f"a streamed exec was answered with {content_type!r:.60}, not text/event-stream")


def command_text(command: str | Sequence[str]) -> str:
    """The command as the server runs it (and names it in results and errors)."""
    return command if isinstance(command, str) else shlex.join(str(w) for w in command)


def sandbox_path(sandbox_id: str, tail: str = "") -> str:
    return f"/v1/sandboxes/{urllib.parse.quote(check_sandbox_id(sandbox_id), safe='')}{tail}"


def json_body(value: Any) -> bytes:
    """A request body; a value JSON cannot carry (a lone surrogate too) is the caller's ConfigError,
    raised before anything is sent."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        raise ConfigError(f"the request cannot be sent as JSON: {exc}") from exc


def exec_body(
    command: str | Sequence[str],
    *,
    timeout: float | None,
    cwd: str | None,
    env: Mapping[str, str] | None,
    stdin: bytes | str | None,
    max_output: int,
    stream: bool,
    user: str | None = None,
) -> dict[str, Any]:
    """The exec request (checked here what the client can check: the rest is the server's 400)."""
    if isinstance(command, bytes) or not isinstance(command, str | Sequence):
        raise ConfigError(f"command {command!r:.60} must be a string or a list of strings")
    body: dict[str, Any] = {
        "command": command if isinstance(command, str) else list(command),
        "encoding": "base64",
        "stream": stream,
    }
    cap = check_max_bytes(max_output, "max_output")
    if not stream:  # a stream carries every byte; this client keeps max_output of them in the result
        body["max_output"] = cap
    if timeout is not None:
        body["timeout"] = timeout
    if cwd is not None:
        body["cwd"] = check_remote_path(cwd, "cwd")
    if env:
        body["env"] = dict(env)
    if user is not None:
        if not isinstance(user, str):
            raise ConfigError(f"user={user!r:.60} must be a string ('root' or the sandbox user)")
        body["user"] = user
    if stdin is not None:
        if not isinstance(stdin, bytes | str):
            raise ConfigError(f"stdin must be bytes or str, not {type(stdin).__name__}")
        data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
        body["stdin_b64"] = base64.b64encode(data).decode("ascii")
    return body


def exec_wait(timeout: float | None) -> float:
    """How long the client waits for a command's answer (or its next event) before giving up."""
    wait = DEFAULT_EXEC_WAIT_S
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and 0 < timeout < wait:
        wait = float(timeout)
    return wait + EXEC_GRACE_S


def request_parts(call: Call[Any]) -> tuple[bytes | None, dict[str, str]]:
    """The body and headers of a call's request."""
    if call.json is not None:
        return json_body(call.json), {"Content-Type": "application/json"}
    return call.content, {"Content-Type": "application/octet-stream"}


def exec_answer_bytes(max_output: int) -> int:
    """The most bytes a JSON exec answer (or a timeout error with the output so far) may take:
    both streams base64-encoded, plus room for the rest."""
    return 2 * 4 * (max_output // 3 + 1) + MAX_TEXT + SMALL_ANSWER_BYTES


def check_exec_result(result: ExecResult, check: bool) -> ExecResult:
    if check and result.exit_code != 0:
        raise ExecError(result.command, result.exit_code, result.stdout, result.stderr)
    return result
