"""Lifecycle latency of sandbox_rt vs the raw engine, measured in the same run on the same machine.

    python -m benchmarks.lifecycle [--runs 20] [--json out.json]

Rows: warm-pool acquire (create() when the pool has a sandbox ready), create → SSH-ready (vs raw
lxc-copy -s + lxc-start + first TCP connect to :22 on a static IP),
exec round trip of `true` (vs OpenSSH ControlMaster to the same container, and vs lxc-attach),
destroy (vs raw lxc-stop -k + lxc-destroy). Prints median, p90, max and the ratio of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import sandbox_rt
from sandbox_rt.backends.lxc import LxcBackend
from sandbox_rt.ipam import mac_for_ip


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "median_ms": statistics.median(values) * 1e3,
        "p90_ms": _pct(values, 0.9) * 1e3,
        "max_ms": max(values) * 1e3,
        "n": len(values),
    }


def _wait_port(ip: str, port: int = 22, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((ip, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)  # polling a booting container's port


class RawLxc:
    """The engine alone: what a sandbox costs without the runtime."""

    def __init__(self, mgr: sandbox_rt.Manager) -> None:
        backend = mgr.backend
        assert isinstance(backend, LxcBackend)
        self.b = backend
        self.s = mgr.settings

    def create(self, name: str, ip: str) -> None:
        p = str(self.s.lxc_path)
        subprocess.run(
            ["lxc-copy", "-P", p, "-n", self.s.template, "-N", name, "-s", "-B", "overlayfs"],
            check=True,
            capture_output=True,
        )
        with (self.s.lxc_path / name / "config").open("a") as fh:
            fh.write(
                f"lxc.net.0.ipv4.address = {ip}/{self.b.prefixlen}\n"
                f"lxc.net.0.ipv4.gateway = {self.s.gateway}\nlxc.net.0.hwaddr = {mac_for_ip(ip)}\n"
            )
        subprocess.run(["lxc-start", "-P", p, "-n", name], check=True, capture_output=True)
        _wait_port(ip)

    def destroy(self, name: str) -> None:
        p = str(self.s.lxc_path)
        subprocess.run(["lxc-stop", "-P", p, "-n", name, "-k"], check=True, capture_output=True)
        subprocess.run(["lxc-destroy", "-P", p, "-n", name], check=True, capture_output=True)


def _time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(runs: int) -> dict[str, dict[str, float]]:
    mgr = sandbox_rt.Manager.from_env()
    raw = RawLxc(mgr)
    res: dict[str, list[float]] = {
        k: []
        for k in (
            "create_ssh_ready",
            "raw_create_port22",
            "destroy",
            "raw_destroy",
            "exec_true",
            "raw_openssh_controlmaster",
            "raw_lxc_attach",
            "warm_pool_acquire",
        )
    }
    raw_ip = "10.99.254.250"
    for i in range(runs):
        name = f"bench-raw-{os.getpid()}-{i}"
        res["raw_create_port22"].append(_time(lambda n=name: raw.create(n, raw_ip)))
        res["raw_destroy"].append(_time(lambda n=name: raw.destroy(n)))
        t0 = time.perf_counter()
        sb = mgr.create(memory_mb=512, labels={"bench": "1"})
        res["create_ssh_ready"].append(time.perf_counter() - t0)
        res["destroy"].append(_time(sb.destroy))

    # exec round trips on one sandbox, against OpenSSH ControlMaster and lxc-attach to the same one
    with mgr.create(memory_mb=512, labels={"bench": "1"}) as sb, tempfile.TemporaryDirectory() as tmp:
        known = Path(tmp) / "known_hosts"
        known.write_text(f"{sb.ip} {sb.record.host_key}\n")
        ctl = Path(tmp) / "ctl"
        base = [
            "ssh",
            "-i",
            str(mgr.settings.ssh_key),
            "-o",
            f"UserKnownHostsFile={known}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"ControlPath={ctl}",
            "-o",
            "BatchMode=yes",
            f"{mgr.settings.ssh_user}@{sb.ip}",
        ]
        subprocess.run(
            [*base[:-1], "-o", "ControlMaster=yes", "-o", "ControlPersist=60", "-fN", base[-1]], check=True
        )
        try:
            for _ in range(max(runs, 20) * 5):
                res["exec_true"].append(_time(lambda: sb.exec("true")))
                res["raw_openssh_controlmaster"].append(
                    _time(lambda: subprocess.run([*base, "true"], check=True))
                )
                res["raw_lxc_attach"].append(
                    _time(
                        lambda: subprocess.run(
                            ["lxc-attach", "-P", str(mgr.settings.lxc_path), "-n", sb.id, "--", "true"],
                            check=True,
                        )
                    )
                )
        finally:
            subprocess.run([*base[:-1], "-O", "exit", base[-1]], capture_output=True)

    # warm pool: time from create() to a usable sandbox when the pool has one ready
    with sandbox_rt.Manager(mgr.settings, pool_size=2, pool_spec={"labels": {"bench": "1"}}) as warm:
        assert warm.pool is not None
        for _ in range(runs):
            if not warm.pool.wait_ready(1, timeout=60):
                raise RuntimeError("warm pool did not refill")
            t0 = time.perf_counter()
            sb = warm.create(memory_mb=512, labels={"bench": "1"})
            res["warm_pool_acquire"].append(time.perf_counter() - t0)
            sb.destroy()
    return {k: _summary(v) for k, v in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    table = run(args.runs)
    pairs = {
        "create_ssh_ready": "raw_create_port22",
        "destroy": "raw_destroy",
        "exec_true": "raw_openssh_controlmaster",
    }
    print(f"{'measure':28} {'median ms':>10} {'p90 ms':>9} {'max ms':>9} {'ratio':>7}")
    for k, v in table.items():
        ratio = ""
        if k in pairs:
            ratio = f"{v['median_ms'] / table[pairs[k]]['median_ms']:.2f}x"
        print(f"{k:28} {v['median_ms']:10.1f} {v['p90_ms']:9.1f} {v['max_ms']:9.1f} {ratio:>7}")
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
