"""Runs INSIDE a benchmark sandbox (python3 of the template, stdlib only): the floods of a hostile
sandbox and the measurements of its victim neighbour (benchmarks.neighbours uploads it).

    python3 neighbour_probe.py flood KIND SECONDS HOST STOPFILE   -> one JSON line when it ends
    python3 neighbour_probe.py dns COUNT HOST NAME                -> {"latencies": [...], "lost": n}
    python3 neighbour_probe.py fsync COUNT PATH                   -> {"latencies": [...]}

A flood runs until SECONDS have passed or STOPFILE (made empty beforehand) has content, whichever
is first, and writes STOPFILE + ".running" once it is under way. All traffic goes to HOST (the
sandbox bridge's address).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import random
import socket
import struct
import sys
import time

DNS_PORT = 53
DISCARD_PORT = 9  # nothing listens on the host's bridge address there: the host drops it
DHCP_PORT = 67  # the host's dnsmasq: the one port besides DNS a sandbox reaches on the host


def dns_query(name: str, qid: int) -> bytes:
    head = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return head + labels + struct.pack(">HH", 1, 1)


class Flood:
    def __init__(self, seconds: float, host: str, stopfile: str) -> None:
        self.deadline = time.monotonic() + seconds
        self.host = host
        self.stopfile = stopfile
        self.checked = 0.0
        self.stopped = False
        with open(stopfile + ".running", "w") as f:
            f.write(str(os.getpid()))

    def going(self) -> bool:
        now = time.monotonic()
        if now >= self.deadline or self.stopped:
            return False
        if now - self.checked > 0.05:
            self.checked = now
            try:
                self.stopped = os.path.getsize(self.stopfile) > 0  # the host writes into it
            except OSError:
                self.stopped = True
        return not self.stopped


def flood_conntrack(f: Flood) -> dict[str, int]:
    """One DNS query from each local UDP port in turn (the attack of issue 26), and TCP connection
    attempts to the host's DNS from as many ports as the open-file limit allows, held open."""
    query = dns_query("host.sandbox.internal", 1)
    sent = udp = tcp = 0
    held: list[socket.socket] = []
    port = 1024
    while f.going():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.bind(("0.0.0.0", port))
            s.sendto(query, (f.host, DNS_PORT))
            sent += 1
            udp += 1
        except OSError:
            pass
        finally:
            s.close()
        port = port + 1 if port < 65535 else 1024
        if len(held) < 3000 and sent % 4 == 0:
            t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            t.setblocking(False)
            if t.connect_ex((f.host, DNS_PORT)) in (0, 115):  # EINPROGRESS
                held.append(t)
                tcp += 1
            else:
                t.close()
    for t in held:
        t.close()
    return {"udp_ports": udp, "tcp_attempts": tcp}


def flood_dns(f: Flood) -> dict[str, int]:
    """DNS queries on one socket as fast as it can send; answers are counted, never awaited."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    sent = answered = 0
    while f.going():
        try:
            s.sendto(dns_query("host.sandbox.internal", random.randrange(65536)), (f.host, DNS_PORT))
            sent += 1
        except BlockingIOError:
            pass
        while True:
            try:
                s.recv(4096)
                answered += 1
            except (BlockingIOError, ConnectionRefusedError):
                break
    return {"sent": sent, "answered": answered}


def flood_connrate(f: Flood) -> dict[str, int]:
    """New flows to the host as fast as they go: a datagram to its DHCP port (which the host
    accepts) from each local UDP port in turn, and a TCP connection attempt to a closed port."""
    udp = tcp = 0
    port = 1024
    while f.going():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.bind(("0.0.0.0", port))
            s.sendto(b"\0" * 240, (f.host, DHCP_PORT))
            udp += 1
        except OSError:
            pass
        finally:
            s.close()
        port = port + 1 if port < 65535 else 1024
        t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        t.setblocking(False)
        with contextlib.suppress(OSError):
            t.connect_ex((f.host, DISCARD_PORT))
            tcp += 1
        t.close()
    return {"udp_flows": udp, "tcp_attempts": tcp}


def flood_bandwidth(f: Flood) -> dict[str, int]:
    """Full-size UDP datagrams to the host as fast as the sandbox can send (the host drops them)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = os.urandom(1400)
    sent = 0
    while f.going():
        for _ in range(64):
            with contextlib.suppress(OSError):
                sent += s.sendto(payload, (f.host, DISCARD_PORT))
    return {"bytes": sent}


