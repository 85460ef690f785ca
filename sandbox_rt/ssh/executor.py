"""The SSH executor: commands, streams and file transfers on one sandbox's pinned connection.

- The connection (:mod:`.connection`): key auth only, the host key pinned before the first contact,
  one persistent transport per sandbox, a channel per command.
- Each command runs in its own session (``setsid``): a timeout kills the whole process group (see
  :mod:`.markers` for the end-marker protocol).
- Nothing the sandbox sends is trusted: output is capped per stream (``max_output``), file reads
  take at most ``max_bytes`` (see :mod:`.files`), listings are bounded and their names checked.
"""

from __future__ import annotations

import contextlib
import errno
import io
import posixpath
import select
import stat
import threading
import time
from collections.abc import Iterator, Mapping
from typing import IO

import paramiko

from ..errors import CommandTimeout, ConnectionLost, FileOperationError
from ..models import OutputChunk
from ..output_limits import DEFAULT_MAX_OUTPUT, DEFAULT_READ_MAX_BYTES, STREAM_QUEUE_CHUNKS
from . import wire
from .connection import MAX_PARALLEL_CHANNELS, SSHConnection
from .files import Op, check_entry_name, explain, is_directory, read_script, receive_file
from .markers import ChunkSink, Demux, Markers

__all__ = ["RawResult", "SSHExecutor"]

_READ_SIZE = 65536
_SFTP_CHUNK = 1 << 20
# Channels that carry a file: a 16 MiB window and 256 KiB packets (paramiko's defaults are 2 MiB and
# 32 KiB) take the read from ~580 to ~700 MB/s: fewer packets for paramiko to handle in Python.
_BULK_WINDOW = 16 << 20
_BULK_PACKET = 256 << 10


@contextlib.contextmanager
def _explained(sftp: wire.BoundedSFTPClient, op: Op, path: str, dst: str | None = None) -> Iterator[None]:
    """An SFTP failure the server did not explain (OpenSSH's generic FAILURE...) as the error it
    stands for (see :func:`.files.explain`); only on failure, the success path asks nothing more."""
    try:
        yield
    except OSError as exc:
        # a timeout leaves a request pending on the session: asking it anything more would wait again
        unexplained = isinstance(exc, FileOperationError | TimeoutError)
        why = None if unexplained else explain(sftp, op, exc, path, dst)
        if why is None:
            raise
        raise why from exc


class RawResult:
    """Output and status of one finished command (the executor's own, before timing).

    ``dropped_stdout``/``dropped_stderr``: bytes past ``max_output`` that were not kept.
    """

    __slots__ = ("dropped_stderr", "dropped_stdout", "exit_code", "stderr", "stdout")

    def __init__(
        self, stdout: bytes, stderr: bytes, exit_code: int, dropped_stdout: int = 0, dropped_stderr: int = 0
    ) -> None:
        self.stdout = stdout
        self.stderr = stderr
        self.exit_code = exit_code
        self.dropped_stdout = dropped_stdout
        self.dropped_stderr = dropped_stderr


