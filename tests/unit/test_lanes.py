"""tests/lanes.py places every test file in one group, and keeps apart what must not share the machine."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

from tests import lanes


def test_every_test_file_is_in_exactly_one_lane() -> None:
    files = lanes.test_files()
    groups = lanes.placement(files)
    placed = [f for members in groups.values() for f in members]
    assert sorted(placed) == sorted(files) and len(set(placed)) == len(placed)
    assert all(groups[name] for name in lanes.LANES)


def test_a_file_outside_tests_has_no_lane() -> None:
    with pytest.raises(ValueError, match=r"no lane for elsewhere/test_new\.py"):
        lanes.placement(["tests/unit/test_lanes.py", "elsewhere/test_new.py"])


def test_every_rule_places_a_file() -> None:
    """No stale rule: each one is the first match of some test file."""
    files = lanes.test_files()
    for group, pattern in lanes.RULES:
        assert any(fnmatch.fnmatch(f, pattern) and lanes.group_of(f) == group for f in files), pattern


# what only a test of the machine's sandbox host uses: beside the host lane, it would race it
HOST_WIDE = (
    "run_playbook(",  # site.yml on this machine
    "emulated_pve",  # emulated node 0, a session fixture
    "lxc_manager",
    "from_env(",
    "Settings.load(",
    "simulated_network",
    "pve_test_server(",  # a PVE test server whose CTs are real containers on this host
    "template_clone(",
    "LxcEngine(",
)


def test_the_apart_lane_touches_nothing_the_host_lane_uses() -> None:
    """Outside the unit tests, no test file of the apart lane names what uses the machine's sandbox host
    (the unit tests are what ``scripts/test.sh --fast`` runs: no host either)."""
    apart = [f for f in lanes.placement(lanes.test_files())["apart"] if not f.startswith("tests/unit/")]
    assert apart
    for f in apart:
        text = (lanes.REPO / f).read_text()
        assert not [word for word in HOST_WIDE if word in text], f


def test_the_summary_sums_the_lanes(capsys: pytest.CaptureFixture[str]) -> None:
    results = [
        lanes.LaneResult("host", 0, 100.0, {"passed": 3, "failed": 0, "errors": 0, "skipped": 1}),
        lanes.LaneResult("apart", 1, 120.0, {"passed": 5, "failed": 2, "errors": 0, "skipped": 0}),
    ]
    assert lanes._report(results) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "========== lanes FAILED: 2 failed, 8 passed, 1 skipped in 120.00s =========="
    assert lanes._report([results[0], lanes.LaneResult("apart", 5, 1.0, {})]) == 0


def test_a_lane_counts_its_test_cases_not_its_subtests(tmp_path: Path) -> None:
    """A JUnit report from pytest: the suite's ``tests`` counts the 32 subtests of one test too."""
    report = tmp_path / "lane.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest" tests="36" failures="1" errors="1" skipped="1">'
        '<testcase classname="a" name="fuzzed" />'
        '<testcase classname="a" name="broken"><failure message="x" /></testcase>'
        '<testcase classname="a" name="setup"><error message="y" /></testcase>'
        '<testcase classname="a" name="later"><skipped message="z" /></testcase>'
        "</testsuite></testsuites>"
    )
    assert lanes._counts(report) == {"passed": 1, "failed": 1, "errors": 1, "skipped": 1}
    assert lanes._counts(tmp_path / "missing.xml") == {}
