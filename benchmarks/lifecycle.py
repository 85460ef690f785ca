"""Lifecycle latency on the LXC backend vs the raw engine, measured in the same run.

    python -m benchmarks --only lifecycle

- create → SSH-ready (``Manager.create`` returns a connected sandbox) vs raw ``lxc-copy -s -B
  overlayfs`` + static IP + ``lxc-start`` + first TCP connect to :22;
- create → first command (create + ``exec("true")``) vs the same raw container + OpenSSH's first
  ``ssh true`` (a fresh connection, host key pinned);
- warm-pool acquire (``Manager(pool_size=2).create()`` with a sandbox ready) vs the raw create;
- exec round trip of ``true`` vs OpenSSH through a ControlMaster to the same sandbox, and vs
  ``lxc-attach``;
- destroy vs raw ``lxc-stop -k`` + ``lxc-destroy``;
- the cost of isolated id maps: create → SSH-ready with them (the default) vs with the one
  shared map (``idmap_isolated=false``);
- the cost of lxcfs (issue 26: a sandbox sees its own memory and CPUs): create → SSH-ready and
  destroy with the template's lxcfs bind mounts (the default) vs a copy of the template without
  them (what sandboxes had before), and destroy with Debian's lxcfs hooks instead (their stop hook
  sleeps 0.5 s), the way the bind mounts avoid.
Raw and runtime samples alternate, so drift on a shared machine hits both alike.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from typing import Any

import sandbox_rt

from .context import Bench
from .raw import OpenSSH, wait_port
from .stats import compare, summary, timed

__all__ = ["run"]

WHAT = {
    "create_ssh_ready": "Manager.create() until the sandbox is SSH-connected",
    "raw_create_port22": "raw lxc-copy + lxc-start + first TCP connect to :22",
    "create_first_exec": "Manager.create() + exec('true')",
    "create_ssh_ready_shared_ids": "Manager.create() with one id map shared by all sandboxes",
    "raw_create_first_ssh": "raw lxc-copy + lxc-start + OpenSSH `ssh true` (new connection)",
    "warm_pool_acquire": "create() with Manager(pool_size=2) holding a ready sandbox",
    "exec_true": "Sandbox.exec('true') round trip",
    "raw_openssh_controlmaster": "OpenSSH `ssh true` through a ControlMaster",
    "raw_lxc_attach": "lxc-attach -- true",
    "destroy": "Sandbox.destroy()",
    "raw_destroy": "raw lxc-stop -k + lxc-destroy",
    "create_ssh_ready_no_lxcfs": "Manager.create() from a template copy without lxcfs",
    "destroy_no_lxcfs": "Sandbox.destroy() of a sandbox without lxcfs",
    "destroy_lxcfs_hooks": "Sandbox.destroy() with Debian's lxcfs hooks instead of bind mounts",
}
LXCFS_HOOKS = [  # /usr/share/lxc/config/common.conf.d/00-lxcfs.conf
    "lxc.hook.mount = /usr/share/lxcfs/lxc.mount.hook",
    "lxc.hook.post-stop = /usr/share/lxcfs/lxc.reboot.hook",
]
RAW = {k for k in WHAT if k.startswith("raw_")}


def _run_ok(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def _raw_cycle(b: Bench, res: dict[str, list[float]]) -> None:
    """One raw container: create to :22, then OpenSSH's first command, then destroy."""
    name = b.raw.new_name()
    with b.raw.address() as ip:
        try:
            t0 = time.perf_counter()
            b.raw.clone_start(name, ip)
            wait_port(ip)
            t_port = time.perf_counter()
            ossh = OpenSSH(ip, b.raw.host_key(name), b.settings.ssh_key, b.settings.ssh_user, b.tmp / name)
            _run_ok(ossh.ssh("true"))
            t_ssh = time.perf_counter()
            res["raw_create_port22"].append(t_port - t0)
            res["raw_create_first_ssh"].append(t_ssh - t0)
            res["raw_destroy"].append(timed(lambda: b.raw.destroy(name)))
        finally:
            b.raw.remove(name)


def _cycle(b: Bench, res: dict[str, list[float]]) -> None:
    t0 = time.perf_counter()
    sb = b.create()
    t_ready = time.perf_counter()
    try:
        sb.exec("true", check=True)
        t_first = time.perf_counter()
        res["create_ssh_ready"].append(t_ready - t0)
        res["create_first_exec"].append(t_first - t0)
    finally:
        res["destroy"].append(timed(sb.destroy))


