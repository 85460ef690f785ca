"""Network probes run inside a sandbox (Debian's python3, standard library only; no ping, no nmap).

    python3 probe.py tcp HOST PORT [TIMEOUT]          {"open": bool, "error": str}
    python3 probe.py http HOST PORT [TIMEOUT]         {"ok": bool, "body": str, "error": str}
    python3 probe.py dns SERVER NAME [udp|tcp]        {"answer": "a.b.c.d" | null, "rcode": int | null,
                                                       "error": str}
    python3 probe.py dns-many NAME SERVER/PROTO ...   {"SERVER/PROTO": "a.b.c.d" | null, ...} (at once)
    python3 probe.py sweep TIMEOUT HOST:P1,P2-P3 ...  {"open": [[host, port], ...], "tried": n}
    python3 probe.py burst HOST PORT N WINDOW         {"connected": n, "tried": N}
    python3 probe.py hold HOST PORT LOGFILE           a long-lived echo connection, logged line by line
    python3 probe.py icmp HOST [TIMEOUT]              {"reply": bool, "error": str} (needs CAP_NET_RAW)
    python3 probe.py spoof SRC DST DPORT SPORT        {"sent": bool, "error": str}: one TCP SYN from a
                                                      forged source address (needs CAP_NET_RAW)
    python3 probe.py spoof-dns SRC DST SPORT          the same for one UDP DNS query
    python3 probe.py arp-claim IFACE IP TARGET        {"sent": bool, "error": str}: an ARP request for
                                                      TARGET saying IP is at IFACE's MAC (CAP_NET_RAW)
    python3 probe.py flows HOST SECONDS               {"dns": n, "dhcp": n}: new UDP flows to the host
                                                      (DNS queries and datagrams to its DHCP port), each
                                                      from the next local port, as fast as they go
    python3 probe.py udp-flows HOST PORT COUNT        {"sent": n}: COUNT datagrams, each from its own port
    python3 probe.py dns-flood HOST NAME SECONDS      {"sent": n, "answered": n}: queries on one socket
    python3 probe.py dns-series HOST NAME COUNT GAP   {"lost": n, "answered": n}: COUNT queries one by one
    python3 probe.py serve PORT BYTES                 send BYTES to the first TCP client, then exit
    python3 probe.py sink PORT                        read the first TCP client to its end, then exit

Every probe prints one JSON line and exits 0 (``hold`` exits 1 when its connection dies). The DNS
packet helpers are imported by the host side too (tests/hardening/testnet.py).
"""

from __future__ import annotations

import concurrent.futures
import errno
import json
import os
import resource
import select
import socket
import struct
import sys
import time


def dns_packet(name: str, qid: int = 0x5B5B) -> bytes:
    """A DNS A query for ``name`` (recursion desired)."""
    header = qid.to_bytes(2, "big") + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    qname = b"".join(len(p).to_bytes(1, "big") + p.encode() for p in name.split(".")) + b"\x00"
    return header + qname + b"\x00\x01\x00\x01"


def first_a_record(reply: bytes) -> str | None:
    """The first A record of a DNS reply, or None (a small parser, enough for dnsmasq's answers)."""
    if len(reply) < 12 or reply[3] & 0x0F != 0:
        return None
    answers = int.from_bytes(reply[6:8], "big")
    pos = 12
    while reply[pos] != 0:
        pos += reply[pos] + 1
    pos += 5
    for _ in range(answers):
        if reply[pos] & 0xC0 == 0xC0:
            pos += 2
        else:
            pos = reply.index(b"\x00", pos) + 1
        rtype = int.from_bytes(reply[pos : pos + 2], "big")
        rdlen = int.from_bytes(reply[pos + 8 : pos + 10], "big")
        pos += 10
        if rtype == 1 and rdlen == 4:
            return socket.inet_ntoa(reply[pos : pos + 4])
        pos += rdlen
    return None


def dns_query(server: str, name: str, proto: str = "udp", timeout: float = 2.0) -> dict[str, object]:
    packet = dns_packet(name)
    try:
        if proto == "tcp":
            with socket.create_connection((server, 53), timeout=timeout) as sock:
                sock.sendall(len(packet).to_bytes(2, "big") + packet)
                size = int.from_bytes(sock.recv(2), "big")
                data = b""
                while len(data) < size:
                    chunk = sock.recv(size - len(data))
                    if not chunk:
                        break
                    data += chunk
        else:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.settimeout(timeout)
                sock.sendto(packet, (server, 53))
                data = sock.recv(512)
        rcode = data[3] & 0x0F if len(data) >= 4 else None  # 0 ok, 3 NXDOMAIN, 5 REFUSED
        return {"answer": first_a_record(data), "rcode": rcode, "error": ""}
    except (OSError, ValueError, IndexError) as exc:
        return {"answer": None, "rcode": None, "error": f"{type(exc).__name__}: {exc}"}


def tcp(host: str, port: int, timeout: float = 2.0) -> dict[str, object]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            addr = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0][4]
            sock.connect(addr)
        return {"open": True, "error": ""}
    except OSError as exc:
        return {"open": False, "error": f"{type(exc).__name__}: {exc}"}


