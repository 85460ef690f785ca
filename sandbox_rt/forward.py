"""Expose a port of a sandbox on the host: a TCP forward from a host address to sandbox:port.

The host reaches sandbox addresses directly on the bridge (host → sandbox is allowed; the
reverse is not), so the forward is a plain relay in the caller's process: a listener on the host
address the caller chooses (loopback by default) and two pumps per connection. It ends with
:meth:`PortForward.close`, which ``Sandbox.destroy``/``close`` call.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading

__all__ = ["PortForward"]

_BUF = 65536


class PortForward:
    """``listen (host, port)`` → ``target (ip, port)``; thread-per-connection relay."""

    def __init__(self, target: tuple[str, int], bind: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.target = target
        self._listener = socket.create_server(bind, reuse_port=False)
        self._listener.settimeout(0.5)
        self.host, self.port = self._listener.getsockname()[:2]
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name=f"forward-{self.port}", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """``host:port`` to connect to."""
        return f"{self.host}:{self.port}"

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        for s in (client, upstream):
            s.setblocking(False)
        with self._lock:
            self._conns |= {client, upstream}
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, upstream)
        sel.register(upstream, selectors.EVENT_READ, client)
        open_ends = 2
        try:
            while open_ends and not self._closed.is_set():
                try:
                    events = sel.select(timeout=0.5)
                except (OSError, ValueError):  # closed under us by close()
                    break
                for key, _ in events:
                    src = key.fileobj
                    dst = key.data
                    assert isinstance(src, socket.socket) and isinstance(dst, socket.socket)
                    try:
                        data = src.recv(_BUF)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(src)
                        with contextlib.suppress(OSError):
                            dst.shutdown(socket.SHUT_WR)
                        open_ends -= 1
                        continue
                    try:
                        dst.setblocking(True)
                        dst.sendall(data)
                        dst.setblocking(False)
                    except OSError:  # the peer went away, or close() closed the socket under us
                        open_ends = 0
                        break
        finally:
            sel.close()
            with self._lock:
                self._conns -= {client, upstream}
            client.close()
            upstream.close()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.close()
        self._thread.join(timeout=5)

    def __enter__(self) -> PortForward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
