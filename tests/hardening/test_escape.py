"""SBX-ESC: container confinement. Every escape attempt runs as the sandbox user and, where it matters,
as container root (lxc-attach): what an attacker holds after a privilege escalation inside."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest
from testinfra.host import Host

from tests.integration.provision_helpers import wait_for

from . import checks, hosts
from .checks import Target
from .conftest import Factory
from .controls import Waiver
from .sites import Site

pytestmark = [pytest.mark.slow]


def test_SBX_ESC_01_unprivileged_container(site_baseline: Target) -> None:
    checks.check_unprivileged(site_baseline)


def test_SBX_ESC_02_no_mounts(site_make: Factory) -> None:
    checks.check_no_mounts(site_make())


def test_SBX_ESC_03_no_kernel_log(site_baseline: Target, site_host: Host) -> None:
    checks.check_no_kmsg(site_baseline, site_host)


def test_SBX_ESC_04_no_raw_block_devices(site_baseline: Target) -> None:
    checks.check_no_block_devices(site_baseline)


def test_SBX_ESC_05_no_setuid_shells(site_baseline: Target) -> None:
    checks.check_no_setuid_shells(site_baseline)


def test_SBX_ESC_06_proc_sys_read_only(site_make: Factory) -> None:
    checks.check_proc_sys_readonly(site_make())


def test_SBX_ESC_07_no_kernel_modules(kernel_target: Target) -> None:
    checks.check_no_modules(kernel_target)


def test_SBX_ESC_08_no_user_namespaces(kernel_target: Target) -> None:
    checks.check_no_user_namespaces(kernel_target)


def test_SBX_ESC_09_host_proc_invisible(site_baseline: Target) -> None:
    marker = f"{secrets.randbelow(900) + 100}.{secrets.randbelow(10**6):06d}"
    host_proc = subprocess.Popen(["sleep", marker])
    try:
        cmdline = Path(f"/proc/{host_proc.pid}/cmdline")
        wait_for(lambda: marker in cmdline.read_text(), 5, "the marker process on the host")
        checks.check_host_proc_hidden(site_baseline, marker, host_proc.pid)
    finally:
        host_proc.kill()
        host_proc.wait(timeout=10)


def test_SBX_ESC_10_capabilities_dropped(site_baseline: Target) -> None:
    checks.check_caps_dropped(site_baseline)


def test_SBX_ESC_11_seccomp(kernel_target: Target) -> None:
    checks.check_seccomp(kernel_target)


def test_SBX_ESC_12_no_nesting(site_baseline: Target) -> None:
    checks.check_no_nesting(site_baseline)


def test_SBX_ESC_13_apparmor(site_baseline: Target, site: Site, waivers: dict[str, Waiver]) -> None:
    waiver = waivers["SBX-ESC-13"]
    holds, evidence = checks.apparmor_disabled()
    if holds:  # the waiver's statement: no AppArmor in this kernel, and the config says so openly
        assert waiver.condition == "apparmor_disabled", evidence
        profile = checks.ct_config_values(site_baseline, "lxc.apparmor.profile")
        assert profile == ["unconfined"], f"AppArmor is off, yet the config asks for {profile}"
        if site.is_pve:  # the node engine writes pve-container's keys; PVE itself says 'generated'
            return
        template = (site.settings.lxc_path / site.settings.template / "config").read_text()
        assert "# Waiver: AppArmor is not enabled on this host" in template, "the waiver is not in the config"
        return
    checks.check_apparmor_confined(site_baseline)


# -- the kernel surface (issue 16): one control per refused call family, on both backends ----------
def test_SBX_ESC_14_userns_lock(kernel_target: Target) -> None:
    checks.check_userns_lock(kernel_target)


def test_SBX_ESC_15_no_namespace_switching(kernel_target: Target) -> None:
    checks.check_refused(kernel_target, "setns")


def test_SBX_ESC_16_no_kernel_keyring(kernel_target: Target) -> None:
    checks.check_refused(kernel_target, "keyring")


def test_SBX_ESC_17_no_io_uring(kernel_target: Target) -> None:
    checks.check_refused(kernel_target, "io_uring")


def test_SBX_ESC_18_no_userfaultfd(kernel_target: Target) -> None:
    checks.check_refused(kernel_target, "userfaultfd")


def test_SBX_ESC_19_no_bpf(kernel_target: Target) -> None:
    checks.check_refused(kernel_target, "bpf")


def test_SBX_ESC_20_no_perf_events(kernel_target: Target) -> None:
    checks.check_refused(kernel_target, "perf_event_open")


def test_SBX_ESC_21_no_mount_calls(kernel_target: Target) -> None:
    checks.check_refused(kernel_target, "mount")


def test_SBX_ESC_22_no_clock_setting(kernel_target: Target) -> None:
    checks.check_refused(kernel_target, "clock")


def test_SBX_ESC_23_no_ptrace_family(kernel_target: Target) -> None:
    checks.check_refused(kernel_target, "ptrace")


def test_SBX_ESC_24_no_reboot_or_kexec(kernel_target: Target) -> None:
    checks.check_refused(kernel_target, "reboot")


def test_SBX_ESC_25_no_host_administration(kernel_target: Target) -> None:
    checks.check_refused(kernel_target, "admin")


def test_SBX_ESC_26_no_new_privileges(kernel_target: Target) -> None:
    checks.check_no_new_privs(kernel_target)


def test_SBX_ESC_27_root_on_request_stays_confined(site_make: Factory, site: Site, workdir: Path) -> None:
    t = site_make(root=True)
    root = hosts.sandbox_host(t.sb, site.settings, workdir, user="root")
    checks.check_root_on_request(checks.as_root_login(t, root))


def test_SBX_ESC_28_nothing_runs_as_root_without_root(
    site: Site, site_make: Factory, pve_waivers: dict[str, Waiver]
) -> None:
    t = site_make()
    if site.is_pve:  # PID 1 and sshd still start as root there: root-tainted sources are refused
        holds, evidence = checks.pve_root_side_refused(t, site_make)
        assert holds and pve_waivers["SBX-ESC-28"].condition == "pve_root_side_refused", evidence
        return
    checks.check_nothing_runs_as_root(t)
