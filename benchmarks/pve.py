"""The Proxmox backend's API overhead: create → SSH-ready, exec, destroy on the proxmox backend
(against the schema-checking PVE API test server backed by real LXC, set up as the test fixtures
do; or a real PVE when SANDBOX_RT_PVE_URL is set) vs the LXC backend, alternating in the same run.

API overhead = PVE-backend median - LXC-backend median (``diff_ms`` of each comparison).

Two differences from the test fixtures, so a benchmark and a test session can share a host: the
test server's containers are named ``pvebench-<pid>-<vmid>`` (not ``pve-<vmid>``), and its sandboxes
take addresses from a range 8192 below the pool's top (the fixtures' server counts down from the
top itself). Neither changes what is measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sandbox_rt
import tests.pve_env as pve_env
from sandbox_rt import Manager, Settings

from .context import Bench
from .raw import PVE_PREFIX
from .stats import compare, summary

__all__ = ["run"]

EXECS_PER_SANDBOX = 5
WHAT = {
    "pve_create_ssh_ready": "proxmox backend: create() until SSH-connected",
    "lxc_create_ssh_ready": "lxc backend: create() until SSH-connected",
    "pve_exec_true": "proxmox backend: exec('true') round trip",
    "lxc_exec_true": "lxc backend: exec('true') round trip",
    "pve_destroy": "proxmox backend: destroy()",
    "lxc_destroy": "lxc backend: destroy()",
}


@contextlib.contextmanager
def _pve_settings(base: Settings) -> Iterator[tuple[Settings, str]]:
    real = pve_env.real_pve_settings(base)
    if real is not None:
        yield real, real.pve_url
        return
    prefix = f"{PVE_PREFIX}{os.getpid()}-"  # the benchmark's own containers, never a test's
    with (
        tempfile.TemporaryDirectory(prefix="sandbox-rt-bench-pve-") as state,
        pve_env.pve_test_server(base, Path(state), engine_prefix=prefix) as (settings, _),
    ):
        yield _own_addresses(settings), "PVE API test server (pve_testserver) with the LXC engine"


def _own_addresses(s: Settings) -> Settings:
    start = int(ipaddress.IPv4Address(s.ip_pool_start))
    end = int(ipaddress.IPv4Address(s.ip_pool_end)) - 8192
    if end - start < 1024:
        return s
    return dataclasses.replace(s, ip_pool_end=str(ipaddress.IPv4Address(end)))


def _cycle(b: Bench, mgr: Manager, prefix: str, res: dict[str, list[float]]) -> None:
    t0 = time.perf_counter()
    sb = b.create(mgr)
    res[f"{prefix}_create_ssh_ready"].append(time.perf_counter() - t0)
    try:
        sb.exec("true", check=True)  # the first session pays sshd's post-auth set-up
        for _ in range(EXECS_PER_SANDBOX):
            t0 = time.perf_counter()
            sb.exec("true")
            res[f"{prefix}_exec_true"].append(time.perf_counter() - t0)
    finally:
        t0 = time.perf_counter()
        sb.destroy()
        res[f"{prefix}_destroy"].append(time.perf_counter() - t0)


def run(b: Bench) -> dict[str, Any]:
    res: dict[str, list[float]] = {k: [] for k in WHAT}
    with _pve_settings(b.settings) as (settings, server):
        pmgr = Manager(settings, ssh_key=b.settings.ssh_key)
        try:
            for _ in range(b.opts.runs):
                b.checkpoint()
                _cycle(b, pmgr, "pve", res)
                b.checkpoint()
                _cycle(b, b.mgr, "lxc", res)
        finally:
            with contextlib.suppress(sandbox_rt.SandboxError):
                b.sweep(pmgr)
    measures = {k: summary(v, WHAT[k]) for k, v in res.items()}
    comparisons = [
        compare(measures, f"pve_{op}", f"lxc_{op}") for op in ("create_ssh_ready", "exec_true", "destroy")
    ]
    overhead = {c["measure"][4:]: c["diff_ms"] for c in comparisons}
    return {
        "measures": measures,
        "comparisons": comparisons,
        "facts": {"server": server, "api_overhead_ms": overhead},
    }
