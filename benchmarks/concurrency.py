"""N sandboxes created at once (N = 10, 25, 50; --quick: 5) vs N raw containers at once.

Per N and round: the wall time until all N are SSH-ready (threads calling ``Manager.create``),
sandboxes per second, the host's peak memory above the level before the round (MemTotal -
MemAvailable sampled every 10 ms while the N exist; on a shared host other processes move it too)
and the sum of the N containers' own cgroup memory use, that each runs ``echo ok``, and that nothing
is left afterwards (containers, addresses, nft ``internet_allowed`` members, create markers,
``sbx*`` interfaces; see :mod:`benchmarks.hoststate`). The raw baseline: N threads each doing
``lxc-copy`` + ``lxc-start`` + first TCP connect to :22, then ``lxc-stop -k`` + ``lxc-destroy``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, TypeVar

import sandbox_rt

from .context import Bench
from .hoststate import find_leaks, snapshot
from .stats import compare, summary

__all__ = ["MemorySampler", "run"]
T = TypeVar("T")


class MemorySampler:
    """Peak of MemTotal - MemAvailable (MiB) above the level at start, sampled in a thread."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.base = self._settled()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-meminfo", daemon=True)

    @staticmethod
    def _used() -> float:
        info: dict[str, int] = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                info[key] = int(rest.split()[0])
        return (info["MemTotal"] - info["MemAvailable"]) / 1024

    @classmethod
    def _settled(cls, within_mb: float = 2.0, max_wait_s: float = 5.0) -> float:
        """The level once it stops moving (what the previous round freed is still being released)."""
        recent = [cls._used()]
        deadline = time.monotonic() + max_wait_s
        while time.monotonic() < deadline:
            time.sleep(0.1)  # sampling the level, not waiting for a condition we could be told of
            recent = [*recent[-4:], cls._used()]
            if len(recent) == 5 and max(recent) - min(recent) < within_mb:
                break
        return recent[-1]

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self._used())

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._used())

    @property
    def delta_mb(self) -> float:
        return self.peak - self.base


def containers_memory_mb(names: list[str]) -> float:
    """Sum of the containers' own cgroup memory use (MiB): the per-sandbox cost, immune to what
    other processes on the host do (cgroup v1 or v2)."""
    total = 0
    for name in names:
        group = f"lxc.payload.{name}"
        for f in (
            Path("/sys/fs/cgroup/memory") / group / "memory.usage_in_bytes",
            Path("/sys/fs/cgroup") / group / "memory.current",
        ):
            try:
                total += int(f.read_text().split()[0])
                break
            except (OSError, ValueError, IndexError):
                continue
    return total / 2**20


def _all(pool: ThreadPoolExecutor, fn: Callable[[], T], n: int) -> list[Future[T]]:
    futures = [pool.submit(fn) for _ in range(n)]
    wait(futures)
    return futures


def _results(futures: list[Future[T]]) -> tuple[list[T], list[str]]:
    ok: list[T] = []
    errors: list[str] = []
    for f in futures:
        if f.cancelled() or not f.done():
            continue
        exc = f.exception()
        if exc is None:
            ok.append(f.result())
        else:
            errors.append(f"{type(exc).__name__}: {exc}")
    return ok, errors


def _echo_ok(sb: sandbox_rt.Sandbox) -> bool:
    try:
        r = sb.exec("echo ok", timeout=60)
    except sandbox_rt.SandboxError:
        return False
    return r.exit_code == 0 and r.stdout == b"ok\n"


def _ours_round(b: Bench, n: int) -> dict[str, Any]:
    before = snapshot(b.settings)
    made: list[sandbox_rt.Sandbox] = []
    errors: list[str] = []
    working = 0
    destroy_s = 0.0
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="bench-create") as pool:
        futures: list[Future[sandbox_rt.Sandbox]] = []
        try:
            with MemorySampler() as mem:
                t0 = time.perf_counter()
                futures = _all(pool, b.create, n)
                total = time.perf_counter() - t0
                made, errors = _results(futures)
                working = sum(pool.map(_echo_ok, made))
                cgroup_mb = containers_memory_mb([sb.id for sb in made])
        finally:
            pool.shutdown(wait=True)  # after Ctrl-C too: creates in flight finish, then go below
            made, errors = _results(futures)
            t1 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=n, thread_name_prefix="bench-destroy") as killers:
                for f in [killers.submit(sb.destroy) for sb in made]:
                    if f.exception() is not None:
                        errors.append(f"destroy: {f.exception()}")
            destroy_s = time.perf_counter() - t1
    leaks = find_leaks(b.settings, before, {sb.id for sb in made}, {sb.ip for sb in made})
    return {
        "total_s": total,
        "peak_mem_mb": mem.delta_mb,
        "containers_mem_mb": cgroup_mb,
        "working": working,
        "created": len(made),
        "errors": errors,
        "destroy_all_s": destroy_s,
        "leaked": leaks.leaked,
        "foreign": leaks.foreign,
    }


