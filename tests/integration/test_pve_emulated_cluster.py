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
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox_rt import Manager
from tests.integration.provision_helpers import PlaybookRun
from tests.pve_node import PVENode, spec_for_index
from tests.pve_node.provisioning import admin_api, node_manager, provisioned_node, run_site

pytestmark = [pytest.mark.slow, pytest.mark.root]

INDEX = 5
FIRST = spec_for_index(INDEX).name
SECOND = f"{FIRST}b"
OFFSET = 100  # inventories/pve_emulated_cluster
TEMPLATES = {"default": 9000, "base": 9001}  # inventories/pve_emulated
LABELS = {"test-session": "pve-emulated-cluster"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[PVENode, PlaybookRun, PlaybookRun]]:
    with provisioned_node(INDEX, extra_api_nodes=(SECOND,)) as provisioned:
        node, first = provisioned.node, provisioned.first_run
        assert first.returncode == 0 and first.total("failed") == 0, first.tail(80)
        second = run_site(
            node,
            "-i",
            "inventories/pve_emulated_cluster",
            "--tags",
            "template_build,proxmox_access,sandbox_runtime",
        )
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
