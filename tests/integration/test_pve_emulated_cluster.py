"""A cluster's template copies, made by ``site.yml``, on the emulated PVE node (issue 19 item 1).

A node of its own (tests/pve_node, index 5: not the session's node 0), whose API serves two PVE nodes,
``<name>`` and ``<name>b``, both backed by the one node container (each CT belongs to its node by
name and VMID, as in a cluster). ``site.yml`` provisions it as ``tests/integration/test_pve_emulated.py``
does (node ``<name>``: templates 9000 and 9001), then runs again with ``inventories/pve_emulated_cluster``
added and only the template, access and runtime tags, as an operator adding a node would: the second
node gets its own copy of every template at VMID + 100 (9100, 9101), built, hardened and converted
there; the first node's templates are left alone; the host contract lists the copies, the runtime's
least-privilege token gets the clone-only role on each, and a sandbox pinned to either node is a
linked clone of that node's own copy, working over SSH. Everything is removed at the end.

Last (issue 20 item 3), a template update: with a sandbox running from the current template,
``site.yml`` runs with a new ``template_build_refresh``; every template is rebuilt in its other
generation slot (VMID + 500), the host contract names the new VMIDs, the long-lived manager's next
create clones the new template (no restart), the running sandbox still works, the old template it is a
clone of is kept (the unused older ones are removed) until a later run after its clone is gone, and a
run after that changes nothing. ``SANDBOX_RT_PVE_CLUSTER_NODE_INDEX`` picks another node (development).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox_rt import Manager
from tests.integration.provision_helpers import PlaybookRun
from tests.pve_node import PVENode, spec_for_index
from tests.pve_node.provisioning import admin_api, node_manager, provisioned_node, run_site

pytestmark = [pytest.mark.slow, pytest.mark.root]

INDEX = int(os.environ.get("SANDBOX_RT_PVE_CLUSTER_NODE_INDEX", "5"))
FIRST = spec_for_index(INDEX).name
SECOND = f"{FIRST}b"
OFFSET = 100  # inventories/pve_emulated_cluster
TEMPLATES = {"default": 9000, "base": 9001}  # inventories/pve_emulated
LABELS = {"test-session": "pve-emulated-cluster"}
GENERATION = 500  # template_build_proxmox_generation_offset (its default)
CLUSTER_RUN = (
    "-i",
    "inventories/pve_emulated_cluster",
    "--tags",
    "template_build,proxmox_access,sandbox_runtime",
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[PVENode, PlaybookRun, PlaybookRun]]:
    with provisioned_node(INDEX, extra_api_nodes=(SECOND,)) as provisioned:
        node, first = provisioned.node, provisioned.first_run
        assert first.returncode == 0 and first.total("failed") == 0, first.tail(80)
        second = run_site(node, *CLUSTER_RUN)
        yield node, first, second


@pytest.fixture(scope="module")
def manager(cluster: tuple[PVENode, PlaybookRun, PlaybookRun]) -> Iterator[Manager]:
    node, _, second = cluster
    assert second.returncode == 0 and second.total("failed") == 0, second.tail(80)
    with node_manager(node, LABELS) as mgr:
        yield mgr


def resources(node: PVENode) -> list[dict[str, Any]]:
    return list(admin_api(node).cluster.resources.get(type="vm"))


def test_the_second_node_gets_its_own_copy_of_every_template(
    cluster: tuple[PVENode, PlaybookRun, PlaybookRun],
) -> None:
    node, _, second = cluster
    assert second.returncode == 0 and second.total("failed") == 0, second.tail(80)
    templates = {int(r["vmid"]): r for r in resources(node) if int(r.get("template") or 0)}
    expected = {vmid: FIRST for vmid in TEMPLATES.values()} | {
        vmid + OFFSET: SECOND for vmid in TEMPLATES.values()
    }
    assert {vmid: r["node"] for vmid, r in templates.items()} == expected
    api = admin_api(node)
    for name, vmid in TEMPLATES.items():
        first_desc = api.nodes(FIRST).lxc(vmid).config.get()["description"]
        copy_desc = api.nodes(SECOND).lxc(vmid + OFFSET).config.get()["description"]
        # the same OS template (the marker names it) on both nodes, finished ("being built" gone)
        assert "sandbox-rt-template-source:" in copy_desc and "being built" not in copy_desc, name
        assert first_desc.splitlines()[0] == copy_desc.splitlines()[0], name


def test_the_host_contract_and_the_token_know_the_copies(
    cluster: tuple[PVENode, PlaybookRun, PlaybookRun],
) -> None:
    node, _, _ = cluster
    contract = json.loads((node.spec.home / "controller" / "host.json").read_text())
    assert contract["pve_template_vmid"] == TEMPLATES["default"]
    assert contract["pve_templates"] == {"base": TEMPLATES["base"]}
    assert contract["pve_node_templates"] == {
        SECOND: {name: vmid + OFFSET for name, vmid in TEMPLATES.items()}
    }
    token = contract["pve_token_id"]
    acl = admin_api(node).access.acl.get()
    clone_only = {e["path"] for e in acl if e["ugid"] == token and e["roleid"] == "SandboxTemplateClone"}
    assert clone_only == {f"/vms/{vmid + off}" for vmid in TEMPLATES.values() for off in (0, OFFSET)}


@pytest.mark.parametrize("where", [FIRST, SECOND])
@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_a_sandbox_pinned_to_a_node_is_a_clone_of_that_nodes_copy(
    cluster: tuple[PVENode, PlaybookRun, PlaybookRun], manager: Manager, where: str, template: str
) -> None:
    node, _, _ = cluster
    with manager.create(labels=LABELS, memory_mb=256, node=where, template=template) as sb:
        assert sb.exec("id -un").text.strip() == "sandbox"
        assert sb.status().template == template
        row = next(r for r in resources(node) if sb.id in str(r.get("tags")).split(";"))
        assert row["node"] == where
        lower = node.attach("grep", "^lxc.rootfs.path", f"/var/lib/lxc/{row['vmid']}/config").stdout
        copy = TEMPLATES[template] + (OFFSET if where == SECOND else 0)
        assert f"/{copy}/" in lower, lower  # a linked clone of this node's copy
    assert manager.list(labels=LABELS) == []


def clone_only_paths(node: PVENode, token: str) -> set[str]:
    acl = admin_api(node).access.acl.get()
    return {e["path"] for e in acl if e["ugid"] == token and e["roleid"] == "SandboxTemplateClone"}


def rootfs_lower(node: PVENode, vmid: int) -> str:
    return str(node.attach("grep", "^lxc.rootfs.path", f"/var/lib/lxc/{vmid}/config").stdout)


def test_a_template_update_swaps_the_templates_while_a_sandbox_runs(
    cluster: tuple[PVENode, PlaybookRun, PlaybookRun], manager: Manager
) -> None:
    """Runs last: it replaces the templates the tests above use."""
    node, _, _ = cluster
    contract_file = node.spec.home / "controller" / "host.json"
    token = json.loads(contract_file.read_text())["pve_token_id"]
    old, new = TEMPLATES["default"], TEMPLATES["default"] + GENERATION
    refresh = ("-e", "template_build_refresh=issue-20-item-3")
    running = manager.create(labels=LABELS, memory_mb=256, node=FIRST)
    try:
        row = next(r for r in resources(node) if running.id in str(r.get("tags")).split(";"))
        assert f"/{old}/" in rootfs_lower(node, int(row["vmid"]))

        update = run_site(node, *CLUSTER_RUN, *refresh)
        assert update.returncode == 0 and update.total("failed") == 0, update.tail(80)
        contract = json.loads(contract_file.read_text())
        assert contract["pve_template_vmid"] == new
        assert contract["pve_templates"] == {"base": TEMPLATES["base"] + GENERATION}
        assert contract["pve_node_templates"] == {
            SECOND: {name: vmid + OFFSET + GENERATION for name, vmid in TEMPLATES.items()}
        }
        templates = {int(r["vmid"]): r["node"] for r in resources(node) if int(r.get("template") or 0)}
        # the old default template stays for its linked clone; the other old ones are gone
        assert templates == {old: FIRST} | {vmid + GENERATION: FIRST for vmid in TEMPLATES.values()} | {
            vmid + OFFSET + GENERATION: SECOND for vmid in TEMPLATES.values()
        }
        assert clone_only_paths(node, token) == {f"/vms/{vmid}" for vmid in templates}
        description = admin_api(node).nodes(FIRST).lxc(new).config.get()["description"]
        assert "sandbox-rt-template-generation: 1" in description.splitlines(), description

        assert running.exec("id -un").text.strip() == "sandbox"  # the running sandbox works on
        # the manager made before the update (as a long-lived server's) clones the new template
        with manager.create(labels=LABELS, memory_mb=256, node=FIRST) as fresh:
            assert fresh.exec("id -un").text.strip() == "sandbox"
            row = next(r for r in resources(node) if fresh.id in str(r.get("tags")).split(";"))
            assert f"/{new}/" in rootfs_lower(node, int(row["vmid"]))
    finally:
        running.destroy()

    # its last clone gone, the next run removes the old template (PVE drops its ACL entries)
    cleanup = run_site(node, *CLUSTER_RUN, *refresh)
    assert cleanup.returncode == 0 and cleanup.total("failed") == 0, cleanup.tail(80)
    assert old not in {int(r["vmid"]) for r in resources(node)}
    assert f"/vms/{old}" not in clone_only_paths(node, token)
    again = run_site(node, *CLUSTER_RUN, *refresh)
    assert again.returncode == 0 and again.total("failed") == 0, again.tail(80)
    assert again.total("changed") == 0, again.tail(120)
    assert json.loads(contract_file.read_text())["pve_template_vmid"] == new
