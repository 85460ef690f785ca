"""A tiny TCP server for the hardening test network, run inside a network namespace.

    python netns_server.py ADDR:PORT [ADDR:PORT ...]

Every listener answers an HTTP request (first line starts with ``GET ``) with ``200`` and the body
``<addr>:<port> ok``, and echoes anything else line by line (a long-lived connection the tests can
watch die). Plain sockets, bound explicitly: no reverse lookups (http.server would stall ~10 s in a
namespace without DNS). Prints ``ready`` once every socket listens.
"""

from __future__ import annotations

import socket
import sys
import threading


def _serve_client(conn: socket.socket, tag: str) -> None:
    with conn:
        conn.settimeout(120)
        try:
            reader = conn.makefile("rb")
            first = reader.readline()
            if first.startswith(b"GET "):
                body = f"{tag} ok\n".encode()
                conn.sendall(
                    b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\nConnection: close\r\n\r\n"
                    + body
                )
                return
            line = first
            while line:
                conn.sendall(line)
                line = reader.readline()
        except OSError:
            return


def _listen(addr: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((addr, port))
    sock.listen(512)
    return sock


def _accept_loop(sock: socket.socket, tag: str) -> None:
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=_serve_client, args=(conn, tag), daemon=True).start()


def main(argv: list[str]) -> int:
    socks = []
    for spec in argv:
        addr, _, port = spec.rpartition(":")
        socks.append((_listen(addr, int(port)), spec))
    for sock, tag in socks:
        threading.Thread(target=_accept_loop, args=(sock, tag), daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
