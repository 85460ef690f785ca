"""A streamed exec as server-sent events: ``event: stdout|stderr`` chunks as the command prints
them, then ``event: exit`` (or ``event: error``). If the client goes away the command is not
killed: it runs on until it ends or its timeout."""

from __future__ import annotations

import base64
import codecs
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import SandboxError
from ..protocols import ExecStreamLike
from .errors import HttpError, error_for

__all__ = ["SSE_SCHEMA", "SSE_TEXT", "exec_events"]

log = logging.getLogger(__name__)

SSE_TEXT = """\
Server-sent events (with `"stream": true` or `Accept: text/event-stream`). Each chunk of output
is sent as soon as the command prints it:

    event: stdout
    data: {"data": "1\\n"}

    event: stderr
    data: {"data": "warning\\n"}

    event: exit
    data: {"command": "...", "exit_code": 0, "duration_s": 3.02}

`data` is a JSON object on one line: ExecOutputEvent for stdout/stderr (text or base64 as the
request's `encoding` says), ExecExitEvent for the last event. If the command cannot finish
(timeout, lost connection) the last event is `event: error` with an ExecErrorEvent instead.
Errors found before the command starts (bad body, unknown sandbox) are ordinary JSON errors.
"""


def _event_schema(names: list[str], model: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"enum": names},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": {"$ref": f"#/components/schemas/{model}"},
            },
        },
    }


# OpenAPI before 3.2 has a text/event-stream schema describe one event: its name and its data
SSE_SCHEMA: dict[str, Any] = {
    "description": SSE_TEXT,
    "oneOf": [
        _event_schema(["stdout", "stderr"], "ExecOutputEvent"),
        _event_schema(["exit"], "ExecExitEvent"),
        _event_schema(["error"], "ExecErrorEvent"),
    ],
}


def _event(name: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def exec_events(stream: ExecStreamLike, encoding: str) -> Iterator[bytes]:
    """The events of ``stream`` (blocking: iterated on a worker thread)."""
    decoders = {
        name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in ("stdout", "stderr")
    }

    def text(name: str, data: bytes, final: bool = False) -> str:
        if encoding == "base64":
            return base64.b64encode(data).decode("ascii")
        return str(decoders[name].decode(data, final))

    try:
        for chunk in stream:
            piece = text(chunk.stream, chunk.data)
            if piece:
                yield _event(chunk.stream, {"data": piece})
        if encoding != "base64":
            for name in ("stdout", "stderr"):  # a trailing partial UTF-8 sequence
                rest = text(name, b"", final=True)
                if rest:
                    yield _event(name, {"data": rest})
        result = stream.result
        if result is None:
            raise SandboxError("the command's stream ended without a result")
        yield _event(
            "exit",
            {
                "command": result.command,
                "exit_code": result.exit_code,
                "duration_s": result.duration_s,
                "truncated": result.truncated,
                "stdout_dropped": result.stdout_dropped,
                "stderr_dropped": result.stderr_dropped,
            },
        )
    except SandboxError as exc:
        err = error_for(exc, encoding)
        err.extra.pop("stdout", None)  # already streamed
        err.extra.pop("stderr", None)
        yield _event("error", {"status": err.status, **err.body()})
    except Exception:
        log.exception("internal error while streaming")
        internal = HttpError(500, "internal_error", "internal server error (see the log)")
        yield _event("error", {"status": 500, **internal.body()})
