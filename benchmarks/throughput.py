"""Throughput (issue 19): sustained create -> exec('true') -> destroy cycles with T caller threads.

    python -m benchmarks --only throughput [--throughput 8,32]

Per T (8 and 32; ``--quick``: 4), two phases in the same run, ours then the raw engine:

- ours: T threads each loop ``Manager.create()`` (cold: no warm pool) -> ``exec("true")`` ->
  ``destroy()``;
- raw: T threads each loop ``lxc-copy -s -B overlayfs`` + static IP + ``lxc-start`` + first TCP
  connect to :22 (:class:`benchmarks.raw.RawLxc`, the lifecycle group's ``raw_create_port22``) ->
  ``lxc-attach -- true`` -> ``lxc-stop -k`` + ``lxc-destroy``.

Each phase runs ``WARMUP_S`` (the threads' first creates all collide; not counted), then a window
of ``throughput_s`` seconds, then drains (no cycle starts after the window; those in flight finish).
**cycles/s** = cycles completed inside the window / the window. The latencies (create, exec,
destroy, the whole cycle; median/p90/p99/max) are of the cycles that started inside the window.
A failed cycle is counted and its error kept (never retried or hidden); what it made is destroyed
at once. Afterwards the host is checked for leaks as the concurrency group does
(:mod:`benchmarks.hoststate`).

Also per phase, to see what limits the rate: the host's CPU busy fraction over the window
(``/proc/stat``; the kernel's share apart), the host's CPU time per cycle (every process and the
kernel: the containers' init and sshd, the lxc monitors, and whatever else runs on the host), this
process's CPU (the runtime: Python, paramiko) and its children's (the lxc tools it ran) per cycle,
the processes and threads the host started per cycle, the load average; for ours, where a cycle's
time goes, summed over the threads and divided by the cycles (the profile group's timers), and the
host-wide locks' (IPAM, netstate) uses, waits and holds.

Bounded: a phase ends ``throughput_s + WARMUP_S`` after it began plus one cycle's drain; a thread
stuck longer than ``STUCK_S`` past the window is given up on (reported as a failure) and what it
made is swept; ``MAX_FAILURES`` failures end the phase early. Ctrl-C stops at the next cycle.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sandbox_rt.backends.lxc.netstate import NetState
from sandbox_rt.ipam import IpPool

from .context import Bench
from .hoststate import find_leaks, snapshot
from .profile import PARALLEL, TARGETS, _timers
from .stats import compare, percentile, summary

__all__ = ["run"]

WARMUP_S = 3.0  # --quick: 1 s
STUCK_S = 120.0  # a cycle still running this long after the window is a hang, not a sample
MAX_FAILURES = 10  # per phase: past this the phase stops (the failures are the result)
EXEC_TIMEOUT_S = 30

LOCKS = ((IpPool, "locked", "ipam lock"), (NetState, "_locked", "netstate lock"))


def _timed_lock(orig: Any, label: str, acc: dict[str, float], guard: threading.Lock) -> Any:
    """``orig`` (a method returning a lock's context manager), timing the wait and the hold."""

    def factory(self: Any, *args: Any) -> contextlib.AbstractContextManager[None]:
        @contextlib.contextmanager
        def timed() -> Iterator[None]:
            t0 = time.perf_counter()
            with orig(self, *args):
                t1 = time.perf_counter()
                try:
                    yield
                finally:
                    t2 = time.perf_counter()
                    with guard:
                        acc[f"{label} wait"] += t1 - t0
                        acc[f"{label} held"] += t2 - t1
                        acc[f"{label} uses"] += 1

        return timed()

    return factory


@contextlib.contextmanager
def _lock_times() -> Iterator[dict[str, float]]:
    """Time the host-wide locks' acquisitions (wait) and holds while the block runs: the runtime's
    lock factories are wrapped (restored afterwards), so every ``with x.locked():`` adds to
    ``acc["<lock> wait"]``, ``acc["<lock> held"]`` and ``acc["<lock> uses"]``."""
    acc: dict[str, float] = defaultdict(float)
    guard = threading.Lock()
    saved: list[tuple[Any, str, Any]] = []
    for owner, attr, label in LOCKS:
        if attr not in vars(owner):
            continue  # the runtime changed: that lock is simply not timed
        saved.append((owner, attr, vars(owner)[attr]))
        setattr(owner, attr, _timed_lock(vars(owner)[attr], label, acc, guard))
    try:
        yield acc
    finally:
        for owner, attr, orig in reversed(saved):
            setattr(owner, attr, orig)


def _error(exc: BaseException) -> str:
    detail = str(getattr(exc, "detail", "") or "").strip()
    return f"{type(exc).__name__}: {exc}" + (f" ({detail[-300:]})" if detail else "")


def _cpu_jiffies() -> tuple[int, int, int]:
    """(busy, kernel, total) clock ticks of the whole host since boot (busy = all but idle and
    iowait; kernel = system + irq + softirq)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return sum(fields) - fields[3] - fields[4], fields[2] + fields[5] + fields[6], sum(fields)


def _forks() -> int:
    """Processes (and threads) the host has started since boot."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("processes "):
            return int(line.split()[1])
    return 0


def _own_cpu() -> tuple[float, float]:
    """(this process's, its waited-for children's) CPU seconds."""
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system


class _Phase:
    """T threads looping ``cycle`` until the window closes; the samples and failures they made."""

    def __init__(self, b: Bench, threads: int, window_s: float, warmup_s: float) -> None:
        self.b, self.threads = b, threads
        self.lock = threading.Lock()
        self.samples: list[dict[str, float]] = []  # start, create, exec, destroy, cycle, end
        self.failures: list[str] = []
        self.made: set[str] = set()  # sandbox ids / raw container names
        self.ips: set[str] = set()
        self.in_flight: dict[int, float] = {}
        self.t0 = time.monotonic()
        self.window = (self.t0 + warmup_s, self.t0 + warmup_s + window_s)
        self.cpu: dict[str, float] = {}
        self.end = self.t0

    def _go_on(self) -> bool:
        return (
            time.monotonic() < self.window[1]
            and not self.b.stop.is_set()
            and len(self.failures) < MAX_FAILURES
        )

    def _worker(self, cycle: Callable[[_Phase], dict[str, float]]) -> None:
        me = threading.get_ident()
        while self._go_on():
            start = time.monotonic()
            with self.lock:
                self.in_flight[me] = start
            try:
                sample = cycle(self)
            except Exception as exc:  # a failed cycle is a result: counted, kept, never retried
                with self.lock:
                    self.failures.append(_error(exc))
                continue
            finally:
                with self.lock:
                    self.in_flight.pop(me, None)
            sample["start"], sample["end"] = start, time.monotonic()
            with self.lock:
                self.samples.append(sample)

    def run(self, cycle: Callable[[_Phase], dict[str, float]]) -> None:
        workers = [
            threading.Thread(target=self._worker, args=(cycle,), name=f"bench-throughput-{i}", daemon=True)
            for i in range(self.threads)
        ]
        for t in workers:
            t.start()
        while time.monotonic() < self.window[0] and any(t.is_alive() for t in workers):
            time.sleep(0.05)  # waiting for a point in time (the window's start), not a condition
        busy0, kernel0, total0 = _cpu_jiffies()
        own0, kids0 = _own_cpu()
        forks0 = _forks()

        def sample_cpu() -> None:
            busy1, kernel1, total1 = _cpu_jiffies()
            own1, kids1 = _own_cpu()
            self.cpu = {
                "host_busy": (busy1 - busy0) / max(total1 - total0, 1),
                "host_kernel": (kernel1 - kernel0) / max(total1 - total0, 1),
                "host_busy_s": (busy1 - busy0) / os.sysconf("SC_CLK_TCK"),
                "own_s": own1 - own0,
                "children_s": kids1 - kids0,
                "loadavg_1m": os.getloadavg()[0],
                "forks": _forks() - forks0,
            }

        while any(t.is_alive() for t in workers):
            time.sleep(0.05)  # polling the workers' progress (and the window's end)
            now = time.monotonic()
            if now >= self.window[1] and not self.cpu:
                sample_cpu()
            with self.lock:
                stuck = [s for s in self.in_flight.values() if now - max(s, self.window[1]) > STUCK_S]
                if stuck:
                    self.failures.append(f"{len(stuck)} cycle(s) stuck for more than {STUCK_S:.0f} s")
                    break  # left behind (daemon threads); what they made is swept below
        if not self.cpu:  # every worker stopped before the window closed (failures, a stop)
            sample_cpu()
        self.end = time.monotonic()

    def in_window(self) -> int:
        lo, hi = self.window
        return sum(1 for s in self.samples if lo <= s["end"] < hi)

    def started_in_window(self) -> list[dict[str, float]]:
        lo, hi = self.window
        return [s for s in self.samples if lo <= s["start"] < hi]


def _ours_cycle(p: _Phase) -> dict[str, float]:
    t0 = time.perf_counter()
    sb = p.b.create()
    t1 = time.perf_counter()
    with p.lock:
        p.made.add(sb.id)
        p.ips.add(sb.ip)
    try:
        r = sb.exec("true", timeout=EXEC_TIMEOUT_S)
        t2 = time.perf_counter()
        if r.exit_code != 0:
            raise RuntimeError(f"exec('true') exited {r.exit_code}")
    finally:
        t3 = time.perf_counter()
        sb.destroy()
    t4 = time.perf_counter()
    return {"create": t1 - t0, "exec": t2 - t1, "destroy": t4 - t3, "cycle": t4 - t0}


def _raw_cycle(p: _Phase) -> dict[str, float]:
    raw = p.b.raw
    name = raw.new_name()
    with p.lock:
        p.made.add(name)
    attach = ["lxc-attach", "-P", str(raw.path), "-n", name, "--", "true"]
    with raw.address() as ip:
        try:
            t0 = time.perf_counter()
            raw.create(name, ip)
            t1 = time.perf_counter()
            subprocess.run(attach, check=True, capture_output=True, timeout=EXEC_TIMEOUT_S)
            t2 = time.perf_counter()
            raw.destroy(name)
            t3 = time.perf_counter()
        finally:
            raw.remove(name)  # a failed step's container (nothing to do after raw.destroy)
    return {"create": t1 - t0, "exec": t2 - t1, "destroy": t3 - t2, "cycle": t3 - t0}


def _phase(b: Bench, threads: int, *, raw: bool) -> tuple[_Phase, dict[str, Any]]:
    warmup = 1.0 if b.opts.quick else WARMUP_S
    before = snapshot(b.settings)
    phase = _Phase(b, threads, b.opts.throughput_s, warmup)
    steps: dict[str, float] = {}
    lock_use: dict[str, float] = {}
    try:
        if raw:
            phase.run(_raw_cycle)
        else:
            with _timers(TARGETS) as acc, _lock_times() as locks:
                phase.run(_ours_cycle)
                steps = {k.removeprefix(PARALLEL): v for k, v in acc.items()}
                lock_use = dict(locks)
    finally:
        swept = b.sweep()  # what a stuck or interrupted cycle made (its own finally did the rest)
    with phase.lock:
        made, ips = set(phase.made), set(phase.ips)
    leaks = find_leaks(b.settings, before, made | set(swept), ips)
    cycles = len(phase.samples)
    window_s = phase.window[1] - phase.window[0]
    per = max(phase.in_window(), 1)  # CPU is sampled over the window: per cycle completed in it
    facts: dict[str, Any] = {
        "threads": threads,
        "window_s": window_s,
        "cycles_in_window": phase.in_window(),
        "cycles_per_s": phase.in_window() / window_s,
        "cycles_total": cycles,
        "wall_s": phase.end - phase.t0,
        "failures": len(phase.failures),
        "failure_detail": sorted(set(phase.failures))[:5],
        "swept_late": swept,
        "leaked": len(leaks.leaked),
        "leak_detail": leaks.leaked,
        "foreign_changes": leaks.foreign,
        "host_cpu_busy": phase.cpu.get("host_busy"),
        "host_cpu_kernel": phase.cpu.get("host_kernel"),
        "loadavg_1m": phase.cpu.get("loadavg_1m"),
        "host_cpu_ms_per_cycle": phase.cpu.get("host_busy_s", 0.0) * 1e3 / per,
        "own_cpu_ms_per_cycle": phase.cpu.get("own_s", 0.0) * 1e3 / per,
        "children_cpu_ms_per_cycle": phase.cpu.get("children_s", 0.0) * 1e3 / per,
        "host_forks_per_cycle": phase.cpu.get("forks", 0.0) / per,  # processes and threads started
    }
    if steps:
        facts["step_ms_per_cycle"] = {k: v * 1e3 / max(cycles, 1) for k, v in sorted(steps.items())}
    for label in sorted({k.rsplit(" ", 1)[0] for k in lock_use}):
        uses = lock_use[f"{label} uses"]
        facts.setdefault("locks", {})[label] = {
            "uses_per_cycle": uses / max(cycles, 1),
            "wait_ms_per_cycle": lock_use[f"{label} wait"] * 1e3 / max(cycles, 1),
            "held_ms_per_use": lock_use[f"{label} held"] * 1e3 / max(uses, 1),
            "held_fraction": lock_use[f"{label} held"] / max(phase.end - phase.t0, 1e-9),  # of the phase
        }
    return phase, facts


def _entries(phase: _Phase, prefix: str, raw: bool, cycles_per_s: float) -> dict[str, dict[str, Any]]:
    samples = phase.started_in_window() or phase.samples  # a window too short for any: all of them
    what = {
        "create": "raw lxc-copy + lxc-start + TCP :22" if raw else "Manager.create() (cold)",
        "exec": "lxc-attach -- true" if raw else "exec('true')",
        "destroy": "raw lxc-stop -k + lxc-destroy" if raw else "Sandbox.destroy()",
        "cycle": "create + exec + destroy",
    }
    out: dict[str, dict[str, Any]] = {}
    if not samples:
        return out
    for step in ("create", "exec", "destroy", "cycle"):
        values = [s[step] for s in samples]
        entry = summary(values, f"{what[step]}, {phase.threads} threads in a loop", raw=raw)
        entry["p99_ms"] = percentile(values, 0.99) * 1e3
        if step == "cycle":
            entry["rate_per_s"] = cycles_per_s
        out[f"{prefix}_{step}"] = entry
    return out


def run(b: Bench) -> dict[str, Any]:
    measures: dict[str, dict[str, Any]] = {}
    comparisons: list[dict[str, Any]] = []
    by_t: list[dict[str, Any]] = []
    for threads in b.opts.throughput:
        row: dict[str, Any] = {"threads": threads}
        for side, raw in (("ours", False), ("raw", True)):
            b.checkpoint()
            print(f"[benchmarks] throughput: T={threads} {side} ...", flush=True)
            phase, facts = _phase(b, threads, raw=raw)
            row[side] = facts
            prefix = f"{'raw_' if raw else ''}throughput_t{threads}"
            measures.update(_entries(phase, prefix, raw, facts["cycles_per_s"]))
        ours, base = f"throughput_t{threads}", f"raw_throughput_t{threads}"
        if f"{ours}_cycle" in measures and f"{base}_cycle" in measures:
            comparisons += [
                compare(measures, f"{ours}_cycle", f"{base}_cycle", "rate"),
                compare(measures, f"{ours}_create", f"{base}_create", "p99"),
                compare(measures, f"{ours}_create", f"{base}_create"),
                compare(measures, f"{ours}_exec", f"{base}_exec"),
                compare(measures, f"{ours}_destroy", f"{base}_destroy"),
                compare(measures, f"{ours}_cycle", f"{base}_cycle"),
            ]
        by_t.append(row)
    return {"measures": measures, "comparisons": comparisons, "facts": {"by_t": by_t}}
