"""A template rebuilt while sandboxes run (issue 20 item 3), on real parts: site.yml builds the new
generation of a named template beside the old one, hardens it, switches the slot's link; a sandbox
on the old generation keeps working (exec, files), its snapshot still forks onto the old files, a
new create (also a warm pool's, in a Manager that lived through the switch) gets the new one, a
second run changes nothing, and the old generation goes once nothing uses it (``sandbox-rt gc``).

Both generations come from the default template's cached tarball (no download: the tag also covers
the template's own tasks file, which differs), so the module costs two extractions and three
site.yml runs, a few minutes. Network: loopback and the sandbox bridge only.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox_rt
from sandbox_rt import Manager, Settings
from sandbox_rt.backends.lxc import generations

from ..provision_helpers import HOST_JSON, PlaybookRun, run_playbook
from .conftest import SESSION_LABEL, _sweep, settings_environ

NAME = "itest-swap"
MARKER = "/etc/sandbox-rt-itest-swap"


def _tasks(version: str) -> str:
    return f"""---
- name: Mark the template generation
  ansible.builtin.copy:
    dest: {MARKER}
    content: "{version}\\n"
    mode: "0644"
"""


def _site(work: Path, version: str) -> PlaybookRun:
    tasks = work / f"tasks-{version}.yml"
    tasks.write_text(_tasks(version))
    extra = work / f"vars-{version}.json"
    extra.write_text(json.dumps({"template_build_templates": [{"name": NAME, "tasks": str(tasks)}]}))
    return run_playbook("-e", f"@{extra}")


def _make(mgr: Manager, **kwargs: object) -> sandbox_rt.Sandbox:
    return mgr.create(labels=SESSION_LABEL, memory_mb=256, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def work(settings: Settings) -> Iterator[Path]:
    saved = HOST_JSON.read_bytes()
    slot = f"{settings.template}-{NAME}"
    with tempfile.TemporaryDirectory(prefix="sandbox-rt-swap-") as tmp:
        try:
            yield Path(tmp)
        finally:
            HOST_JSON.write_bytes(saved)
            for gen in generations.generations(settings.lxc_path, slot):
                shutil.rmtree(settings.lxc_path / gen, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                (settings.lxc_path / slot).unlink()


def test_a_template_swaps_while_its_sandboxes_run(settings: Settings, work: Path) -> None:
    first = _site(work, "v1")
    assert first.returncode == 0, first.tail()
    named = Settings.load()
    slot = named.templates[NAME]
    old = generations.resolve(named.lxc_path, slot)
    assert old.startswith(f"{slot}.") and (named.lxc_path / slot).is_symlink()
    snap = f"itswap{secrets.token_hex(3)}"
    # a long-lived process (like `sandbox-rt serve`): its warm pool fills with the old generation
    pooled = Manager(named, pool_size=1, pool_spec={"template": NAME, "memory_mb": 256})
    mgr = Manager(named)
    try:
        assert pooled.pool is not None and pooled.pool.wait_ready(1, timeout=120)
        sb = _make(mgr, template=NAME)
        assert sb.exec(f"cat {MARKER}").text == "v1\n"
        sb.files.write("/home/sandbox/note.txt", b"written before the swap")
        mgr.snapshot(sb.id, snap)

        second = _site(work, "v2")  # the sandbox runs on through the rebuild and the switch
        assert second.returncode == 0, second.tail()
        new = generations.resolve(named.lxc_path, slot)
        assert new != old and (named.lxc_path / old / "config").is_file()  # in use: kept

        # the running sandbox: exec and files as before, still on the old files
        assert sb.exec(f"cat {MARKER}").text == "v1\n"
        assert sb.files.read("/home/sandbox/note.txt") == b"written before the swap"
        sb.files.write("/home/sandbox/after.txt", b"after")
        assert sb.exec("cat /home/sandbox/after.txt").text == "after"
        # its snapshot forks onto the generation it was taken on
        with _make(mgr, from_snapshot=snap) as fork:
            assert fork.exec(f"cat {MARKER}").text == "v1\n"
            assert fork.files.read("/home/sandbox/note.txt") == b"written before the swap"
        # a new create, and the pool of a Manager made before the switch, get the new generation
        with _make(mgr, template=NAME) as fresh:
            assert fresh.exec(f"cat {MARKER}").text == "v2\n"
        with pooled.create(labels=SESSION_LABEL, template=NAME, memory_mb=256) as warm:
            assert warm.exec(f"cat {MARKER}").text == "v2\n"

        third = _site(work, "v2")  # nothing changed: nothing changes
        assert third.returncode == 0, third.tail()
        assert third.total("changed") == 0, third.tail(120)

        sb.destroy()
        mgr.delete_snapshot(snap)
        pooled.close()  # its idle sandbox (of the new generation) goes too
        gc = subprocess.run(
            [sys.executable, "-m", "sandbox_rt", "gc"],
            env={**settings_environ(named), "PATH": os.environ.get("PATH", "")},
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert gc.returncode == 0, gc.stderr
        assert f"removed template generation {old}: unused" in gc.stdout
        assert not (named.lxc_path / old).exists()
        assert generations.resolve(named.lxc_path, slot) == new
        with _make(mgr, template=NAME) as again:
            assert again.exec(f"cat {MARKER}").text == "v2\n"
    finally:
        pooled.close()
        with contextlib.suppress(sandbox_rt.SandboxError):
            mgr.delete_snapshot(snap)
        _sweep(mgr)
