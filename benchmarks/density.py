"""Density on one host (issue 19): N sandboxes alive at once (N = 100, 250, 500, 1000; --quick: 10).

    python -m benchmarks --only density [--density 100,250,500,1000]

Per N, in ascending order, from an empty start: a few threads (``WORKERS``) call ``Manager.create``
until N sandboxes are alive at once (or a create fails, or the host's available memory would fall
below ``MEM_FLOOR_MB``); then every one must answer ``exec("true")``; then all are destroyed and the
host is checked for leaks exactly as the concurrency group does (containers, addresses, nft
``internet_allowed`` members, create markers, ``sbx*`` interfaces; :mod:`benchmarks.hoststate`).

Reported per N: create latency (median/p90/max of the single creates while the population grows)
and the create rate (sandboxes per second of wall time); host memory per sandbox (MemTotal -
MemAvailable with the N alive, minus the level before, over N; other processes move it too), the
containers' own cgroup memory per sandbox; this process's (the runtime's) RSS, open fds and threads
with the N attached sandboxes, and per sandbox; the kernel's ARP (neighbour) table entries; the exec
round trip over all N; destroy wall time; leaks.

A failure at N is a result, not a crash: ``limit`` names the N, how many were alive and the error,
and no higher N is tried. Bounded: every create has ``CREATE_TIMEOUT_S`` (a worker stuck past it
ends the step as a limit; its sandbox, if it ever appears, is swept by the group), every exec a
timeout, the whole step a deadline; Ctrl-C stops at the next sandbox and destroys what was made.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import sandbox_rt

from .concurrency import MemorySampler, containers_memory_mb
from .context import Bench
from .hoststate import find_leaks, snapshot
from .stats import summary

__all__ = ["run"]

WORKERS = 8  # creates in flight at once (2 cores here: more only queue on the IPAM lock and CPU)
CREATE_TIMEOUT_S = 120.0  # one create longer than this is a limit (a hang must not hang the run)
EXEC_TIMEOUT_S = 30
EXEC_SWEEP_S = 60.0  # the exec sweep over all N ends after this + 0.1 s per sandbox at the latest
MEM_FLOOR_MB = 2048  # never let the host's MemAvailable go below this
FIRST_GUESS_MB = 8.0  # per-sandbox host memory assumed before the first N measured it


def _mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _self_usage() -> dict[str, float]:
    """This process's resident memory (MiB), open fds and threads."""
    lines = Path("/proc/self/status").read_text().splitlines()
    status = {k: v for k, _, v in (ln.partition(":") for ln in lines)}
    return {
        "rss_mb": int(status["VmRSS"].split()[0]) / 1024,
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": int(status["Threads"].strip()),
    }


