"""Molecule's idempotence step catches a non-idempotent role.

A throw-away copy of the project (the sandbox_runtime role, the sandbox_host_vars role it depends on,
and its scenario, molecule/sandbox_runtime) gets one task appended to the role,
``ansible.builtin.command: date`` without ``changed_when``. The unmodified scenario passes in
scripts/molecule.sh; with the injected task, ``molecule test`` must converge fine, then fail at the
idempotence step naming that task, and still destroy what it made.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="molecule scenarios run against this machine as root"),
]

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SCENARIO = "sandbox_runtime"
INJECTED = "Deliberately not idempotent (injected by test_molecule_idempotence)"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _throwaway_project(dest: Path) -> None:
    shutil.copytree(ROOT / "roles" / SCENARIO, dest / "roles" / SCENARIO)
    shared = "sandbox_host_vars"  # the role's dependency
    shutil.copytree(ROOT / "roles" / shared, dest / "roles" / shared)
    shutil.copytree(ROOT / "molecule" / SCENARIO, dest / "molecule" / SCENARIO)
    shutil.copytree(ROOT / "molecule" / "shared", dest / "molecule" / "shared")
    with (dest / "roles" / SCENARIO / "tasks" / "main.yml").open("a") as tasks:
        tasks.write(f"\n- name: {INJECTED}\n  ansible.builtin.command: date\n")


def test_idempotence_step_fails_on_a_non_idempotent_task(tmp_path: Path) -> None:
    project = tmp_path / "project"
    _throwaway_project(project)
    # The scenario's scratch root; its destroy only removes /tmp/...molecule... paths.
    scratch = Path("/tmp") / f"sandbox_rt-molecule-idempotence-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "SANDBOX_RT_MOLECULE_SCRATCH": str(scratch),
        "NO_COLOR": "1",
        "ANSIBLE_NOCOLOR": "1",
    }
    try:
        proc = subprocess.run(
            [str(VENV_BIN / "molecule"), "test", "--scenario-name", SCENARIO],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        leftover = scratch.exists()
        shutil.rmtree(scratch, ignore_errors=True)
    out = ANSI.sub("", proc.stdout + proc.stderr)
    tail = "\n".join(out.splitlines()[-60:])

    assert proc.returncode != 0, f"molecule passed although the role is not idempotent:\n{tail}"
    # The failure is the idempotence step's, and it names the injected task.
    assert re.search(r"converge[^\n]*Executed: Successful", out), tail
    assert re.search(r"idempotence[^\n]*Executed: Failed", out), tail
    assert "Idempotence test failed because of the following tasks" in out, tail
    # Molecule lists "* [host] => task" (the host part is empty when the output is not a terminal).
    # Only the injected task is listed: the role itself is idempotent.
    listed = set(re.findall(r"^\*\s+(?:\[\w+\]\s+)?=> (.*)$", out, re.MULTILINE))
    assert listed == {f"sandbox_runtime : {INJECTED}"}, tail
    # destroy ran after the failure and removed the scratch directory.
    assert re.search(r"destroy[^\n]*Executed: Successful", out.split("idempotence", 1)[1]), tail
    assert not leftover, f"{scratch} survived the destroy step"
