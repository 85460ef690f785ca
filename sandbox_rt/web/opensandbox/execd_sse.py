"""Command output as execd streams it: each event one JSON object followed by a blank line (execd's
own framing, which its SDKs parse: a bare ``{...}\\n\\n``, not ``data:`` lines), in this order:

- ``{"type": "init", "text": "<command id>"}`` once, first;
- ``{"type": "stdout"|"stderr", "text": "..."}`` as the command prints (UTF-8; a bad byte is U+FFFD);
- then either ``{"type": "execution_complete", "execution_time": <ms>}`` (exit status 0), or
  ``{"type": "error", "error": {"ename": "CommandExecError", "evalue": "<exit status>",
  "traceback": [...]}}`` (the SDK reads a non-zero exit status from ``evalue``); a command that
  cannot finish (timeout, lost connection) ends with an ``error`` whose ``ename`` says why.

Every event has ``timestamp`` (Unix milliseconds). A client that goes away does not stop the
command: it runs on (to its end or its timeout) and its status is kept.
"""

from __future__ import annotations

import codecs
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ...errors import CommandTimeout, SandboxError
from ...models import ExecResult, OutputChunk
from ...protocols import ExecStreamLike
from .execd_registry import Registry

__all__ = ["SSE_MEDIA_TYPE", "After", "command_events", "complete_event", "frame", "init_event", "now_ms"]

log = logging.getLogger(__name__)

SSE_MEDIA_TYPE = "text/event-stream"
SSE_HEADERS = {"X-Accel-Buffering": "no", "Cache-Control": "no-cache"}

# run exactly once when the command is over (its result; None if it could not finish), before its
# last event: a text to report on stderr, or None
After = Callable[[ExecResult | None], "str | None"]


def now_ms() -> int:
    return int(time.time() * 1000)


def frame(event: Mapping[str, Any]) -> bytes:
    return json.dumps({**event, "timestamp": now_ms()}, ensure_ascii=False).encode("utf-8") + b"\n\n"


def init_event(command_id: str) -> bytes:
    return frame({"type": "init", "text": command_id})


def complete_event(elapsed_ms: int) -> bytes:
    return frame({"type": "execution_complete", "execution_time": max(0, elapsed_ms)})


def _error_event(ename: str, evalue: str, traceback: list[str]) -> bytes:
    return frame({"type": "error", "error": {"ename": ename, "evalue": evalue, "traceback": traceback}})


def _outcome(result: ExecResult | None) -> tuple[int | None, str | None]:
    if result is None:
        return None, "the command's stream ended without a result"
    return result.exit_code, None


def _finish(registry: Registry, command_id: str, exc: BaseException) -> None:
    registry.finish(command_id, None, str(exc)[:500] if isinstance(exc, SandboxError) else "internal error")


def _drain(
    it: Iterator[OutputChunk], stream: ExecStreamLike, command_id: str, registry: Registry, settle: After
) -> None:
    """What is left of a stream whose client went away: read to its end, keep its status."""
    result: ExecResult | None = None
    try:
        for _ in it:
            pass
        result = stream.result
        code, error = _outcome(result)
        registry.finish(command_id, code, error)
    except Exception as exc:
        _finish(registry, command_id, exc)
        if not isinstance(exc, SandboxError):
            log.exception("internal error while draining command %s", command_id)
    finally:
        settle(result)


def command_events(
    stream: ExecStreamLike, command_id: str, registry: Registry, *, after: After | None = None
) -> Iterator[bytes]:
    """The events of a running command (blocking: iterated on a worker thread)."""
    started = time.monotonic()
    decoders = {
        name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in ("stdout", "stderr")
    }
    it = iter(stream)
    ended = False  # the stream gave its result: nothing is left to drain
    settled = False

    def settle(result: ExecResult | None) -> str | None:
        nonlocal settled
        if settled or after is None:
            return None
        settled = True
        return after(result)

    try:
        yield init_event(command_id)
        for chunk in it:
            text = str(decoders[chunk.stream].decode(chunk.data))
            if text:
                yield frame({"type": chunk.stream, "text": text})
        for name, decoder in decoders.items():  # a trailing partial UTF-8 sequence
            rest = str(decoder.decode(b"", True))
            if rest:
                yield frame({"type": name, "text": rest})
        ended = True
        result = stream.result
        code, error = _outcome(result)
        note = settle(result)
        registry.finish(command_id, code, error)
        if note:
            yield frame({"type": "stderr", "text": note})
        elapsed = int((time.monotonic() - started) * 1000)
        if code == 0:
            yield complete_event(elapsed)
        elif code is None:
            yield _error_event("CommandExecError", str(error), [str(error)])
        else:
            yield _error_event("CommandExecError", str(code), [f"exit status {code}"])
    except GeneratorExit:
        if ended:
            raise
        drain = threading.Thread(
            target=_drain, args=(it, stream, command_id, registry, settle), name=f"execd-drain-{command_id}"
        )
        drain.daemon = True
        drain.start()
        raise
    except CommandTimeout as exc:
        settle(None)
        registry.finish(command_id, None, str(exc)[:500])
        yield _error_event(
            "CommandTimeout", "-1", [f"timed out after {exc.timeout:g} s; its process group was killed"]
        )
    except SandboxError as exc:
        settle(None)
        _finish(registry, command_id, exc)
        message = str(exc)[:1000]
        yield _error_event(type(exc).__name__, message, [message])
    except Exception as exc:
        settle(None)
        _finish(registry, command_id, exc)
        log.exception("internal error while streaming command %s", command_id)
        yield _error_event("InternalError", "internal server error (see the log)", [])
