"""Probes for verify.yml, run inside the scenario's network namespace (`ip netns exec NS python3 ...`).

    probe.py tcp HOST PORT      prints open, refused or timeout (1 s)
    probe.py dns SERVER NAME    one UDP A query: prints the first address, nxdomain, dns-refused (the
                                server answered REFUSED), refused (ICMP port unreachable) or timeout

The namespace has no resolver and the template image has no dig or ping, so the protocols are spoken
here with plain sockets.
"""

from __future__ import annotations

import random
import socket
import struct
import sys

TIMEOUT = 1.0


def tcp(host: str, port: int) -> str:
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"


def dns(server: str, name: str) -> str:
    qid = random.getrandbits(16)
    question = b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\0"
    query = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + question + struct.pack("!HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(TIMEOUT)
        sock.connect((server, 53))  # connected: an ICMP port unreachable surfaces as ECONNREFUSED
        sock.send(query)
        try:
            reply = sock.recv(512)
        except ConnectionRefusedError:
            return "refused"
        except TimeoutError:
            return "timeout"
    rid, flags, _qd, ancount = struct.unpack("!HHHH", reply[:8])
    if rid != qid:
        return "bad-id"
    if flags & 0xF == 5:
        return "dns-refused"
    if flags & 0xF == 3 or ancount == 0:
        return "nxdomain"
    # Skip the echoed question; the first answer with a compressed name pointer (2 bytes), then
    # type, class, ttl, rdlength (10 bytes) and a 4-byte A record.
    offset = 12 + len(question) + 4
    rtype, _rclass, _ttl, rdlength = struct.unpack("!HHIH", reply[offset + 2 : offset + 12])
    if rtype != 1 or rdlength != 4:
        return "not-a"
    return socket.inet_ntoa(reply[offset + 12 : offset + 16])


def main() -> None:
    kind, target, arg = sys.argv[1:4]
    print(tcp(target, int(arg)) if kind == "tcp" else dns(target, arg))


if __name__ == "__main__":
    main()