def http(host: str, port: int, timeout: float = 3.0) -> dict[str, object]:
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(f"GET / HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
            data = b""
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        return {"ok": head.startswith(b"HTTP/1.0 200"), "body": body.decode(errors="replace"), "error": ""}
    except OSError as exc:
        return {"ok": False, "body": "", "error": f"{type(exc).__name__}: {exc}"}


def _ports(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def sweep(timeout: float, targets: list[str]) -> dict[str, object]:
    """Non-blocking TCP connects to every host:port at once (nmap -sT, bounded), then wait."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # one socket per target at once
    pending: dict[int, tuple[socket.socket, str, int]] = {}
    found: list[list[object]] = []
    tried = 0
    for target in targets:
        host, _, spec = target.rpartition(":")
        for port in _ports(spec):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            tried += 1
            code = sock.connect_ex((host, port))
            if code == 0:
                found.append([host, port])
                sock.close()
            elif code in (errno.EINPROGRESS, errno.EAGAIN):
                pending[sock.fileno()] = (sock, host, port)
            else:
                sock.close()
    poller = select.poll()
    for fd in pending:
        poller.register(fd, select.POLLOUT | select.POLLERR | select.POLLHUP)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for fd, _ in poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            sock, host, port = pending.pop(fd)
            poller.unregister(fd)
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                found.append([host, port])
            sock.close()
    for sock, _, _ in pending.values():
        sock.close()
    return {"open": sorted(found), "tried": tried}


def burst(host: str, port: int, count: int, window: float) -> dict[str, object]:
    """Start ``count`` connections at once; how many are established within ``window`` seconds."""
    result = sweep(window, [f"{host}:{port}"] * count) if count else {"open": []}
    return {"connected": len(result["open"]), "tried": count}  # type: ignore[arg-type]


def hold(host: str, port: int, logfile: str) -> int:
    """Keep one connection open, echo a line every 0.3 s; log each round trip; exit 1 when it dies."""
    with open(logfile, "a", buffering=1) as log:
        try:
            sock = socket.create_connection((host, port), timeout=3)
        except OSError as exc:
            log.write(f"connect FAIL {exc}\n")
            return 1
        sock.settimeout(2)
        reader = sock.makefile("rb")
        n = 0
        while True:
            try:
                sock.sendall(f"ping {n}\n".encode())
                line = reader.readline()
                if line != f"ping {n}\n".encode():
                    raise OSError(f"connection closed ({line!r})")
            except OSError as exc:
                log.write(f"echo {n} FAIL {exc}\n")
                return 1
            log.write(f"echo {n} ok\n")
            n += 1
            time.sleep(0.3)


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\x00"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def icmp(host: str, timeout: float = 2.0) -> dict[str, object]:
    """One ICMP echo request with a raw socket (what `ping -c1` does)."""
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    except OSError as exc:
        return {"reply": False, "error": f"socket: {exc}"}
    ident = os.getpid() & 0xFFFF
    payload = b"sandbox-rt-hardening"
    header = struct.pack("!BBHHH", 8, 0, 0, ident, 1)
    packet = struct.pack("!BBHHH", 8, 0, _checksum(header + payload), ident, 1) + payload
    with sock:
        sock.settimeout(timeout)
        try:
            sock.sendto(packet, (host, 0))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                data, addr = sock.recvfrom(2048)
                ihl = (data[0] & 0x0F) * 4
                kind, _, _, rid, _ = struct.unpack("!BBHHH", data[ihl : ihl + 8])
                if addr[0] == host and kind == 0 and rid == ident:
                    return {"reply": True, "error": ""}
        except OSError as exc:
            return {"reply": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"reply": False, "error": "timeout"}


def spoof(src: str, dst: str, dport: int, sport: int) -> dict[str, object]:
    """Send one TCP SYN with a forged IPv4 source address (a raw IP_HDRINCL socket)."""
    tcp = struct.pack("!HHIIBBHHH", sport, dport, 1000, 0, 5 << 4, 0x02, 64240, 0, 0)
    pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, 6, len(tcp))
    tcp = tcp[:16] + struct.pack("!H", _checksum(pseudo + tcp)) + tcp[18:]
    header = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 1, 0, 64, 6, 0, socket.inet_aton(src), socket.inet_aton(dst)
    )
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as sock:
            sock.sendto(header + tcp, (dst, 0))
    except OSError as exc:
        return {"sent": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"sent": True, "error": ""}


def spoof_dns(src: str, dst: str, sport: int) -> dict[str, object]:
    """Send one UDP DNS query with a forged IPv4 source address (a raw IP_HDRINCL socket)."""
    query = dns_packet("host.sandbox.internal")
    udp = struct.pack("!HHHH", sport, 53, 8 + len(query), 0) + query
    header = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, socket.inet_aton(src), socket.inet_aton(dst)
    )
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as sock:
            sock.sendto(header + udp, (dst, 0))
    except OSError as exc:
        return {"sent": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"sent": True, "error": ""}


def arp_claim(iface: str, ip: str, target: str) -> dict[str, object]:
    """Broadcast an ARP request for ``target`` whose sender is ``ip`` at this interface's MAC (what a
    sandbox that wants another one's traffic sends: the host learns ``ip`` -> our MAC)."""
    try:
        with open(f"/sys/class/net/{iface}/address") as f:
            mac = bytes.fromhex(f.read().strip().replace(":", ""))
        arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + mac + socket.inet_aton(ip)
        arp += b"\0" * 6 + socket.inet_aton(target)
        frame = b"\xff" * 6 + mac + struct.pack("!H", 0x0806) + arp
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as sock:
            sock.bind((iface, 0))
            sock.send(frame)
    except OSError as exc:
        return {"sent": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"sent": True, "error": ""}


def _udp_from_next_port(port: int, payload: bytes, dst: tuple[str, int]) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind(("0.0.0.0", port))
        s.sendto(payload, dst)
        return True
    except OSError:
        return False
    finally:
        s.close()


def flows(host: str, seconds: float) -> dict[str, object]:
    """New UDP flows to the host for ``seconds``: DNS queries and DHCP-port datagrams in turn."""
    deadline = time.monotonic() + seconds
    query, junk = dns_packet("host.sandbox.internal"), b"\0" * 240
    dns = dhcp = 0
    port = 1024
    while time.monotonic() < deadline:
        dns += _udp_from_next_port(port, query, (host, 53))
        dhcp += _udp_from_next_port(port + 1, junk, (host, 67))
        port = port + 2 if port < 65500 else 1024
    return {"dns": dns, "dhcp": dhcp}


def udp_flows(host: str, port: int, count: int) -> dict[str, object]:
    sent = sum(_udp_from_next_port(20000 + i, b"\0" * 240, (host, port)) for i in range(count))
    return {"sent": sent}


def dns_flood(host: str, name: str, seconds: float) -> dict[str, object]:
    """Queries on one socket as fast as it sends for ``seconds``; the answers that came back."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    query = dns_packet(name)
    sent = answered = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            s.sendto(query, (host, 53))
            sent += 1
        except OSError:
            pass
        while True:
            try:
                s.recv(4096)
                answered += 1
            except OSError:
                break
    time.sleep(0.2)  # the last answers in flight
    while True:
        try:
            s.recv(4096)
            answered += 1
        except OSError:
            break
    return {"sent": sent, "answered": answered}


def dns_series(host: str, name: str, count: int, gap: float) -> dict[str, object]:
    """``count`` queries one after another, ``gap`` seconds apart; how many got no answer."""
    lost = 0
    for _ in range(count):
        lost += dns_query(host, name)["answer"] is None
        time.sleep(gap)
    return {"lost": lost, "answered": count - lost}


def _listener(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(1)
    return s


def serve(port: int, size: int) -> int:
    conn, _ = _listener(port).accept()
    block = b"x" * 65536
    while size > 0:
        size -= conn.send(block[: min(size, len(block))])
    conn.close()
    return 0


def sink(port: int) -> int:
    conn, _ = _listener(port).accept()
    while conn.recv(1 << 20):
        pass
    conn.close()
    return 0


def main(argv: list[str]) -> int:
    cmd, args = argv[0], argv[1:]
    if cmd == "serve":
        return serve(int(args[0]), int(args[1]))
    if cmd == "sink":
        return sink(int(args[0]))
    if cmd == "hold":
        return hold(args[0], int(args[1]), args[2])
    if cmd == "tcp":
        out = tcp(args[0], int(args[1]), float(args[2]) if len(args) > 2 else 2.0)
    elif cmd == "http":
        out = http(args[0], int(args[1]), float(args[2]) if len(args) > 2 else 3.0)
    elif cmd == "dns":
        out = dns_query(args[0], args[1], args[2] if len(args) > 2 else "udp")
    elif cmd == "dns-many":
        name, specs = args[0], args[1:]
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(specs) or 1) as pool:
            futures = {s: pool.submit(dns_query, s.split("/")[0], name, s.split("/")[1]) for s in specs}
        out = {s: f.result()["answer"] for s, f in futures.items()}
    elif cmd == "sweep":
        out = sweep(float(args[0]), args[1:])
    elif cmd == "burst":
        out = burst(args[0], int(args[1]), int(args[2]), float(args[3]))
    elif cmd == "spoof":
        out = spoof(args[0], args[1], int(args[2]), int(args[3]))
    elif cmd == "icmp":
        out = icmp(args[0], float(args[1]) if len(args) > 1 else 2.0)
    elif cmd == "spoof-dns":
        out = spoof_dns(args[0], args[1], int(args[2]))
    elif cmd == "arp-claim":
        out = arp_claim(args[0], args[1], args[2])
    elif cmd == "flows":
        out = flows(args[0], float(args[1]))
    elif cmd == "udp-flows":
        out = udp_flows(args[0], int(args[1]), int(args[2]))
    elif cmd == "dns-flood":
        out = dns_flood(args[0], args[1], float(args[2]))
    elif cmd == "dns-series":
        out = dns_series(args[0], args[1], int(args[2]), float(args[3]))
    else:
        print(f"unknown probe {cmd!r}", file=sys.stderr)
        return 2
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
