"""Where a cold create (and a destroy) on the LXC backend spends its time, step by step.

The runtime's own functions are wrapped with timers for this group only (restored afterwards):
every subprocess by tool (lxc-copy, lxc-start, lxc-info, nft, ...), the address allocation (with
the config write it commits), the rootfs seeding (host key, machine-id, names), the record, and in
SSH: paramiko's handshake (banner, key exchange, host-key check) and the public-key auth. The rest
of ``SSHExecutor.connect`` is waiting for sshd to listen. Also the engine's own floor on a raw
container: lxc-copy, lxc-start, and how long after lxc-start sshd listens (polled every 0.5 ms).
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import paramiko

from sandbox_rt import ipam
from sandbox_rt.backends import lxc
from sandbox_rt.ipam import mac_for_ip
from sandbox_rt.ssh.connection import SSHConnection

from .context import Bench
from .raw import wait_port
from .stats import summary

__all__ = ["run"]

Acc = dict[str, float]


@contextlib.contextmanager
def _timers(targets: list[tuple[Any, str, Callable[..., str]]]) -> Iterator[Acc]:
    """Wrap ``owner.attr`` so each call adds its duration to ``acc[label(*args)]``."""
    acc: Acc = defaultdict(float)
    saved: list[tuple[Any, str, Any]] = []
    for owner, attr, label in targets:
        if attr not in vars(owner):
            continue  # the runtime changed: that step is simply not split out
        orig = vars(owner)[attr]

        @functools.wraps(orig)
        def wrapper(*args: Any, __orig: Any = orig, __label: Any = label, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return __orig(*args, **kwargs)
            finally:
                # a step of a helper thread (destroy forgets the network state while lxc-stop runs)
                # overlaps the others: counted apart, never subtracted from the caller's rest
                side = "" if threading.current_thread() is threading.main_thread() else PARALLEL
                acc[side + __label(*args, **kwargs)] += time.perf_counter() - t0

        saved.append((owner, attr, orig))
        setattr(owner, attr, wrapper)
    try:
        yield acc
    finally:
        for owner, attr, orig in reversed(saved):
            setattr(owner, attr, orig)


def _tool(*args: Any, **kwargs: Any) -> str:
    argv = args[0] if args else kwargs.get("args")
    first = argv[0] if isinstance(argv, list | tuple) and argv else str(argv)
    return f"exec {str(first).rsplit('/', 1)[-1]}"


def _const(name: str) -> Callable[..., str]:
    return lambda *a, **k: name


TARGETS: list[tuple[Any, str, Callable[..., str]]] = [
    (subprocess, "run", _tool),
    (lxc.LxcBackend, "begin", _const("create marker")),
    (lxc.LxcBackend, "end", _const("create marker")),
    (ipam.IpPool, "allocate", _const("address + config write")),
    (lxc.LxcBackend, "_seed_rootfs", _const("seed rootfs (host key, ids)")),
    (lxc.LxcBackend, "_write_record", _const("write record")),
    (lxc.LxcBackend, "clone", _const("clone (total)")),
    (lxc.LxcBackend, "start", _const("start (total)")),
    (SSHConnection, "connect", _const("ssh connect (total)")),
    (paramiko.Transport, "start_client", _const("ssh handshake (banner, kex, host key)")),
    (paramiko.Transport, "auth_publickey", _const("ssh auth (publickey)")),
]
TOTALS = ("clone (total)", "start (total)", "ssh connect (total)")
PARALLEL = "(in parallel) "


def _create_steps(acc: Acc, total: float) -> dict[str, float]:
    steps = {k: v for k, v in acc.items() if k not in TOTALS}
    steps["clone: other"] = acc["clone (total)"] - sum(
        acc[k]
        for k in (
            "exec lxc-copy",
            "address + config write",
            "seed rootfs (host key, ids)",
            "write record",
            "exec nft",  # the port binding (issue 26), made before start
        )
    )
    steps["start: other"] = acc["start (total)"] - acc["exec lxc-start"]
    steps["ssh: wait for sshd to listen"] = (
        acc["ssh connect (total)"]
        - acc["ssh handshake (banner, kex, host key)"]
        - acc["ssh auth (publickey)"]
    )
    steps["create: rest (python, manager)"] = total - sum(steps.values())
    return steps


def _raw_floor(b: Bench, res: dict[str, list[float]]) -> None:
    name = b.raw.new_name()
    with b.raw.address() as ip:
        try:
            p = str(b.settings.lxc_path)
            t0 = time.perf_counter()
            copy = ["lxc-copy", "-P", p, "-n", b.settings.template, "-N", name, "-s", "-B", "overlayfs"]
            subprocess.run(copy, check=True, capture_output=True)
            t1 = time.perf_counter()
            with (b.settings.lxc_path / name / "config").open("a") as fh:
                fh.write(
                    f"lxc.net.0.ipv4.address = {ip}/{b.settings.network.prefixlen}\n"
                    f"lxc.net.0.ipv4.gateway = {b.settings.gateway}\n"
                    f"lxc.net.0.hwaddr = {mac_for_ip(ip)}\n"
                )
            t2 = time.perf_counter()
            subprocess.run(["lxc-start", "-P", p, "-n", name], check=True, capture_output=True)
            t3 = time.perf_counter()
            wait_port(ip, interval=0.0005)
            t4 = time.perf_counter()
            res["raw: lxc-copy"].append(t1 - t0)
            res["raw: lxc-start"].append(t3 - t2)
            res["raw: sshd listens after lxc-start"].append(t4 - t3)
        finally:
            b.raw.remove(name)


def _collect(per_run: list[dict[str, float]], what: str, raw: bool = False) -> dict[str, dict[str, Any]]:
    keys = sorted({k for r in per_run for k in r}, key=lambda k: (k.startswith("="), k))
    return {k: summary([r.get(k, 0.0) for r in per_run], what, raw=raw) for k in keys}


def run(b: Bench) -> dict[str, Any]:
    creates: list[dict[str, float]] = []
    destroys: list[dict[str, float]] = []
    raw: dict[str, list[float]] = defaultdict(list)
    for _ in range(b.opts.runs):
        b.checkpoint()
        _raw_floor(b, raw)
        b.checkpoint()
        with _timers(TARGETS) as acc:
            t0 = time.perf_counter()
            sb = b.create()
            total = time.perf_counter() - t0
            steps = _create_steps(acc, total)
            acc.clear()
            try:
                t0 = time.perf_counter()
                sb.exec("true", check=True)
                steps["(after create) first exec('true')"] = time.perf_counter() - t0
            finally:
                acc.clear()
                t0 = time.perf_counter()
                sb.destroy()
                d_total = time.perf_counter() - t0
                d_steps = dict(acc)
        steps["= create total"] = total
        d_steps["destroy: rest"] = d_total - sum(v for k, v in d_steps.items() if not k.startswith(PARALLEL))
        d_steps["= destroy total"] = d_total
        creates.append(steps)
        destroys.append(d_steps)
    measures = {f"create | {k}": v for k, v in _collect(creates, "create step").items()}
    measures.update({f"destroy | {k}": v for k, v in _collect(destroys, "destroy step").items()})
    measures.update({k: summary(v, "raw engine step", raw=True) for k, v in raw.items()})
    return {"measures": measures, "comparisons": [], "facts": {"runs": b.opts.runs}}
