"""Summaries of timing samples (seconds in, milliseconds out) and the comparisons between them."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Measures", "compare", "percentile", "summary", "throughput", "timed"]

Measures = dict[str, dict[str, Any]]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..1) of a non-empty sample."""
    if not values:
        raise ValueError("no samples")
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def summary(seconds: list[float], what: str, *, raw: bool = False) -> dict[str, Any]:
    """median/p90/max/min in ms of a sample of durations in seconds."""
    return {
        "median_ms": statistics.median(seconds) * 1e3,
        "p90_ms": percentile(seconds, 0.9) * 1e3,
        "max_ms": max(seconds) * 1e3,
        "min_ms": min(seconds) * 1e3,
        "n": len(seconds),
        "what": what,
        "raw": raw,
    }


def throughput(entry: dict[str, Any], megabytes: float) -> dict[str, Any]:
    """Add the size moved per run and MB/s at the median duration (MB = 2**20 bytes)."""
    entry["mb"] = megabytes
    entry["mb_per_s"] = megabytes / (entry["median_ms"] / 1e3)
    return entry


def compare(
    measures: Measures, measure: str, baseline: str, kind: str = "time", *, against: str = "raw"
) -> dict[str, Any]:
    """One comparison of two measured medians.

    ``time``: ratio = ours / baseline of the median durations (above 1 = slower than the baseline),
    ``diff_ms`` = ours - baseline. ``throughput``: ratio = ours / baseline of MB/s (above 1 = faster).
    ``p99``: ratio = ours / baseline of the 99th percentiles (``p99_ms``; above 1 = slower). ``rate``:
    ratio = ours / baseline of ``rate_per_s`` (operations per second; above 1 = faster). ``diff_ms``
    is always the difference of the medians.
    ``against``: ``raw`` (the raw engine or tool), ``variant`` (the runtime with an option turned
    off, to show what the option costs) or ``idle`` (the same measure while the neighbours idle, to
    show what their load costs).
    """
    if against not in ("raw", "variant", "idle"):
        raise ValueError(f"unknown baseline kind {against!r}")
    ours, base = measures[measure], measures[baseline]
    if kind == "throughput":
        ratio = ours["mb_per_s"] / base["mb_per_s"]
    elif kind == "time":
        ratio = ours["median_ms"] / base["median_ms"]
    elif kind == "p99":
        ratio = ours["p99_ms"] / base["p99_ms"]
    elif kind == "rate":
        ratio = ours["rate_per_s"] / base["rate_per_s"]
    else:
        raise ValueError(f"unknown comparison kind {kind!r}")
    return {
        "measure": measure,
        "baseline": baseline,
        "kind": kind,
        "against": against,
        "ratio": ratio,
        "diff_ms": ours["median_ms"] - base["median_ms"],
    }


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn()`` took (perf_counter)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
