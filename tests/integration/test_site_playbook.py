"""site.yml on the embedded default: converges, is idempotent, has a clean check mode, and refuses bad
variables before it changes anything."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.provision_helpers import (
    HOST_JSON,
    NFT_FILE,
    PlaybookRun,
    ensure_provisioned,
    run_playbook,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="provisions this machine: needs root"),
]


def _assert_clean(run: PlaybookRun, what: str) -> None:
    assert run.returncode == 0, f"{what} failed:\n{run.tail()}"
    assert run.recap, f"{what}: no PLAY RECAP in the output:\n{run.tail()}"
    assert run.total("failed") == 0 and run.total("unreachable") == 0, f"{what}: {run.recap}\n{run.tail()}"
    changed = [line for line in run.output.splitlines() if line.startswith("changed:")]
    assert run.total("changed") == 0, f"{what} changed something: {run.recap}\n" + "\n".join(changed)


def test_site_converges_then_changes_nothing() -> None:
    # The suite's runner normally provisioned the host already, so the first run here is the idempotence
    # run. On a host that was not converged, the first run converges and the second must change nothing.
    first = run_playbook()
    assert first.returncode == 0, f"site.yml failed:\n{first.tail()}"
    assert "localhost" in first.recap and "sandbox-template-rootfs" in first.recap, first.recap
    last = first if first.total("changed") == 0 else run_playbook()
    _assert_clean(last, "site.yml (idempotence run)")
    print(f"site.yml no-change run: {last.seconds:.1f} s")


def test_check_mode_on_a_provisioned_host_reports_nothing() -> None:
    ensure_provisioned()
    _assert_clean(run_playbook("--check"), "site.yml --check")


_WATCHED = [
    NFT_FILE,
    HOST_JSON,
    Path("/etc/sandbox_rt/dnsmasq.conf"),
    Path("/var/lib/sandbox_rt/lxc/sandbox-template/config"),
    Path("/var/lib/sandbox_rt/lxc/sandbox-template/rootfs/etc/security/limits.d/sandbox.conf"),
    Path("/var/lib/sandbox_rt/lxc/sandbox-template/rootfs/etc/ssh/sshd_config"),
]


@pytest.mark.parametrize(
    ("extra_var", "variable"),
    [
        ("sandbox_network_cidr=10.99.0.1/33", "sandbox_network_cidr"),
        ("sandbox_network_cidr=10.99.0.1/16", "sandbox_network_cidr"),
        ("sandbox_bridge_address=192.168.5.1", "sandbox_bridge_address"),
        ("sandbox_template_nproc_hard=lots", "sandbox_template_nproc_hard"),
        ("sandbox_template_nproc_soft=1024", "sandbox_template_nproc_soft"),
        ("sandbox_network_forward_policy=maybe", "sandbox_network_forward_policy"),
        ("sandbox_runtime_ip_pool_start=10.99.0.50", "sandbox_runtime_ip_pool_start"),
    ],
)
def test_bad_variable_fails_validation_before_any_change(extra_var: str, variable: str) -> None:
    ensure_provisioned()
    before = {path: path.stat().st_mtime_ns for path in _WATCHED if path.exists()}
    run = run_playbook("-e", extra_var)
    assert run.returncode != 0, f"site.yml accepted {extra_var}:\n{run.tail()}"
    assert run.total("failed") >= 1, run.recap
    assert run.total("changed") == 0, f"site.yml changed something before failing: {run.recap}"
    failure = run.output[run.output.find("fatal:") :]
    assert "fatal:" in run.output, run.tail()
    assert variable in failure.split("PLAY RECAP")[0], f"the failure does not name {variable}:\n{run.tail()}"
    # Validation is the first thing the play does: no role's main tasks ran (their entry point's
    # argument check is the first of them; the roles' `validate` entry points ran before, by design).
    assert "TASK [lxc_host : Validating arguments against arg spec 'main'" not in run.output, run.tail()
    after = {path: path.stat().st_mtime_ns for path in _WATCHED if path.exists()}
    assert after == before, "a managed file was touched"


def test_storage_larger_than_the_free_space_is_refused_before_anything(tmp_path: Path) -> None:
    ensure_provisioned()
    image = Path("/var/lib/sandbox_rt") / f"test-{tmp_path.name}.btrfs"
    run = run_playbook("-e", f"lxc_host_storage_image={image}", "-e", "lxc_host_storage_size_gb=1000000")
    assert run.returncode != 0, run.tail()
    assert "needs 1000000 GiB but only" in run.output, run.tail()
    assert run.total("changed") == 0, run.recap
    assert not image.exists()
