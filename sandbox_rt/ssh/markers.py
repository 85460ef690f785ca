"""The end-marker protocol of one command: the wrapper sshd runs, and the demultiplexer that splits
the channel's two streams into the command's output, its process group and its exit code.

Completion is decided by end markers the wrapper prints after the command, not by EOF, so a
command that leaves a background process holding stdout (``sleep 100 &``) returns at once. The
markers carry a random token per command, but the server sees the command text, so a lying server
can forge them: what they carry is checked (bounded digits and ranges) like any sandbox output.

Output kept for the result is capped per stream (``max_output``); beyond it, bytes are counted and
dropped (``truncated``) while a streaming sink still sees every chunk as it arrives.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Callable, Mapping
from typing import Literal

from ..models import OutputChunk
from ..output_limits import DEFAULT_MAX_OUTPUT

__all__ = ["ChunkSink", "Demux", "Markers", "StreamName"]

StreamName = Literal["stdout", "stderr"]
ChunkSink = Callable[[OutputChunk], None]

_MARKER_MAX = 64  # longer than any marker: a partial marker can only sit in the last 64 bytes
# before the process-group marker (the wrapper's first output), stderr is held back; a server that
# never sends it gets this much held, then the rest is plain output
_PENDING_ERR_MAX = 64 << 10
_PID_MAX = 1 << 22  # the kernel's largest pid_max


class Markers:
    """The per-command random markers the wrapper prints, and how to find them."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(12)
        self.pgid_re = re.compile(rb"\x1e" + self.token.encode() + rb"P(\d{1,7})\x1e")
        self.end_out_re = re.compile(rb"\x1e" + self.token.encode() + rb"E(\d{1,3})\x1e")
        self.end_err = b"\x1e" + self.token.encode() + b"E\x1e"

    def wrap(self, command: str, cwd: str | None, env: Mapping[str, str]) -> str:
        """The shell text sshd runs: the command in a new session, then the end markers."""
        tok = self.token
        inner = 'printf "\\036%sP%s\\036" "$0" "$$" >&2; '
        if cwd is not None:
            inner += 'cd -- "$1" || exit 1; '
        inner += 'shift; exec "$@"'
        argv = ["env", *(f"{k}={v}" for k, v in env.items()), "/bin/bash", "-c", command]
        # The brace group's own stderr is /dev/null so the shell's job notices ("Killed ...") stay
        # out of the output; the command itself gets the real stderr through fd 3.
        return (
            f"{{ setsid -w /bin/sh -c {shlex.quote(inner)} {tok} {shlex.quote(cwd or '/')} "
            f"{shlex.join(argv)} 2>&3 3>&-; }} 3>&2 2>/dev/null; "
            f"printf '\\036%sE%s\\036' {tok} \"$?\"; printf '\\036%sE\\036' {tok} >&2"
        )


class Demux:
    """Splits a channel's two streams into user output and markers.

    ``out``/``err`` keep at most ``max_output`` bytes each; ``dropped_out``/``dropped_err`` count
    what did not fit. ``sink`` (streaming) gets every chunk, kept or not.
    """

    def __init__(
        self, markers: Markers, sink: ChunkSink | None, max_output: int = DEFAULT_MAX_OUTPUT
    ) -> None:
        self.m = markers
        self.sink = sink
        self.max_output = max_output
        self.out = bytearray()
        self.err = bytearray()
        self.dropped_out = 0
        self.dropped_err = 0
        self.pending_out = bytearray()  # bytes not yet known to be free of a marker prefix
        self.pending_err = bytearray()
        self.pgid: int | None = None
        self.exit_code: int | None = None
        self.err_done = False
        self._pgid_given_up = False

    @property
    def done(self) -> bool:
        return self.exit_code is not None and self.err_done

    @property
    def truncated(self) -> bool:
        return bool(self.dropped_out or self.dropped_err)

    def feed(self, stream: StreamName, data: bytes) -> None:
        if stream == "stdout":
            if self.exit_code is not None:
                return  # output after the end marker comes from background processes
            buf = self.pending_out
            buf += data
            m = self.m.end_out_re.search(buf)
            if m and int(m.group(1)) <= 255:
                self.exit_code = int(m.group(1))
                self._emit("stdout", bytes(buf[: m.start()]))
                buf.clear()
                return
            self._emit("stdout", self._release(buf))
        else:
            if self.err_done:
                return
            buf = self.pending_err
            buf += data
            if self.pgid is None and not self._pgid_given_up:
                m = self.m.pgid_re.search(buf)
                if m and 1 < int(m.group(1)) < _PID_MAX:
                    self.pgid = int(m.group(1))
                    del buf[m.start() : m.end()]
                elif len(buf) > _PENDING_ERR_MAX:
                    self._pgid_given_up = True  # no process group to kill on timeout
            idx = buf.find(self.m.end_err)
            if idx >= 0:
                self.err_done = True
                self._emit("stderr", bytes(buf[:idx]))
                buf.clear()
                return
            if self.pgid is not None or self._pgid_given_up:
                self._emit("stderr", self._release(buf))

    def flush(self) -> None:
        """The channel ended without markers: everything pending is output."""
        self._emit("stdout", bytes(self.pending_out))
        self._emit("stderr", bytes(self.pending_err))
        self.pending_out.clear()
        self.pending_err.clear()

    @staticmethod
    def _release(buf: bytearray) -> bytes:
        """Emit all of ``buf`` except a tail that could be the start of a marker."""
        cut = buf.rfind(b"\x1e", max(0, len(buf) - _MARKER_MAX))
        if cut < 0:
            cut = len(buf)
        out = bytes(buf[:cut])
        del buf[:cut]
        return out

    def _emit(self, stream: StreamName, data: bytes) -> None:
        if not data:
            return
        kept = self.out if stream == "stdout" else self.err
        room = self.max_output - len(kept)
        if room >= len(data):
            kept += data
        else:
            if room > 0:
                kept += data[:room]
            dropped = len(data) - max(room, 0)
            if stream == "stdout":
                self.dropped_out += dropped
            else:
                self.dropped_err += dropped
        if self.sink is not None:
            self.sink(OutputChunk(stream, data))
