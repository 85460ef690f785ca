"""SBX-RES: pids, memory, swap, CPU and disk limits, shown with bounded attacks on real sandboxes."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import cgroup_checks as cc
from . import checks
from .checks import Target
from .conftest import Factory
from .controls import Waiver
from .sites import Site

pytestmark = [pytest.mark.slow]


def test_SBX_RES_01_fork_bomb_stays_inside(site_make: Factory) -> None:
    # PVE: the CT config has no process limit option; the node's hookscript writes the sandbox's
    # pids_max into the CT's cgroup at post-start and the runtime refuses a CT it did not confirm
    checks.check_fork_bomb_contained(site_make(pids_max=128), 128)


def test_SBX_RES_02_oom_killed_inside(site_make: Factory) -> None:
    checks.check_oom_contained(site_make(memory_mb=256), 256)


def test_SBX_RES_03_no_swap(site_baseline: Target) -> None:
    checks.check_no_swap(site_baseline)


def test_SBX_RES_04_cpu_quota(site_make: Factory) -> None:
    ratio = checks.check_cpu_quota(site_make(cpus=0.5), 0.5)
    print(f"cpus=0.5 sandbox with two busy loops: {ratio:.2f} CPU-seconds per second")


def test_SBX_RES_05_disk_fill(
    site: Site, site_make: Factory, waivers: dict[str, Waiver], pve_waivers: dict[str, Waiver]
) -> None:
    t = site_make(disk_gb=1)
    waiver = pve_waivers["SBX-RES-05"] if site.is_pve else waivers["SBX-RES-05"]
    holds, evidence = checks.overlay_disk_unbounded(t, disk_gb=1)
    if holds:  # the waiver's statement, shown: the disk is not bounded (LXC: dir storage; PVE: see why)
        assert waiver.condition == "overlay_disk_unbounded", evidence
        return
    checks.check_disk_bounded(t, disk_gb=1)


def test_SBX_RES_13_root_cannot_leave_its_cgroup(site_make: Factory, workdir: Path) -> None:
    caps = cc.Caps()
    t = cc.root_target(site_make(root=True, **caps.create_kwargs()), workdir)
    for controller, seen in cc.check_caps_hold(t, caps).items():
        print(f"root's move in {controller}: {seen}")
    cc.check_cgroup_tree_read_only(t)
