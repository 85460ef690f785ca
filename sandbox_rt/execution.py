"""What running one command means on the host: the command text, its result, its stream.

Shared by ``Sandbox`` and the ``sb.commands`` namespace (no import of either by the other).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator, Sequence

from .errors import ConfigError, ExecError
from .models import ExecResult, OutputChunk
from .ssh import RawResult

__all__ = ["Command", "ExecStream", "command_text", "result_of"]

Command = str | Sequence[str]


# what a command of nothing but is empty: ASCII blanks, the same in the HTTP API's document (whose
# regexes are ECMA-262's, whose \s differs from Python's str.strip())
COMMAND_BLANKS = " \t\n\r\f\v"


def command_text(command: Command) -> str:
    """A string runs in the sandbox's bash as written; a list is quoted exactly, word by word."""
    if isinstance(command, str):
        if not command.strip(COMMAND_BLANKS):
            raise ConfigError("command is empty")
        if "\x00" in command:
            raise ConfigError(f"command {command[:60]!r} contains a NUL byte")
        return command
    if isinstance(command, bytes) or not isinstance(command, Sequence) or not command:
        raise ConfigError(f"command {command!r} must be a non-empty string or list of strings")
    words = list(command)
    for w in words:
        if not isinstance(w, str) or "\x00" in w:
            raise ConfigError(f"argument {w!r} must be a string without NUL bytes")
    return shlex.join(words)


def result_of(command: str, raw: RawResult, duration_s: float) -> ExecResult:
    return ExecResult(
        command, raw.stdout, raw.stderr, raw.exit_code, duration_s, raw.dropped_stdout, raw.dropped_stderr
    )


class ExecStream:
    """Iterate to get :class:`OutputChunk` s as the command prints them; ``result`` when done."""

    def __init__(self, chunks: Iterator[OutputChunk | RawResult], command: str, check: bool) -> None:
        self._chunks = chunks
        self._command = command
        self._check = check
        self._started = time.monotonic()
        self.result: ExecResult | None = None

    def __iter__(self) -> Iterator[OutputChunk]:
        for item in self._chunks:
            if isinstance(item, OutputChunk):
                yield item
            else:
                self.result = result_of(self._command, item, time.monotonic() - self._started)
                if self._check and item.exit_code != 0:
                    raise ExecError(self._command, item.exit_code, item.stdout, item.stderr)

    def wait(self) -> ExecResult:
        """Consume the rest of the output and return the result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result
