"""Noisy neighbours (issue 26): what one hostile sandbox's floods cost another sandbox.

    python -m benchmarks --only neighbours

Two sandboxes with internet (so DNS is theirs to use), cpus=1, 512 MiB, the host's default caps.
The hostile one runs each flood in turn, each until its neighbour has measured:

- ``cpu``: one busy thread, nothing else: the sandbox uses its whole CPU share and touches nothing
  shared (the reference: what any busy neighbour costs on this host);
- ``conntrack``: one DNS query from each local UDP port in turn plus TCP connections held open
  (the attack that filled a quarter of the host's table in 0.4 s);
- ``dns``: DNS queries on one socket as fast as it can send;
- ``connrate``: new flows to the host as fast as they go (UDP to its DHCP port from each local port,
  TCP attempts to a closed port);
- ``bandwidth``: full-size UDP datagrams to the host as fast as it can send;
- ``odirect`` / ``buffered``: 1 MiB writes with O_DIRECT / through the page cache, without end;
- ``forkstorm``: a fork bomb (bounded: its session is KILLed when the phase ends);
- ``memory``: children that allocate until the sandbox's limit OOM-kills them, again and again.

Meanwhile the victim measures its exec round trip (``exec('true')``), DNS answers (a query for the
host's own record, 1 s timeout, lost ones counted), 4 KiB write+fsync latency in its home, and
throughput (``head -c N /dev/zero`` through ``exec``, MB/s). Each figure is compared with the same
figure while the hostile sandbox idles (measured in the same run, just before each flood, all those
idle windows pooled): ratio = flooded median / idle median (throughput: MB/s flooded / MB/s idle). The
host's conntrack table is sampled every 20 ms; its peak per phase is a fact. Targets: every ratio
<= 1.5x, no DNS answer lost, the conntrack table never full.

The whole cycle (idle, flood, for each flood) runs ``ROUNDS`` times (``--quick``: once) and each
figure pools its samples over the rounds: on a shared 2-CPU host a phase's two seconds can fall on
a moment when something else has the CPUs (the same flood's ``exec_rtt`` was 1.0x in one run and
1.8x in the next), and three windows minutes apart show the flood's steady cost rather than that
moment. The worst ratio of each round alone is a fact too (``worst_by_round``).

All traffic goes to the host's own address on the sandbox bridge (DNS, a discard port nothing
listens on) or stays inside the two sandboxes.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import sandbox_rt
from sandbox_rt.backends.lxc.fstree import rewrite_file_beneath

from .context import Bench
from .stats import compare, summary, throughput, timed

__all__ = ["FIGURES", "PHASES", "run"]

PROBE_SOURCE = Path(__file__).with_name("neighbour_probe.py")
PROBE = "/tmp/.neighbour-probe.py"
PHASES = ("cpu", "conntrack", "dns", "connrate", "bandwidth", "odirect", "buffered", "forkstorm", "memory")
FIGURES = {
    "exec_rtt": "victim: Sandbox.exec('true') round trip",
    "dns_answer": "victim: one DNS query to the host's dnsmasq until its answer",
    "fsync": "victim: 4 KiB pwrite + fsync in its home",
    "throughput": "victim: exec('head -c N /dev/zero') to the host",
}
DNS_NAME = "host.sandbox.internal"
DNS_QUERIES_PER_SAMPLE = 3  # DNS queries per exec/fsync sample of a phase
ROUNDS = 3  # the whole idle/flood cycle, pooled (--quick: 1)
THROUGHPUT_SAMPLES = 6  # head -c N transfers per phase and round (~0.2 s each; --quick: 3)
FLOOD_MAX_S = 120  # a flood ends by itself at the latest after this long
FORKSTORM_PIDS = 200  # the fork storm is on once the hostile sandbox holds this many tasks
CONNTRACK = Path("/proc/sys/net/netfilter")


class ConntrackSampler:
    """The peak of the host's conntrack table while the block runs (every 20 ms)."""

    def __init__(self) -> None:
        self.peak = self._count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-conntrack", daemon=True)

    @staticmethod
    def _count() -> int:
        try:
            return int((CONNTRACK / "nf_conntrack_count").read_text())
        except (OSError, ValueError):
            return 0

    def _loop(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._count())

    def __enter__(self) -> ConntrackSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _probe_json(sb: sandbox_rt.Sandbox, *args: object, timeout: float = 120) -> dict[str, Any]:
    r = sb.exec(["python3", PROBE, *map(str, args)], timeout=timeout)
    if r.exit_code != 0:
        raise RuntimeError(f"probe {args} in {sb.id} exited {r.exit_code}: {r.stderr_text[-500:]}")
    out: dict[str, Any] = json.loads(r.text.strip().splitlines()[-1])
    return out


