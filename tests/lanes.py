"""The pytest stage in lanes (issue 36 item 5): two pytest processes side by side.

Most tests wait on SSH and container boots, so one pytest process keeps a 2-CPU machine well under
half busy. The test files are split by whether they touch what the whole machine shares:

- ``host``: everything that uses this machine's sandbox host (its LXC path, bridge, dnsmasq and
  tables, templates and host.json; site.yml runs; the hardening catalogue's simulated network; the
  emulated PVE node 0, one session fixture), in one process, in the order of a plain run: these
  tests compare the host's sandbox list, run gc, swap templates and reload the tables, so nothing
  else of this kind may run beside them;
- ``apart``: what touches none of that: the unit tests, the PVE API test server on its memory engine,
  and the emulated cluster (nodes of its own index, networks of their own: tests/pve_node/spec.py).

Every test file is in exactly one lane, the first rule that matches its path; a file no rule names is
in ``host``. The ``apart`` lane's output is printed when it ends, whole, after the ``host`` lane's,
which streams; the last line sums both as pytest's own summary line does.

    python -m tests.lanes [pytest options]            the whole suite in lanes (scripts/test.sh)
    SANDBOX_RT_TEST_LANES=1 python -m tests.lanes ... one pytest process, as before
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LANES_ENV = "SANDBOX_RT_TEST_LANES"  # "1": one pytest process, no lanes

# (group, path pattern relative to the repository): the first that matches a test file places it
RULES: tuple[tuple[str, str], ...] = (
    ("apart", "tests/unit/*"),
    ("apart", "tests/integration/test_pve_emulated_cluster.py"),  # emulated nodes 5 and 5b
    ("apart", "tests/integration/test_proxmox_access_role.py"),  # the test server's memory engine
    ("apart", "tests/integration/test_proxmox_least_privilege.py"),  # the same
    ("apart", "tests/integration/test_pve_ct_setup_hook.py"),  # a user and network namespace of its own
    ("host", "tests/*"),
)
LANES = ("host", "apart")  # side by side; the first streams its output


def test_files(root: Path = REPO) -> list[str]:
    """Every test module of the suite, relative to ``root``."""
    return sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py"))


def group_of(path: str) -> str | None:
    for group, pattern in RULES:
        if fnmatch.fnmatch(path, pattern):
            return group
    return None


def placement(files: Sequence[str]) -> dict[str, list[str]]:
    """Each group's files; raises ValueError naming a file that no rule places."""
    groups: dict[str, list[str]] = {name: [] for name in LANES}
    unplaced = [f for f in files if group_of(f) is None]
    if unplaced:
        raise ValueError(f"no lane for {', '.join(unplaced)}: add it to RULES in tests/lanes.py")
    for f in files:
        groups[str(group_of(f))].append(f)
    return groups


@dataclass
class LaneResult:
    name: str
    returncode: int
    seconds: float
    counts: dict[str, int] = field(default_factory=dict)  # passed, failed, errors, skipped


def _counts(junit: Path) -> dict[str, int]:
    """The lane's tests by outcome, one per test case of its JUnit report (the suite's ``tests``
    attribute counts each subtest as a test too, pytest's summary line does not)."""
    if not junit.is_file():
        return {}
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    for case in ET.parse(junit).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        kind = (
            "errors"
            if "error" in tags
            else "failed"
            if "failure" in tags
            else "skipped"
            if "skipped" in tags
            else "passed"
        )
        counts[kind] += 1
    return counts


def _command(files: Sequence[str], junit: Path, args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", *args, f"--junitxml={junit}", *files]


def run_lanes(args: Sequence[str]) -> int:
    groups = placement(test_files())
    first, *others = LANES
    with tempfile.TemporaryDirectory(prefix="sandbox-rt-lanes-") as scratch:
        work = Path(scratch)
        side: list[tuple[str, subprocess.Popen[bytes], Path, float]] = []
        for name in others:
            log = work / f"{name}.log"
            print(f"=== lane {name}: {len(groups[name])} files, output when it ends", flush=True)
            with log.open("wb") as out:
                command = _command(groups[name], work / f"{name}.xml", args)
                proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=out)
            side.append((name, proc, log, time.monotonic()))
        print(f"=== lane {first}: {len(groups[first])} files", flush=True)
        t0 = time.monotonic()
        command = _command(groups[first], work / f"{first}.xml", args)
        results = [LaneResult(first, subprocess.call(command, cwd=REPO), time.monotonic() - t0)]
        for name, proc, log, started in side:
            rc = proc.wait()
            results.append(LaneResult(name, rc, time.monotonic() - started))
            print(f"=== lane {name}: ended (exit {rc})", flush=True)
            sys.stdout.write(log.read_text(errors="replace"))
            sys.stdout.flush()
        for r in results:
            r.counts = _counts(work / f"{r.name}.xml")
    return _report(results)


def _report(results: Sequence[LaneResult]) -> int:
    print("=== lanes")
    for r in results:
        shown = ", ".join(f"{v} {k}" for k, v in r.counts.items() if v) or "no results"
        print(f"  {r.name:<8} {r.seconds:6.0f}s  exit {r.returncode}  {shown}")
    total: dict[str, int] = {}
    for r in results:
        for k, v in r.counts.items():
            total[k] = total.get(k, 0) + v
    # exit 5 (nothing collected, e.g. -m "not slow" leaves a lane empty) is not a failure
    failed = [r for r in results if r.returncode not in (0, 5)]
    kinds = ("failed", "errors", "passed", "skipped")
    summary = ", ".join(f"{total[k]} {k}" for k in kinds if total.get(k))
    wall = max((r.seconds for r in results), default=0.0)
    word = "FAILED" if failed else "ok"
    print(f"========== lanes {word}: {summary or 'nothing ran'} in {wall:.2f}s ==========")
    return failed[0].returncode if failed else 0


def main(argv: Sequence[str]) -> int:
    # a run of named tests (a path or a node id among the arguments) or SANDBOX_RT_TEST_LANES=1: one process
    named = any(not a.startswith("-") and (REPO / a.split("::")[0]).exists() for a in argv)
    if named or os.environ.get(LANES_ENV, "").strip() == "1":
        return subprocess.call([sys.executable, "-m", "pytest", *argv], cwd=REPO)
    return run_lanes(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
