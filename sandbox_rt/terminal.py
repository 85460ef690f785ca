"""``sandbox-rt shell ID``: the user's own terminal, connected to a terminal in a sandbox.

The local terminal goes into raw mode (every key goes to the sandbox as typed, Ctrl-C included),
its size follows the local window (SIGWINCH -> resize), and everything is restored when the shell
ends, whatever happens. Without a local terminal (stdin is a pipe) the bytes are passed as they are.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
import termios
import tty
from collections.abc import Iterator
from types import FrameType

from .pty import Pty

__all__ = ["attach_terminal"]


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def local_size() -> tuple[int, int]:
    size = shutil.get_terminal_size((80, 24))
    return max(1, size.columns), max(1, size.lines)


def attach_terminal(pty: Pty, stdin_fd: int | None = None, stdout_fd: int | None = None) -> int:
    """Bridge the local terminal and ``pty`` until the program in it ends; its exit status."""
    fd_in = sys.stdin.fileno() if stdin_fd is None else stdin_fd
    fd_out = sys.stdout.fileno() if stdout_fd is None else stdout_fd
    resized = [False]

    def on_winch(_signum: int, _frame: FrameType | None) -> None:
        resized[0] = True

    old = signal.signal(signal.SIGWINCH, on_winch)
    stdin_open = True
    try:
        with _raw(fd_in):
            while not pty.closed:
                if resized[0]:
                    resized[0] = False
                    pty.resize(*local_size())
                wait = [fd_in] if stdin_open else []
                poller = select.poll()  # not select(): any fd number works
                for watched in (*wait, pty.fileno()):
                    poller.register(watched, select.POLLIN)
                try:
                    ready = {fd for fd, _events in poller.poll(500)}
                except InterruptedError:  # SIGWINCH
                    continue
                if fd_in in ready:
                    data = os.read(fd_in, 4096)
                    if data:
                        pty.write(data)
                    else:
                        stdin_open = False  # local EOF: the program's own input decides what follows
                if pty.fileno() in ready or not wait:
                    out = pty.read(timeout=0.05)
                    if out:
                        os.write(fd_out, out)
            while out := pty.read(timeout=0.2):  # what it printed last
                os.write(fd_out, out)
    finally:
        signal.signal(signal.SIGWINCH, old)
    code = pty.wait(timeout=5)
    return 255 if code is None else code
