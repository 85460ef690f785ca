"""A minimal DHCP client for the tests, run inside a network namespace (`ip netns exec NS python3 ...`).

    dhcp_probe.py acquire DEV MAC            DISCOVER, OFFER, REQUEST, ACK; prints "IP ROUTER MASK SERVER"
    dhcp_probe.py release DEV MAC IP SERVER  sends DHCPRELEASE from IP (which must be on DEV)

The sandbox template has no DHCP client (the runtime uses static addresses), and a fresh machine may
have neither busybox nor dhclient, so the protocol is spoken here directly with UDP sockets.
"""

from __future__ import annotations

import random
import socket
import struct
import sys
import time

MAGIC = b"\x63\x82\x53\x63"


def packet(msg_type: int, xid: int, mac: bytes, ciaddr: str = "0.0.0.0", options: bytes = b"") -> bytes:
    header = struct.pack(
        "!BBBBIHH4s4s4s4s16s64s128s",
        1,
        1,
        6,
        0,
        xid,
        0,
        0x8000,
        socket.inet_aton(ciaddr),
        b"\0" * 4,
        b"\0" * 4,
        b"\0" * 4,
        mac + b"\0" * 10,
        b"\0" * 64,
        b"\0" * 128,
    )
    return header + MAGIC + bytes([53, 1, msg_type]) + options + b"\xff"


def parse(data: bytes) -> tuple[int, str, dict[int, bytes]]:
    xid = struct.unpack("!I", data[4:8])[0]
    yiaddr = socket.inet_ntoa(data[16:20])
    options: dict[int, bytes] = {}
    i = 240
    while i < len(data) and data[i] != 255:
        if data[i] == 0:
            i += 1
            continue
        options[data[i]] = data[i + 2 : i + 2 + data[i + 1]]
        i += 2 + data[i + 1]
    return xid, yiaddr, options


def acquire(dev: str, mac: bytes) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, dev.encode())
    sock.bind(("0.0.0.0", 68))
    sock.settimeout(1.0)
    xid = random.getrandbits(32)

    def exchange(request: bytes, want: int) -> tuple[str, dict[int, bytes]]:
        for _ in range(8):
            sock.sendto(request, ("255.255.255.255", 67))
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                try:
                    data = sock.recv(4096)
                except TimeoutError:
                    break
                rxid, yiaddr, options = parse(data)
                if rxid == xid and options.get(53) == bytes([want]):
                    return yiaddr, options
        raise SystemExit(f"dhcp_probe: no DHCP reply of type {want} on {dev}")

    offered, options = exchange(packet(1, xid, mac), 2)
    server = options[54]
    request_options = bytes([50, 4]) + socket.inet_aton(offered) + bytes([54, 4]) + server
    acked, options = exchange(packet(3, xid, mac, options=request_options), 5)
    router = socket.inet_ntoa(options[3][:4]) if 3 in options else "-"
    netmask = socket.inet_ntoa(options[1]) if 1 in options else "-"
    print(acked, router, netmask, socket.inet_ntoa(server))


def release(dev: str, mac: bytes, address: str, server: str) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, dev.encode())
    sock.bind((address, 68))
    options = bytes([54, 4]) + socket.inet_aton(server)
    sock.sendto(packet(7, random.getrandbits(32), mac, ciaddr=address, options=options), (server, 67))


def main() -> None:
    command, dev, mac_text = sys.argv[1:4]
    mac = bytes.fromhex(mac_text.replace(":", ""))
    if command == "acquire":
        acquire(dev, mac)
    elif command == "release":
        release(dev, mac, sys.argv[4], sys.argv[5])
    else:
        raise SystemExit(f"dhcp_probe: unknown command {command}")


if __name__ == "__main__":
    main()