def _arp_entries() -> int:
    """Entries of the kernel's IPv4 neighbour table (one table for every network namespace)."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        return int(Path("/proc/net/stat/arp_cache").read_text().splitlines()[1].split()[0], 16)
    return -1


def _error(exc: BaseException) -> str:
    detail = str(getattr(exc, "detail", "") or "").strip()
    return f"{type(exc).__name__}: {exc}" + (f" ({detail[-500:]})" if detail else "")


class _Population:
    """Creates sandboxes with a few daemon threads until ``n`` are alive or something stops it."""

    def __init__(self, b: Bench, n: int, mem_per_sb_mb: float) -> None:
        self.b, self.n, self.mem_per_sb_mb = b, n, mem_per_sb_mb
        self.lock = threading.Lock()
        self.made: list[sandbox_rt.Sandbox] = []
        self.durations: list[float] = []
        self.started = 0  # creates begun
        self.failure: str | None = None
        self.in_flight: dict[int, float] = {}  # thread ident -> start (monotonic)

    def _claim(self) -> bool:
        with self.lock:
            if self.failure is not None or self.b.stop.is_set() or self.started >= self.n:
                return False
            if _mem_available_mb() < MEM_FLOOR_MB + 2 * self.mem_per_sb_mb * WORKERS:
                self.failure = f"host memory floor: MemAvailable {_mem_available_mb():.0f} MiB"
                return False
            self.started += 1
            return True

    def _worker(self) -> None:
        me = threading.get_ident()
        while self._claim():
            t0 = time.monotonic()
            with self.lock:
                self.in_flight[me] = t0
            try:
                sb = self.b.create()
            except Exception as exc:  # a failed create is the result of this N
                with self.lock:
                    self.failure = self.failure or f"create #{len(self.made) + 1}: {_error(exc)}"
                    self.in_flight.pop(me, None)
                return
            with self.lock:
                self.in_flight.pop(me, None)
                self.made.append(sb)
                self.durations.append(time.monotonic() - t0)

    def fill(self) -> float:
        """Run the workers; the wall time until they stopped (or one got stuck)."""
        threads = [
            threading.Thread(target=self._worker, name=f"bench-density-{i}", daemon=True)
            for i in range(min(WORKERS, self.n))
        ]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            time.sleep(0.2)  # polling the workers' progress, not waiting for one condition
            now = time.monotonic()
            with self.lock:
                stuck = [s for s in self.in_flight.values() if now - s > CREATE_TIMEOUT_S]
                if stuck and self.failure is None:
                    self.failure = f"a create took more than {CREATE_TIMEOUT_S:.0f} s (stuck)"
                if stuck:
                    break  # a stuck worker is left behind (daemon); the sweep removes its sandbox
        return time.monotonic() - t0


def _exec_true(sb: sandbox_rt.Sandbox, give_up: float, stop: threading.Event) -> tuple[bool, float, str]:
    if stop.is_set() or time.monotonic() > give_up:  # the sweep's deadline: the rest count as silent
        return False, 0.0, "not asked: the exec sweep's deadline passed (or a stop)"
    t0 = time.perf_counter()
    try:
        r = sb.exec("true", timeout=EXEC_TIMEOUT_S)
    except sandbox_rt.SandboxError as exc:
        return False, time.perf_counter() - t0, _error(exc)
    return r.exit_code == 0, time.perf_counter() - t0, "" if r.exit_code == 0 else f"exit {r.exit_code}"


def _step(b: Bench, n: int, mem_per_sb_mb: float) -> dict[str, Any]:
    before = snapshot(b.settings)
    base_mb = MemorySampler._settled()
    self0 = _self_usage()
    arp0 = _arp_entries()
    pop = _Population(b, n, mem_per_sb_mb)
    row: dict[str, Any] = {"n": n}
    exec_s: list[float] = []
    errors: list[str] = []
    try:
        fill_s = pop.fill()
        alive = list(pop.made)
        row.update(created=len(alive), fill_s=fill_s, create_per_s=len(alive) / fill_s if fill_s else 0.0)
        k = max(len(alive), 1)
        used_mb = MemorySampler._used() - base_mb
        cg_mb = containers_memory_mb([sb.id for sb in alive])
        self1 = _self_usage()
        row.update(
            host_mem_mb=used_mb,
            host_mem_per_sb_mb=used_mb / k,
            containers_mem_mb=cg_mb,
            containers_mem_per_sb_mb=cg_mb / k,
            runtime_rss_mb=self1["rss_mb"],
            runtime_rss_per_sb_kb=(self1["rss_mb"] - self0["rss_mb"]) * 1024 / k,
            runtime_fds=self1["fds"],
            runtime_fds_per_sb=(self1["fds"] - self0["fds"]) / k,
            runtime_threads=self1["threads"],
            runtime_threads_per_sb=(self1["threads"] - self0["threads"]) / k,
            arp_entries=_arp_entries(),
            arp_entries_before=arp0,
            mem_available_mb=_mem_available_mb(),
        )
        b.checkpoint()
        with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="bench-density-exec") as pool:
            give_up = time.monotonic() + EXEC_SWEEP_S + 0.1 * len(alive)
            answers = list(pool.map(lambda sb: _exec_true(sb, give_up, b.stop), alive))
        exec_s = [s for ok, s, _ in answers if ok]
        row["answered"] = sum(ok for ok, _, _ in answers)
        errors += sorted({e for ok, _, e in answers if not ok})[:5]
    finally:
        with pop.lock:
            pop.failure = pop.failure or "stopped"  # a worker still inside a create makes no more
            made = list(pop.made)
        t1 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="bench-density-destroy") as pool:
            for f in [pool.submit(sb.destroy) for sb in made]:
                if f.exception() is not None:
                    errors.append(f"destroy: {_error(f.exception())}")  # type: ignore[arg-type]
        row["destroy_all_s"] = time.perf_counter() - t1
        swept = b.sweep()  # a create that finished after its worker was given up on
    if pop.failure == "stopped":
        pop.failure = None
    leaks = find_leaks(b.settings, before, {sb.id for sb in made} | set(swept), {sb.ip for sb in made})
    row.update(
        limit=pop.failure,
        all_answered=row.get("answered") == n,
        errors=errors,
        swept_late=swept,
        leaked=len(leaks.leaked),
        leak_detail=leaks.leaked,
        foreign_changes=leaks.foreign,
        create_s=pop.durations,
        exec_s=exec_s,
    )
    return row


def run(b: Bench) -> dict[str, Any]:
    measures: dict[str, dict[str, Any]] = {}
    by_n: list[dict[str, Any]] = []
    limit: dict[str, Any] | None = None
    per_sb_mb = FIRST_GUESS_MB
    for n in sorted(b.opts.density):
        b.checkpoint()
        need = n * per_sb_mb * 1.25  # the floor check before every create is the real guard
        if _mem_available_mb() - need < MEM_FLOOR_MB:
            limit = {
                "n": n,
                "alive": 0,
                "error": f"not tried: ~{need:.0f} MiB needed, "
                f"{_mem_available_mb():.0f} MiB available, floor {MEM_FLOOR_MB} MiB",
            }
            break
        print(f"[benchmarks] density: N={n} ...", flush=True)
        row = _step(b, n, per_sb_mb)
        create_s, exec_s = row.pop("create_s"), row.pop("exec_s")
        if create_s:
            entry = summary(create_s, f"one Manager.create() while growing to {n} alive ({WORKERS} threads)")
            entry["sandboxes_per_s"] = row["create_per_s"]
            measures[f"density_create_n{n}"] = entry
        if exec_s:
            what = f"exec('true') in each of {n} alive sandboxes"
            measures[f"density_exec_true_n{n}"] = summary(exec_s, what)
        by_n.append(row)
        if row.get("host_mem_per_sb_mb", 0) > 0:
            per_sb_mb = max(per_sb_mb, row["host_mem_per_sb_mb"])
        if row["limit"] is not None or not row["all_answered"]:
            limit = {"n": n, "alive": row.get("created", 0), "error": row["limit"] or row["errors"][:1]}
            break
    reached = max((r["n"] for r in by_n if r["limit"] is None and r["all_answered"]), default=0)
    return {
        "measures": measures,
        "comparisons": [],
        "facts": {"by_n": by_n, "reached": reached, "limit": limit, "workers": WORKERS},
    }