def _writer(f: Flood, path: str, direct: bool) -> dict[str, int]:
    block, span = 1 << 20, 256 << 20
    flags = os.O_WRONLY | os.O_CREAT | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags, 0o600)
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT wants
    buf.write(os.urandom(block))
    written = offset = 0
    try:
        while f.going():
            written += os.pwrite(fd, buf, offset)
            offset = (offset + block) % span
    finally:
        os.close(fd)
        os.unlink(path)
    return {"bytes": written}


def flood_odirect(f: Flood) -> dict[str, int]:
    return _writer(f, os.path.expanduser("~/.flood-odirect"), direct=True)


def flood_buffered(f: Flood) -> dict[str, int]:
    return _writer(f, os.path.expanduser("~/.flood-buffered"), direct=False)


def flood_cpu(f: Flood) -> dict[str, int]:
    """One busy thread: the sandbox uses its whole CPU share (cpus=1) and touches nothing shared."""
    loops = 0
    while f.going():
        loops += 1
    return {"loops": loops}


def flood_memory(f: Flood) -> dict[str, int]:
    """Children that allocate and touch memory until the sandbox's limit OOM-kills them."""
    kills = 0
    while f.going():
        pid = os.fork()
        if pid == 0:
            hold = []
            while True:
                chunk = bytearray(16 << 20)
                chunk[::4096] = b"x" * len(chunk[::4096])
                hold.append(chunk)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            kills += 1
    return {"oom_kills": kills}


FLOODS = {
    "cpu": flood_cpu,
    "conntrack": flood_conntrack,
    "dns": flood_dns,
    "connrate": flood_connrate,
    "bandwidth": flood_bandwidth,
    "odirect": flood_odirect,
    "buffered": flood_buffered,
    "memory": flood_memory,
}


def measure_dns(count: int, host: str, name: str) -> dict[str, object]:
    """``count`` queries one after another, each waiting up to 1 s for its answer."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1.0)
    latencies: list[float] = []
    lost = 0
    for _ in range(count):
        qid = random.randrange(65536)
        t0 = time.perf_counter()
        s.sendto(dns_query(name, qid), (host, DNS_PORT))
        while True:
            try:
                data = s.recv(4096)
            except OSError:
                lost += 1
                break
            if data[:2] == struct.pack(">H", qid):
                latencies.append(time.perf_counter() - t0)
                break
        time.sleep(0.01)
    return {"latencies": latencies, "lost": lost}


def measure_fsync(count: int, path: str) -> dict[str, object]:
    """4 KiB written and fsync'ed ``count`` times (10 ms apart), each timed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    block = os.urandom(4096)
    latencies: list[float] = []
    try:
        for i in range(count):
            t0 = time.perf_counter()
            os.pwrite(fd, block, (i % 256) * 4096)
            os.fsync(fd)
            latencies.append(time.perf_counter() - t0)
            time.sleep(0.01)
    finally:
        os.close(fd)
    return {"latencies": latencies}


def main(argv: list[str]) -> int:
    what = argv[1]
    if what == "flood":
        kind, seconds, host, stopfile = argv[2], float(argv[3]), argv[4], argv[5]
        out: dict[str, object] = {"kind": kind, **FLOODS[kind](Flood(seconds, host, stopfile))}
    elif what == "dns":
        out = measure_dns(int(argv[2]), argv[3], argv[4])
    elif what == "fsync":
        out = measure_fsync(int(argv[2]), argv[3])
    else:
        raise SystemExit(f"unknown probe {what!r}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