def _init_pid(b: Bench, sb: sandbox_rt.Sandbox) -> int:
    out = subprocess.run(
        ["lxc-info", "-P", str(b.settings.lxc_path), "-n", sb.id, "-p", "-H"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout.strip()
    if not out.isdigit():
        raise RuntimeError(f"{sb.id} has no init pid")
    return int(out)


def _pids_current(sandbox_id: str) -> int:
    v1 = Path(f"/sys/fs/cgroup/pids/lxc.payload.{sandbox_id}/pids.current")
    path = v1 if v1.exists() else Path(f"/sys/fs/cgroup/lxc.payload.{sandbox_id}/pids.current")
    return int(path.read_text())


def _wait(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)  # polling a condition of another process


class Hostile:
    """The flooding sandbox: starts a flood, waits until it runs, stops it (without a process
    inside: the stop flag is written from the host into a file the sandbox made beforehand)."""

    def __init__(self, b: Bench, sb: sandbox_rt.Sandbox) -> None:
        self.b, self.sb = b, sb
        self.pid = _init_pid(b, sb)
        self.root = f"/proc/{self.pid}/root"

    def _running(self, rel: str) -> bool:
        with contextlib.suppress(OSError):
            return os.stat(f"{self.root}/{rel}", follow_symlinks=False).st_size >= 0
        return False

    @contextlib.contextmanager
    def flood(self, kind: str) -> Iterator[dict[str, Any]]:
        stop = f"tmp/.nb-stop-{kind}"
        self.sb.exec(f"rm -f /{stop}.running && : > /{stop}", check=True)
        result: dict[str, Any] = {}
        errors: list[BaseException] = []
        if kind == "forkstorm":
            # bash builtins only while the bomb holds every pid; its session is KILLed as one group
            script = (
                "setsid bash -c ':(){ :|:& };:' 2>/dev/null & bomb=$!; SECONDS=0\n"
                f"while [[ ! -s /{stop} ]] && (( SECONDS < {FLOOD_MAX_S} )); do :; done\n"
                "kill -KILL -- -$bomb; while kill -0 -- -$bomb 2>/dev/null; do :; done\n"
            )
            self.sb.write_file("/tmp/.nb-forkstorm.sh", script)
            cmd = "exec bash /tmp/.nb-forkstorm.sh"
            # the user's nproc limit (256, SBX-LIM-01) stops the bomb before the cgroup's pids.max
            started: Callable[[], bool] = lambda: _pids_current(self.sb.id) >= FORKSTORM_PIDS  # noqa: E731
        else:
            host = self.b.settings.gateway
            cmd = f"python3 {PROBE} flood {kind} {FLOOD_MAX_S} {host} /{stop}"
            started = lambda: self._running(f"{stop}.running")  # noqa: E731

        def work() -> None:
            try:
                r = self.sb.exec(cmd, timeout=FLOOD_MAX_S + 60)
                if kind != "forkstorm" and r.exit_code == 0 and r.text.strip():
                    result.update(json.loads(r.text.strip().splitlines()[-1]))
                result["exit_code"] = r.exit_code
            except BaseException as exc:  # handed to the caller after join
                errors.append(exc)

        thread = threading.Thread(target=work, name=f"bench-flood-{kind}", daemon=True)
        thread.start()
        try:
            _wait(lambda: started() or not thread.is_alive(), 30, f"the {kind} flood to start")
            if not thread.is_alive():
                raise RuntimeError(f"the {kind} flood ended at once: {errors or result}")
            yield result
        finally:
            rewrite_file_beneath(self.root, stop, b"stop\n")
            thread.join(FLOOD_MAX_S + 90)
        if errors:
            raise errors[0]


def _measure(b: Bench, victim: sandbox_rt.Sandbox, res: dict[str, list[float]], phase: str) -> dict[str, Any]:
    count = 10 if b.opts.quick else 40
    # a DNS answer takes ~0.1-0.2 ms and its time depends on whether a CPU was awake (a flood keeps
    # one busy): three times the queries (1.2 s per phase) so that a phase's median is not a coin toss
    dns_count = count * DNS_QUERIES_PER_SAMPLE
    mb = _throughput_mb(b)
    for _ in range(count):
        res[f"exec_rtt@{phase}"].append(timed(lambda: victim.exec("true", check=True)))
    dns = _probe_json(victim, "dns", dns_count, b.settings.dns_server, DNS_NAME)
    res[f"dns_answer@{phase}"] += [float(x) for x in dns["latencies"]]
    fsync = _probe_json(victim, "fsync", count, "/home/sandbox/.fsync-probe")
    res[f"fsync@{phase}"] += [float(x) for x in fsync["latencies"]]
    # a connection of its own per phase, so every phase starts from the same transport state (its
    # own key re-exchange schedule)
    fresh = b.mgr.attach(victim.id)
    try:
        fresh.exec("true")
        for _ in range(3 if b.opts.quick else THROUGHPUT_SAMPLES):
            r = fresh.exec(f"head -c {mb}M /dev/zero", timeout=120)
            res[f"throughput@{phase}"].append(r.duration_s)
            if len(r.stdout) != mb << 20:
                raise RuntimeError(f"the victim sent {len(r.stdout)} bytes, not {mb} MiB")
    finally:
        fresh.close()
    return {"dns_lost": int(dns["lost"]), "dns_asked": dns_count}


def _throughput_mb(b: Bench) -> int:
    return 8 if b.opts.quick else 32


def _flood_entries(ip: str) -> int:
    proc = subprocess.run(["conntrack", "-L", "-s", ip], capture_output=True, text=True, check=False)
    return len(proc.stdout.splitlines())


def _compare(res: dict[str, list[float]], mb: int) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
    """Summaries of the samples, each flood's figure against idle, and the worst slowdown."""
    measures: dict[str, dict[str, Any]] = {}
    for key, values in res.items():
        if not values:
            continue  # every DNS answer of a phase lost: its facts say so
        fig = key.split("@", 1)[0]
        measures[key] = summary(values, FIGURES[fig])
        if fig == "throughput":
            throughput(measures[key], mb)
    comparisons = []
    for phase in PHASES:
        for fig in FIGURES:
            ours, base = f"{fig}@{phase}", f"{fig}@idle"
            if ours in measures and base in measures:
                kind = "throughput" if fig == "throughput" else "time"
                comparisons.append(compare(measures, ours, base, kind, against="idle"))
    worst = max((c["ratio"] if c["kind"] == "time" else 1 / c["ratio"] for c in comparisons), default=0.0)
    return measures, comparisons, worst


def _empty_samples() -> dict[str, list[float]]:
    return {f"{fig}@{p}": [] for p in ("idle", *PHASES) for fig in FIGURES}


def run(b: Bench) -> dict[str, Any]:
    rounds: list[dict[str, list[float]]] = []
    phases: dict[str, dict[str, Any]] = {}
    ct_max = int((CONNTRACK / "nf_conntrack_max").read_text())
    mb = _throughput_mb(b)
    with (
        b.sandbox(internet=True, cpus=1, memory_mb=512) as victim,
        b.sandbox(internet=True, cpus=1, memory_mb=512) as hostile_sb,
    ):
        for sb in (victim, hostile_sb):
            sb.write_file(PROBE, PROBE_SOURCE.read_bytes())
        victim.exec("true")  # the first session pays sshd's set-up
        hostile = Hostile(b, hostile_sb)
        for _ in range(1 if b.opts.quick else ROUNDS):
            res = _empty_samples()
            rounds.append(res)
            # idle before every flood: the baseline spans the same minutes as the floods (a shared
            # host's own load drifts), pooled into one idle figure per measure
            for phase in [step for flood in PHASES for step in ("idle", flood)]:
                b.checkpoint()
                with ConntrackSampler() as ct:
                    if phase == "idle":
                        facts = _measure(b, victim, res, phase)
                        flood: dict[str, Any] = {}
                    else:
                        with hostile.flood(phase) as flood:
                            facts = _measure(b, victim, res, phase)
                            facts["hostile_entries"] = _flood_entries(hostile_sb.ip)
                row = phases.setdefault(phase, {"dns_lost": 0, "dns_asked": 0, "conntrack_peak": 0})
                if phase == "idle" and facts["dns_lost"] == facts["dns_asked"]:
                    raise RuntimeError(
                        f"the host's dnsmasq ({b.settings.dns_server}) answered none of "
                        f"{facts['dns_asked']} queries while the neighbour idled: is it running? "
                        "(ansible-playbook -i inventories/local site.yml starts it)"
                    )
                row["dns_lost"] += facts["dns_lost"]
                row["dns_asked"] += facts["dns_asked"]
                row["conntrack_peak"] = max(row["conntrack_peak"], ct.peak)
                if "hostile_entries" in facts:
                    row["hostile_entries"] = max(row.get("hostile_entries", 0), facts["hostile_entries"])
                if flood and row.get("flood", {}).get("exit_code", 0) == 0:
                    row["flood"] = dict(flood)  # the last round's, or the first that failed
    pooled = {key: [v for res in rounds for v in res[key]] for key in rounds[0]}
    measures, comparisons, worst = _compare(pooled, mb)
    facts_out = {
        "phases": phases,
        "rounds": len(rounds),
        "worst_by_round": [_compare(res, mb)[2] for res in rounds],
        "conntrack_max": ct_max,
        "conntrack_peak": max(p["conntrack_peak"] for p in phases.values()),
        "dns_lost": sum(p["dns_lost"] for p in phases.values()),
        "worst_slowdown": worst,
        "caps": {
            "net_mbps": victim.record.spec.net_mbps,
            "disk_mbps": victim.record.spec.disk_mbps,
            "disk_iops": victim.record.spec.disk_iops,
        },
        "throughput_mb": mb,
    }
    return {"measures": measures, "comparisons": comparisons, "facts": facts_out}
