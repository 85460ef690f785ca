"""The printed table and the JSON file of a benchmark run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

__all__ = ["format_table", "write_json"]

_HEAD = f"{'measure':44} {'median':>9} {'p90':>9} {'max':>9}  {'(ms)':10} {'vs baseline':31} {'ratio':>7}"


def _note(m: dict[str, Any]) -> str:
    if "mb_per_s" in m:
        return f"{m['mb_per_s']:.0f} MB/s"
    if "sandboxes_per_s" in m:
        return f"{m['sandboxes_per_s']:.1f}/s"
    if "rate_per_s" in m:
        return f"{m['rate_per_s']:.2f}/s"
    return ""


def _ms(value: float) -> str:
    """Milliseconds, with three decimals below 1 ms (a DNS answer takes ~0.1 ms)."""
    return f"{value:9.3f}" if value < 1 else f"{value:9.1f}"


def _against(c: dict[str, Any]) -> str:
    """The baseline's name, with the figure compared when it is not the median (p99, rate)."""
    return f"{c['baseline']} ({c['kind']})" if c["kind"] in ("p99", "rate") else c["baseline"]


def _ratio(c: dict[str, Any]) -> str:
    return f"{c['ratio']:.2f}x"


def _facts(name: str, group: dict[str, Any]) -> list[str]:
    facts = group.get("facts", {})
    lines: list[str] = []
    if name == "transfer":
        lines.append(
            f"  {facts.get('megabytes')} MB per transfer; SHA-256 verified: {facts.get('all_verified')}"
        )
        lines.append("  throughput ratio = ours MB/s / OpenSSH MB/s (above 1: ours is faster)")
    elif name == "concurrency":
        for row in facts.get("by_n", []):
            mem = max(row["peak_mem_mb"], default=0.0)
            raw_mem = max(row["raw_peak_mem_mb"], default=0.0)
            cg = max(row["containers_mem_mb"], default=0.0)
            raw_cg = max(row["raw_containers_mem_mb"], default=0.0)
            lines.append(
                f"  N={row['n']}: all_working={row['all_working']} leaked={row['leaked']} "
                f"raw_leaked={row['raw_leaked']}; peak host memory +{mem:.0f} MB (raw +{raw_mem:.0f} MB); "
                f"containers' cgroups {cg:.0f} MB (raw {raw_cg:.0f} MB); "
                f"destroy all {max(row['destroy_all_s'], default=0.0):.2f} s"
            )
            if row["leak_detail"] or row["raw_leak_detail"]:
                lines.append(f"    leaked: {row['leak_detail'] + row['raw_leak_detail']}")
            if row["errors"]:
                lines.append(f"    errors: {row['errors'][:5]}")
    elif name == "neighbours":
        by_round = ", ".join(f"{w:.2f}x" for w in facts.get("worst_by_round", []))
        lines.append(
            f"  victim figures vs the same while the neighbour idles (ratio > 1: worse); worst "
            f"{facts.get('worst_slowdown', 0):.2f}x ({facts.get('rounds', 1)} rounds pooled; each round "
            f"alone: {by_round}); DNS answers lost {facts.get('dns_lost')}; conntrack "
            f"peak {facts.get('conntrack_peak')} of {facts.get('conntrack_max')}; caps {facts.get('caps')}"
        )
        for phase, row in facts.get("phases", {}).items():
            flood = {k: v for k, v in (row.get("flood") or {}).items() if k not in ("kind", "exit_code")}
            held = f", hostile's entries {row['hostile_entries']}" if "hostile_entries" in row else ""
            lines.append(
                f"  {phase:10} DNS lost {row['dns_lost']}/{row['dns_asked']}, conntrack peak "
                f"{row['conntrack_peak']}{held}{'; flood ' + str(flood) if flood else ''}"
            )
    elif name == "throughput":
        lines.append("  cycles/s and create p99 vs the raw engine: ratios above (rate: above 1 = faster)")
        for row in facts.get("by_t", []):
            for side in ("ours", "raw"):
                f = row[side]
                busy = f["host_cpu_busy"]
                lines.append(
                    f"  T={row['threads']} {side:4}: {f['cycles_per_s']:.2f} cycles/s "
                    f"({f['cycles_in_window']} in {f['window_s']:.0f} s), failures {f['failures']}, "
                    f"leaked {f['leaked']}; host CPU busy {'?' if busy is None else f'{busy:.0%}'} "
                    f"(kernel {f['host_cpu_kernel'] or 0:.0%}); CPU per cycle: host "
                    f"{f['host_cpu_ms_per_cycle']:.0f} ms, this process {f['own_cpu_ms_per_cycle']:.0f} ms, "
                    f"its children {f['children_cpu_ms_per_cycle']:.0f} ms; "
                    f"{f['host_forks_per_cycle']:.0f} processes/threads started per cycle"
                )
                if f["failure_detail"] or f["leak_detail"]:
                    lines.append(f"    failures: {f['failure_detail']}; leaked: {f['leak_detail']}")
                if f.get("step_ms_per_cycle"):
                    steps = ", ".join(f"{k} {v:.0f}" for k, v in f["step_ms_per_cycle"].items())
                    lines.append(f"    ms per cycle (summed over threads): {steps}")
                for lock, use in f.get("locks", {}).items():
                    lines.append(
                        f"    {lock}: {use['uses_per_cycle']:.1f} uses per cycle, waited "
                        f"{use['wait_ms_per_cycle']:.0f} ms per cycle, held {use['held_ms_per_use']:.1f} ms "
                        f"per use ({use['held_fraction']:.0%} of the phase)"
                    )
    elif name == "pve":
        over = facts.get("api_overhead_ms", {})
        lines.append(f"  server: {facts.get('server')}")
        lines.append(
            "  API overhead (proxmox - lxc, medians): "
            + ", ".join(f"{op} {ms:+.1f} ms" for op, ms in over.items())
        )
    return lines


def format_table(results: dict[str, Any], out: TextIO) -> None:
    meta = results["meta"]
    out.write(
        f"sandbox_rt benchmarks: runs={meta['runs']} quick={meta['quick']} "
        f"({meta['duration_s']:.1f} s, {meta['host']['cpus']} CPUs, kernel {meta['host']['kernel']})\n"
    )
    for name, group in results["groups"].items():
        out.write(f"\n== {name} ==\n")
        if "error" in group:
            out.write(f"  FAILED: {group['error']}\n")
            continue
        out.write(_HEAD + "\n")
        by_measure: dict[str, list[dict[str, Any]]] = {}
        for c in group["comparisons"]:
            by_measure.setdefault(c["measure"], []).append(c)
        for key, m in group["measures"].items():
            comps = by_measure.get(key, [])
            first = comps[0] if comps else None
            out.write(
                f"{key[:44]:44} {_ms(m['median_ms'])} {_ms(m['p90_ms'])} {_ms(m['max_ms'])}  {_note(m):10} "
                f"{(_against(first) if first else '')[:31]:31} {(_ratio(first) if first else ''):>7}\n"
            )
            for c in comps[1:]:
                out.write(f"{'':44} {'':9} {'':9} {'':9}  {'':10} {_against(c)[:31]:31} {_ratio(c):>7}\n")
        for line in _facts(name, group):
            out.write(line + "\n")


def write_json(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)