def _shared_ids_cycle(b: Bench, res: dict[str, list[float]], shared: sandbox_rt.Manager) -> None:
    t0 = time.perf_counter()
    sb = b.create(shared)
    res["create_ssh_ready_shared_ids"].append(time.perf_counter() - t0)
    sb.destroy()


def _without_lxcfs(lines: list[str]) -> list[str]:
    return [ln for ln in lines if not (ln.startswith("lxc.mount.entry") and "lxcfs" in ln)]


def _lxcfs_cycle(b: Bench, res: dict[str, list[float]], plain: sandbox_rt.Manager) -> None:
    t0 = time.perf_counter()
    sb = b.create(plain)
    res["create_ssh_ready_no_lxcfs"].append(time.perf_counter() - t0)
    res["destroy_no_lxcfs"].append(timed(sb.destroy))


def _exec_round_trips(b: Bench, res: dict[str, list[float]], count: int) -> None:
    with b.sandbox() as sb:
        ossh = OpenSSH(sb.ip, sb.record.host_key, b.settings.ssh_key, b.settings.ssh_user, b.tmp / "exec")
        attach = ["lxc-attach", "-P", str(b.settings.lxc_path), "-n", sb.id, "--", "true"]
        with ossh.master():
            sb.exec("true")  # the first session pays sshd's post-auth set-up: not a round trip
            _run_ok(ossh.ssh("true", mux=True))
            for _ in range(count):
                b.checkpoint()
                res["exec_true"].append(timed(lambda: sb.exec("true")))
                res["raw_openssh_controlmaster"].append(timed(lambda: _run_ok(ossh.ssh("true", mux=True))))
                res["raw_lxc_attach"].append(timed(lambda: _run_ok(attach)))


def _warm_pool(b: Bench, res: dict[str, list[float]], runs: int) -> None:
    spec = {"labels": b.labels, "memory_mb": b.opts.memory_mb}
    with sandbox_rt.Manager(b.settings, pool_size=2, pool_spec=spec) as warm:
        assert warm.pool is not None
        for _ in range(runs):
            b.checkpoint()
            if not warm.pool.wait_ready(1, timeout=60):
                raise RuntimeError("the warm pool did not refill within 60 s")
            t0 = time.perf_counter()
            sb = b.create(warm)
            res["warm_pool_acquire"].append(time.perf_counter() - t0)
            sb.destroy()


def run(b: Bench) -> dict[str, Any]:
    runs = b.opts.runs
    res: dict[str, list[float]] = {k: [] for k in WHAT}
    shared = sandbox_rt.Manager(dataclasses.replace(b.settings, idmap_isolated=False))
    with b.template_variant(_without_lxcfs) as plain:
        for _ in range(runs):
            b.checkpoint()
            _raw_cycle(b, res)
            b.checkpoint()
            _cycle(b, res)
            b.checkpoint()
            _shared_ids_cycle(b, res, shared)
            b.checkpoint()
            _lxcfs_cycle(b, res, plain)
    with b.template_variant(lambda lines: [*_without_lxcfs(lines), *LXCFS_HOOKS]) as hooked:
        for _ in range(min(runs, 3)):  # 0.5 s each: a few show it
            b.checkpoint()
            res["destroy_lxcfs_hooks"].append(timed(b.create(hooked).destroy))
    _exec_round_trips(b, res, max(runs * 5, 20))
    _warm_pool(b, res, runs)
    measures = {k: summary(v, WHAT[k], raw=k in RAW) for k, v in res.items()}
    comparisons = [
        compare(measures, "create_ssh_ready", "raw_create_port22"),
        compare(measures, "create_first_exec", "raw_create_first_ssh"),
        compare(measures, "create_ssh_ready", "create_ssh_ready_shared_ids", against="variant"),
        compare(measures, "warm_pool_acquire", "raw_create_port22"),
        compare(measures, "exec_true", "raw_openssh_controlmaster"),
        compare(measures, "exec_true", "raw_lxc_attach"),
        compare(measures, "destroy", "raw_destroy"),
        compare(measures, "create_ssh_ready", "create_ssh_ready_no_lxcfs", against="variant"),
        compare(measures, "destroy", "destroy_no_lxcfs", against="variant"),
        compare(measures, "destroy_lxcfs_hooks", "destroy", against="variant"),
    ]
    return {"measures": measures, "comparisons": comparisons, "facts": {"runs": runs}}