def _raw_round(b: Bench, n: int) -> dict[str, Any]:
    before = snapshot(b.settings)
    names: list[str] = []
    lock = threading.Lock()

    def one() -> str:
        name = b.raw.new_name()
        with lock:
            names.append(name)
        with b.raw.address() as ip:
            b.raw.create(name, ip)
        return name

    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="bench-raw") as pool:
        futures: list[Future[str]] = []
        try:
            with MemorySampler() as mem:
                t0 = time.perf_counter()
                futures = _all(pool, one, n)
                total = time.perf_counter() - t0
                cgroup_mb = containers_memory_mb(list(names))
        finally:
            pool.shutdown(wait=True)
            up, errors = _results(futures)
            with ThreadPoolExecutor(max_workers=n, thread_name_prefix="bench-raw-destroy") as killers:
                list(killers.map(b.raw.remove, list(names)))
    leaks = find_leaks(b.settings, before, set(names), set())
    return {
        "total_s": total,
        "peak_mem_mb": mem.delta_mb,
        "containers_mem_mb": cgroup_mb,
        "working": len(up),
        "created": len(up),
        "errors": errors,
        "leaked": leaks.leaked,
        "foreign": leaks.foreign,
    }


def run(b: Bench) -> dict[str, Any]:
    measures: dict[str, dict[str, Any]] = {}
    comparisons = []
    by_n = []
    for n in b.opts.concurrency:
        ours = []
        raw = []
        for _ in range(b.opts.concurrency_rounds):
            b.checkpoint()
            ours.append(_ours_round(b, n))
            b.checkpoint()
            raw.append(_raw_round(b, n))
        for key, rounds, what in (
            (f"concurrent_create_n{n}", ours, f"{n} Manager.create() at once, until all are SSH-ready"),
            (f"raw_concurrent_create_n{n}", raw, f"{n} raw lxc-copy + lxc-start + TCP :22 at once"),
        ):
            entry = summary([r["total_s"] for r in rounds], what, raw=key.startswith("raw_"))
            entry["sandboxes_per_s"] = n / (entry["median_ms"] / 1e3)
            entry["peak_mem_mb"] = max(r["peak_mem_mb"] for r in rounds)
            entry["containers_mem_mb"] = max(r["containers_mem_mb"] for r in rounds)
            measures[key] = entry
        comparisons.append(compare(measures, f"concurrent_create_n{n}", f"raw_concurrent_create_n{n}"))
        by_n.append(
            {
                "n": n,
                "rounds": len(ours),
                "all_working": all(r["working"] == n for r in ours),
                "working": min(r["working"] for r in ours),
                "leaked": sum(len(r["leaked"]) for r in ours),
                "leak_detail": sorted({x for r in ours for x in r["leaked"]}),
                "raw_all_up": all(r["working"] == n for r in raw),
                "raw_leaked": sum(len(r["leaked"]) for r in raw),
                "raw_leak_detail": sorted({x for r in raw for x in r["leaked"]}),
                "foreign_changes": sorted({x for r in ours + raw for x in r["foreign"]}),
                "errors": [e for r in ours + raw for e in r["errors"]],
                "destroy_all_s": [r["destroy_all_s"] for r in ours],
                "peak_mem_mb": [r["peak_mem_mb"] for r in ours],
                "raw_peak_mem_mb": [r["peak_mem_mb"] for r in raw],
                "containers_mem_mb": [r["containers_mem_mb"] for r in ours],
                "raw_containers_mem_mb": [r["containers_mem_mb"] for r in raw],
            }
        )
    return {"measures": measures, "comparisons": comparisons, "facts": {"by_n": by_n}}