class SSHExecutor(SSHConnection):
    """Commands, streams and files on a persistent SSH transport to one sandbox; thread-safe."""

    # -- commands ------------------------------------------------------------------------------
    def run(
        self,
        command: str,
        *,
        timeout: float | None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        sink: ChunkSink | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> RawResult:
        """Run ``command`` with bash in a new session; stream chunks to ``sink`` as they come.

        The result keeps at most ``max_output`` bytes per stream (``sink`` still sees all of it).
        """
        markers = Markers()
        demux = Demux(markers, sink, max_output)
        with self._channels:
            chan = self._start_channel(markers.wrap(command, cwd, env or {}))
            try:
                wire.send_input(chan, stdin)
                self._pump(chan, demux, command, timeout)
            except CommandTimeout:
                raise
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self._drop_broken()
                raise ConnectionLost(f"connection to {self.host} lost during {command!r}: {exc}") from exc
            finally:
                wire.close_quietly(chan)
        code = demux.exit_code
        if code is None:
            demux.flush()
            if not self.is_connected():
                raise ConnectionLost(f"connection to {self.host} lost during {command!r}")
            code = chan.recv_exit_status() if chan.exit_status_ready() else -1
        return RawResult(bytes(demux.out), bytes(demux.err), code, demux.dropped_out, demux.dropped_err)

    def open_pty(self, command: str | None, *, cols: int, rows: int, term: str) -> paramiko.Channel:
        """A channel with a pseudo-terminal running ``command`` (the login shell if None); the
        caller owns it (close it). It takes one of the parallel-channel slots until closed."""
        if not self._channels.acquire(timeout=self._connect_timeout):
            raise ConnectionLost(f"{self.host}: all {MAX_PARALLEL_CHANNELS} channels are busy")
        try:
            chan = self._transport().open_session(timeout=self._connect_timeout)
            try:
                chan.get_pty(term=term, width=cols, height=rows)
                if command is None:
                    chan.invoke_shell()
                else:
                    chan.exec_command(command)
            except BaseException:
                wire.close_quietly(chan)
                raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self._channels.release()
            self._drop_broken()
            raise ConnectionLost(f"cannot open a terminal on {self.host}: {exc}") from exc
        except BaseException:
            self._channels.release()
            raise
        return chan

    def release_channel(self) -> None:
        """Give back the slot a closed :meth:`open_pty` channel held."""
        self._channels.release()

    def _pump(self, chan: paramiko.Channel, demux: Demux, command: str, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        # poll, not select: a process holding ~1,000 attached sandboxes has fds above FD_SETSIZE
        # (1024), and select() refuses those (the channel's wake-up pipe is opened last)
        poller = select.poll()
        poller.register(chan, select.POLLIN)
        while not demux.done:
            wait = 1.0 if deadline is None else deadline - time.monotonic()
            if wait <= 0:
                self._kill_group(demux)
                demux.flush()
                raise CommandTimeout(command, timeout or 0.0, bytes(demux.out), bytes(demux.err))
            poller.poll(int(min(wait, 1.0) * 1000) + 1)
            progressed = False
            while chan.recv_stderr_ready():
                demux.feed("stderr", chan.recv_stderr(_READ_SIZE))
                progressed = True
            while chan.recv_ready():
                data = chan.recv(_READ_SIZE)
                if not data:
                    break
                demux.feed("stdout", data)
                progressed = True
            ended = chan.closed or (chan.eof_received and chan.exit_status_ready())
            if not progressed and ended and not chan.recv_stderr_ready():
                return
            if not chan.get_transport() or not self.is_connected():
                return

    def _kill_group(self, demux: Demux) -> None:
        """Kill the timed-out command's whole process group through a second channel."""
        if demux.pgid is None:
            return
        with contextlib.suppress(paramiko.SSHException, OSError, EOFError):
            chan = self._transport().open_session(timeout=self._connect_timeout)
            try:
                chan.exec_command(f"kill -KILL -- -{int(demux.pgid)} 2>/dev/null; true")
                chan.recv_exit_status()
            finally:
                wire.close_quietly(chan)

    def stream(
        self,
        command: str,
        *,
        timeout: float | None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> Iterator[OutputChunk | RawResult]:
        """Yield output chunks as they arrive, then the final :class:`RawResult`.

        At most ``STREAM_QUEUE_CHUNKS`` chunks wait for the consumer: beyond, the reader pauses, the
        SSH window closes and the command blocks on its output (memory stays bounded, nothing lost).
        A consumer that stops iterating early leaves the command to its timeout.
        """
        chunks: list[OutputChunk | RawResult | BaseException] = []
        cond = threading.Condition()
        abandoned = threading.Event()

        def sink(chunk: OutputChunk) -> None:
            with cond:
                while len(chunks) >= STREAM_QUEUE_CHUNKS and not abandoned.is_set():
                    cond.wait(1.0)
                chunks.append(chunk)
                cond.notify_all()

        def worker() -> None:
            item: RawResult | BaseException
            try:
                item = self.run(
                    command, timeout=timeout, cwd=cwd, env=env, stdin=stdin, sink=sink, max_output=max_output
                )
            except BaseException as exc:  # handed to the consumer below
                item = exc
            with cond:
                chunks.append(item)
                cond.notify_all()

        thread = threading.Thread(target=worker, name=f"exec-stream-{self.host}", daemon=True)
        thread.start()
        try:
            while True:
                with cond:
                    while not chunks:
                        cond.wait()
                    batch = chunks[:]
                    chunks.clear()
                    cond.notify_all()
                for item in batch:
                    if isinstance(item, BaseException):
                        raise item
                    yield item
                    if isinstance(item, RawResult):
                        thread.join()
                        return
        finally:
            abandoned.set()  # a consumer gone early must not leave the reader blocked on the queue
            with cond:
                cond.notify_all()

    # -- files -----------------------------------------------------------------------------------
    def write_bytes(self, path: str, data: bytes, mode: int | None = None) -> None:
        self.put_stream(io.BytesIO(data), path, mode)

    def read_bytes(self, path: str, max_bytes: int = DEFAULT_READ_MAX_BYTES) -> bytes:
        buf = io.BytesIO()
        self.get_stream(path, buf, max_bytes)
        return buf.getvalue()

    def put_stream(self, src: IO[bytes], path: str, mode: int | None = None) -> int:
        """Copy a local stream into ``path`` in chunks (never the whole file in memory)."""
        total = 0
        with (
            self._sftp_client("write", path) as sftp,
            _explained(sftp, "write", path),  # after the file's close, before the session is handed back
            sftp.open(path, "wb") as remote,
        ):
            remote.set_pipelined(True)
            while chunk := src.read(_SFTP_CHUNK):
                remote.write(chunk)
                total += len(chunk)
            if mode is not None:
                remote.chmod(mode)
        return total

    def get_stream(self, path: str, dst: IO[bytes], max_bytes: int = DEFAULT_READ_MAX_BYTES) -> int:
        """Copy the regular file at ``path`` into ``dst`` in chunks; the bytes written.

        FileOperationError(EFBIG) at once if the file is larger than ``max_bytes`` (see
        :mod:`.files` for the exchange and why it is bounded against a lying sandbox).
        """
        with self._channels:
            chan = self._start_channel(read_script(path), window=_BULK_WINDOW, packet=_BULK_PACKET)
            try:
                wire.send_eof(chan)
                return receive_file(chan, path, dst, max_bytes)
            except FileOperationError:
                raise
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self._drop_broken()
                raise ConnectionLost(f"read {path}: connection to {self.host} lost: {exc}") from exc
            finally:
                wire.close_quietly(chan)

    def stat(self, path: str, *, follow_symlinks: bool = True) -> paramiko.SFTPAttributes | None:
        """The entry's attributes (None if there is none); ``follow_symlinks=False``: the link itself."""
        try:
            with self._sftp_client("stat", path) as sftp:
                return sftp.stat(path) if follow_symlinks else sftp.lstat(path)
        except FileOperationError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise

    def readlink(self, path: str) -> str | None:
        """A symlink's target as the sandbox says it (bounded to 4 KiB; None if unreadable)."""
        with self._sftp_client("readlink", path) as sftp:
            target = sftp.readlink(path)
        if not isinstance(target, str) or len(target) > 4096 or "\x00" in target:  # bytes: not UTF-8
            return None
        return target

    def remove(self, path: str) -> None:
        """Remove a file or symlink (not a directory)."""
        with self._sftp_client("remove", path) as sftp, _explained(sftp, "remove", path):
            sftp.remove(path)

    def rmdir(self, path: str) -> None:
        """Remove an empty directory."""
        with self._sftp_client("rmdir", path) as sftp, _explained(sftp, "rmdir", path):
            sftp.rmdir(path)

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        with self._sftp_client("mkdir", path) as sftp, _explained(sftp, "mkdir", path):
            sftp.mkdir(path, mode)

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst``, replacing a file there (POSIX rename semantics)."""
        with self._sftp_client("rename", src) as sftp, _explained(sftp, "rename", src, dst):
            sftp.posix_rename(src, dst)

    def makedirs(self, path: str) -> None:
        with self._sftp_client("mkdir", path) as sftp:
            parts: list[str] = []
            head = path
            while head not in ("", "/"):
                parts.append(head)
                head = posixpath.dirname(head)
            for directory in reversed(parts):
                try:
                    attrs = sftp.stat(directory)
                except FileNotFoundError:
                    try:
                        sftp.mkdir(directory)
                    except OSError as exc:
                        if is_directory(sftp, directory):  # made meanwhile (a concurrent mkdir): fine
                            continue
                        why = explain(sftp, "mkdir", exc, directory)
                        if why is None:
                            raise
                        raise why from exc
                    continue
                if not stat.S_ISDIR(attrs.st_mode or 0):
                    raise FileOperationError(errno.ENOTDIR, "mkdir: not a directory", directory)

    def listdir(self, path: str, max_entries: int) -> list[paramiko.SFTPAttributes]:
        """The entries of directory ``path`` (lstat attributes), each name checked to be one path
        component; FileOperationError past ``max_entries`` entries or on a bad name."""
        entries: list[paramiko.SFTPAttributes] = []
        with self._sftp_client("list", path) as sftp:
            complete = False
            try:
                for attrs in sftp.listdir_iter(path, read_aheads=8):
                    if len(entries) >= max_entries:
                        raise FileOperationError(errno.E2BIG, f"list: more than {max_entries} entries", path)
                    check_entry_name(attrs.filename, path)
                    entries.append(attrs)
                complete = True
            finally:
                if not complete:  # replies to our read-ahead requests are still on the way
                    self._reset_sftp()
        return entries
