"""An interactive terminal in a sandbox (``sb.pty()``): a pseudo-terminal over the sandbox's SSH
connection, with input, output, resize and the shell's exit status.

Output is what the terminal prints: read it as it comes (``read``, or iterate). The SSH receive
window bounds what waits unread on the host (a sandbox that ignores it loses the connection), so a
reader that stops reading costs at most the window, never unbounded memory.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import paramiko

from .errors import ConfigError, ConnectionLost
from .ssh import SSHExecutor, wire

__all__ = ["Pty"]

_READ = 65536


def check_size(cols: object, rows: object) -> tuple[int, int]:
    for name, value in (("cols", cols), ("rows", rows)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000:
            raise ConfigError(f"{name}={value!r} must be a whole number from 1 to 10000")
    return cols, rows  # type: ignore[return-value]


class Pty:
    """A terminal running a shell (or ``command``) in the sandbox. Close it when done (or use
    ``with``); closing ends what runs in it (SIGHUP), as closing a terminal window does."""

    def __init__(
        self,
        executor: SSHExecutor,
        *,
        cols: int = 80,
        rows: int = 24,
        command: str | None = None,
        term: str = "xterm-256color",
    ) -> None:
        self.cols, self.rows = check_size(cols, rows)
        if command is not None and (not isinstance(command, str) or "\x00" in command or not command.strip()):
            raise ConfigError(f"command={command!r} must be a non-empty string without NUL bytes")
        if not isinstance(term, str) or not term.isascii() or not term or len(term) > 64:
            raise ConfigError(f"term={term!r} must be a terminal type name")
        self._ssh = executor
        self._chan = executor.open_pty(command, cols=self.cols, rows=self.rows, term=term)
        self._closed = False
        self._lock = threading.Lock()

    # -- input / output --------------------------------------------------------------------------
    def write(self, data: bytes | str) -> None:
        """Type ``data`` into the terminal (keys, control characters: ``"\\x03"`` is Ctrl-C)."""
        if not isinstance(data, bytes | str):
            raise ConfigError(f"data must be bytes or str, not {type(data).__name__}")
        payload = data.encode() if isinstance(data, str) else data
        try:
            if payload and not wire.send_data(self._chan, payload):
                raise ConnectionLost("the terminal has closed")
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectionLost(f"the terminal's connection failed: {exc}") from exc

    def read(self, timeout: float | None = None) -> bytes:
        """What the terminal printed, as soon as there is some (at most 64 KiB); ``b""`` when it
        has closed, or when nothing came within ``timeout`` seconds (see :attr:`closed`)."""
        self._chan.settimeout(timeout)
        try:
            return self._chan.recv(_READ)
        except TimeoutError:
            return b""
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectionLost(f"the terminal's connection failed: {exc}") from exc

    def fileno(self) -> int:
        """Readable when output waits (for ``select``)."""
        return self._chan.fileno()

    def __iter__(self) -> Iterator[bytes]:
        """Output chunks until the terminal closes."""
        while True:
            data = self.read()
            if not data:
                return
            yield data

    def resize(self, cols: int, rows: int) -> None:
        """Tell the terminal its new size (the program in it gets SIGWINCH)."""
        self.cols, self.rows = check_size(cols, rows)
        try:
            self._chan.resize_pty(width=self.cols, height=self.rows)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectionLost(f"the terminal's connection failed: {exc}") from exc

    # -- end -------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once the program in the terminal ended (or the terminal was closed)."""
        return self._closed or self._chan.closed or self._chan.exit_status_ready()

    def wait(self, timeout: float | None = None) -> int | None:
        """The program's exit status once it ended; None if it did not end within ``timeout``."""
        if not self._chan.status_event.wait(timeout):
            return None
        return self._chan.exit_status

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        wire.close_quietly(self._chan)
        self._ssh.release_channel()

    def __enter__(self) -> Pty:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
