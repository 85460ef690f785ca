"""A streamed command's server-sent events read strictly, into output chunks and a result."""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import CommandTimeout, ConnectionLost
from ..models import ExecResult, OutputChunk
from .answers import (
    MAX_MESSAGE,
    MAX_TEXT,
    bad_answer,
    decode_json,
    read_b64,
    read_int,
    read_member,
    read_num,
    read_object,
    read_str,
)
from .error_map import ErrorContext, error_from_answer

__all__ = ["ExecState", "SseDecoder"]

# one server-sent event (a chunk of output, base64): the server sends what one SSH read gave
MAX_EVENT_BYTES = 4 << 20


class SseDecoder:
    """Bytes of a ``text/event-stream`` in, ``(event, data)`` pairs out; an event (its lines
    together) larger than ``max_event_bytes`` is a bad answer, so a server that never ends a line
    cannot grow the client's memory."""

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._buf = bytearray()
        self._event = ""
        self._data: list[str] = []
        self._size = 0
        self._max = max_event_bytes

    def feed(self, chunk: bytes) -> Iterator[tuple[str, str]]:
        self._buf += chunk
        while True:
            end = self._buf.find(b"\n")
            if end < 0:
                if len(self._buf) + self._size > self._max:
                    raise bad_answer(f"a server-sent event is larger than {self._max} bytes")
                return
            raw = bytes(self._buf[:end])
            del self._buf[: end + 1]
            self._size += len(raw)
            if self._size > self._max:
                raise bad_answer(f"a server-sent event is larger than {self._max} bytes")
            try:
                line = raw.removesuffix(b"\r").decode("utf-8")
            except UnicodeDecodeError:
                raise bad_answer("a server-sent event is not UTF-8") from None
            if not line:
                if self._data or self._event:
                    yield self._event or "message", "\n".join(self._data)
                self._event, self._data, self._size = "", [], 0
            elif line.startswith(":"):
                continue  # a comment (keep-alive)
            else:
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "event":
                    self._event = value
                elif name == "data":
                    self._data.append(value)


class ExecState:
    """One streamed command: turns its events into :class:`OutputChunk` s and, at the ``exit``
    event, an :class:`ExecResult` holding the first ``max_output`` bytes of each stream (the rest
    counted as dropped), like the in-process :class:`~sandbox_rt.ExecStream`."""

    def __init__(self, command: str, max_output: int, ctx: ErrorContext) -> None:
        self.command = command
        self.max_output = max_output
        self.ctx = ctx
        self._kept = {"stdout": bytearray(), "stderr": bytearray()}
        self._dropped = {"stdout": 0, "stderr": 0}
        self.result: ExecResult | None = None

    def event(self, name: str, data: str) -> OutputChunk | None:
        """The chunk an output event carries, else None (``exit`` sets :attr:`result`); raises the
        error an ``error`` event names."""
        if name not in ("stdout", "stderr", "exit", "error"):
            return None  # an event this client does not know (a newer server's): skipped
        if self.result is not None:
            raise bad_answer(f"an event ({name!r}) after the command's exit")
        payload = read_object(decode_json(data.encode("utf-8"), f"the {name!r} event"), f"the {name!r} event")
        if name == "stdout" or name == "stderr":
            chunk = read_b64(read_member(payload, "data", "an output event"), f"{name} data", MAX_EVENT_BYTES)
            kept = self._kept[name]
            room = max(0, self.max_output - len(kept))
            kept += chunk[:room]
            self._dropped[name] += len(chunk) - min(room, len(chunk))
            return OutputChunk("stdout" if name == "stdout" else "stderr", chunk)
        if name == "exit":

            def member(key: str) -> object:
                return read_member(payload, key, "the exit event")

            self.result = ExecResult(
                command=read_str(member("command"), "exit.command", MAX_TEXT),
                stdout=bytes(self._kept["stdout"]),
                stderr=bytes(self._kept["stderr"]),
                exit_code=read_int(member("exit_code"), "exit.exit_code", -(1 << 31), 1 << 31),
                duration_s=read_num(member("duration_s"), "exit.duration_s"),
                stdout_dropped=self._dropped["stdout"],
                stderr_dropped=self._dropped["stderr"],
            )
            return None
        if name == "error":
            status = read_int(read_member(payload, "status", "the error event"), "error.status", 100, 599)
            detail = read_object(read_member(payload, "error", "the error event"), "error.error")
            code = read_str(detail.get("code", "http_error"), "error.code", 64)
            message = read_str(detail.get("message", ""), "error.message", MAX_TEXT)[:MAX_MESSAGE]
            exc = error_from_answer(status, code, message, detail, self.ctx)
            if isinstance(exc, CommandTimeout):  # its output was streamed: what this client kept
                exc = CommandTimeout(
                    self.command, exc.timeout, bytes(self._kept["stdout"]), bytes(self._kept["stderr"])
                )
            raise exc
        return None

    def finish(self) -> ExecResult:
        if self.result is None:
            raise ConnectionLost("the server's event stream ended before the command's exit")
        return self.result
