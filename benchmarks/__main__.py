"""The benchmark suite: sandbox_rt vs the raw engine and raw tools, measured in the same run.

    python -m benchmarks [--runs 20] [--quick] [--only lifecycle,transfer,...] [--json PATH]

Groups (all by default): lifecycle, transfer, concurrency, pve, profile, neighbours, frontdoors, density,
templates, throughput
(see each module's docstring and docs/benchmarks.md). Prints median, p90 and max of every measure and the
ratio to its baseline; writes everything to JSON (default benchmarks/results.json, not committed). Run as root
on a host prepared by site.yml. Every sandbox made carries the labels bench=1 and bench-run=<id>
and is destroyed before the suite exits, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import paramiko

from . import (
    concurrency,
    density,
    frontdoors,
    lifecycle,
    neighbours,
    profile,
    pve,
    templates,
    throughput,
    transfer,
)
from .context import Bench, Options
from .report import format_table, write_json

GROUPS: dict[str, Callable[[Bench], dict[str, Any]]] = {
    "lifecycle": lifecycle.run,
    "transfer": transfer.run,
    "concurrency": concurrency.run,
    "pve": pve.run,
    "profile": profile.run,
    "neighbours": neighbours.run,
    "frontdoors": frontdoors.run,
    "density": density.run,
    "templates": templates.run,
    "throughput": throughput.run,
}
DEFAULT_JSON = Path(__file__).resolve().parent / "results.json"


def _version(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (proc.stdout or proc.stderr).strip().splitlines()[0] if (proc.stdout or proc.stderr) else "unknown"


def _host() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "paramiko": paramiko.__version__,
        "lxc": _version(["lxc-start", "--version"]),
        "openssh": _version(["ssh", "-V"]),
    }


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, help="samples per measure (default 20; --quick: 3)")
    ap.add_argument("--quick", action="store_true", help="small N and sizes, concurrency N=5 only (CI)")
    ap.add_argument("--only", help=f"comma-separated groups of: {', '.join(GROUPS)}")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})")
    ap.add_argument(
        "--transfer-mb", type=int, help="file size of the transfer group (default 100; --quick: 20)"
    )
    ap.add_argument("--concurrency", help="comma-separated N of the concurrency group (default 10,25,50)")
    ap.add_argument("--concurrency-rounds", type=int, help="rounds per N (default 3; --quick: 1)")
    ap.add_argument(
        "--density",
        help="comma-separated N alive at once of the density group (default 100,250,500,1000; --quick: 10)",
    )
    ap.add_argument(
        "--throughput",
        help="comma-separated caller threads of the throughput group (default 8,32; --quick: 4)",
    )
    ap.add_argument(
        "--throughput-seconds",
        type=float,
        help="measured seconds per throughput phase (default 20; --quick: 4)",
    )
    args = ap.parse_args(argv)
    names = [n.strip() for n in (args.only or ",".join(GROUPS)).split(",") if n.strip()]
    unknown = [n for n in names if n not in GROUPS]
    if unknown or not names:
        ap.error(f"unknown group(s) {unknown}; choose from {', '.join(GROUPS)}")
    args.groups = names
    if args.runs is not None and args.runs < 1:
        ap.error("--runs must be >= 1")
    return args


def _options(args: argparse.Namespace) -> Options:
    opts = Options.quick_mode(args.runs) if args.quick else Options(runs=args.runs or 20)
    changes: dict[str, Any] = {}
    if args.transfer_mb:
        changes["transfer_mb"] = args.transfer_mb
    if args.concurrency:
        changes["concurrency"] = tuple(int(n) for n in args.concurrency.split(","))
    if args.concurrency_rounds:
        changes["concurrency_rounds"] = args.concurrency_rounds
    if args.density:
        changes["density"] = tuple(int(n) for n in args.density.split(","))
    if args.throughput:
        changes["throughput"] = tuple(int(n) for n in args.throughput.split(","))
    if args.throughput_seconds:
        changes["throughput_s"] = args.throughput_seconds
    return dataclasses.replace(opts, **changes)


def _handle_signals(bench: Bench) -> None:
    """First Ctrl-C/SIGTERM: stop at the next checkpoint (then clean up); a second one: at once."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        if bench.stop.is_set():
            raise KeyboardInterrupt
        bench.stop.set()
        print(
            f"\n[benchmarks] {signal.Signals(signum).name}: stopping after the current step, then "
            "destroying this run's sandboxes (again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    for sig in (signal.SIGINT, signal.SIGTERM):  # SIGINT too, even if the parent ignored it
        signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    opts = _options(args)
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack
    started = time.time()
    t_start = time.perf_counter()
    results: dict[str, Any] = {
        "meta": {
            "runs": opts.runs,
            "quick": opts.quick,
            "options": dataclasses.asdict(opts),
            "groups": args.groups,
            "started_at": started,
            "host": _host(),
        },
        "groups": {},
    }
    failed = interrupted = False
    bench = Bench(opts)
    _handle_signals(bench)
    results["meta"]["run_id"] = bench.run_id
    try:
        for name in args.groups:
            bench.checkpoint()
            print(f"[benchmarks] {name} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                group = GROUPS[name](bench)
                bench.checkpoint()  # a stop requested during the group's last step
            except Exception as exc:  # one failing group must not hide the others' numbers
                traceback.print_exc()
                detail = str(getattr(exc, "detail", "") or "").strip()
                group = {"error": f"{type(exc).__name__}: {exc}" + (f" ({detail[-1500:]})" if detail else "")}
                failed = True
            group["duration_s"] = time.perf_counter() - t0
            results["groups"][name] = group
            print(f"[benchmarks] {name} done in {group['duration_s']:.1f} s", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("[benchmarks] interrupted: destroying this run's sandboxes", file=sys.stderr, flush=True)
    finally:
        swept = bench.close()
        results["meta"]["swept_after_run"] = swept
    results["meta"]["duration_s"] = time.perf_counter() - t_start
    results["meta"]["interrupted"] = interrupted
    write_json(results, args.json)
    format_table(results, sys.stdout)
    print(f"\n[benchmarks] results in {args.json}", file=sys.stderr)
    if interrupted:
        return 130
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
