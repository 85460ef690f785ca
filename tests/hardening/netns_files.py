"""A static file server for the test network's "internet", run inside a network namespace.

    python netns_files.py ADDR PORT DIRECTORY

Serves DIRECTORY read-only over HTTP/1.0 (a package index, tarballs, a dumb-HTTP git repository).
No name lookups: http.server's own bind asks getfqdn(), which stalls in a namespace without DNS.
Prints ``ready`` once the socket listens.
"""

from __future__ import annotations

import functools
import http.server
import socketserver
import sys


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:  # no getfqdn()
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"{self.client_address[0]} {format % args}\n")


def main() -> None:
    addr, port, directory = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    handler = functools.partial(_Quiet, directory=directory)
    with _Server((addr, port), handler) as server:
        print("ready", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
