"""The placement policy over /cluster/resources rows (sandbox_rt/backends/proxmox/placement.py)."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_rt.backends.proxmox.placement import NodeView, cluster_view, rank
from sandbox_rt.errors import BackendError, ConfigError

GIB = 1024**3
TAG = "sandbox-rt"


def node(name: str, *, status: str = "online", free_gib: float | None = 8.0) -> dict[str, Any]:
    row: dict[str, Any] = {"id": f"node/{name}", "node": name, "type": "node", "status": status}
    if free_gib is not None:  # a token without Sys.Audit on /nodes/<node> sees no memory
        row.update(maxmem=16 * GIB, mem=int(16 * GIB - free_gib * GIB))
    return row


def ct(vmid: int, where: str, *, tags: str = "", template: int = 0) -> dict[str, Any]:
    return {
        "id": f"lxc/{vmid}",
        "vmid": vmid,
        "node": where,
        "type": "lxc",
        "tags": tags,
        "template": template,
    }


def sandbox(vmid: int, where: str) -> dict[str, Any]:
    return ct(vmid, where, tags=f"{TAG};sbx-{vmid:010x}")


TEMPLATES = [9000, 9100, 9200]  # one copy per node
COPIES = [ct(9000, "a", template=1), ct(9100, "b", template=1), ct(9200, "c", template=1)]


def names(views: list[NodeView]) -> list[str]:
    return [v.name for v in views]


def test_most_free_memory_first_then_fewest_sandboxes_then_name() -> None:
    rows = [node("a", free_gib=4), node("b", free_gib=12), node("c", free_gib=12), *COPIES]
    assert names(rank(cluster_view(rows, TEMPLATES, TAG), template="default")) == ["b", "c", "a"]
    rows += [sandbox(101, "b"), sandbox(102, "b"), sandbox(103, "c")]
    assert names(rank(cluster_view(rows, TEMPLATES, TAG), template="default")) == ["c", "b", "a"]


def test_only_our_tagged_cts_count_as_sandboxes() -> None:
    rows = [
        node("a"),
        node("b"),
        node("c"),
        *COPIES,
        ct(300, "a", tags="web"),
        ct(301, "a"),
        sandbox(302, "b"),
    ]
    view = {v.name: v for v in cluster_view(rows, TEMPLATES, TAG)}
    assert (view["a"].sandboxes, view["b"].sandboxes, view["c"].sandboxes) == (0, 1, 0)


def test_offline_nodes_and_nodes_without_the_template_are_not_candidates() -> None:
    rows = [
        node("a", status="offline", free_gib=None),
        node("b"),
        node("c", free_gib=15),
        node("d", free_gib=15),
    ]
    rows += COPIES
    assert names(rank(cluster_view(rows, TEMPLATES, TAG), template="default")) == ["c", "b"]


def test_a_template_copy_counts_only_where_it_is_a_template_and_listed() -> None:
    rows = [
        node("a"),
        node("b"),
        ct(9000, "a", template=1),
        ct(9100, "b", template=0),
        ct(7777, "b", template=1),
    ]
    view = {v.name: v for v in cluster_view(rows, TEMPLATES, TAG)}
    assert view["a"].template_vmid == 9000
    assert view["b"].template_vmid is None  # 9100 is not a template, 7777 not a copy of this one


def test_the_host_contract_order_decides_between_two_copies_on_one_node() -> None:
    rows = [node("a"), ct(9100, "a", template=1), ct(9000, "a", template=1)]
    assert cluster_view(rows, TEMPLATES, TAG)[0].template_vmid == 9000


def test_without_node_memory_fewest_sandboxes_decide_and_known_memory_ranks_first() -> None:
    rows = [node("a", free_gib=None), node("b", free_gib=None), *COPIES, sandbox(101, "a")]
    assert names(rank(cluster_view(rows, TEMPLATES, TAG), template="default")) == ["b", "a"]
    rows = [node("a", free_gib=None), node("b", free_gib=1), *COPIES]
    assert names(rank(cluster_view(rows, TEMPLATES, TAG), template="default")) == ["b", "a"]


def test_memory_being_placed_by_this_process_counts_against_the_node() -> None:
    rows = [node("a", free_gib=8), node("b", free_gib=7), *COPIES]
    views = cluster_view(rows, TEMPLATES, TAG)
    assert names(rank(views, template="default"))[0] == "a"
    assert names(rank(views, template="default", placing_mb={"a": 2048}))[0] == "b"


def test_node_override_takes_that_node_even_when_it_ranks_last() -> None:
    rows = [node("a", free_gib=1), node("b", free_gib=12), *COPIES]
    assert names(rank(cluster_view(rows, TEMPLATES, TAG), template="default", node="a")) == ["a"]


def test_node_override_errors_name_the_problem() -> None:
    rows = [node("a"), node("b", status="offline", free_gib=None), node("c"), *COPIES[:2]]
    views = cluster_view(rows, TEMPLATES, TAG)
    with pytest.raises(ConfigError, match=r"'x' is not a node of this cluster \(nodes: a, b, c\)"):
        rank(views, template="default", node="x")
    with pytest.raises(ConfigError, match=r"'c' has no copy of template 'default'.*nodes with it: a, b"):
        rank(views, template="default", node="c")
    with pytest.raises(BackendError, match="'b' is offline"):
        rank(views, template="default", node="b")


def test_no_candidate_is_a_backend_error_naming_what_is_missing() -> None:
    rows = [node("a", status="offline", free_gib=None), node("b"), ct(9000, "a", template=1)]
    with pytest.raises(
        BackendError, match=r"no online node holds template 'base' \(online: b; with the template: a\)"
    ):
        rank(cluster_view(rows, TEMPLATES, TAG), template="base")
