"""The roles as an Ansible collection (issue 20 item 1): built with ansible-galaxy, installed offline
into a scratch path, documented by ansible-doc with every default, and a play that uses a role by
its FQCN runs (sandbox_runtime, writing its key and host contract into a scratch directory)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

import sandbox_rt

from .provision_helpers import REPO

pytestmark = [pytest.mark.slow]
BIN = REPO / ".venv" / "bin"
GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
FQCN = f"{GALAXY['namespace']}.{GALAXY['name']}"


def _run(*argv: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> str:
    proc = subprocess.run(
        list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, f"{argv}: {proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment in which the built collection is installed (and nothing from this tree)."""
    work = tmp_path_factory.mktemp("collection")
    _run(str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(work))
    (tarball,) = work.glob("*.tar.gz")
    target = work / "collections"
    _run(str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "-p", str(target), str(tarball))
    bundled = Path(importlib.util.find_spec("ansible_collections").origin or "").parent  # type: ignore[union-attr]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(
        ANSIBLE_COLLECTIONS_PATH=f"{target}:{bundled.parent}",
        ANSIBLE_ROLES_PATH=str(work / "no-roles"),  # nothing from the repository's roles/
        ANSIBLE_CONFIG=str(work / "none.cfg"),
        ANSIBLE_NOCOLOR="1",
    )
    root = target / "ansible_collections" / GALAXY["namespace"] / GALAXY["name"]
    assert (root / "roles" / "lxc_host").is_dir()
    return env


def test_the_version_is_the_runtimes() -> None:
    assert GALAXY["version"] == sandbox_rt.__version__


@pytest.mark.parametrize("role", ["sandbox_network", "sandbox_host_vars"])
def test_ansible_doc_documents_every_option_with_its_default(installed: dict[str, str], role: str) -> None:
    argv = (str(BIN / "ansible-doc"), "-t", "role", "--json", f"{FQCN}.{role}")
    doc = json.loads(_run(*argv, env=installed))
    options = next(iter(doc.values()))["entry_points"]["main"]["options"]
    defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text())
    assert set(options) == set(defaults)
    assert all(options[name].get("default") == value for name, value in defaults.items())
    if role == "sandbox_host_vars":  # the bridge several roles read is declared there (issue 36)
        assert options["sandbox_network_bridge"]["default"] == "vmbr1"


def test_a_play_runs_a_role_by_its_fqcn(installed: dict[str, str], tmp_path: Path) -> None:
    play = tmp_path / "play.yml"
    config = tmp_path / "etc"
    play.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "The runtime's key and host contract, from the installed collection",
                    "hosts": "localhost",
                    "gather_facts": False,
                    "roles": [
                        {
                            "role": f"{FQCN}.sandbox_runtime",
                            "vars": {
                                "sandbox_runtime_config_dir": str(config),
                                "sandbox_runtime_ssh_key": str(config / "ssh" / "id_ed25519"),
                                "template_build_templates": [{"name": "base", "packages": []}],
                            },
                        }
                    ],
                }
            ]
        )
    )
    argv = [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(play)]
    out = _run(*argv, "-e", f"ansible_python_interpreter={BIN / 'python'}", env=installed, cwd=tmp_path)
    assert "failed=0" in out
    contract = json.loads((config / "host.json").read_text())
    assert contract["templates"] == {"base": "sandbox-template-base"}
    assert (config / "ssh" / "id_ed25519").stat().st_mode & 0o077 == 0
    assert sandbox_rt.Settings.load(config / "host.json", env={}).template_names() == ["default", "base"]


def _standalone_plays() -> list[dict[str, object]]:
    """The stand-alone plays docs/collection.md shows (its first YAML block)."""
    text = (REPO / "docs" / "collection.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    plays: list[dict[str, object]] = yaml.safe_load(block)
    assert [p["hosts"] for p in plays] == ["sandbox_hosts", "sandbox_hosts"]
    return plays


def test_the_documented_standalone_plays_change_nothing_on_a_provisioned_host(
    installed: dict[str, str], tmp_path: Path
) -> None:
    """docs/collection.md's plays, each role alone from the installed collection, on this host as
    site.yml provisioned it (its inventory's variables, the docs' group named as that inventory names
    its hosts): ``--check --diff`` reports nothing to change. Before the shared host variables, the
    stand-alone sandbox_runtime would have turned host.json's disk_limits from true to false."""
    plays = [{**p, "hosts": "sandbox_hosts_local"} for p in _standalone_plays()]
    play = tmp_path / "standalone.yml"
    play.write_text(yaml.safe_dump(plays))
    before = (Path("/etc/sandbox_rt") / "host.json").read_bytes()
    argv = [str(BIN / "ansible-playbook"), "-i", str(REPO / "inventories" / "local"), str(play)]
    out = _run(*argv, "--check", "--diff", env=installed, cwd=tmp_path)
    recap = out.rsplit("PLAY RECAP", 1)[1]
    assert "localhost" in recap and "changed=0" in recap and "failed=0" in recap, out[-4000:]
    assert "ok=" in recap and " ok=0 " not in recap  # the roles ran, not a play that matched nothing
    assert (Path("/etc/sandbox_rt") / "host.json").read_bytes() == before
